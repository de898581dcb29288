package main

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/cli"
	"github.com/gosrp/gosrp/internal/e2etest"
)

// TestSRPTargetPort: srp_id_ext and srp_ioc_guid make the 16-byte SRP
// target port identifier as ib_srp sends it (each half big-endian), from
// plain hex, sysfs's colon groups or 0x; both empty is the zero
// identifier; anything else is a usage error naming the flag.
func TestSRPTargetPort(t *testing.T) {
	for _, tc := range []struct {
		idExt, ioc string
		want       string // the identifier in hex, or "" for an error
		errHas     string
	}{
		{"", "", "00000000000000000000000000000000", ""},
		{"0002c90300012345", "0002:c903:0001:2345", "0002c903000123450002c90300012345", ""},
		{"0x1", "ff", "000000000000000100000000000000ff", ""},
		{"1", "", "", "go together"},
		{"", "1", "", "go together"},
		{"12345678901234567", "1", "", "--srp-id-ext"},
		{"1", "xyz", "", "--srp-ioc-guid"},
	} {
		c := Config{SRPIDExt: tc.idExt, SRPIOCGUID: tc.ioc}
		port, err := c.srpTargetPort()
		switch {
		case tc.want == "" && (!errors.As(err, new(*cli.UsageError)) || !strings.Contains(err.Error(), tc.errHas)):
			t.Errorf("%q/%q: error %v, want a usage error about %s", tc.idExt, tc.ioc, err, tc.errHas)
		case tc.want != "" && err != nil:
			t.Errorf("%q/%q: %v", tc.idExt, tc.ioc, err)
		case tc.want != "" && hex.EncodeToString(port[:]) != tc.want:
			t.Errorf("%q/%q: port %x, want %s", tc.idExt, tc.ioc, port, tc.want)
		}
	}
	for _, tc := range []struct {
		n    int
		want uint16
		ok   bool
	}{{0, 0, true}, {1, 1, true}, {65535, 65535, true}, {65536, 0, false}, {-1, 0, false}} {
		c := Config{SRPPortGroup: tc.n}
		g, err := c.srpPortGroup()
		if ok := err == nil; ok != tc.ok || g != tc.want || (!ok && !errors.As(err, new(*cli.UsageError))) {
			t.Errorf("--srp-port-group %d: %d, %v", tc.n, g, err)
		}
	}
	p := srpStatus([16]byte{7: 1, 15: 2}, "10.0.2.15:4420", 0)
	if p.AddTarget != "id_ext=0000000000000001,ioc_guid=0000000000000002,dest=10.0.2.15:4420" || p.Any {
		t.Errorf("status %+v", p)
	}
	if p := srpStatus([16]byte{}, "0.0.0.0:4420", 0); !p.Any || !strings.HasSuffix(p.AddTarget, "dest=ADDRESS:4420") {
		t.Errorf("wildcard listener: %+v", p)
	}
	if p := srpStatus([16]byte{}, "[::]:4420", 0); !strings.HasSuffix(p.AddTarget, "dest=ADDRESS:4420") {
		t.Errorf("IPv6 wildcard listener: %+v", p)
	}

	// The config file keys, and the flags over them.
	f := filepath.Join(t.TempDir(), "srpd.toml")
	os.WriteFile(f, []byte("srp_id_ext = \"0002c90300012345\"\nsrp_ioc_guid = \"0002c90300012345\"\nsrp_port_group = 3\n"), 0o644)
	c, err := loadConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	fc := defaultConfig()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fc.register(fs)
	if err := fs.Parse([]string{"--srp-ioc-guid", "0002:c903:0001:abcd"}); err != nil {
		t.Fatal(err)
	}
	if err := c.applyFlags(fs); err != nil {
		t.Fatal(err)
	}
	if c.SRPIDExt != "0002c90300012345" || c.SRPIOCGUID != "0002:c903:0001:abcd" || c.SRPPortGroup != 3 {
		t.Fatalf("config %q %q %d", c.SRPIDExt, c.SRPIOCGUID, c.SRPPortGroup)
	}
}

// TestSRPStatus: srpd status shows the SRP target port, the add_target
// line for its listener and the ALUA target port group, as text and as
// JSON.
func TestSRPStatus(t *testing.T) {
	srpd, _ := e2etest.Binaries(t)
	data := filepath.Join(t.TempDir(), "data")
	addr := e2etest.FreeAddr(t)
	d := e2etest.StartDaemon(t, srpd, data, addr, "", "--backend", "memory", "--srp-id-ext", "0002c90300012345", "--srp-ioc-guid", "0002:c903:0001:2346", "--srp-port-group", "7")
	defer d.Stop(t)
	want := "id_ext=0002c90300012345,ioc_guid=0002c90300012346,dest=" + addr
	r := e2etest.MustRun(t, srpd, "status", "--data", data)
	if !strings.Contains(r.Stdout, "; ALUA target port group 7; ib_srp add_target: "+want+"\n") {
		t.Errorf("status does not show the add_target line %q:\n%s", want, r.Stdout)
	}
	r = e2etest.MustRun(t, srpd, "status", "--data", data, "--json")
	var st admin.Status
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatal(err)
	}
	if st.SRP == nil || st.SRP.AddTarget != want || st.SRP.Any || st.SRP.IOCGUID != "0002c90300012346" || st.SRP.PortGroup != 7 {
		t.Errorf("status --json srp: %+v", st.SRP)
	}
	r = e2etest.Run(t, nil, srpd, "--data", filepath.Join(t.TempDir(), "d2"), "--listen", e2etest.FreeAddr(t), "--srp-id-ext", "1")
	if r.Code != 2 || !strings.Contains(r.Stderr, "go together") {
		t.Errorf("--srp-id-ext alone: exit %d, stderr %q", r.Code, r.Stderr)
	}
}
