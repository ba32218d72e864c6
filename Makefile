# godurable developer targets. Go lives in /usr/local/go/bin on the CI box.
export PATH := /usr/local/go/bin:$(PATH)

GO          ?= go
TEST_TIMEOUT ?= 30m
FUZZTIME    ?= 10s
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2

CHAOS_FLAGS ?=

.PHONY: all demo demo-pg test lint bench fuzz fuzz-short chaos scale

all: lint test

## demo: run both example services on the in-memory store (no database needed)
demo:
	DATABASE_URL= $(GO) run ./examples/accountsync
	@echo
	DATABASE_URL= $(GO) run ./examples/stripecharge

## demo-pg: the same on PostgreSQL (DATABASE_URL, default the local server)
demo-pg:
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable} $(GO) run ./examples/accountsync
	@echo
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable} $(GO) run ./examples/stripecharge

## test: every package, with the race detector, no cache
test:
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

## scale: a fleet of 8 engine processes under steady load for 30 minutes on a throwaway cluster
## holding 10M instances (loaded first); a line per minute. SCALE_FLAGS
## passes flags, e.g. SCALE_FLAGS="-duration 10m -rows 2000000" (see go doc ./cmd/durable-scale).
scale:
	$(GO) run ./cmd/durable-scale $(SCALE_FLAGS)

## chaos: the full chaos run (about 3 minutes): worker processes SIGKILLed and
## restarted, PostgreSQL restarted once, then every promise checked; exits 1
## on any violation. A short version runs in make test (cmd/durable-chaos).
## CHAOS_FLAGS passes flags, e.g. CHAOS_FLAGS="-duration 5m -dir /tmp/chaos".
chaos:
	$(GO) run ./cmd/durable-chaos $(CHAOS_FLAGS)

## lint: gofmt (fails on any unformatted file), go vet, staticcheck
lint:
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...

## bench: the throughput benchmark (cmd/durable-bench): eleven scenarios against PostgreSQL
## (DATABASE_URL or the local server) in a database it creates and drops; see BENCHMARKS.md
bench:
	$(GO) run ./cmd/durable-bench

## fuzz: run every Fuzz target for FUZZTIME each (default 10s; e.g. FUZZTIME=5m for a long run).
## The targets cover key parsing and limit matching (gate), the engine's JSON and text checks and
## the decoding of stored states (durable), schema names (store/postgres), and states and rows
## round-tripped through PostgreSQL (internal/enginepg). Inputs that failed once are kept in each
## package's testdata/fuzz and replayed by every go test.
fuzz:
	@set -e; for file in $$(grep -rl --include="*_test.go" "^func Fuzz" .); do \
		dir=$$(dirname $$file); \
		for target in $$(sed -n "s/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p" $$file); do \
			echo "$(GO) test -run=^\$$ -fuzz=^$$target\$$ -fuzztime=$(FUZZTIME) $$dir"; \
			$(GO) test -run='^$$' -fuzz="^$$target\$$" -fuzztime=$(FUZZTIME) $$dir; \
		done; \
	done

## fuzz-short: every Fuzz target for 5000 inputs, as CI runs it. A count, not a duration: with a
## duration, Go 1.26's fuzz coordinator can report "context deadline exceeded" as a failure when a
## worker is mid-input at the deadline on a busy machine (go.dev/issue/75804, fixed in Go 1.27);
## a count has no deadline to race.
fuzz-short:
	$(MAKE) fuzz FUZZTIME=5000x
