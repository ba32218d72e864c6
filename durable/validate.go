package durable

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/godurable/godurable/internal/runtime"
)

// Limits on the text the engine stores. Names are indexed by the stores, and
// PostgreSQL caps an index entry at about 2.7 kB, so a longer name could not
// be stored; the limits here leave room for the other columns of the entry.
const (
	// MaxNameLength is the longest workflow, step, queue or signal name, in bytes.
	MaxNameLength = 255
	// MaxUniqueKeyLength is the longest unique key or signal dedup key, in bytes.
	MaxUniqueKeyLength = 1024
	// MaxErrorLength is the longest error text stored with an instance, in
	// bytes; a longer error is truncated (its start is kept).
	MaxErrorLength = 16 << 10
	// maxNumberExponent bounds the exponent of a JSON number in a state,
	// result or payload: PostgreSQL's numeric type overflows near 10^131072,
	// and a number such as 1e100000 would be stored as 100,001 digits.
	maxNumberExponent = 1000
)

// ErrInvalidInput is wrapped by the errors of names, ids and keys that the
// engine refuses before they reach the store: empty where one is required,
// not valid UTF-8, containing a control character (NUL included), or longer
// than the documented limit.
var ErrInvalidInput = errors.New("invalid input")

// checkName validates a workflow, step, queue or signal name.
func checkName(what, s string) error {
	if s == "" {
		return fmt.Errorf("%w: empty %s", ErrInvalidInput, what)
	}
	return checkText(what, s, MaxNameLength)
}

// checkText validates optional text of at most max bytes: valid UTF-8 with
// no control characters.
func checkText(what, s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%w: %s is %d bytes, limit %d", ErrInvalidInput, what, len(s), max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidInput, what)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: %s contains the control character %U", ErrInvalidInput, what, r)
		}
	}
	return nil
}

// cleanText makes free text (an error message, a stop reason) storable
// anywhere: invalid UTF-8 and NUL characters become U+FFFD, and text longer
// than MaxErrorLength is cut at a rune boundary with a marker.
func cleanText(s string) string { return runtime.CleanText(s, MaxErrorLength) }

// checkStorableJSON reports JSON that is valid but that a store cannot keep
// as it is: text that is not valid UTF-8, a \u0000 escape (PostgreSQL's
// jsonb refuses U+0000), an unpaired surrogate escape (refused as invalid
// input), or a number whose exponent is beyond ±maxNumberExponent. b must
// already be valid JSON (json.Marshal's output is).
func checkStorableJSON(b []byte) error {
	if !utf8.Valid(b) {
		// json.Valid accepts invalid UTF-8 inside strings (and json.Marshal
		// passes a json.RawMessage through as it is); PostgreSQL does not.
		return errors.New("the JSON text is not valid UTF-8")
	}
	inString := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !inString {
			switch {
			case c == '"':
				inString = true
			case c == 'e' || c == 'E':
				// Only numbers contain e/E outside strings (true, false and
				// null contain 'e' too, but not followed by a digit or sign).
				j := i + 1
				if j < len(b) && (b[j] == '+' || b[j] == '-') {
					j++
				}
				start := j
				exp := 0
				for j < len(b) && b[j] >= '0' && b[j] <= '9' {
					if exp <= maxNumberExponent {
						exp = exp*10 + int(b[j]-'0')
					}
					j++
				}
				if j > start && exp > maxNumberExponent {
					return fmt.Errorf("a number has an exponent beyond ±%d", maxNumberExponent)
				}
			}
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			i++
			if i >= len(b) || b[i] != 'u' {
				continue
			}
			r, ok := hex4(b, i+1)
			if !ok {
				continue
			}
			i += 4
			switch {
			case r == 0:
				return errors.New(`a string contains U+0000 (\u0000), which cannot be stored`)
			case r >= 0xDC00 && r <= 0xDFFF:
				return errors.New("a string contains an unpaired surrogate escape")
			case r >= 0xD800 && r <= 0xDBFF:
				if i+6 < len(b) && b[i+1] == '\\' && b[i+2] == 'u' {
					if lo, ok := hex4(b, i+3); ok && lo >= 0xDC00 && lo <= 0xDFFF {
						i += 6
						continue
					}
				}
				return errors.New("a string contains an unpaired surrogate escape")
			}
		}
	}
	return nil
}

// hex4 decodes the four hex digits at b[i:i+4].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
