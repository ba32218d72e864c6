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
	// Every table of the schema but the migrations' record is emptied: a
	// table a migration adds is emptied without being listed here.
	func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		var tables string
		err := pool.QueryRow(ctx, `SELECT string_agg(format('%I.%I', schemaname, tablename), ', ' ORDER BY tablename)
			FROM pg_tables WHERE schemaname = $1 AND tablename <> 'schema_migrations'`, schema).Scan(&tables)
		if err != nil {
			return err
		}
		_, err = pool.Exec(ctx, "TRUNCATE "+tables+" RESTART IDENTITY")
		return err
	})
