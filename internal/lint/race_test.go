//go:build race

package lint

// raceEnabled reports a -race build: the tool-driven checks skip there, as
// their verdict does not depend on the detector and CI runs the plain tests
// too.
const raceEnabled = true
