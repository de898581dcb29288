package block

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/gosrp/gosrp/internal/testenv"
	"github.com/stretchr/testify/require"
)

// refVol is the reference model of a volume: a plain map of blocks.
type refVol struct {
	size   int64
	bs     int
	blocks map[int64][]byte
}

func (r *refVol) clone() *refVol {
	c := &refVol{size: r.size, bs: r.bs, blocks: make(map[int64][]byte, len(r.blocks))}
	for k, v := range r.blocks {
		c.blocks[k] = v
	}
	return c
}

func (r *refVol) image() []byte {
	img := make([]byte, r.size)
	for k, v := range r.blocks {
		copy(img[k*int64(r.bs):], v)
	}
	return img
}

func (r *refVol) write(p []byte, off int64) {
	bs := int64(r.bs)
	for i := int64(0); i < int64(len(p)); i += bs {
		r.blocks[(off+i)/bs] = append([]byte(nil), p[i:i+bs]...)
	}
}

func (r *refVol) zero(off, n int64) {
	bs := int64(r.bs)
	for b := off / bs; b < (off+n)/bs; b++ {
		delete(r.blocks, b)
	}
}

func (r *refVol) resize(n int64) {
	for k := range r.blocks {
		if k >= n/int64(r.bs) {
			delete(r.blocks, k)
		}
	}
	r.size = n
}

// modelRun is one randomized run of operations against a backend and the
// reference, compared after every step.
type modelRun struct {
	t     *testing.T
	be    backend
	dir   string
	rng   *rand.Rand
	store Store
	vols  map[string]Volume  // open handles
	ref   map[string]*refVol // reference content of volumes
	snaps map[string]*refVol // "vol@snap" → frozen reference
	seq   int
}

func TestModel(t *testing.T) {
	seed := seedFrom(t, "GOSRP_MODEL_SEED")
	steps := int(testenv.Int(t, "GOSRP_MODEL_STEPS", 250, 1))
	for _, be := range apiBackends() {
		t.Run(be.name, func(t *testing.T) {
			steps := steps
			if be.name == "rbd" && os.Getenv("GOSRP_MODEL_STEPS") == "" {
				// Every step is a round trip to the cluster (250
				// steps: ≈ 55 s); CI runs a shorter sequence.
				steps = 50
			}
			for i := int64(0); i < 2; i++ {
				s := seed + i
				t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
					t.Logf("seed=%d (replay with GOSRP_MODEL_SEED=%d; -run 'TestModel/%s')", s, s, be.name)
					runModel(t, be, s, steps)
				})
			}
		})
	}
}

func runModel(t *testing.T, be backend, seed int64, steps int) {
	m := &modelRun{
		t: t, be: be, dir: t.TempDir(),
		rng:  rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15)),
		vols: map[string]Volume{}, ref: map[string]*refVol{}, snaps: map[string]*refVol{},
	}
	m.store = be.open(t, m.dir)
	defer func() { _ = m.store.Close() }()
	bs := []int{512, 4096}[m.rng.IntN(2)]
	m.create("v0", bs)
	tally := map[string]int{}
	for step := 0; step < steps; step++ {
		desc := m.step()
		m.compareAll(fmt.Sprintf("step %d (%s)", step, desc))
		op, _, _ := strings.Cut(desc, " ")
		tally[op]++
	}
	t.Logf("ops: %v", tally)
}

func (m *modelRun) create(name string, bs int) {
	size := int64(m.rng.IntN(17)) * int64(bs)
	v, err := m.store.Create(name, size, bs)
	require.NoError(m.t, err)
	m.vols[name] = v
	m.ref[name] = &refVol{size: size, bs: bs, blocks: map[int64][]byte{}}
}

func (m *modelRun) pickVol() string {
	names := make([]string, 0, len(m.ref))
	for n := range m.ref {
		names = append(names, n)
	}
	sort.Strings(names)
	return names[m.rng.IntN(len(names))]
}

func (m *modelRun) pickSnap() (string, bool) {
	names := make([]string, 0, len(m.snaps))
	for n := range m.snaps {
		names = append(names, n)
	}
	if len(names) == 0 {
		return "", false
	}
	sort.Strings(names)
	return names[m.rng.IntN(len(names))], true
}

// span picks a block-aligned range inside the volume (nil ok if empty).
// hasSnaps reports whether the model holds snapshots of the volume.
func (m *modelRun) hasSnaps(volume string) bool {
	for k := range m.snaps {
		if vol, _, _ := strings.Cut(k, "@"); vol == volume {
			return true
		}
	}
	return false
}

