//go:build !linux

package block

// mapChunk allocates a chunk on the Go heap where anonymous mappings and
// huge-page advice are not at hand.
func mapChunk() ([]byte, error) { return make([]byte, chunkBytes), nil }

func unmapChunk([]byte) {}
func dropPages([]byte)  {}
func collapse([]byte)   {}
