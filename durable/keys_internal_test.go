package durable

import (
	"errors"
	"strings"
	"testing"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/transitions"
)

// nextKeys applies the edits in order to the keys held now; an edit that
// cannot apply names itself.
func TestNextKeys(t *testing.T) {
	acct := gate.Identity("acct", "1")
	acct2 := gate.Identity("acct", "2")
	stripe := gate.Gate("stripe", "global")
	mail := gate.Gate("mail", "eu")
	plain := gate.Key("acct", "1") // acct:1 with no declared intent
	bad := gate.Identity("acct", "")
	edits := func(opts ...transitions.Option) []transitions.KeyEdit {
		return transitions.Next("x", nil, opts...).KeyEdits
	}
	cases := []struct {
		name  string
		held  []gate.ConcurrencyKey
		edits []transitions.KeyEdit
		want  []gate.ConcurrencyKey // nil: none
		err   string                // non-empty: the error contains it
	}{
		{name: "no edit keeps the keys", held: []gate.ConcurrencyKey{acct, stripe}, want: []gate.ConcurrencyKey{acct, stripe}},
		{name: "add to none", edits: edits(transitions.AddKey(acct)), want: []gate.ConcurrencyKey{acct}},
		{name: "add keeps the others", held: []gate.ConcurrencyKey{acct}, edits: edits(transitions.AddKey(stripe)), want: []gate.ConcurrencyKey{acct, stripe}},
		{name: "drop keeps the others", held: []gate.ConcurrencyKey{acct, stripe}, edits: edits(transitions.DropKey(stripe)), want: []gate.ConcurrencyKey{acct}},
		{name: "drop matches by name:id", held: []gate.ConcurrencyKey{acct, stripe}, edits: edits(transitions.DropKey(plain)), want: []gate.ConcurrencyKey{stripe}},
		{name: "drop the last", held: []gate.ConcurrencyKey{acct}, edits: edits(transitions.DropKey(acct))},
		{name: "replace in place", held: []gate.ConcurrencyKey{acct, stripe}, edits: edits(transitions.ReplaceKey(acct, acct2)), want: []gate.ConcurrencyKey{acct2, stripe}},
		{name: "replace a key's intent", held: []gate.ConcurrencyKey{plain}, edits: edits(transitions.ReplaceKey(plain, acct)), want: []gate.ConcurrencyKey{acct}},
		{name: "switch replaces every key", held: []gate.ConcurrencyKey{acct, stripe}, edits: edits(transitions.SwitchKey(stripe)), want: []gate.ConcurrencyKey{stripe}},
		{name: "switch to zero releases", held: []gate.ConcurrencyKey{acct, stripe}, edits: edits(transitions.SwitchKey(gate.ConcurrencyKey{}))},
		{name: "release releases every key", held: []gate.ConcurrencyKey{acct, stripe}, edits: edits(transitions.ReleaseKey())},
		{name: "set keys", held: []gate.ConcurrencyKey{acct}, edits: edits(transitions.SetKeys(stripe, mail)), want: []gate.ConcurrencyKey{stripe, mail}},
		{name: "set none", held: []gate.ConcurrencyKey{acct}, edits: edits(transitions.SetKeys())},
		{name: "in the order given", held: []gate.ConcurrencyKey{acct}, want: []gate.ConcurrencyKey{stripe, mail},
			edits: edits(transitions.AddKey(stripe), transitions.DropKey(acct), transitions.AddKey(mail))},
		{name: "switch then add", held: []gate.ConcurrencyKey{acct, mail}, want: []gate.ConcurrencyKey{stripe, acct},
			edits: edits(transitions.SwitchKey(stripe), transitions.AddKey(acct))},
		{name: "add then release", held: []gate.ConcurrencyKey{acct}, edits: edits(transitions.AddKey(stripe), transitions.ReleaseKey())},
		{name: "the fourth key", held: []gate.ConcurrencyKey{acct, acct2, stripe}, edits: edits(transitions.AddKey(mail)),
			want: []gate.ConcurrencyKey{acct, acct2, stripe, mail}},

		{name: "add a key held", held: []gate.ConcurrencyKey{acct, stripe}, edits: edits(transitions.AddKey(plain)), err: "AddKey(acct:1): the instance already holds it"},
		{name: "drop a key not held", held: []gate.ConcurrencyKey{acct}, edits: edits(transitions.DropKey(stripe)), err: "DropKey(stripe:global): the instance does not hold it (keys: acct:1)"},
		{name: "drop after release", held: []gate.ConcurrencyKey{acct}, edits: edits(transitions.ReleaseKey(), transitions.DropKey(acct)), err: "does not hold it (keys: none)"},
		{name: "replace a key not held", held: []gate.ConcurrencyKey{acct}, edits: edits(transitions.ReplaceKey(acct2, stripe)), err: "does not hold acct:2"},
		{name: "replace with a key held", held: []gate.ConcurrencyKey{acct, stripe}, edits: edits(transitions.ReplaceKey(acct, stripe)), err: "already holds stripe:global"},
		{name: "a fifth key", held: []gate.ConcurrencyKey{acct, acct2, stripe, mail}, edits: edits(transitions.AddKey(gate.Key("x", "1"))), err: "leave 5 concurrency keys"},
		{name: "set five keys", edits: edits(transitions.SetKeys(acct, acct2, stripe, mail, gate.Key("x", "1"))), err: "5 concurrency keys, at most 4"},
		{name: "set a key twice", edits: edits(transitions.SetKeys(acct, plain)), err: `key "acct:1" given twice`},
		{name: "set the zero key", edits: edits(transitions.SetKeys(acct, gate.ConcurrencyKey{})), err: "key #1 is the zero key"},
		{name: "add an invalid key", edits: edits(transitions.AddKey(bad)), err: "AddKey of a key that cannot be made: invalid concurrency key"},
		{name: "add the zero key", edits: edits(transitions.AddKey(gate.ConcurrencyKey{})), err: "AddKey of the zero key"},
		{name: "switch to an invalid key", edits: edits(transitions.SwitchKey(bad)), err: "invalid concurrency key"},
		{name: "unknown op", edits: []transitions.KeyEdit{{Op: 99, Key: acct}}, err: "unknown key operation 99"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := nextKeys(c.held, c.edits)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) || !errors.Is(err, errKeyEdit) {
					t.Fatalf("got %v, %v; want an error containing %q", keyList(got), err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if keyList(got) != keyList(c.want) {
				t.Fatalf("got %s, want %s", keyList(got), keyList(c.want))
			}
			for i := range got {
				if got[i].Intent() != c.want[i].Intent() {
					t.Errorf("key %s: intent %q, want %q", got[i], got[i].Intent(), c.want[i].Intent())
				}
			}
		})
	}
	held := []gate.ConcurrencyKey{acct, stripe}
	if _, err := nextKeys(held, edits(transitions.DropKey(acct), transitions.AddKey(mail))); err != nil || keyList(held) != "acct:1, stripe:global" {
		t.Fatalf("nextKeys changed the keys held: %s (%v)", keyList(held), err)
	}
	if _, err := nextKeys(nil, edits(transitions.AddKey(bad))); !errors.Is(err, gate.ErrInvalidKey) {
		t.Fatalf("an invalid key's error does not wrap gate.ErrInvalidKey: %v", err)
	}
}

