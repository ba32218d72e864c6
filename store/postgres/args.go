package postgres

import (
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// ptrArray is an array parameter whose elements go to pgx by pointer: pgx
// boxes each element of a slice into an interface to encode it, which
// allocates for a string, a UUID or a large integer, and not for a pointer.
// T is a pgtype value (pgtype.Text, pgtype.UUID, pgtype.Int8) whose pointer
// implements the element codec's valuer interface.
type ptrArray[T any] []T

// Dimensions implements pgtype.ArrayGetter.
func (a ptrArray[T]) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

// Index implements pgtype.ArrayGetter.
func (a ptrArray[T]) Index(i int) any { return &a[i] }

// IndexType implements pgtype.ArrayGetter.
func (a ptrArray[T]) IndexType() any { return new(T) }

// textElem is a text element (never NULL).
func textElem(s string) pgtype.Text { return pgtype.Text{String: s, Valid: true} }

// jsonElem is a JSON value as a text element, NULL when empty (as jsonArg).
func jsonElem(b []byte) pgtype.Text {
	if len(b) == 0 {
		return pgtype.Text{}
	}
	return pgtype.Text{String: string(b), Valid: true}
}

// uuidArg is ids as a uuid[] parameter. As a []string, pgx tries the
// binary format first, fails (formatting the whole array into the error),
// then sends text, allocating for every element; parsed here, the ids go
// in binary. An id not in the canonical 36-character form is left to
// PostgreSQL's parser: the whole array then goes as text, as before.
func uuidArg(ids []string) any {
	if ids == nil {
		return ptrArray[pgtype.UUID](nil) // NULL, as a nil []string
	}
	a := make(ptrArray[pgtype.UUID], len(ids))
	for i, id := range ids {
		if len(id) != 36 {
			return ids
		}
		u, err := uuid.Parse(id)
		if err != nil {
			return ids
		}
		a[i] = pgtype.UUID{Bytes: u, Valid: true}
	}
	return a
}

// The arrays of text and bigint elements.
type (
	textArray = ptrArray[pgtype.Text]
	int8Array = ptrArray[pgtype.Int8]
)

// int8Elem is a bigint element (never NULL).
func int8Elem(v int64) pgtype.Int8 { return pgtype.Int8{Int64: v, Valid: true} }
