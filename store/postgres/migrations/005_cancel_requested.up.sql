-- A cancel of an executing row does not free its slot while its step may
-- still run: the row is marked and stays executing until its claim ends
-- (an outcome, a release, or the reaper), which then makes it canceled.
ALTER TABLE {schema}.instances ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;
