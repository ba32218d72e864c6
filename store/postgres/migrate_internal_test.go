package postgres

import (
	"context"
	"testing"
	"testing/fstest"

	"github.com/godurable/godurable/internal/pgtest"
	"github.com/stretchr/testify/require"
)

func fakeMigrations(t *testing.T) []Migration {
	t.Helper()
	fsys := fstest.MapFS{
		"m/001_one.up.sql":   {Data: []byte(`CREATE TABLE {schema}.one (id int)`)},
		"m/001_one.down.sql": {Data: []byte(`DROP TABLE {schema}.one`)},
		"m/002_two.up.sql":   {Data: []byte(`CREATE TABLE {schema}.two (id int)`)},
		"m/002_two.down.sql": {Data: []byte(`DROP TABLE {schema}.two`)},
		"m/003_bad.up.sql":   {Data: []byte(`CREATE TABLE {schema}.three (id int); SELECT 1/0`)},
		"m/003_bad.down.sql": {Data: []byte(`DROP TABLE {schema}.three`)},
	}
	ms, err := loadMigrations(fsys, "m")
	require.NoError(t, err)
	require.Len(t, ms, 3)
	return ms
}

func tableExists(t *testing.T, ctx context.Context, q querier, schema, table string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, q.QueryRow(ctx, `SELECT to_regclass(format('%I.%I', $1::text, $2::text)) IS NOT NULL`, schema, table).Scan(&ok))
	return ok
}

func TestMigratorVersionsAndAtomicity(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := "mig_" + pgtest.SchemaOf(pool)[2:]
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	ms := fakeMigrations(t)

	done, err := migrateTo(ctx, pool, schema, ms, 2)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, done)
	v, err := AppliedVersions(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, v)
	require.True(t, tableExists(t, ctx, pool, schema, "two"))

	// Idempotent.
	done, err = migrateTo(ctx, pool, schema, ms, 2)
	require.NoError(t, err)
	require.Empty(t, done)

	// A failing migration applies nothing and records nothing.
	_, err = migrateTo(ctx, pool, schema, ms, 3)
	require.ErrorContains(t, err, "migration 3 (bad) up")
	require.False(t, tableExists(t, ctx, pool, schema, "three"))
	v, err = AppliedVersions(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, v)

	// Down to 1, then to 0.
	done, err = migrateTo(ctx, pool, schema, ms, 1)
	require.NoError(t, err)
	require.Equal(t, []int{2}, done)
	require.False(t, tableExists(t, ctx, pool, schema, "two"))
	require.True(t, tableExists(t, ctx, pool, schema, "one"))
	done, err = migrateTo(ctx, pool, schema, ms, 0)
	require.NoError(t, err)
	require.Equal(t, []int{1}, done)
	v, err = AppliedVersions(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, v)
}

func TestMigratorRejectsBadFiles(t *testing.T) {
	for name, fsys := range map[string]fstest.MapFS{
		"missing down": {"m/001_a.up.sql": {Data: []byte(`SELECT 1`)}},
		"gap": {
			"m/001_a.up.sql": {Data: []byte(`SELECT 1`)}, "m/001_a.down.sql": {Data: []byte(`SELECT 1`)},
			"m/003_c.up.sql": {Data: []byte(`SELECT 1`)}, "m/003_c.down.sql": {Data: []byte(`SELECT 1`)},
		},
		"bad name": {"m/one.sql": {Data: []byte(`SELECT 1`)}},
	} {
		_, err := loadMigrations(fsys, "m")
		require.Error(t, err, name)
	}
}

func TestResizeShards(t *testing.T) {
	// Limit 10 in 4 shards is [3 3 2 2]; shard 0 holds 5 rows (it had
	// capacity 5 before the resize): it keeps capacity 5, with no slot free.
	got := resizeShards([]int{3, 3, 2, 2}, map[int]int{0: 5, 1: 1}, []int{0, 1})
	require.Equal(t, map[int]slotTarget{0: {5, 0}, 1: {3, 2}, 2: {2, 2}, 3: {2, 2}}, got)
	// Shards beyond the new count keep what their rows use; rows without a
	// shard are charged to shard 0; an empty extra shard is emptied.
	got = resizeShards([]int{2}, map[int]int{3: 1, -1: 1}, []int{0, 1, 3})
	require.Equal(t, map[int]slotTarget{0: {2, 1}, 1: {0, 0}, 3: {1, 0}}, got)
}
