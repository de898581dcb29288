package block

import (
	"fmt"
)

// The pebble store's thin-provisioning accounting: what its volumes
// promise, what the disk holds, and the overcommit bound.

// provisionedLocked is the sum of the volume sizes (snapshots are not
// counted: they are never written). REQUIRES: s.mu.
func (s *PebbleStore) provisionedLocked() (int64, error) {
	var sum int64
	err := s.scanMetaLocked([]byte{kindVolume}, func(_ []byte, m *volumeMeta) error {
		sum += m.Size
		return nil
	})
	return sum, err
}

// checkOvercommitLocked refuses a volume of size replacing one of before
// bytes (0: a new volume) if the volumes would then total more than
// s.overcommit times the file system. REQUIRES: s.mu.
func (s *PebbleStore) checkOvercommitLocked(what string, before, size int64) error {
	if s.overcommit <= 0 || s.space == nil || size <= before {
		return nil
	}
	p, err := s.provisionedLocked()
	if err != nil {
		return fmt.Errorf("block: %s: %w", what, err)
	}
	return checkOvercommit(what, p, before, size, s.overcommit, s.space.capacity())
}

// Space implements SpaceReporter.
func (s *PebbleStore) Space() (SpaceInfo, error) {
	if err := s.lock("space"); err != nil {
		return SpaceInfo{}, err
	}
	defer s.mu.Unlock()
	info := s.space.info()
	if !info.Known {
		return info, nil
	}
	p, err := s.provisionedLocked()
	if err != nil {
		return SpaceInfo{}, fmt.Errorf("block: pebble store %s: space: %w", s.dir, err)
	}
	info.Provisioned = p
	info.MaxOvercommit = max(s.overcommit, 0)
	return info, nil
}
