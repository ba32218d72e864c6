package durable

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestCheckStorableJSON(t *testing.T) {
	for _, ok := range []string{`{}`, `"plain"`, `{"s":"\ud83d\ude00"}`, `{"s":"\\u0000"}`, `["\u0001"]`, `[1e308,-5e-324,1E+999]`,
		`{"true":true,"false":false,"e":"e9999"}`, `"\\\\u0000"`, `[0.5e-1000]`} {
		if err := checkStorableJSON([]byte(ok)); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{`"\u0000"`, `{"a\u0000":1}`, `"\\\u0000"`, `"\ud800"`, `"\udc00"`, `"\ud800\u0041"`, `"\uD800x"`,
		`[1e1001]`, `[1E-5000]`, `{"n":-2e+99999}`, `"x\ud83d"`, "{\"\x84\":0}", "\"\xff\""} {
		if err := checkStorableJSON([]byte(bad)); err == nil {
			t.Errorf("%s passed", bad)
		}
	}
}

// FuzzCheckStorableJSON: whatever valid JSON comes in, the check never
// panics, and JSON it passes holds no NUL in any string or key once decoded
// and no number whose exponent is out of bounds.
func FuzzCheckStorableJSON(f *testing.F) {
	for _, s := range []string{`{"s":"\u0000"}`, `"\ud800"`, `[1e1001]`, `{"a":[true,false,null,"e5"]}`, `"\\u0000"`, `1E+3`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := checkStorableJSON(b)
		if !json.Valid(b) || err != nil {
			return
		}
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("valid JSON %q does not decode: %v", b, err)
		}
		var walk func(any)
		walk = func(v any) {
			switch x := v.(type) {
			case string:
				if strings.ContainsRune(x, 0) {
					t.Fatalf("%q passed with a NUL in a string", b)
				}
			case json.Number:
				s := strings.ToLower(string(x))
				if i := strings.IndexByte(s, 'e'); i >= 0 {
					exp := strings.TrimLeft(s[i+1:], "+-")
					exp = strings.TrimLeft(exp, "0")
					if len(exp) > 4 || (len(exp) == 4 && exp > "1000") {
						t.Fatalf("%q passed with the number %s", b, x)
					}
				}
			case []any:
				for _, e := range x {
					walk(e)
				}
			case map[string]any:
				for k, e := range x {
					walk(k)
					walk(e)
				}
			}
		}
		walk(v)
	})
}

// FuzzCleanText: cleaned text is valid UTF-8 with no NUL, bounded, and text
// that needed no cleaning comes back unchanged.
func FuzzCleanText(f *testing.F) {
	for _, s := range []string{"", "ok", "a\x00b", "\xff", strings.Repeat("é", MaxErrorLength)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c := cleanText(s)
		if !utf8.ValidString(c) || strings.ContainsRune(c, 0) {
			t.Fatalf("cleanText(%q) = %q", s, c)
		}
		if len(c) > MaxErrorLength+len("…(truncated)") {
			t.Fatalf("cleanText kept %d bytes", len(c))
		}
		if utf8.ValidString(s) && !strings.ContainsRune(s, 0) && len(s) <= MaxErrorLength && c != s {
			t.Fatalf("cleanText changed clean text %q to %q", s, c)
		}
	})
}

// FuzzCheckName: a name that passes is non-empty, at most MaxNameLength
// bytes, valid UTF-8 and free of control characters; errors wrap
// ErrInvalidInput.
func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"default", "", "a\x00", "\t", "ü", strings.Repeat("q", MaxNameLength+1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := checkName("name", s)
		if err != nil {
			if !errors.Is(err, ErrInvalidInput) {
				t.Fatalf("error %v does not wrap ErrInvalidInput", err)
			}
			return
		}
		if s == "" || len(s) > MaxNameLength || !utf8.ValidString(s) || strings.IndexFunc(s, unicode.IsControl) >= 0 {
			t.Fatalf("checkName passed %q", s)
		}
	})
}
