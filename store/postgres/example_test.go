package postgres_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store/postgres"
	"github.com/godurable/godurable/transitions"
)

// Wiring an engine to PostgreSQL: migrate the schema once per deployment
// (or run `durable migrate`), open the store on it, and give it to the
// engine as Config.Store. Every engine that shares the schema shares the
// instances, the keys' slots and the limits. Inserts that must commit with
// the caller's own writes go through Engine.InsertTx (or the typed
// Workflow.InsertTx). This example needs a database, so it is compiled but
// not run.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	if _, err := postgres.Migrate(ctx, pool, "durable"); err != nil {
		log.Fatal(err)
	}
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: "durable"})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	welcome := durable.NewWorkflow[string]("user.welcome", "send", durable.WorkflowOptions{}).
		Step("send", func(ctx steps.Context, email string) (transitions.Transition, error) {
			return transitions.Done("welcomed " + email), nil
		})
	eng, err := durable.New(durable.Config{Store: st})
	if err != nil {
		log.Fatal(err)
	}
	if err := eng.Register(welcome); err != nil {
		log.Fatal(err)
	}
	if err := eng.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer eng.Stop(ctx)

	var id string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO users (email) VALUES ($1)`, "ada@example.com"); err != nil {
			return err
		}
		var insertErr error
		id, insertErr = welcome.InsertTx(ctx, eng, tx, "ada@example.com", durable.InsertOptions{})
		return insertErr
	})
	if err != nil {
		log.Fatal(err)
	}
	msg, err := durable.Result[string](ctx, eng, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(msg)
}
