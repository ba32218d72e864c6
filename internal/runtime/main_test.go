package runtime

import (
	"testing"

	"github.com/godurable/godurable/internal/pgtest"
)

// TestMain stops a throwaway PostgreSQL cluster, if a test started one
// (pgtest.Pool: TestCommitAfterAnUnknownCommitHandsOnTheSuccessorItPassed).
func TestMain(m *testing.M) { pgtest.Main(m) }