// insertKeys takes Key or Keys, never both, and validates Keys.
func TestInsertKeys(t *testing.T) {
	acct := gate.Identity("acct", "1")
	stripe := gate.Gate("stripe", "global")
	if ks, err := insertKeys(gate.ConcurrencyKey{}, nil); err != nil || ks != nil {
		t.Fatalf("no key: %v, %v", ks, err)
	}
	if ks, err := insertKeys(acct, nil); err != nil || keyList(ks) != "acct:1" {
		t.Fatalf("Key: %v, %v", ks, err)
	}
	if ks, err := insertKeys(gate.ConcurrencyKey{}, []gate.ConcurrencyKey{acct, stripe}); err != nil || keyList(ks) != "acct:1, stripe:global" {
		t.Fatalf("Keys: %v, %v", ks, err)
	}
	for _, c := range []struct {
		name string
		key  gate.ConcurrencyKey
		keys []gate.ConcurrencyKey
		err  string
	}{
		{"both", acct, []gate.ConcurrencyKey{stripe}, "both Key and Keys are set"},
		{"five", gate.ConcurrencyKey{}, []gate.ConcurrencyKey{acct, stripe, gate.Key("a", "1"), gate.Key("b", "1"), gate.Key("c", "1")}, "5 concurrency keys, at most 4"},
		{"twice", gate.ConcurrencyKey{}, []gate.ConcurrencyKey{acct, stripe, gate.Gate("acct", "1")}, `key "acct:1" given twice`},
		{"zero", gate.ConcurrencyKey{}, []gate.ConcurrencyKey{acct, {}}, "key #1 is the zero key"},
		{"invalid in the list", gate.ConcurrencyKey{}, []gate.ConcurrencyKey{acct, gate.Gate("stripe", "")}, "key #1: invalid concurrency key"},
		{"invalid Key", gate.Identity("acct", ""), nil, "invalid concurrency key"},
	} {
		_, err := insertKeys(c.key, c.keys)
		if err == nil || !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: got %v, want ErrInvalidInput containing %q", c.name, err, c.err)
		}
	}
}
