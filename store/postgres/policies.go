package postgres

import (
	"context"
	"errors"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

var errTODO = errors.New("postgres: not implemented yet")

// SyncKeyLimits is not implemented yet.
func (s *Store) SyncKeyLimits(ctx context.Context, namespace string, want store.KeyLimits, opts ...store.SyncOptions) (store.LimitsResult, error) {
	return store.LimitsResult{}, errTODO
}

// RateLimits is not implemented yet.
func (s *Store) RateLimits(ctx context.Context) ([]gate.RateLimit, error) { return nil, errTODO }

// SyncConcurrencyPolicies is not implemented yet.
func (s *Store) SyncConcurrencyPolicies(ctx context.Context, namespace string, defs []store.ConcurrencyPolicy, opts ...store.SyncOptions) ([]store.ConcurrencyPolicy, error) {
	return nil, errTODO
}

// ListConcurrencyPolicies is not implemented yet.
func (s *Store) ListConcurrencyPolicies(ctx context.Context) ([]store.ConcurrencyPolicy, error) {
	return nil, errTODO
}
