//go:build !unix

package block

import "fmt"

// Statfs is the default StatfsFunc; it is unavailable on this platform,
// where stores run without a space guard.
func Statfs(dir string) (SpaceUsage, error) {
	return SpaceUsage{}, fmt.Errorf("block: statfs %s: not on this platform: %w", dir, ErrUnsupported)
}
