package fusedisk

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestErrLogRepeats: a volume that fails every request is logged once,
// then once per errLogEvery with the count of lines left out, reads,
// writes and flushes alike; another error is logged at once.
func TestErrLogRepeats(t *testing.T) {
	var out bytes.Buffer
	now := time.Unix(1000, 0)
	l := errLog{log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == slog.LevelKey {
				return slog.Attr{}
			}
			return a
		}})), now: func() time.Time { return now }}
	replaced := errors.New("the volume was replaced")
	for i := range 1000 {
		l.report("write", int64(i)*4096, 4096, replaced)
	}
	now = now.Add(errLogEvery - time.Millisecond)
	l.report("read", 0, 4096, replaced)
	l.report("flush", 0, 0, replaced)
	l.report("write", 8192, 4096, replaced)
	now = now.Add(errLogEvery)
	l.report("write", 4096, 4096, replaced)
	l.report("write", 4096, 4096, errors.New("connection lost"))
	want := []string{
		`msg="fusedisk: I/O error" op=write offset=0 length=4096 err="the volume was replaced"`,
		`msg="fusedisk: I/O error" op=write offset=4096 length=4096 err="the volume was replaced" unlogged_before=1002`,
		`msg="fusedisk: I/O error" op=write offset=4096 length=4096 err="connection lost"`,
	}
	if got := strings.Split(strings.TrimSpace(out.String()), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("logged:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
