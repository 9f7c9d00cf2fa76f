//go:build !libcni13

package main

import (
	"context"
	"errors"
)

// gc is not available before libcni 1.3 (Debian 12's libcni 1.1.2 has no GC).
func gc(_ context.Context, _ string, _ []string, _ []string) error {
	return errors.New("this runtime (libcni 1.1.2) has no GC; build with -tags libcni13")
}
