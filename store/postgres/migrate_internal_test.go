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

// TestMigratorRunsNoTransactionMigrationsOutsideTheTransaction: a
// migration marked to run without a transaction builds its index
// CONCURRENTLY on a schema that already has tables (which PostgreSQL
// refuses inside a transaction block), is recorded only once its last
// statement ran, and runs again from its start after a failure that left
// an invalid index behind; on an empty schema the whole run is one
// transaction (the same files, without CONCURRENTLY).
func TestMigratorRunsNoTransactionMigrationsOutsideTheTransaction(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := "mig_" + pgtest.SchemaOf(pool)[2:]
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	ms, err := loadMigrations(fstest.MapFS{
		"m/001_one.up.sql":   {Data: []byte(`CREATE TABLE {schema}.one (id int); INSERT INTO {schema}.one VALUES (1), (1)`)},
		"m/001_one.down.sql": {Data: []byte(`DROP TABLE {schema}.one`)},
		"m/002_unique.up.sql": {Data: []byte(noTxMarker + `
-- One id per row, built without blocking writes.
DROP INDEX CONCURRENTLY IF EXISTS {schema}.one_id;
CREATE UNIQUE INDEX CONCURRENTLY one_id
    ON {schema}.one (id);
`)},
		"m/002_unique.down.sql": {Data: []byte(noTxMarker + "\nDROP INDEX CONCURRENTLY IF EXISTS {schema}.one_id;\n")},
	}, "m")
	require.NoError(t, err)
	require.True(t, ms[1].NoTransaction(false))
	require.True(t, ms[1].NoTransaction(true))
	require.False(t, ms[0].NoTransaction(false))

	valid := func() (exists, ok bool) {
		err := pool.QueryRow(ctx, `SELECT count(*) > 0, coalesce(bool_and(indisvalid), false) FROM pg_index
			WHERE indexrelid = to_regclass(format('%I.one_id', $1::text))`, schema).Scan(&exists, &ok)
		require.NoError(t, err)
		return exists, ok
	}
	done, err := migrateTo(ctx, pool, schema, ms, 1)
	require.NoError(t, err)
	require.Equal(t, []int{1}, done)
	// The duplicate fails the build, which leaves an invalid index.
	done, err = migrateTo(ctx, pool, schema, ms, 2)
	require.ErrorContains(t, err, "migration 2 (unique) up")
	require.Empty(t, done)
	exists, ok := valid()
	require.True(t, exists)
	require.False(t, ok)
	v, err := AppliedVersions(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, []int{1}, v)

	_, err = pool.Exec(ctx, "DELETE FROM "+schema+".one WHERE ctid <> (SELECT min(ctid) FROM "+schema+".one)")
	require.NoError(t, err)
	done, err = migrateTo(ctx, pool, schema, ms, 2)
	require.NoError(t, err)
	require.Equal(t, []int{2}, done)
	exists, ok = valid()
	require.True(t, exists && ok)

	done, err = migrateTo(ctx, pool, schema, ms, 0)
	require.NoError(t, err)
	require.Equal(t, []int{2, 1}, done)

	// From an empty schema: one transaction, so the failing build undoes
	// the table too.
	_, err = migrateTo(ctx, pool, schema, ms, 2)
	require.ErrorContains(t, err, "migration 2 (unique) up")
	require.False(t, tableExists(t, ctx, pool, schema, "one"))
	v, err = AppliedVersions(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, v)
}

// TestMigrationLocks: what durable migrate prints before it applies a
// migration, for the real files.
func TestMigrationLocks(t *testing.T) {
	ms, err := Migrations()
	require.NoError(t, err)
	require.Equal(t, []string{
		"instances: SHARE while index instances_key_blocked builds (writes wait)",
		"instances: SHARE while index instances_key_ready builds (writes wait)",
		"the table of index instances_key_waiting: ACCESS EXCLUSIVE (reads and writes wait)",
	}, ms[10].Locks(false))
	require.Equal(t, []string{"instances: ACCESS EXCLUSIVE (reads and writes wait)",
		"instances: SHARE while index instances_handed_back builds (writes wait)"}, ms[7].Locks(false))
	require.Empty(t, ms[13].Locks(false), "a new table locks nothing")
	require.True(t, ms[16].NoTransaction(false))
	require.Equal(t, []string{
		"the table of index instances_pick_free_workflow: SHARE UPDATE EXCLUSIVE while the index is dropped (reads and writes go on)",
		"instances: SHARE UPDATE EXCLUSIVE while index instances_pick_free_workflow builds (reads and writes go on)",
		"the table of index instances_pick_keyed_workflow: SHARE UPDATE EXCLUSIVE while the index is dropped (reads and writes go on)",
		"instances: SHARE UPDATE EXCLUSIVE while index instances_pick_keyed_workflow builds (reads and writes go on)",
	}, ms[16].Locks(false))
	require.Equal(t, []string{"instances: SHARE UPDATE EXCLUSIVE while its storage parameters change (reads and writes go on)"}, ms[23].Locks(false))
	require.Equal(t, ms[23].Locks(false), ms[23].Locks(true))
}

// TestMigrateBuildsNewIndexesOnALiveSchema: a schema at version 16 with
// rows is brought to the latest version by migrations 017 on, which build
// their indexes outside a transaction, valid.
func TestMigrateBuildsNewIndexesOnALiveSchema(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	_, err := MigrateDown(ctx, s.pool, s.schema, 16)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, `INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, created_at, updated_at)
		SELECT gen_random_uuid(), 'wf', 'q', 'ready', 's', now(), 0, CASE WHEN i % 2 = 0 THEN 'acct:' || i END, now(), now()
		FROM generate_series(1, 1000) i`)
	require.NoError(t, err)
	done, err := Migrate(ctx, s.pool, s.schema)
	require.NoError(t, err)
	ms, err := Migrations()
	require.NoError(t, err)
	require.Equal(t, 17, done[0])
	require.Equal(t, len(ms), done[len(done)-1])
	var invalid int
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND NOT i.indisvalid`, s.schema).Scan(&invalid))
	require.Zero(t, invalid)
	for _, ix := range []string{"instances_pick_free_version", "instances_pick_keyed_version", "instances_live_key_name_key_c",
		"instances_live_extra_keys", "instances_terminal_workflow", "instances_key_ready_posix", "instances_key_blocked_posix"} {
		require.True(t, tableExists(t, ctx, s.pool, s.schema, ix), ix)
	}
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
