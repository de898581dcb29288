//go:build linux

package block

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gosrp/gosrp/internal/durable"
)

// FileStore is the file backend: each volume is a sparse file NAME.vol in
// one directory beside a small msgpack record NAME.meta. A volume exists
// when its .meta file exists. It has no snapshots.
type FileStore struct {
	dir string

	// storeState.mu serializes creates, deletes and resizes and guards
	// open. Lock order: mu before any fileCore.mu.
	storeState[*fileCore]
	open map[string]*fileCore
}

var _ Store = (*FileStore)(nil)

// fileCore is an open file volume, shared by its handles.
type fileCore struct {
	sizedState
	st       *FileStore // nil for OpenFileVolume
	f        *os.File
	fd       int
	blockDev bool
	punch    bool // fallocate(PUNCH_HOLE) works here

	sg syncGroup

	// Guarded by mu:
	meta *volumeMeta // nil for OpenFileVolume
}

// OpenFileStore opens (creating if needed) a file store in dir.
func OpenFileStore(dir string) (*FileStore, error) {
	if err := os.MkdirAll(dir, privateDirMode); err != nil {
		return nil, fmt.Errorf("block: file store %s: %w", dir, err)
	}
	return &FileStore{storeState: newStoreState[*fileCore]("file store " + dir), dir: dir, open: map[string]*fileCore{}}, nil
}

func (s *FileStore) volPath(name string) string  { return filepath.Join(s.dir, name+".vol") }
func (s *FileStore) metaPath(name string) string { return filepath.Join(s.dir, name+".meta") }

// readMeta reads and decodes NAME.meta.
func (s *FileStore) readMeta(name string) (*volumeMeta, error) {
	b, err := os.ReadFile(s.metaPath(name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("block: volume %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("block: volume %q: read metadata: %w", name, err)
	}
	return decodeVolumeMeta(b, name, "")
}

// writeMeta replaces NAME.meta atomically and durably (internal/durable).
func (s *FileStore) writeMeta(m *volumeMeta) error {
	return durable.WriteFile(s.metaPath(m.Name), encodeRecord(m), privateFileMode)
}

// Create implements Store.
func (s *FileStore) Create(name string, size int64, blockSize int) (Volume, error) {
	bs, err := s.lockCreate(name, size, blockSize)
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if _, err := os.Stat(s.metaPath(name)); err == nil {
		return nil, fmt.Errorf("block: volume %q: create: %w", name, ErrExists)
	}
	// A .vol without .meta is left over from a crashed create or delete:
	// truncating it to zero first discards its old content.
	f, err := os.OpenFile(s.volPath(name), os.O_RDWR|os.O_CREATE|os.O_TRUNC, privateFileMode)
	if err != nil {
		return nil, fmt.Errorf("block: volume %q: create: %w", name, err)
	}
	m := &volumeMeta{Format: formatVersion, Name: name, Size: size, BlockSize: bs, Created: time.Now().UnixNano(), Generation: 1}
	err = f.Truncate(size)
	if err == nil {
		err = s.writeMeta(m)
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("block: volume %q: create: %w", name, err)
	}
	c, err := newFileCore(f, name, m.Size, bs, false)
	if err != nil {
		return nil, err
	}
	c.st, c.meta, c.id = s, m, volumeIdentity(m.Name, "", m.Created)
	return openNamedLocked(&s.storeState, s.open, c), nil
}

// Open implements Store. The file's length is set to the recorded size, which
// completes or undoes a resize a crash interrupted.
func (s *FileStore) Open(name string) (Volume, error) {
	if err := s.lock("open " + name); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if c := s.open[name]; c != nil {
		return openNamedLocked(&s.storeState, s.open, c), nil
	}
	if err := checkName("volume", name); err != nil {
		return nil, err
	}
	m, err := s.readMeta(name)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(s.volPath(name), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("block: volume %q: open data file: %w", name, err)
	}
	if fi, err := f.Stat(); err != nil || fi.Size() != m.Size {
		if err == nil {
			err = f.Truncate(m.Size)
		}
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("block: volume %q: open: %w", name, err)
		}
	}
	c, err := newFileCore(f, name, m.Size, m.BlockSize, false)
	if err != nil {
		return nil, err
	}
	c.st, c.meta, c.id = s, m, volumeIdentity(m.Name, "", m.Created)
	return openNamedLocked(&s.storeState, s.open, c), nil
}

// List implements Store.
func (s *FileStore) List() ([]VolumeInfo, error) {
	if err := s.lock("list"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("block: file store %s: list: %w", s.dir, err)
	}
	out := []VolumeInfo{}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".meta")
		if !ok || e.IsDir() {
			continue
		}
		m, err := s.readMeta(name)
		if err != nil {
			return nil, fmt.Errorf("block: file store %s: list: %w", s.dir, err)
		}
		if c := s.open[name]; c != nil {
			c.mu.RLock()
			m = c.meta
			c.mu.RUnlock()
		}
		out = append(out, m.info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Delete implements Store.
func (s *FileStore) Delete(name string) error {
	if err := s.lock("delete " + name); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := checkName("volume", name); err != nil {
		return err
	}
	if c := s.open[name]; c != nil {
		return fmt.Errorf("block: volume %q: delete: %w", name, ErrBusy)
	}
	// Removing .meta first deletes the volume; the .vol is then an orphan
	// that the next Create of the name truncates.
	if err := os.Remove(s.metaPath(name)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("block: volume %q: delete: %w", name, ErrNotFound)
		}
		return fmt.Errorf("block: volume %q: delete: %w", name, err)
	}
	if err := os.Remove(s.volPath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("block: volume %q: delete: %w", name, err)
	}
	return durable.SyncDir(s.dir)
}

// Close implements Store: open handles then fail with ErrClosed. Data
// written without Flush is left to the kernel to write back.
func (s *FileStore) Close() error {
	if err := s.lock("close"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.closed = true
	return closeAllLocked(s.open)
}

// OpenFileVolume opens an existing regular file or block device as a
// volume of the given block size (0 means DefaultBlockSize), without a
// store or metadata file; its size is the file's size rounded down to the
// block size. Resize works on regular files only.
func OpenFileVolume(path string, blockSize int) (Volume, error) {
	bs, err := normBlockSize(blockSize)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("block: volume %q: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("block: volume %q: %w", path, err)
	}
	blockDev := fi.Mode()&os.ModeDevice != 0
	size := fi.Size()
	if blockDev {
		if size, err = f.Seek(0, io.SeekEnd); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("block: volume %q: size: %w", path, err)
		}
	} else if !fi.Mode().IsRegular() {
		_ = f.Close()
		return nil, fmt.Errorf("block: volume %q: not a regular file or block device: %w", path, ErrInvalid)
	}
	c, err := newFileCore(f, path, size-size%int64(bs), bs, blockDev)
	if err != nil {
		return nil, err
	}
	return newHandle(c, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.closeLocked()
	}), nil
}

