//go:build race

package main

// raceEnabled reports a -race build: the detector allocates beside the
// code under test, so the allocation counts are checked without it.
const raceEnabled = true
