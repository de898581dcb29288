//go:build linux

package ibverbs

import "testing"

func TestKernelAtLeast(t *testing.T) {
	for _, tc := range []struct {
		release string
		want    bool
	}{
		{"6.12.95+deb12-amd64", true},
		{"6.10.0", true},
		{"6.10", true},
		{"6.9.12-arch1", false},
		{"6.1.0-41-amd64", false},
		{"7.0.0", true},
		{"5.15.0-generic", false},
		{"", false},
		{"six.ten", false},
		{"6.x", false},
	} {
		if got := kernelAtLeast(tc.release, 6, 10); got != tc.want {
			t.Errorf("kernelAtLeast(%q, 6, 10) = %v, want %v", tc.release, got, tc.want)
		}
	}
	for _, tc := range []struct {
		release string
		want    bool
	}{
		{"6.1.0-41-amd64", false},
		{"5.15.0-generic", false},
		{"6.12.95+deb12-amd64", true},
		{"6.12.110", true},
		{"6.12.111+deb12-amd64", false},
		{"6.12.118", false},
		{"6.12", true},
		{"6.12-rc3.111", true},
		{"6.10-rc1", true},
		{"6.6.30", true},
		{"7.0.0", true},
		{"", true},
		{"six.ten", true},
	} {
		if got := rxeReplaysOnErr(tc.release); got != tc.want {
			t.Errorf("rxeReplaysOnErr(%q) = %v, want %v", tc.release, got, tc.want)
		}
	}
	if kernelRelease() == "" {
		t.Error("uname gave no release")
	}
}
