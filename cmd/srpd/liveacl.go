package main

import (
	"github.com/gosrp/gosrp/target"
)

// setLive makes access changes reach the running target at once: a rule
// change through SetACL, a secret change through PolicyChanged. Either
// re-evaluates every open session within milliseconds: a host that lost
// a volume has it closed (its I/O then fails access denied), one
// narrowed to read-only has its writes refused, and a host whose secret
// changed or was deleted is disconnected and must log in with the
// current one. The target logs each effect.
func setLive(t *target.Target, a *access) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.onChange = func(acl *target.ACL, secrets bool) {
		if secrets {
			t.PolicyChanged()
			return
		}
		t.SetACL(acl)
	}
}
