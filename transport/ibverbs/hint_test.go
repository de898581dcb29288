//go:build !(linux && cgo && ibverbs)

package ibverbs

import (
	"errors"
	"strings"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

func TestHint(t *testing.T) {
	_, err := transport.Open("ibverbs", nil)
	if !errors.Is(err, transport.ErrNotFound) || !strings.Contains(err.Error(), "-tags ibverbs") {
		t.Fatalf("Open(ibverbs) on a default build: %v; want ErrNotFound naming -tags ibverbs", err)
	}
}
