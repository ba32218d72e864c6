DROP FUNCTION {schema}.debit_check(bigint, int);
ALTER TABLE {schema}.key_slots DROP COLUMN epoch;
DROP SEQUENCE {schema}.slot_epoch_seq;
