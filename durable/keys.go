package durable

import (
	"errors"
	"fmt"
	"strings"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/transitions"
)

// MaxKeys is the most concurrency keys an instance holds at once
// (InsertOptions.Keys, transitions.Child.Keys, and the keys a transition
// leaves).
const MaxKeys = store.MaxKeys

// insertKeys returns the keys of an insert or a child: keys, or key alone
// (none when key is zero). Every error wraps ErrInvalidInput, and the
// error of an invalid key wraps gate.ErrInvalidKey too.
func insertKeys(key gate.ConcurrencyKey, keys []gate.ConcurrencyKey) ([]gate.ConcurrencyKey, error) {
	if len(keys) == 0 {
		if err := key.Err(); err != nil {
			return nil, fmt.Errorf("%w: key: %w", ErrInvalidInput, err)
		}
		if key.IsZero() {
			return nil, nil
		}
		return []gate.ConcurrencyKey{key}, nil
	}
	if !key.IsZero() {
		return nil, fmt.Errorf("%w: both Key and Keys are set: Key is the one-key shorthand; give every key in Keys", ErrInvalidInput)
	}
	if err := validateKeys(keys); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	return keys, nil
}

// validateKeys checks a list of keys an instance is to hold: each valid
// and not zero, then the store's rules for a set of keys (at most MaxKeys,
// no key twice, whatever the intents: store.NormalizeKeys).
func validateKeys(keys []gate.ConcurrencyKey) error {
	for i, k := range keys {
		if err := k.Err(); err != nil {
			return fmt.Errorf("key #%d: %w", i, err)
		}
		if k.IsZero() {
			return fmt.Errorf("key #%d is the zero key (no key): leave it out", i)
		}
	}
	_, _, _, err := storeKeys(keys)
	return err
}

// storeKeys turns valid keys (see validateKeys) into the store's form, in
// the store's one order (store.NormalizeKeys): Key/KeyIntent and Also. No
// keys: "" and none. The engine orders them itself so that what it sends
// is what every store keeps, children included.
func storeKeys(keys []gate.ConcurrencyKey) (string, gate.Intent, []store.KeyRef, error) {
	if len(keys) == 0 {
		return "", gate.Unspecified, nil, nil
	}
	var also []store.KeyRef
	for _, k := range keys[1:] {
		also = append(also, store.KeyRef{Key: k.String(), Intent: k.Intent()})
	}
	key, intent := keys[0].String(), keys[0].Intent()
	if err := store.NormalizeKeys(&key, &intent, &also); err != nil {
		return "", "", nil, err
	}
	return key, intent, also, nil
}

// rowKeys returns the keys a stored row holds: its Key, then its Also.
func rowKeys(in store.Instance) ([]gate.ConcurrencyKey, error) {
	if in.Key == "" {
		return nil, nil
	}
	refs := append([]store.KeyRef{{Key: in.Key, Intent: in.KeyIntent}}, in.Also...)
	out := make([]gate.ConcurrencyKey, len(refs))
	for i, r := range refs {
		k, err := gate.ParseWithIntent(r.Key, r.Intent)
		if err != nil {
			return nil, err
		}
		out[i] = k
	}
	return out, nil
}

// errKeyEdit is wrapped by the errors of nextKeys.
var errKeyEdit = errors.New("key edit")

// nextKeys applies a transition's key edits, in order, to the keys held
// now, and returns the keys of the next step. Keys are matched by name:id.
// Dropping or replacing a key not held, adding a key held, an invalid or
// zero key, and a result of more than MaxKeys keys are errors.
func nextKeys(held []gate.ConcurrencyKey, edits []transitions.KeyEdit) ([]gate.ConcurrencyKey, error) {
	keys := append([]gate.ConcurrencyKey(nil), held...)
	find := func(k gate.ConcurrencyKey) int {
		for i, h := range keys {
			if h.String() == k.String() {
				return i
			}
		}
		return -1
	}
	usable := func(op string, k gate.ConcurrencyKey) error {
		if err := k.Err(); err != nil {
			return fmt.Errorf("%w: %s of a key that cannot be made: %w", errKeyEdit, op, err)
		}
		if k.IsZero() {
			return fmt.Errorf("%w: %s of the zero key (no key)", errKeyEdit, op)
		}
		return nil
	}
	for _, e := range edits {
		switch e.Op {
		case transitions.KeySet:
			if err := validateKeys(e.Keys); err != nil {
				return nil, fmt.Errorf("%w: setting the keys (ReleaseKey, SwitchKey or SetKeys): %w", errKeyEdit, err)
			}
			keys = append(keys[:0:0], e.Keys...)
		case transitions.KeyAdd:
			if err := usable("AddKey", e.Key); err != nil {
				return nil, err
			}
			if find(e.Key) >= 0 {
				return nil, fmt.Errorf("%w: AddKey(%s): the instance already holds it (keys: %s)", errKeyEdit, e.Key, keyList(keys))
			}
			keys = append(keys, e.Key)
		case transitions.KeyDrop:
			if err := usable("DropKey", e.Key); err != nil {
				return nil, err
			}
			i := find(e.Key)
			if i < 0 {
				return nil, fmt.Errorf("%w: DropKey(%s): the instance does not hold it (keys: %s)", errKeyEdit, e.Key, keyList(keys))
			}
			keys = append(keys[:i:i], keys[i+1:]...)
		case transitions.KeyReplace:
			if err := usable("ReplaceKey (old key)", e.Old); err != nil {
				return nil, err
			}
			if err := usable("ReplaceKey (new key)", e.Key); err != nil {
				return nil, err
			}
			i := find(e.Old)
			if i < 0 {
				return nil, fmt.Errorf("%w: ReplaceKey(%s, %s): the instance does not hold %s (keys: %s)", errKeyEdit, e.Old, e.Key, e.Old, keyList(keys))
			}
			if j := find(e.Key); j >= 0 && j != i {
				return nil, fmt.Errorf("%w: ReplaceKey(%s, %s): the instance already holds %s (keys: %s)", errKeyEdit, e.Old, e.Key, e.Key, keyList(keys))
			}
			keys = append(keys[:i:i], append([]gate.ConcurrencyKey{e.Key}, keys[i+1:]...)...)
		default:
			return nil, fmt.Errorf("%w: unknown key operation %d: build key edits with the transitions package", errKeyEdit, e.Op)
		}
	}
	if len(keys) > MaxKeys {
		return nil, fmt.Errorf("%w: the edits leave %d concurrency keys (%s), at most %d", errKeyEdit, len(keys), keyList(keys), MaxKeys)
	}
	return keys, nil
}

// keyList prints keys for an error message.
func keyList(keys []gate.ConcurrencyKey) string {
	if len(keys) == 0 {
		return "none"
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.String()
	}
	return strings.Join(out, ", ")
}
