package target

import (
	"slices"
	"testing"
)

// TestPathChangesReplay: what a connection replays of the path states a
// volume passed through before its run loop looked. Every state it went
// through is applied, the last one last, so that a change that went and
// came back still reaches each host as a change.
func TestPathChangesReplay(t *testing.T) {
	for _, tc := range []struct {
		name   string
		states []gwState
		want   []gwState
	}{
		{"none", nil, nil},
		{"one", []gwState{gwActive}, []gwState{gwActive}},
		{"repeated", []gwState{gwStandby, gwStandby}, []gwState{gwStandby}},
		{"went and came back", []gwState{gwActive, gwStandby}, []gwState{gwActive, gwStandby}},
		{"back and forth", []gwState{gwStandby, gwActive, gwStandby, gwActive}, []gwState{gwStandby, gwActive}},
		{"the last is not repeated", []gwState{gwActive, gwFenced, gwActive}, []gwState{gwFenced, gwActive}},
		{"all three", []gwState{gwFenced, gwActive, gwStandby}, []gwState{gwActive, gwFenced, gwStandby}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p pathChanges
			for _, st := range tc.states {
				p = p.add(st)
			}
			if got := p.replay(); !slices.Equal(got, tc.want) {
				t.Errorf("replay after %v = %v, want %v", tc.states, got, tc.want)
			}
		})
	}
}