func (m *modelRun) span(r *refVol, maxBlocks int64) (off, n int64, ok bool) {
	nb := r.size / int64(r.bs)
	if nb == 0 {
		return 0, 0, false
	}
	first := m.rng.Int64N(nb)
	cnt := 1 + m.rng.Int64N(min(maxBlocks, nb-first))
	return first * int64(r.bs), cnt * int64(r.bs), true
}

// data returns n bytes of random non-zero data.
func (m *modelRun) data(n int64) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(m.rng.IntN(255) + 1)
	}
	return p
}

func (m *modelRun) step() string {
	t := m.t
	name := m.pickVol()
	v, r := m.vols[name], m.ref[name]
	snapper, canSnap := m.store.(Snapshotter)
	switch op := m.rng.IntN(100); {
	case op < 35: // write / FUA write / write batch
		off, n, ok := m.span(r, 8)
		if !ok {
			return "write on empty volume"
		}
		p := m.data(n)
		if bw, ok := v.(BatchWriter); ok && op < 10 {
			// Up to four writes, overlapping at random: the last wins.
			bufs, offs := [][]byte{p}, []int64{off}
			for k := m.rng.IntN(4); k > 0; k-- {
				o, n, _ := m.span(r, 8)
				bufs, offs = append(bufs, m.data(n)), append(offs, o)
			}
			require.NoError(t, bw.WriteBatch(bufs, offs))
			for i := range bufs {
				r.write(bufs[i], offs[i])
			}
			return fmt.Sprintf("batch %s %d writes, first %d@%d", name, len(bufs), n, off)
		}
		var err error
		if op < 25 {
			_, err = v.WriteAt(p, off)
		} else {
			_, err = v.WriteAtFUA(p, off)
		}
		require.NoError(t, err)
		r.write(p, off)
		return fmt.Sprintf("write %s %d@%d", name, n, off)
	case op < 45: // discard / write-zeroes
		off, n, ok := m.span(r, 16)
		if !ok {
			return "zero on empty volume"
		}
		var err error
		if op < 40 {
			err = v.Discard(off, n)
		} else {
			err = v.WriteZeroes(off, n)
		}
		require.NoError(t, err)
		r.zero(off, n)
		return fmt.Sprintf("zero %s %d@%d", name, n, off)
	case op < 52: // resize
		n := int64(m.rng.IntN(17)) * int64(r.bs)
		require.NoError(t, v.Resize(n))
		r.resize(n)
		return fmt.Sprintf("resize %s %d", name, n)
	case op < 57: // flush
		require.NoError(t, v.Flush())
		return "flush"
	case op < 65: // bad requests change nothing
		bs := int64(r.bs)
		_, err := v.WriteAt(make([]byte, bs), r.size)
		require.ErrorIs(t, err, ErrOutOfRange)
		_, err = v.ReadAt(make([]byte, bs+1), 0)
		require.ErrorIs(t, err, ErrMisaligned)
		require.ErrorIs(t, v.Discard(0, 0), ErrZeroLength)
		if bw, ok := v.(BatchWriter); ok {
			// A batch with one bad request writes none of them.
			good := m.data(bs)
			require.ErrorIs(t, bw.WriteBatch([][]byte{good, good}, []int64{0, r.size}), ErrOutOfRange)
			require.ErrorIs(t, bw.WriteBatch([][]byte{good[1:], good}, []int64{0, 0}), ErrMisaligned)
			require.ErrorIs(t, bw.WriteBatch([][]byte{good}, nil), ErrInvalid)
		}
		return "bad requests"
	case op < 72 && canSnap && len(m.snaps) < 6:
		m.seq++
		sn := fmt.Sprintf("s%d", m.seq)
		_, err := snapper.Snapshot(name, sn)
		require.NoError(t, err)
		m.snaps[name+"@"+sn] = r.clone()
		return "snapshot " + name + "@" + sn
	case op < 76 && canSnap && len(m.ref) < 4:
		key, ok := m.pickSnap()
		if !ok {
			return "clone without snapshot"
		}
		vol, sn, _ := bytes.Cut([]byte(key), []byte("@"))
		m.seq++
		nn := fmt.Sprintf("c%d", m.seq)
		nv, err := snapper.Clone(string(vol), string(sn), nn)
		require.NoError(t, err)
		m.vols[nn], m.ref[nn] = nv, m.snaps[key].clone()
		return "clone " + key + " → " + nn
	case op < 80 && canSnap:
		key, ok := m.pickSnap()
		if !ok {
			return "delete without snapshot"
		}
		vol, sn, _ := bytes.Cut([]byte(key), []byte("@"))
		require.NoError(t, snapper.DeleteSnapshot(string(vol), string(sn)))
		delete(m.snaps, key)
		return "delete snapshot " + key
	case op < 83 && len(m.ref) > 1: // delete a volume (and its snapshots)
		require.ErrorIs(t, m.store.Delete(name), ErrBusy)
		require.NoError(t, v.Close())
		switch {
		case canSnap && m.hasSnaps(name):
			// Refused and kept whole; compareAll checks the content.
			require.ErrorIs(t, snapper.DeleteIfNoSnapshots(name), ErrHasSnapshots)
			if m.rng.IntN(2) == 0 {
				nv, err := m.store.Open(name)
				require.NoError(t, err)
				m.vols[name] = nv
				return "delete refused " + name
			}
			require.NoError(t, m.store.Delete(name))
		case canSnap:
			require.NoError(t, snapper.DeleteIfNoSnapshots(name))
		default:
			require.NoError(t, m.store.Delete(name))
		}
		delete(m.vols, name)
		delete(m.ref, name)
		for k := range m.snaps {
			if vol, _, _ := bytes.Cut([]byte(k), []byte("@")); string(vol) == name {
				delete(m.snaps, k)
			}
		}
		return "delete " + name
	case op < 86 && len(m.ref) < 4:
		m.seq++
		nn := fmt.Sprintf("v%d", m.seq)
		m.create(nn, []int{512, 4096}[m.rng.IntN(2)])
		return "create " + nn
	case op < 90 && m.be.persistent: // close everything and reopen
		for _, v := range m.vols {
			require.NoError(t, v.Close())
		}
		require.NoError(t, m.store.Close())
		m.store = m.be.open(t, m.dir)
		for n := range m.ref {
			v, err := m.store.Open(n)
			require.NoError(t, err)
			m.vols[n] = v
		}
		return "reopen"
	default: // read a random span and compare
		off, n, ok := m.span(r, 8)
		if !ok {
			return "read on empty volume"
		}
		got := make([]byte, n)
		_, err := v.ReadAt(got, off)
		require.NoError(t, err)
		require.True(t, bytes.Equal(r.image()[off:off+n], got), "read %s %d@%d", name, n, off)
		return fmt.Sprintf("read %s %d@%d", name, n, off)
	}
}

