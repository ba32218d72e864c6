// Package pgstoretest hands tests schemas of the shared test server that
// carry the PostgreSQL store's migrations, emptied between tests (migrating
// a fresh schema per test would dominate a package's run time).
package pgstoretest

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store/postgres"
)

// Migrated hands out migrated schemas; see pgtest.Schemas.
var Migrated = pgtest.NewSchemas(
	func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		_, err := postgres.Migrate(ctx, pool, schema)
		return err
	},
	func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		_, err := pool.Exec(ctx, "TRUNCATE instances, key_slots, key_holds, limits, signals, history, rate_limits, rate_buckets, queue_policies, limit_changes, schedules, leases, worked_queues, paused_queues RESTART IDENTITY")
		return err
	})
