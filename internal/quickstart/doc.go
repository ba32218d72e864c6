// Package quickstart checks the README's install path and PostgreSQL quick
// start the way a user runs them: the program between the README's
// quickstart markers is built as a module of its own, which imports
// godurable's public packages through a replace directive, and is run
// against PostgreSQL; the shell block between its install markers is run
// as it is in a new module outside the repository, with the repository as
// the user's clone. It has no code outside its tests.
package quickstart
