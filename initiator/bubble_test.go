package initiator_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
)

// inBubble runs f in a synctest bubble, in a process of its own: the test
// binary again, asked for this test alone. Requests are pooled
// (sync.Pool), and a request whose channel was made in one bubble must
// never be used outside it, which a bubble inside the shared test
// process would allow.
func inBubble(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	if os.Getenv("GOSRP_BUBBLE") == t.Name() {
		synctest.Test(t, f)
		return
	}
	parts := strings.Split(t.Name(), "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(parts, "/"), "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "GOSRP_BUBBLE="+t.Name())
	out, err := cmd.CombinedOutput()
	t.Logf("the bubble's process:\n%s", out)
	if err != nil {
		t.Fatalf("the bubble's process: %v", err)
	}
}
