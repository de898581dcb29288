package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestDirtyMarks: marks survive a reopen of the data directory, even of
// a name too long for a file name; a clear forgets one; a leftover of an
// interrupted write is no mark; a file whose content does not match its
// name is refused rather than trusted; clearAll forgets all.
func TestDirtyMarks(t *testing.T) {
	data := t.TempDir()
	d, err := openDirtyMarks(data, false)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("v", 200)
	for _, v := range []string{"vol0", long, "vol1"} {
		if err := d.MarkDirty(v); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.ClearDirty("vol1"); err != nil {
		t.Fatal(err)
	}
	if err := d.ClearDirty("never-marked"); err != nil {
		t.Fatalf("clearing a volume never marked: %v", err)
	}
	os.WriteFile(filepath.Join(data, dirtyDir, "abc.tmp"), []byte("half"), 0o600)
	d, err = openDirtyMarks(data, false)
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.DirtyVolumes()
	want := []string{long, "vol0"}
	if d.path(long) > d.path("vol0") {
		want = []string{"vol0", long}
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("DirtyVolumes = %q, %v; want %q", got, err, want)
	}
	if _, err := os.Stat(filepath.Join(data, dirtyDir, "abc.tmp")); err == nil {
		t.Error("the leftover of an interrupted mark is still there")
	}

	// Under a backend that loses nothing when srpd is killed, a mark of
	// this boot is no loss; one of another boot is.
	safe, err := openDirtyMarks(data, true)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(d.path("vol0"), []byte("vol0\nan-earlier-boot"), 0o600)
	if safe.boot == "" {
		t.Logf("no %s: every mark is reported", bootIDFile)
	} else {
		got, err := safe.DirtyVolumes()
		if err != nil || !reflect.DeepEqual(got, []string{"vol0"}) {
			t.Fatalf("process-safe: %q, %v; want only vol0, marked under another boot", got, err)
		}
		if _, err := os.Stat(d.path(long)); err == nil {
			t.Error("a mark of this boot, dropped unreported, is still on disk")
		}
	}

	os.WriteFile(d.path("vol2"), []byte("vol3"), 0o600)
	if _, err := d.DirtyVolumes(); err == nil || !strings.Contains(err.Error(), "does not match its name") {
		t.Fatalf("a mark holding another name: %v", err)
	}
	if err := d.clearAll(); err != nil {
		t.Fatal(err)
	}
	if got, err := d.DirtyVolumes(); err != nil || len(got) != 0 {
		t.Fatalf("after clearAll: %q, %v", got, err)
	}
}
