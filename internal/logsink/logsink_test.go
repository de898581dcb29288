package logsink

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestConcurrentWrites: writers on many goroutines and a reader at the
// same time lose no write and tear none (run with -race: a plain
// bytes.Buffer fails it).
func TestConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				fmt.Fprintf(&b, "g%d-%d\n", g, i)
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 800 {
		t.Fatalf("%d lines, want 800", len(lines))
	}
	seen := map[string]bool{}
	for _, l := range lines {
		var g, i int
		if _, err := fmt.Sscanf(l, "g%d-%d", &g, &i); err != nil || seen[l] {
			t.Fatalf("torn or repeated line %q", l)
		}
		seen[l] = true
	}
}
