package postgres_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store/postgres"
)

// TestSQLIsStaticAndParameterised reads the backend's source and checks that
// every statement it sends to PostgreSQL is static text: a constant (whole
// or with the quoted schema put in by s.q or render), an embedded migration,
// or literals joined with pgx.Identifier{...}.Sanitize(). Values always
// travel as parameters; no statement is built with fmt.Sprintf or from a
// variable, so no value can be injected into SQL.
func TestSQLIsStaticAndParameterised(t *testing.T) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	var files []*ast.File
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, 0)
		require.NoError(t, err)
		files = append(files, f)
	}
	require.NotEmpty(t, files)

	consts := map[string]bool{}
	// stmtParams: functions that take the statement as a parameter named
	// stmt, and its position; their call sites are checked instead.
	stmtParams := map[string]int{}
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				if d.Tok == token.CONST {
					for _, s := range d.Specs {
						for _, n := range s.(*ast.ValueSpec).Names {
							consts[n.Name] = true
						}
					}
				}
			case *ast.FuncDecl:
				i := 0
				for _, field := range d.Type.Params.List {
					for _, n := range field.Names {
						if n.Name == "stmt" {
							stmtParams[d.Name.Name] = i
						}
						i++
					}
					if len(field.Names) == 0 {
						i++
					}
				}
			}
		}
	}

	// staticVars are the variables every assignment of which (a range
	// over statements included) is static text: the statements of a
	// migration file, say. Names are matched across the package, so a
	// name also assigned anything else is not one.
	assigned := map[string][]ast.Expr{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for i, l := range n.Lhs {
					if id, ok := l.(*ast.Ident); ok && id.Name != "_" {
						var rhs ast.Expr
						if len(n.Rhs) == len(n.Lhs) {
							rhs = n.Rhs[i]
						}
						assigned[id.Name] = append(assigned[id.Name], rhs)
					}
				}
			case *ast.RangeStmt:
				if id, ok := n.Value.(*ast.Ident); ok {
					assigned[id.Name] = append(assigned[id.Name], n.X) // its elements: see static
				}
				if id, ok := n.Key.(*ast.Ident); ok && id.Name != "_" {
					assigned[id.Name] = append(assigned[id.Name], nil)
				}
			}
			return true
		})
	}
	staticVars := map[string]bool{}

	var static func(e ast.Expr) bool
	static = func(e ast.Expr) bool {
		switch e := e.(type) {
		case *ast.BasicLit:
			return e.Kind == token.STRING
		case *ast.Ident:
			return consts[e.Name] || staticVars[e.Name] || e.Name == "stmt" // stmt: checked at its call sites
		case *ast.ParenExpr:
			return static(e.X)
		case *ast.BinaryExpr:
			return e.Op == token.ADD && static(e.X) && static(e.Y)
		case *ast.SelectorExpr:
			// The embedded migration files (Migration.up, Migration.down).
			return e.Sel.Name == "up" || e.Sel.Name == "down"
		case *ast.CallExpr:
			switch fn := e.Fun.(type) {
			case *ast.SelectorExpr:
				if fn.Sel.Name == "q" && len(e.Args) == 1 { // s.q(const)
					return static(e.Args[0])
				}
				if fn.Sel.Name == "file" && len(e.Args) == 1 { // Migration.file: an embedded migration file
					return true
				}
				if x, ok := fn.X.(*ast.Ident); ok && x.Name == "concurrently" && fn.Sel.Name == "ReplaceAllString" {
					return static(e.Args[0]) && static(e.Args[1])
				}
				if fn.Sel.Name == "Sanitize" { // pgx.Identifier{...}.Sanitize()
					if cl, ok := fn.X.(*ast.CompositeLit); ok {
						if sel, ok := cl.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Identifier" {
							return true
						}
					}
				}
			case *ast.Ident:
				if fn.Name == "render" && len(e.Args) == 2 {
					return static(e.Args[0])
				}
				if fn.Name == "statements" && len(e.Args) == 1 { // the statements of a file
					return static(e.Args[0])
				}
			}
		}
		return false
	}
	// The greatest fixpoint: every variable is taken for static text until
	// one of its assignments is not (a variable built from itself and
	// static text stays static).
	for name := range assigned {
		staticVars[name] = true
	}
	for changed := true; changed; {
		changed = false
		for name, exprs := range assigned {
			if !staticVars[name] {
				continue
			}
			for _, x := range exprs {
				if x == nil || !static(x) {
					delete(staticVars, name)
					changed = true
					break
				}
			}
		}
	}

	sqlArg := map[string]int{"Exec": 1, "Query": 1, "QueryRow": 1, "Queue": 0}
	checked := 0
	var bad []string
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			idx, isSQL := -1, false
			switch fn := call.Fun.(type) {
			case *ast.SelectorExpr:
				if i, ok := sqlArg[fn.Sel.Name]; ok {
					idx, isSQL = i, true
				}
				if i, ok := stmtParams[fn.Sel.Name]; ok {
					idx, isSQL = i, true
				}
			case *ast.Ident:
				if i, ok := stmtParams[fn.Name]; ok {
					idx, isSQL = i, true
				}
			}
			if !isSQL || idx >= len(call.Args) {
				return true
			}
			checked++
			if !static(call.Args[idx]) {
				bad = append(bad, fmt.Sprintf("%s: statement is not static text", fset.Position(call.Args[idx].Pos())))
			}
			return true
		})
	}
	assert.Empty(t, bad, "every statement must be a constant or built only from constants and quoted identifiers")
	assert.Greater(t, checked, 40, "the check saw the backend's statements")
}

// TestSchemaNamesAreValidatedAndQuoted: a schema name reaches SQL only after
// ValidateSchema, which accepts plain lower-case identifiers, and then
// always quoted.
func TestSchemaNamesAreValidatedAndQuoted(t *testing.T) {
	for _, bad := range []string{"", "Durable", "a-b", "a b", `x"; DROP TABLE instances; --`, "pg_catalog", "1abc",
		strings.Repeat("a", 64), "ü", "a\x00"} {
		assert.ErrorIs(t, postgres.ValidateSchema(bad), postgres.ErrInvalidSchema, "%q", bad)
	}
	for _, ok := range []string{"durable", "_x", "tenant_42", strings.Repeat("a", 63)} {
		assert.NoError(t, postgres.ValidateSchema(ok), ok)
	}
}

// FuzzValidateSchema: a name that passes ValidateSchema is a plain
// identifier that needs no escaping inside its quotes, and its notification
// channel fits PostgreSQL's 63-byte identifier limit.
func FuzzValidateSchema(f *testing.F) {
	for _, s := range []string{"durable", `a"b`, "pg_x", "", "x;y", strings.Repeat("z", 70)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if err := postgres.ValidateSchema(s); err != nil {
			if !strings.Contains(err.Error(), postgres.ErrInvalidSchema.Error()) {
				t.Fatalf("error %v does not name ErrInvalidSchema", err)
			}
			return
		}
		if len(s) == 0 || len(s) > 63 || strings.HasPrefix(s, "pg_") {
			t.Fatalf("accepted %q", s)
		}
		for _, r := range s {
			if !(r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9')) {
				t.Fatalf("accepted %q with %q", s, r)
			}
		}
		if c := postgres.Channel(s); len(c) > 63 {
			t.Fatalf("channel %q is %d bytes", c, len(c))
		}
	})
}
