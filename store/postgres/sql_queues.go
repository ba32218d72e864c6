package postgres

// The record of which queues engines work (see store.Store.MarkQueuesWorked).
const (
	// sqlMarkQueuesWorked sets the last-worked time of queues $1 (sorted,
	// so that concurrent marks lock their rows in one order) to $2 (NULL:
	// now()), never moving one back.
	sqlMarkQueuesWorked = `
INSERT INTO {schema}.worked_queues AS w (queue, last_worked_at)
SELECT q, coalesce($2::timestamptz, now()) FROM unnest($1::text[]) AS q
ON CONFLICT (queue) DO UPDATE SET last_worked_at = excluded.last_worked_at
WHERE w.last_worked_at < excluded.last_worked_at`

	// sqlWorkedQueues reads every queue's last-worked time and the time
	// $1 (NULL: now()) it is measured against.
	sqlWorkedQueues = `
SELECT queue, last_worked_at, coalesce($1::timestamptz, now())
FROM {schema}.worked_queues ORDER BY queue COLLATE "C"`
)

// The paused queues (see store.Store.PauseQueue).
const (
	// sqlPauseQueue pauses queue $1 at $2 (NULL: now()) unless it is
	// paused already, and returns it when it did.
	sqlPauseQueue = `
INSERT INTO {schema}.paused_queues (queue, paused_at) VALUES ($1, coalesce($2::timestamptz, now()))
ON CONFLICT (queue) DO NOTHING RETURNING queue`

	// sqlResumeQueue resumes queue $1 and returns it when it was paused.
	sqlResumeQueue = `DELETE FROM {schema}.paused_queues WHERE queue = $1 RETURNING queue`

	// sqlPausedQueues reads every paused queue, in its primary key's order:
	// it runs in the hand-off's transaction (see queueHandOffReads), under
	// sqlNoSeqScan, where another order would leave it no path but a
	// disabled scan. PausedQueues sorts the list by bytes.
	sqlPausedQueues = `SELECT queue, paused_at FROM {schema}.paused_queues ORDER BY queue`
)
