//go:build unix

package block

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Statfs is the default StatfsFunc: statfs(2) of dir.
func Statfs(dir string) (SpaceUsage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return SpaceUsage{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	bs := int64(st.Bsize)
	return SpaceUsage{Total: int64(st.Blocks) * bs, Avail: int64(st.Bavail) * bs}, nil
}
