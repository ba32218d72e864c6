-- instances churns: every step rewrites its row, and retention deletes
-- terminal rows as fast as they finish, while most of a big table is
-- terminal rows nobody writes. PostgreSQL's default vacuums a table once a
-- fifth of it is dead, which at 10 million rows is 2 million dead row
-- versions between passes; in make scale the rate of steps then fell by up
-- to a third between two passes and was fastest in the minute after each.
-- A twentieth keeps the passes small and frequent. It is a storage
-- parameter: the ALTER takes SHARE UPDATE EXCLUSIVE (reads and writes go
-- on), and an operator's own setting replaces it with the same statement.
ALTER TABLE {schema}.instances SET (autovacuum_vacuum_scale_factor = 0.05);
