package block

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/testenv"
	"github.com/stretchr/testify/require"
)

// Benchmarks, per backend:
//
//	go test -run '^$' -bench . -benchtime 2s ./block
//
// Volumes are sparse 1 GiB; random I/O touches the first benchSpan bytes
// so that the read benchmark can pre-write all of it.

const (
	benchVolSize = 1 << 30
	benchSpan    = 256 << 20
)

func benchVolume(b *testing.B, be backend) (Store, Volume) {
	s := be.open(b, b.TempDir())
	if ps, ok := s.(*PebbleStore); ok {
		// The tests' backend uses small pebble buffers; benchmark the defaults.
		require.NoError(b, ps.Close())
		var err error
		s, err = OpenPebbleStore(ps.Dir(), nil)
		require.NoError(b, err)
	}
	v, err := s.Create("bench", benchVolSize, 4096)
	require.NoError(b, err)
	b.Cleanup(func() { _ = v.Close(); _ = s.Close() })
	return s, v
}

func BenchmarkRandWrite4K(b *testing.B) {
	for _, be := range backends() {
		for _, every := range []int{0, 32, 1} {
			name := be.name + "/noflush"
			if every > 0 {
				name = fmt.Sprintf("%s/flush-every-%d", be.name, every)
			}
			b.Run(name, func(b *testing.B) {
				_, v := benchVolume(b, be)
				buf := make([]byte, 4096)
				rng := rand.New(rand.NewPCG(1, 2))
				b.SetBytes(4096)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					buf[0] = byte(i)
					if _, err := v.WriteAt(buf, rng.Int64N(benchSpan/4096)*4096); err != nil {
						b.Fatal(err)
					}
					if every > 0 && (i+1)%every == 0 {
						if err := v.Flush(); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}

// BenchmarkRandWrite4KFUAParallel shows group commit: concurrent FUA
// writers share fsyncs.
func BenchmarkRandWrite4KFUAParallel(b *testing.B) {
	for _, be := range backends() {
		b.Run(be.name, func(b *testing.B) {
			_, v := benchVolume(b, be)
			b.SetBytes(4096)
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				buf := make([]byte, 4096)
				rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
				for pb.Next() {
					if _, err := v.WriteAtFUA(buf, rng.Int64N(benchSpan/4096)*4096); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// fillVolume writes every block of the first span bytes (128 KiB at a time).
func fillVolume(tb testing.TB, v Volume, span int64) {
	buf := make([]byte, 128<<10)
	for i := range buf {
		buf[i] = byte(i)
	}
	for off := int64(0); off < span; off += int64(len(buf)) {
		_, err := v.WriteAt(buf, off)
		require.NoError(tb, err)
	}
	require.NoError(tb, v.Flush())
}

func BenchmarkRandRead4K(b *testing.B) {
	for _, be := range backends() {
		b.Run(be.name, func(b *testing.B) {
			_, v := benchVolume(b, be)
			fillVolume(b, v, benchSpan)
			buf := make([]byte, 4096)
			rng := rand.New(rand.NewPCG(3, 4))
			b.SetBytes(4096)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := v.ReadAt(buf, rng.Int64N(benchSpan/4096)*4096); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkSeqWrite128K(b *testing.B) {
	for _, be := range backends() {
		b.Run(be.name, func(b *testing.B) {
			_, v := benchVolume(b, be)
			buf := make([]byte, 128<<10)
			b.SetBytes(int64(len(buf)))
			b.ResetTimer()
			off := int64(0)
			for i := 0; i < b.N; i++ {
				if _, err := v.WriteAt(buf, off); err != nil {
					b.Fatal(err)
				}
				off = (off + int64(len(buf))) % benchVolSize
			}
		})
	}
}

// TestMeasureIOPSRatio measures 4 KiB random-write and random-read IOPS of
// the pebble and file backends in one run and reports pebble ÷ file.
// Behind GOSRP_MEASURE=1 (seconds per phase in GOSRP_MEASURE_SECS, default 3).
func TestMeasureIOPSRatio(t *testing.T) {
	if os.Getenv("GOSRP_MEASURE") == "" {
		t.Skip("set GOSRP_MEASURE=1")
	}
	secs := time.Duration(testenv.Int(t, "GOSRP_MEASURE_SECS", 3, 1)) * time.Second
	iops := map[string]float64{}
	for _, be := range backends()[1:] { // file, pebble
		var v Volume
		var s Store
		if be.name == "pebble" {
			ps, err := OpenPebbleStore(t.TempDir(), nil)
			require.NoError(t, err)
			s = ps
		} else {
			s = be.open(t, t.TempDir())
		}
		v, err := s.Create("m", benchVolSize, 4096)
		require.NoError(t, err)
		rng := rand.New(rand.NewPCG(5, 6))
		buf := make([]byte, 4096)
		run := func(phase string, op func(off int64) error) {
			n, start := 0, time.Now()
			for time.Since(start) < secs {
				for j := 0; j < 256; j++ {
					require.NoError(t, op(rng.Int64N(benchSpan/4096)*4096))
				}
				n += 256
			}
			iops[be.name+"/"+phase] = float64(n) / time.Since(start).Seconds()
		}
		run("randwrite", func(off int64) error { _, err := v.WriteAt(buf, off); return err })
		fillVolume(t, v, benchSpan)
		run("randread", func(off int64) error { _, err := v.ReadAt(buf, off); return err })
		require.NoError(t, v.Close())
		require.NoError(t, s.Close())
	}
	for _, phase := range []string{"randwrite", "randread"} {
		p, f := iops["pebble/"+phase], iops["file/"+phase]
		t.Logf("4 KiB %-9s QD1: pebble %8.0f IOPS, file %8.0f IOPS, pebble/file = %.2f", phase, p, f, p/f)
	}
}

// TestMeasureWriteAmp writes GOSRP_WA_BYTES (e.g. 1073741824) of random
// 4 KiB blocks to a pebble volume of the same size, flushes the memtable,
// waits for compactions, and reports write amplification = bytes pebble
// wrote (WAL + flushes + compactions) ÷ bytes the user wrote, plus the
// kernel's count of bytes this process sent to the disk and the store's
// size on disk.
func TestMeasureWriteAmp(t *testing.T) {
	total := testenv.Int(t, "GOSRP_WA_BYTES", 0, 0)
	if total == 0 {
		t.Skip("set GOSRP_WA_BYTES=1073741824")
	}
	total -= total % 4096
	dir := t.TempDir()
	s, err := OpenPebbleStore(dir, nil)
	require.NoError(t, err)
	defer s.Close()
	v, err := s.Create("wa", total, 4096)
	require.NoError(t, err)
	defer v.Close()
	ioBefore := procWriteBytes()
	rng := rand.New(rand.NewPCG(7, 8))
	buf := make([]byte, 4096)
	start := time.Now()
	for written := int64(0); written < total; written += 4096 {
		for j := 0; j < len(buf); j += 8 { // incompressible: the worst case
			binary.LittleEndian.PutUint64(buf[j:], rng.Uint64())
		}
		_, err := v.WriteAt(buf, rng.Int64N(total/4096)*4096)
		require.NoError(t, err)
	}
	require.NoError(t, v.Flush())
	elapsed := time.Since(start)
	require.NoError(t, s.db.Flush())
	// Let compactions settle: poll until none runs (measurement, not assertion).
	for i := 0; i < 600 && s.db.Metrics().Compact.NumInProgress > 0; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	m := s.db.Metrics()
	// Sum the levels: Metrics.Total() counts memtable flushes twice.
	var flushed, compacted uint64
	for _, l := range m.Levels {
		flushed += l.TableBytesFlushed + l.BlobBytesFlushed
		compacted += l.TableBytesCompacted + l.BlobBytesCompacted
	}
	disk := m.WAL.BytesWritten + flushed + compacted
	t.Logf("user bytes %d (%.0f MiB) in %v (%.0f IOPS)", total, float64(total)/(1<<20), elapsed.Round(time.Millisecond), float64(total/4096)/elapsed.Seconds())
	t.Logf("pebble: WAL %d MiB + flushes %d MiB + compactions %d MiB = %d MiB → write amplification %.2f (%.2f without the WAL)",
		m.WAL.BytesWritten>>20, flushed>>20, compacted>>20, disk>>20,
		float64(disk)/float64(total), float64(flushed+compacted)/float64(total))
	if ioAfter := procWriteBytes(); ioAfter > ioBefore {
		t.Logf("kernel: /proc/self/io write_bytes %d MiB → %.2f × user bytes", (ioAfter-ioBefore)>>20, float64(ioAfter-ioBefore)/float64(total))
	}
	if testing.Verbose() {
		t.Logf("pebble metrics:\n%s", m)
	}
	t.Logf("on disk: %d MiB (pebble DiskSpaceUsage), dir %d MiB", m.DiskSpaceUsage()>>20, dirSize(dir)>>20)
}

func procWriteBytes() uint64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes: "); ok {
			n, _ := strconv.ParseUint(v, 10, 64)
			return n
		}
	}
	return 0
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}
