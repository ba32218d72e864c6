DROP TABLE IF EXISTS {schema}.history;
DROP TABLE IF EXISTS {schema}.signals;
DROP TABLE IF EXISTS {schema}.limits;
DROP TABLE IF EXISTS {schema}.key_slots;
DROP SEQUENCE IF EXISTS {schema}.fence_seq;
DROP TABLE IF EXISTS {schema}.instances;
