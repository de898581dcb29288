package nbd

import (
	"context"
	"errors"
	"sync"
)

// Memory is an in-memory Backend, for tests and experiments. Fail, when
// set, is consulted before every operation ("read", "write", "flush",
// "trim", "zero", "status") and its error returned instead of doing it.
// Its BlockStatus reports every block of zeros as a hole, as a sparse
// file whose zero blocks were punched out would be.
type Memory struct {
	mu    sync.RWMutex
	data  []byte
	bs    int
	ro    bool
	Fail  func(op string, off, n int64) error
	calls []Call
}

// Call records one operation Memory performed.
type Call struct {
	Op     string
	Off, N int64
	FUA    bool
}

// NewMemory returns a zeroed in-memory backend.
func NewMemory(size int64, blockSize int, readOnly bool) *Memory {
	return &Memory{data: make([]byte, size), bs: blockSize, ro: readOnly}
}

func (m *Memory) Size() int64    { return int64(len(m.data)) }
func (m *Memory) BlockSize() int { return m.bs }
func (m *Memory) ReadOnly() bool { return m.ro }

// Bytes is the backend's content (not a copy).
func (m *Memory) Bytes() []byte { return m.data }

// Calls returns the operations performed so far.
func (m *Memory) Calls() []Call {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return append([]Call(nil), m.calls...)
}

func (m *Memory) record(op string, off, n int64, fua bool) error {
	if m.Fail != nil {
		if err := m.Fail(op, off, n); err != nil {
			return err
		}
	}
	m.calls = append(m.calls, Call{op, off, n, fua})
	return nil
}

var errRange = errors.New("memory backend: range outside the export")

func (m *Memory) inRange(off, n int64) bool {
	return off >= 0 && n >= 0 && off <= int64(len(m.data)) && n <= int64(len(m.data))-off
}

func (m *Memory) ReadAt(ctx context.Context, p []byte, off int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.record("read", off, int64(len(p)), false); err != nil {
		return err
	}
	if !m.inRange(off, int64(len(p))) {
		return WithErrno(errRange, EINVAL)
	}
	copy(p, m.data[off:])
	return nil
}

func (m *Memory) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.record("write", off, int64(len(p)), fua); err != nil {
		return err
	}
	if !m.inRange(off, int64(len(p))) {
		return WithErrno(errRange, ENOSPC)
	}
	copy(m.data[off:], p)
	return nil
}

func (m *Memory) Flush(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.record("flush", 0, 0, false)
}

func (m *Memory) zero(op string, off, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.record(op, off, n, false); err != nil {
		return err
	}
	if off%int64(m.bs) != 0 || n%int64(m.bs) != 0 {
		return WithErrno(errors.New("memory backend: unaligned "+op), EINVAL)
	}
	if !m.inRange(off, n) {
		return WithErrno(errRange, ENOSPC)
	}
	clear(m.data[off : off+n])
	return nil
}

func (m *Memory) Trim(ctx context.Context, off, n int64) error { return m.zero("trim", off, n) }
func (m *Memory) WriteZeroes(ctx context.Context, off, n int64) error {
	return m.zero("zero", off, n)
}

// BlockStatus implements BlockStatuser: a block that holds only zeros is
// StateHole|StateZero, any other is allocated. Extents follow block
// boundaries, cut to [off, off+n).
func (m *Memory) BlockStatus(ctx context.Context, off, n int64) ([]Extent, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.record("status", off, n, false); err != nil {
		return nil, err
	}
	if !m.inRange(off, n) {
		return nil, WithErrno(errRange, EINVAL)
	}
	var out []Extent
	bs := int64(m.bs)
	for pos, end := off, off+n; pos < end; {
		next := min((pos/bs+1)*bs, end)
		flags := StateHole | StateZero
		for _, b := range m.data[pos:next] {
			if b != 0 {
				flags = 0
				break
			}
		}
		if k := len(out) - 1; k >= 0 && out[k].Flags == flags {
			out[k].Length += next - pos
		} else {
			out = append(out, Extent{Length: next - pos, Flags: flags})
		}
		pos = next
	}
	return out, nil
}