func (m *modelRun) compareAll(when string) {
	t := m.t
	infos, err := m.store.List()
	require.NoError(t, err, when)
	require.Len(t, infos, len(m.ref), when)
	for _, info := range infos {
		r := m.ref[info.Name]
		require.NotNil(t, r, "%s: unexpected volume %s", when, info.Name)
		require.Equal(t, r.size, info.Size, "%s: size of %s", when, info.Name)
		require.Equal(t, r.bs, info.BlockSize, when)
	}
	for name, r := range m.ref {
		m.compare(when, m.vols[name], r)
	}
	snapper, ok := m.store.(Snapshotter)
	if !ok {
		return
	}
	for key, r := range m.snaps {
		vol, sn, _ := bytes.Cut([]byte(key), []byte("@"))
		sv, err := snapper.OpenSnapshot(string(vol), string(sn))
		require.NoError(t, err, when)
		m.compare(when, sv, r)
		_, err = sv.WriteAt(make([]byte, r.bs), 0)
		require.True(t, errors.Is(err, ErrReadOnly), "%s: write to snapshot: %v", when, err)
		require.NoError(t, sv.Close())
	}
}

func (m *modelRun) compare(when string, v Volume, r *refVol) {
	t := m.t
	require.Equal(t, r.size, v.Size(), "%s: size of %s", when, v.Name())
	if r.size == 0 {
		return
	}
	got := make([]byte, r.size)
	_, err := v.ReadAt(got, 0)
	require.NoError(t, err, when)
	want := r.image()
	if !bytes.Equal(want, got) {
		for i := range want {
			if want[i] != got[i] {
				t.Fatalf("%s: %s differs from the reference at byte %d (block %d): want %#x got %#x",
					when, v.Name(), i, i/r.bs, want[i], got[i])
			}
		}
	}
}
