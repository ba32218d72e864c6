// Package quickstart checks the README's PostgreSQL quick start the way a
// user runs it: the program between the README's quickstart markers is
// built as a module of its own, which imports godurable's public packages
// through a replace directive, and is run against PostgreSQL. It has no code
// outside its test.
package quickstart
