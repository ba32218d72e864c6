DROP TABLE {schema}.leases;
