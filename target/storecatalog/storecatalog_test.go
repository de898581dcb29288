package storecatalog

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/target"
)

func TestCatalog(t *testing.T) {
	st := block.NewMemStore()
	defer st.Close()
	v, err := st.Create("db", 1<<20, 4096)
	if err != nil {
		t.Fatal(err)
	}
	v.Close()
	if _, err := st.Snapshot("db", "nightly"); err != nil {
		t.Fatal(err)
	}
	c := Catalog{Store: st}
	got, err := c.List()
	if err != nil {
		t.Fatal(err)
	}
	want := []target.VolumeInfo{
		{Name: "db", Size: 1 << 20, BlockSize: 4096},
		{Name: "db@nightly", Size: 1 << 20, BlockSize: 4096, ReadOnly: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("List: %+v, want %+v", got, want)
	}
	for _, tc := range []struct {
		name      string
		err       error // of the open; nil: opens, and a write fails with wantWrite
		wantWrite error
	}{
		{"db", nil, nil},
		{"db@nightly", nil, block.ErrReadOnly},
		{"db@nosuch", block.ErrNotFound, nil},
		{"nosuch", block.ErrNotFound, nil},
	} {
		vol, err := c.OpenVolume(tc.name)
		if !errors.Is(err, tc.err) {
			t.Errorf("OpenVolume(%q): %v, want %v", tc.name, err, tc.err)
			continue
		}
		if err != nil {
			continue
		}
		bv := vol.(block.Volume)
		if _, err := bv.WriteAt(make([]byte, 4096), 0); !errors.Is(err, tc.wantWrite) {
			t.Errorf("write to %q: %v, want %v", tc.name, err, tc.wantWrite)
		}
		bv.Close()
	}
}
