-- A schedule's other concurrency keys (store.Schedule.Also), beside key and
-- key_intent: each key and its intent joined by U+001E, the keys joined by
-- U+001F, as the statements that write an instance's other keys take them;
-- NULL for a schedule of one key or none. A nullable column without a
-- default is added without rewriting the table.
ALTER TABLE {schema}.schedules ADD COLUMN also_keys text;
