package block

import (
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkChunkRandomRead copies random 4 KiB blocks out of 1 GiB of
// written chunks, as a memory volume's reads do, from the volume's own
// chunks (private anonymous memory, collapsed to huge pages) and from
// memfd-backed shared chunks. The second is what a zero-copy shm read
// would need, so that the peer process's NIC could copy straight out of
// the volume; shmem gets no transparent huge pages unless
// /sys/kernel/mm/transparent_hugepage/shmem_enabled allows them, and on
// this project's CI machines it says "never".
func BenchmarkChunkRandomRead(b *testing.B) {
	const total = 1 << 30
	kinds := []struct {
		name string
		mk   func() ([]byte, func(), error)
	}{
		{"anon-huge", func() ([]byte, func(), error) {
			c, err := mapChunk()
			if err != nil {
				return nil, nil, err
			}
			fillChunk(c)
			collapse(c)
			return c, func() { unmapChunk(c) }, nil
		}},
		{"memfd-shared", func() ([]byte, func(), error) {
			fd, err := unix.MemfdCreate("chunk", unix.MFD_CLOEXEC)
			if err != nil {
				return nil, nil, err
			}
			defer unix.Close(fd)
			if err := unix.Ftruncate(fd, chunkBytes); err != nil {
				return nil, nil, err
			}
			c, err := unix.Mmap(fd, 0, chunkBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				return nil, nil, err
			}
			fillChunk(c)
			return c, func() { unix.Munmap(c) }, nil
		}},
	}
	for _, k := range kinds {
		// Map and write the gigabyte once per kind, not once per b.N
		// the benchmark framework tries.
		chunks := make([][]byte, 0, total/chunkBytes)
		var frees []func()
		for range total / chunkBytes {
			c, free, err := k.mk()
			if err != nil {
				b.Logf("%s skipped: map a chunk: %v", k.name, err)
				break
			}
			frees = append(frees, free)
			chunks = append(chunks, c)
		}
		if len(chunks) == total/chunkBytes {
			b.Run(k.name, func(b *testing.B) {
				const bs = 4096
				perChunk := chunkBytes / bs
				dst := make([]byte, 32*bs)
				r := rand.New(rand.NewPCG(1, 2))
				b.SetBytes(bs)
				for i := range b.N {
					blk := r.IntN(total / bs)
					src := chunks[blk/perChunk][(blk%perChunk)*bs:]
					copy(dst[(i%32)*bs:(i%32+1)*bs], src)
				}
			})
		}
		for _, free := range frees {
			free()
		}
	}
}

func fillChunk(c []byte) {
	for i := range c {
		c[i] = byte(i)
	}
}