func newFileCore(f *os.File, name string, size int64, bs int, blockDev bool) (*fileCore, error) {
	c := &fileCore{sizedState: sizedState{coreState{nm: name, bs: bs}, size}, f: f, fd: int(f.Fd()), blockDev: blockDev}
	c.punch = !blockDev && probePunchHole(c.fd, size)
	return c, nil
}

// probePunchHole reports whether the file system punches holes, by punching
// one past the end of the file, which changes nothing.
func probePunchHole(fd int, size int64) bool {
	return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, size+4096, 4096) == nil
}

// closeLocked closes the file once. REQUIRES: c.mu held exclusively.
func (c *fileCore) closeLocked() error {
	if c.closed {
		return nil
	}
	c.closed = true
	return c.f.Close()
}

func (c *fileCore) caps() Caps {
	caps := CapFlush | CapFUA | CapWriteZeroes | CapPersistent
	if c.punch {
		caps |= CapDiscard
	}
	if !c.blockDev {
		caps |= CapResize
	}
	return caps
}

func (c *fileCore) check(op string, off, n int64) error {
	return c.checkReq(op, off, n, c.sz, false)
}

func (c *fileCore) readAt(p []byte, off int64) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := int64(len(p))
	if err := c.check("read", off, n); err != nil {
		return err
	}
	for done := 0; done < len(p); {
		m, err := unix.Pread(c.fd, p[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return ioErr(c.nm, "read", n, off, err)
		}
		if m == 0 {
			// Past the end of a file that was shortened behind our back.
			clear(p[done:])
			break
		}
		done += m
	}
	return nil
}

