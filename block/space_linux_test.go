//go:build linux

package block

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// smallFS mounts a fresh ext4 file system of size bytes (a loop mount) and
// returns its mount point; it skips the test unless it runs as root with
// mkfs.ext4 and mount available.
func smallFS(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to loop-mount a small file system")
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	require.NoError(t, os.Mkdir(mnt, 0o700))
	f, err := os.Create(img)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(size))
	require.NoError(t, f.Close())
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Skipf("mkfs.ext4: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("mount -o loop: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt
}

// TestPebbleRealDiskFull is TestPebbleDiskFull's black-box twin on a real
// 64 MiB ext4 file system with the default reserve: writes fail fast with
// ErrNoSpace (not a hang, not pebble's fatal error in DB.rotateWAL), the
// data written reads back, and deleting a file elsewhere on the file
// system lets writes succeed again. Only the guard's clock is a fake, so
// the test decides when it measures again.
func TestPebbleRealDiskFull(t *testing.T) {
	mnt := smallFS(t, 64<<20)
	// Something else on the disk the operator can delete later.
	filler := filepath.Join(mnt, "filler")
	require.NoError(t, os.WriteFile(filler, make([]byte, 8<<20), 0o600))
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	s, err := OpenPebbleStore(filepath.Join(mnt, "store"), &PebbleOptions{Clock: clk.now, CacheSize: 8 << 20, MemTableSize: 4 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	v, err := s.Create("v", 256<<20, 4096)
	require.NoError(t, err)
	defer v.Close()

	chunk := make([]byte, 64<<10)
	var werr error
	n := 0
	for ; n < 4*64<<20/len(chunk); n++ {
		for j := range chunk {
			chunk[j] = byte(uint32(n*len(chunk)+j) * 2654435761 >> 24)
		}
		start := time.Now()
		werr = within(t, 20*time.Second, "write", func() error { _, err := v.WriteAt(chunk, int64(n)*int64(len(chunk))); return err })
		if werr != nil {
			if el := time.Since(start); el > time.Second {
				t.Fatalf("refused write took %s, want under 1s", el)
			}
			break
		}
		clk.advance(10 * time.Millisecond)
	}
	t.Logf("%d writes of 64 KiB, then: %v", n, werr)
	require.ErrorIs(t, werr, ErrNoSpace)
	require.ErrorIs(t, werr, syscall.ENOSPC)
	require.NoError(t, v.Flush())
	got := make([]byte, len(chunk))
	_, err = v.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, byte(0), got[0])

	require.NoError(t, os.Remove(filler))
	clk.advance(spaceRefreshInterval)
	_, err = v.WriteAt(chunk, 0)
	require.NoError(t, err)
	require.NoError(t, v.Flush())
	info, err := s.Space()
	require.NoError(t, err)
	require.False(t, info.Full, "%+v", info)
	t.Logf("space after freeing: %+v", info)
}

// TestPebbleDiskUseIsWhatItWrote: a store's files take about the bytes it
// wrote, not what pebble would reserve ahead. Pebble preallocates every
// WAL to 110% of MemTableSize (141 MiB at the default), and a fresh store
// rotates its WAL every few MiB: with the reservation, this store held
// 141 MiB after its first write, and in the rxe VM a 640 MiB tmpfs filled
// after mkfs.ext4 of a 128 MiB volume (unreservedFile). Skipped where the
// file system cannot preallocate, since the test could not fail there.
func TestPebbleDiskUseIsWhatItWrote(t *testing.T) {
	dir := t.TempDir()
	probe, err := os.Create(filepath.Join(dir, "probe"))
	require.NoError(t, err)
	ferr := unix.Fallocate(int(probe.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, 1<<20)
	require.NoError(t, probe.Close())
	require.NoError(t, os.Remove(probe.Name()))
	if ferr != nil {
		t.Skipf("the file system of %s cannot preallocate: %v", dir, ferr)
	}
	s, err := OpenPebbleStore(filepath.Join(dir, "store"), nil)
	require.NoError(t, err)
	defer s.Close()
	v, err := s.Create("v", 128<<20, 4096)
	require.NoError(t, err)
	defer v.Close()
	const written = 16 << 20
	buf := make([]byte, 64<<10)
	for off := int64(0); off < written; off += int64(len(buf)) {
		for i := range buf {
			buf[i] = byte(off>>16) ^ byte(i*7) // not compressible to nothing
		}
		_, err := v.WriteAt(buf, off)
		require.NoError(t, err)
		if off%(1<<20) == 0 {
			require.NoError(t, v.Flush())
		}
	}
	require.NoError(t, v.Flush())
	var held int64
	require.NoError(t, filepath.WalkDir(filepath.Join(dir, "store"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			held += st.Blocks * 512
		}
		return nil
	}))
	t.Logf("%d MiB written, the store's files take %.1f MiB", written>>20, float64(held)/(1<<20))
	require.Less(t, held, int64(3*written), "the store's files take %d bytes for %d written: space reserved, not written", held, written)
}
