//go:build !linux

package block

import "fmt"

// FileStore is the file backend; it needs Linux (pread/pwrite, fallocate,
// fdatasync) and is unavailable on this platform.
type FileStore struct{ Store }

// OpenFileStore reports ErrUnsupported on this platform.
func OpenFileStore(dir string) (*FileStore, error) {
	return nil, fmt.Errorf("block: file store %s: not on this platform: %w", dir, ErrUnsupported)
}

// OpenFileVolume reports ErrUnsupported on this platform.
func OpenFileVolume(path string, blockSize int) (Volume, error) {
	return nil, fmt.Errorf("block: volume %q: file backend not on this platform: %w", path, ErrUnsupported)
}
