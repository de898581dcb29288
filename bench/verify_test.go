package main

import (
	"strings"
	"testing"
)

func TestVerifyBlock(t *testing.T) {
	const run, otherRun = 0xabc, 0xdef
	b := make([]byte, 4096)
	fillBlock(b, 7, 3, run)
	if out, err := checkBlock(b, 7, 3, run); out != verifyOK || err != nil {
		t.Fatalf("intact block: %v %v", out, err)
	}
	cases := []struct {
		name   string
		mutate func(b []byte)
		lba    uint64
		gen    uint64
		want   verifyOutcome
		reason string
	}{
		{"flipped payload byte", func(b []byte) { b[1000] ^= 0x40 }, 7, 3, verifyMismatch, "checksum"},
		{"flipped checksum", func(b []byte) { b[len(b)-1] ^= 1 }, 7, 3, verifyMismatch, "checksum"},
		{"misplaced", func(b []byte) { fillBlock(b, 8, 3, run) }, 7, 3, verifyMismatch, "holds block 8"},
		{"stale generation", func(b []byte) { fillBlock(b, 7, 2, run) }, 7, 3, verifyMismatch, "generation 2, want 3"},
		{"zeros where written", func(b []byte) { clear(b) }, 7, 3, verifyMismatch, "zeros"},
		{"garbage", func(b []byte) { copy(b, "not a verify block") }, 7, 3, verifyMismatch, "no verify header"},
		{"garbage, never written", func(b []byte) { copy(b, "junk") }, 7, 0, verifyMismatch, "neither zeros"},
		{"never written, zeros", func(b []byte) { clear(b) }, 7, 0, verifyZero, ""},
		{"never written, earlier run", func(b []byte) { fillBlock(b, 7, 9, otherRun) }, 7, 0, verifyPrior, ""},
		{"never written, this run", func(b []byte) { fillBlock(b, 7, 1, run) }, 7, 0, verifyMismatch, "never written by this run"},
		{"another run where written", func(b []byte) { fillBlock(b, 7, 3, otherRun) }, 7, 3, verifyMismatch, "another run"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := make([]byte, 4096)
			fillBlock(b, 7, 3, run)
			tc.mutate(b)
			out, err := checkBlock(b, tc.lba, tc.gen, run)
			if out != tc.want {
				t.Fatalf("outcome %d (%v), want %d", out, err, tc.want)
			}
			if tc.reason != "" && (err == nil || !strings.Contains(err.Error(), tc.reason)) {
				t.Fatalf("error %v, want it to mention %q", err, tc.reason)
			}
		})
	}
}

// TestVerifyCountsCorruption feeds a deliberately corrupted block through
// the run's verifier: it must be counted and its reason kept.
func TestVerifyCountsCorruption(t *testing.T) {
	vs := newVerifyState(16, 0, 42)
	b := make([]byte, 512)
	for lba := int64(0); lba < 4; lba++ {
		if !vs.tryLock(lba) {
			t.Fatal("fresh block locked")
		}
		if vs.tryLock(lba) {
			t.Fatal("block locked twice")
		}
		fillBlock(b, uint64(lba), vs.gen(lba)+1, vs.run)
		vs.unlock(lba, 1)
	}
	fillBlock(b, 2, 1, vs.run)
	vs.check(b, 2)
	b[100] ^= 0xff // the corruption
	vs.check(b, 2)
	clear(b)
	vs.check(b, 9) // never written: zeros are fine
	if got := vs.mismatches.Load(); got != 1 {
		t.Fatalf("mismatches = %d, want 1", got)
	}
	if vs.checked.Load() != 3 || vs.zero.Load() != 1 {
		t.Fatalf("checked %d zero %d, want 3 and 1", vs.checked.Load(), vs.zero.Load())
	}
	if r := vs.reasons(); len(r) != 1 || !strings.Contains(r[0], "lba 2") {
		t.Fatalf("reasons %q", r)
	}
}

func TestParseFioSize(t *testing.T) {
	for in, want := range map[string]int64{
		"4096": 4096, "4k": 4096, "4K": 4096, "4KiB": 4096, "4kb": 4096, "128k": 128 << 10,
		"1m": 1 << 20, "1g": 1 << 30, "1G": 1 << 30, "2t": 2 << 40, "1.5m": 3 << 19, "512": 512,
	} {
		if got, err := parseFioSize(in); err != nil || got != want {
			t.Errorf("parseFioSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "k", "x", "-4k", "1.3", "4q"} {
		if _, err := parseFioSize(in); err == nil {
			t.Errorf("parseFioSize(%q) succeeded", in)
		}
	}
}

// TestVerifyStateCheck saves a run's verify state and holds blocks read
// back to it: exactly the acknowledged generation after a clean run;
// after a failed one, an intact generation from the flushed one to the
// submitted one.
func TestVerifyStateCheck(t *testing.T) {
	const run, otherRun, bs = 0x5eed, 0x0dd, 512
	vs := newVerifyState(4, 10, run)
	vs.record()
	// block: acknowledged, submitted, flushed
	for i, g := range [][3]uint64{{0, 0, 0}, {3, 4, 2}, {2, 2, 2}, {1, 1, 0}} {
		vs.gens[i].Store(g[0])
		vs.submitted[i].Store(g[1])
		vs.flushed[i].Store(g[2])
	}
	path := t.TempDir() + "/state"
	if err := vs.save(path, bs); err != nil {
		t.Fatal(err)
	}
	rec, err := loadVerifyState(path)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Run != run || rec.Base != 10 || rec.BS != bs || len(rec.Blocks) != 4 || rec.Blocks[1] != (blockRecord{3, 4, 2}) {
		t.Fatalf("loaded %+v", rec)
	}
	block := func(i int, gen, run uint64) []byte {
		b := make([]byte, bs)
		if gen > 0 {
			fillBlock(b, 10+uint64(i), gen, run)
		}
		return b
	}
	torn := block(1, 3, run)
	copy(torn[bs/2:], block(1, 2, run)[bs/2:])
	cases := []struct {
		name   string
		i      int
		b      []byte
		exact  bool
		reason string // "": passes
	}{
		{"never written, zeros", 0, block(0, 0, 0), true, ""},
		{"never written, earlier run", 0, block(0, 5, otherRun), false, ""},
		{"clean run, acknowledged", 1, block(1, 3, run), true, ""},
		{"clean run, older", 1, block(1, 2, run), true, "generation 2, want 3"},
		{"failed run, flushed", 1, block(1, 2, run), false, ""},
		{"failed run, submitted, unacknowledged", 1, block(1, 4, run), false, ""},
		{"failed run, older than flushed", 1, block(1, 1, run), false, "flushed write lost"},
		{"failed run, never written", 1, block(1, 5, run), false, "only 4 was ever written"},
		{"failed run, torn", 1, torn, false, "torn"},
		{"failed run, flushed block reads zeros", 2, block(2, 0, 0), false, "flushed generation 2 lost"},
		{"failed run, unflushed block reads zeros", 3, block(3, 0, 0), false, ""},
		{"misplaced", 3, block(2, 1, run), false, "holds block 12"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := rec.check(tc.b, tc.i, tc.exact)
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("want no error, got %v", err)
			case tc.reason != "" && (err == nil || !strings.Contains(err.Error(), tc.reason)):
				t.Fatalf("error %v, want it to mention %q", err, tc.reason)
			}
		})
	}
}
