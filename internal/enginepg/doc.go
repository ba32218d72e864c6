// Package enginepg holds the engine tests that need PostgreSQL itself rather
// than the storage contract: a database that goes away and comes back, bad
// input that only PostgreSQL refuses, deployment skew across engines, and the
// fuzzers that round-trip values through real rows. It has no code of its
// own outside its tests.
package enginepg
