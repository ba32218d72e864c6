// Package exstore opens the store the examples run on: the in-memory store,
// or PostgreSQL when DATABASE_URL is set.
package exstore

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/store/postgres"
)

// Open returns the store for the example named name, a function closing
// it, and a description for the output. With DATABASE_URL set it uses the
// schema "example_<name>", emptied first so that every run starts clean.
func Open(ctx context.Context, name string) (store.Store, func(), string, error) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		st := memory.New(memory.Options{})
		return st, func() { _ = st.Close() }, "in-memory store", nil
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, nil, "", fmt.Errorf("DATABASE_URL: %w", err)
	}
	schema := "example_" + name
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		pool.Close()
		return nil, nil, "", fmt.Errorf("reset schema %s: %w", schema, err)
	}
	if _, err := postgres.Migrate(ctx, pool, schema); err != nil {
		pool.Close()
		return nil, nil, "", err
	}
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: schema, History: true})
	if err != nil {
		pool.Close()
		return nil, nil, "", err
	}
	return st, func() { _ = st.Close(); pool.Close() }, "PostgreSQL (schema " + schema + ")", nil
}
