package postgres

// HealthStatement is one statement of Health with its arguments.
type HealthStatement struct {
	Name string
	SQL  string
	Args []any
}

// HealthStatements returns Health's statements rendered for schema.
func HealthStatements(schema string) []HealthStatement {
	return []HealthStatement{
		{"ready", render(sqlHealthReady, schema), []any{nil}},
		{"statuses", render(sqlHealthStatuses, schema), nil},
		{"blocked by name", render(sqlHealthBlockedByName, schema), nil},
		{"gates", render(sqlHealthGates, schema), nil},
		{"intents", render(sqlHealthIntents, schema), []any{1000}},
		{"policy keys", render(sqlHealthPolicyKeys, schema), []any{nil, 1000}},
	}
}

// SetCopyInsertMin sets the smallest batch that s inserts with COPY (0:
// every batch without unique keys; a huge value: none).
func SetCopyInsertMin(s *Store, n int) { s.copyMin = n }
