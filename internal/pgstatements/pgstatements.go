// Package pgstatements names the SQL statements of store/postgres in the
// text pg_stat_statements keeps of them, so that a profile of the server's
// time (durable-bench -server-profile) reads by statement name rather than
// by the first words of its SQL. store/postgres registers each statement
// (statements_gen.go, made by go generate); Name matches a query's text to
// the registered statement whose words it shares most.
package pgstatements

import (
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
)

var (
	mu    sync.Mutex
	texts = map[string]string{} // name -> SQL as written, {schema} placeholders and all
	words map[string][]string   // name -> its words, sorted (made on first Name)
)

// Register records the SQL of the statement name.
func Register(name, sql string) {
	mu.Lock()
	defer mu.Unlock()
	texts[name] = sql
	words = nil
}

// Statements returns the registered statements: name to SQL.
func Statements() map[string]string {
	mu.Lock()
	defer mu.Unlock()
	return maps.Clone(texts)
}

// minShare is how much of two statements' words they must share to be
// taken for the same: the text pg_stat_statements keeps differs from the
// source by its constants, and a statement built at run time by its parts.
const minShare = 0.6

// Name returns the registered statement that query is (as
// pg_stat_statements shows it: constants replaced by $n, the schema
// written out), or false when none shares enough of its words. Statements
// that differ only in their constants are one to the server (one entry of
// pg_stat_statements) and to Name: it returns their names, sorted, joined
// by "|".
func Name(query string) (string, bool) {
	mu.Lock()
	defer mu.Unlock()
	if words == nil {
		words = make(map[string][]string, len(texts))
		for n, t := range texts {
			words[n] = wordsOf(t)
		}
	}
	q := wordsOf(query)
	var best []string
	bestShare := 0.0
	for _, n := range slices.Sorted(maps.Keys(words)) {
		switch s := share(q, words[n]); {
		case s > bestShare:
			best, bestShare = []string{n}, s
		case s == bestShare && s > 0:
			best = append(best, n)
		}
	}
	return strings.Join(best, "|"), bestShare >= minShare
}

var (
	quoted = regexp.MustCompile(`'(?:[^']|'')*'|"[^"]*"|\$\d+|\{schema\}`)
	word   = regexp.MustCompile(`[A-Za-z_][A-Za-z_0-9]*`)
)

// wordsOf returns the distinct words of a statement, sorted, leaving out
// what differs between the source and the server's text: string constants
// and parameters (the server shows both as $n), quoted identifiers (the
// schema, collations) and the schema placeholder.
func wordsOf(sql string) []string {
	ws := word.FindAllString(quoted.ReplaceAllString(sql, " "), -1)
	for i, w := range ws {
		ws[i] = strings.ToLower(w)
	}
	slices.Sort(ws)
	return slices.Compact(ws)
}

// share is the Jaccard index of two sorted sets of words.
func share(a, b []string) float64 {
	both, i, j := 0, 0, 0
	for i < len(a) && j < len(b) {
		switch strings.Compare(a[i], b[j]) {
		case 0:
			both++
			i++
			j++
		case -1:
			i++
		default:
			j++
		}
	}
	all := len(a) + len(b) - both
	if all == 0 {
		return 0
	}
	return float64(both) / float64(all)
}