func (c *fileCore) pwriteAll(p []byte, off int64) error {
	for done := 0; done < len(p); {
		m, err := unix.Pwrite(c.fd, p[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		done += m
	}
	return nil
}

func (c *fileCore) writeAt(p []byte, off int64, fua bool) error {
	op := writeOp(fua)
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := int64(len(p))
	if err := c.check(op, off, n); err != nil {
		return err
	}
	err := c.pwriteAll(p, off)
	if err == nil && fua {
		err = c.sg.do(c.fdatasync)
	}
	if err != nil {
		return ioErr(c.nm, op, n, off, err)
	}
	return nil
}

func (c *fileCore) fdatasync() error {
	for {
		if err := unix.Fdatasync(c.fd); err != unix.EINTR {
			return err
		}
	}
}

// flush is fdatasync with group commit.
func (c *fileCore) flush() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if err := c.usable("flush", false); err != nil {
		return err
	}
	if err := c.sg.do(c.fdatasync); err != nil {
		return fmt.Errorf("block: volume %q: flush: %w", c.nm, noSpace(err))
	}
	return nil
}

// discard punches a hole: the blocks are deallocated and read as zeros.
func (c *fileCore) discard(off, n int64) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if err := c.check("discard", off, n); err != nil {
		return err
	}
	if !c.punch {
		return ioErr(c.nm, "discard", n, off, ErrUnsupported)
	}
	if err := unix.Fallocate(c.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
		return ioErr(c.nm, "discard", n, off, err)
	}
	return nil
}

// writeZeroes prefers ZERO_RANGE (keeps the blocks allocated), then a
// punched hole, and only where the file system has neither writes zero
// buffers: all three leave zeros, so none of them is a fake.
func (c *fileCore) writeZeroes(off, n int64) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if err := c.check("write-zeroes", off, n); err != nil {
		return err
	}
	err := unix.Fallocate(c.fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	if err != nil && c.punch {
		err = unix.Fallocate(c.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	}
	if err != nil {
		err = c.writeZeroBuffers(off, n)
	}
	if err != nil {
		return ioErr(c.nm, "write-zeroes", n, off, err)
	}
	return nil
}

func (c *fileCore) writeZeroBuffers(off, n int64) error {
	buf := make([]byte, min(n, 1<<20))
	for n > 0 {
		m := min(n, int64(len(buf)))
		if err := c.pwriteAll(buf[:m], off); err != nil {
			return err
		}
		off, n = off+m, n-m
	}
	return nil
}

// resize truncates or extends the file. With a store, the order makes a
// crash at any point safe: a shrink records the new size before cutting
// the file, a grow extends the file before recording; Open then sets the
// file's length to the recorded size.
func (c *fileCore) resize(n int64) error {
	if c.st != nil {
		c.st.mu.Lock()
		defer c.st.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(fmt.Sprintf("resize to %d", n), true); err != nil {
		return err
	}
	what := fmt.Sprintf("volume %q: resize to %d", c.nm, n)
	if c.blockDev {
		return fmt.Errorf("block: %s: block device: %w", what, ErrUnsupported)
	}
	if err := checkSize(c.nm, n, c.bs); err != nil {
		return err
	}
	var m *volumeMeta
	if c.meta != nil {
		mm := *c.meta
		mm.Size, mm.Generation = n, mm.Generation+1
		m = &mm
	}
	var err error
	if m != nil && n < c.sz {
		err = c.st.writeMeta(m)
	}
	if err == nil {
		err = c.f.Truncate(n)
	}
	if err == nil && m != nil && n >= c.sz {
		err = c.st.writeMeta(m)
	}
	if err == nil {
		// Make the new length itself durable.
		err = c.f.Sync()
	}
	if err != nil {
		return fmt.Errorf("block: %s: %w", what, err)
	}
	c.sz = n
	if m != nil {
		c.meta = m
	}
	return nil
}

// allocated asks the file system with lseek(SEEK_DATA) and
// lseek(SEEK_HOLE) (lseek(2)), rounding what it reports out to whole
// blocks. A block device, or a file system that does not know the calls
// (EINVAL), has everything reported allocated.
func (c *fileCore) allocated(off, end int64, yield func(off, end int64) bool) (int64, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	end, err := c.allocRange(off, end, c.sz)
	if err != nil || off >= end {
		return off, err
	}
	if c.blockDev {
		yield(off, end)
		return end, nil
	}
	bs := int64(c.bs)
	for pos := off; pos < end; {
		data, err := unix.Seek(c.fd, pos, unix.SEEK_DATA)
		switch {
		case errors.Is(err, unix.ENXIO):
			return end, nil // no data from pos to the end of the file
		case errors.Is(err, unix.EINVAL) && pos == off:
			yield(off, end)
			return end, nil
		case err != nil:
			return 0, ioErr(c.nm, "allocated", end-off, off, err)
		}
		if data >= end {
			return end, nil
		}
		hole, err := unix.Seek(c.fd, data, unix.SEEK_HOLE)
		if err != nil {
			return 0, ioErr(c.nm, "allocated", end-off, off, err)
		}
		from, to := data/bs*bs, min((hole+bs-1)/bs*bs, end)
		if !yield(max(from, pos), to) {
			return to, nil
		}
		pos = to
	}
	return end, nil
}
