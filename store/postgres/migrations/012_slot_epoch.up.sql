-- A counter's epoch changes whenever a limit change or a reconciler sweep
-- rewrites it (sqlSlotsInsert), and a counter created anew gets a fresh
-- one, so that no two writes of that kind ever leave the same epoch. A
-- claim that read a gate key's counters without locking them (an
-- optimistic claim: see admission.go) debits a counter only if its epoch,
-- capacity and room are still what it read; the epoch is what tells it that
-- the key's limit and shards did not change in between, which a capacity
-- alone cannot (a lowered limit may leave a shard's capacity as it was).
CREATE SEQUENCE {schema}.slot_epoch_seq;
ALTER TABLE {schema}.key_slots ADD COLUMN epoch bigint NOT NULL DEFAULT nextval('{schema}.slot_epoch_seq');

-- debit_check fails the transaction of an optimistic claim whose checked
-- debit (sqlDebitChecked) found fewer counters as it read them (got) than it
-- debits (want); the claim is then made again with its counters locked.
CREATE FUNCTION {schema}.debit_check(got bigint, want int) RETURNS int
LANGUAGE plpgsql AS $$
BEGIN
    IF got <> want THEN
        RAISE EXCEPTION 'optimistic debit: % of % gate counters changed since the claim read them', want - got, want
            USING ERRCODE = 'GD001';
    END IF;
    RETURN 0;
END $$;
