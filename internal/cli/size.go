package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"kB", 1e3},
	{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"k", 1 << 10},
	{"B", 1},
}

// ParseSize parses a byte count: a plain integer, or a number with one of
// the suffixes KiB, MiB, GiB, TiB (powers of 1024; K, M, G, T mean the
// same), or KB, MB, GB, TB (powers of 1000). "1.5GiB" is allowed when it
// comes to a whole number of bytes.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty size")
	}
	mult := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			mult, t = u.mult, strings.TrimSpace(strings.TrimSuffix(t, u.suffix))
			break
		}
	}
	if n, err := strconv.ParseInt(t, 0, 64); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("size %q is negative", s)
		}
		if n > math.MaxInt64/mult {
			return 0, fmt.Errorf("size %q is too large", s)
		}
		return n * mult, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("size %q: want a number with an optional KiB, MiB, GiB or TiB suffix", s)
	}
	if f < 0 {
		return 0, fmt.Errorf("size %q is negative", s)
	}
	v := f * float64(mult)
	if v > math.MaxInt64/2 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	if v != math.Trunc(v) {
		return 0, fmt.Errorf("size %q is not a whole number of bytes", s)
	}
	return int64(v), nil
}

// FormatSize formats a byte count with a binary unit: "1 GiB", "1.5 MiB",
// "4096 B".
func FormatSize(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	f := float64(n)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	if f == math.Trunc(f) {
		return fmt.Sprintf("%.0f %s", f, units[i])
	}
	return fmt.Sprintf("%.1f %s", f, units[i])
}

// SizeFlag is a flag.Value holding a byte count written with ParseSize's
// units.
type SizeFlag struct {
	N int64
	// Given is set once the flag is on the command line, so that an
	// explicit 0 can be told apart from a missing flag.
	Given bool
}

func (s *SizeFlag) String() string {
	if s == nil || s.N == 0 {
		return "0"
	}
	return compactSize(s.N)
}

// Set implements flag.Value.
func (s *SizeFlag) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	s.N, s.Given = n, true
	return nil
}

// Get implements flag.Getter.
func (s *SizeFlag) Get() any { return s.N }

func compactSize(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n%u.m == 0 {
			return strconv.FormatInt(n/u.m, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}
