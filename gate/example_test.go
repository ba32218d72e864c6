package gate_test

import (
	"fmt"
	"time"

	"github.com/godurable/godurable/gate"
)

// A key is name:id. Its name decides its concurrency K: the configured
// limit of that name, or 1 (steps of one key never overlap).
func ExampleLimits_K() {
	limits, err := gate.NewLimits([]gate.Limit{{Name: "stripe", Limit: 5}})
	if err != nil {
		panic(err)
	}
	for _, k := range []gate.ConcurrencyKey{gate.Gate("stripe", "acct_1"), gate.Identity("order", "42")} {
		fmt.Printf("%s: name %q, K = %d\n", k, k.Name(), limits.K(k.String()))
	}
	// Output:
	// stripe:acct_1: name "stripe", K = 5
	// order:42: name "order", K = 1
}

// A limit captures every key with its name. Declaring a key's intent lets
// the analysis warn when an identity key would run K at a time, or when a
// gate key has no limit and silently runs at K = 1.
func ExampleLimits_Check() {
	limits, err := gate.NewLimits([]gate.Limit{{Name: "order", Limit: 3}})
	if err != nil {
		panic(err)
	}
	for _, k := range []gate.ConcurrencyKey{
		gate.Identity("order", "42"),  // captured by the "order" limit
		gate.Gate("openai", "team-a"), // a gate with no limit
		gate.Identity("account", "7"), // fine: K = 1 as intended
	} {
		if w, found := limits.Check(k); found {
			fmt.Println(k, "->", w.Kind)
		} else {
			fmt.Println(k, "-> ok")
		}
	}
	// Output:
	// order:42 -> identity_captured
	// openai:team-a -> gate_without_limit
	// account:7 -> ok
}

// Shards split a key's slot counter so that completions do not queue on
// one row lock: shards ≥ limit × commit latency / step duration.
func ExampleShardsFor() {
	shards := gate.ShardsFor(1000, time.Millisecond, 100*time.Millisecond)
	l := gate.Limit{Name: "stripe", Limit: 1000, Shards: shards}
	fmt.Println(shards, l.ShardCapacities()[:3])
	// Output: 10 [100 100 100]
}

// Parse reads a stored key back; NameOf takes the name of a key string.
func ExampleParse() {
	k, err := gate.Parse("tenant:eu:42")
	if err != nil {
		panic(err)
	}
	fmt.Println(k.Name(), k.ID(), gate.NameOf("tenant:eu:42"))
	_, err = gate.Parse("no-colon")
	fmt.Println(err != nil)
	// Output:
	// tenant eu:42 tenant
	// true
}
