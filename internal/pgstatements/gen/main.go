// Command gen writes statements_gen.go in the current directory, which
// registers the package's SQL statements with package pgstatements. It
// runs by go generate in store/postgres.
package main

import (
	"log"
	"os"

	"github.com/godurable/godurable/internal/pgstatements/source"
)

func main() {
	src, err := source.Generate(".")
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("statements_gen.go", src, 0o644); err != nil {
		log.Fatal(err)
	}
}
