package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigFileAndFlags(t *testing.T) {
	dir := t.TempDir()
	toml := filepath.Join(dir, "srpd.toml")
	os.WriteFile(toml, []byte("listen = \"127.0.0.1:5000\"\nmetrics = \"127.0.0.1:9000\"\ndefault_volume_size = \"64MiB\"\nshutdown_timeout = \"5s\"\n"), 0o644)
	js := filepath.Join(dir, "srpd.json")
	os.WriteFile(js, []byte(`{"listen": "127.0.0.1:5001", "default_volume_size": 1048576, "log_format": "json"}`), 0o644)

	c, err := loadConfig(toml)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:5000" || c.DefaultSize != 64<<20 || time.Duration(c.ShutdownTimeout) != 5*time.Second || c.Data != DefaultData {
		t.Fatalf("toml: %+v", c)
	}
	// A flag given on the command line overrides the file; others do not.
	fc := defaultConfig()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fc.register(fs)
	if err := fs.Parse([]string{"--listen", "127.0.0.1:6000"}); err != nil {
		t.Fatal(err)
	}
	if err := c.applyFlags(fs); err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:6000" || c.Metrics != "127.0.0.1:9000" {
		t.Fatalf("after flags: %+v", c)
	}
	c, err = loadConfig(js)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:5001" || c.DefaultSize != 1<<20 || c.LogFormat != "json" {
		t.Fatalf("json: %+v", c)
	}
	os.WriteFile(toml, []byte("lisen = \"x\"\n"), 0o644)
	if _, err := loadConfig(toml); err == nil {
		t.Fatal("unknown key accepted")
	}
	// The example config in contrib/ parses.
	if _, err := loadConfig("../../contrib/srpd.toml"); err != nil {
		t.Fatal(err)
	}
}

// TestPendingLoginCaps: the target's connection caps and the SRP request
// limit are config keys and flags, the flag overriding the file.
func TestPendingLoginCaps(t *testing.T) {
	p := filepath.Join(t.TempDir(), "srpd.toml")
	os.WriteFile(p, []byte("max_pending_logins = 8\nmax_pending_per_source = -1\nsrp_credits = 100\nmax_connections = 50\nmax_connections_per_source = 10\n"), 0o644)
	c, err := loadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxPendingLogins != 8 || c.MaxPendingPerSource != -1 || c.SRPCredits != 100 || c.MaxConnections != 50 || c.MaxConnectionsPerSource != 10 {
		t.Fatalf("toml: %d, %d, %d, %d, %d", c.MaxPendingLogins, c.MaxPendingPerSource, c.SRPCredits, c.MaxConnections, c.MaxConnectionsPerSource)
	}
	fc := defaultConfig()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fc.register(fs)
	if err := fs.Parse([]string{"--max-pending-per-source", "4", "--srp-credits", "70", "--max-connections-per-source", "-1"}); err != nil {
		t.Fatal(err)
	}
	if err := c.applyFlags(fs); err != nil {
		t.Fatal(err)
	}
	if c.MaxPendingLogins != 8 || c.MaxPendingPerSource != 4 || c.SRPCredits != 70 || c.MaxConnections != 50 || c.MaxConnectionsPerSource != -1 {
		t.Fatalf("after flags: %d, %d, %d, %d, %d", c.MaxPendingLogins, c.MaxPendingPerSource, c.SRPCredits, c.MaxConnections, c.MaxConnectionsPerSource)
	}
}

// TestBreakLimit: --break-limit and the config file's break_limit read
// N/DURATION, "" and "0" mean no bound, anything else is refused with a
// one-line error naming the value.
func TestBreakLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want BreakLimit
		bad  bool
	}{
		{in: "3/1m", want: BreakLimit{Burst: 3, Window: time.Minute}},
		{in: "10/30s", want: BreakLimit{Burst: 10, Window: 30 * time.Second}},
		{in: "0"},
		{in: ""},
		{in: "3", bad: true},
		{in: "0/1m", bad: true},
		{in: "-1/1m", bad: true},
		{in: "3/0s", bad: true},
		{in: "3/soon", bad: true},
		{in: "x/1m", bad: true},
	} {
		var l BreakLimit
		err := l.Set(tc.in)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), tc.in) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%q: %v, want a one-line error naming it", tc.in, err)
			}
			continue
		}
		if err != nil || l != tc.want {
			t.Errorf("%q: %+v, %v; want %+v", tc.in, l, err, tc.want)
		}
	}
	p := filepath.Join(t.TempDir(), "srpd.toml")
	if err := os.WriteFile(p, []byte("break_limit = \"3/1m\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := loadConfig(p)
	if err != nil || c.BreakLimit != (BreakLimit{Burst: 3, Window: time.Minute}) {
		t.Fatalf("break_limit from the file: %+v, %v", c.BreakLimit, err)
	}
	if err := os.WriteFile(p, []byte("break_limit = \"3\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadConfig(p); err == nil {
		t.Fatal("break_limit = \"3\" accepted")
	}
}

// TestProviderOptionsBusyPoll: over real verbs srpd polls adaptively
// unless told otherwise (by a flag or the config file's
// provider_options); emu gets no busy_poll, which it would refuse.
func TestProviderOptionsBusyPoll(t *testing.T) {
	for _, tc := range []struct {
		provider string
		opts     map[string]string
		want     string
	}{
		{"ibverbs", nil, "adaptive"},
		{"ibverbs", map[string]string{"busy_poll": "50us"}, "50us"},
		{"ibverbs", map[string]string{"busy_poll": "0"}, "0"},
		{"emu", nil, ""},
	} {
		c := defaultConfig()
		c.Provider, c.ProviderOptions = tc.provider, tc.opts
		if got := providerOptions(&c)["busy_poll"]; got != tc.want {
			t.Errorf("%s %v: busy_poll %q, want %q", tc.provider, tc.opts, got, tc.want)
		}
	}
}
