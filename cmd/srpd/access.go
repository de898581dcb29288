package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/durable"
	"github.com/gosrp/gosrp/target"
)

// accessFile is the name, inside the data directory, of the file holding
// the ACL and the initiators' secrets (mode 0600).
const accessFile = "access.json"

type secretEntry struct {
	Secret   string `json:"secret"`
	Required bool   `json:"required"`
}

type accessDoc struct {
	DenyByDefault bool                   `json:"deny_by_default"`
	Rules         []admin.ACLRule        `json:"rules"`
	Secrets       map[string]secretEntry `json:"secrets"`
}

// access is the ACL and secrets of a data directory, persisted in
// access.json and read live by the target.
type access struct {
	path string
	mu   sync.Mutex
	doc  accessDoc
	acl  *target.ACL // the published ACL; replaced, never mutated
	// onChange, if set, is called after each saved change, outside mu:
	// with the new ACL when the rules changed, with secrets true when
	// the secrets did (the running target then re-evaluates its
	// sessions; see setLive).
	onChange func(acl *target.ACL, secrets bool)
}

func loadAccess(dir string) (*access, error) {
	a := &access{path: filepath.Join(dir, accessFile)}
	b, err := os.ReadFile(a.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if err := json.Unmarshal(b, &a.doc); err != nil {
			return nil, fmt.Errorf("%s: %w", a.path, err)
		}
		for _, r := range a.doc.Rules {
			if _, err := parseAccess(r.Access); err != nil {
				return nil, fmt.Errorf("%s: %w", a.path, err)
			}
		}
	}
	if a.doc.Secrets == nil {
		a.doc.Secrets = map[string]secretEntry{}
	}
	a.acl = a.build()
	return a, nil
}

func parseAccess(s string) (target.Access, error) {
	switch s {
	case "none", "deny":
		return target.AccessNone, nil
	case "ro", "read-only", "readonly":
		return target.AccessReadOnly, nil
	case "rw", "read-write", "readwrite":
		return target.AccessReadWrite, nil
	}
	return 0, admin.Errorf(admin.ErrInvalid, "access %q: want none, ro or rw", s)
}

func (a *access) build() *target.ACL {
	acl := &target.ACL{DenyByDefault: a.doc.DenyByDefault}
	for _, r := range a.doc.Rules {
		acc, _ := parseAccess(r.Access)
		acl.Rules = append(acl.Rules, target.ACLRule{Initiator: r.Initiator, Volume: r.Volume, Access: acc})
	}
	return acl
}

// ACLPointer is the ACL to hand to target.Config.
func (a *access) ACLPointer() *target.ACL {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.acl
}

// Secret is target.Config.Secrets.
func (a *access) Secret(initiator string) ([]byte, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.doc.Secrets[initiator]
	if !ok {
		return nil, false
	}
	return []byte(e.Secret), e.Required
}

// update changes the document with fn, saves it and publishes the ACL;
// secrets says fn changes secrets rather than rules.
func (a *access) update(secrets bool, fn func(d *accessDoc) error) error {
	a.mu.Lock()
	old := a.doc
	old.Rules = append([]admin.ACLRule(nil), a.doc.Rules...)
	old.Secrets = map[string]secretEntry{}
	for k, v := range a.doc.Secrets {
		old.Secrets[k] = v
	}
	if err := fn(&a.doc); err != nil {
		a.doc = old
		a.mu.Unlock()
		return err
	}
	if err := a.saveLocked(); err != nil {
		a.doc = old
		a.mu.Unlock()
		// The change is dropped, in memory as on disk: say so, not only
		// the errno of the temporary file (on a full disk 'srpd acl set'
		// said just "write DIR/access.json.tmp: no space left on device").
		what := "the ACL is"
		if secrets {
			what = "the secrets are"
		}
		return fmt.Errorf("%s unchanged: %w", what, err)
	}
	a.acl = a.build()
	acl, hook := a.acl, a.onChange
	a.mu.Unlock()
	if hook != nil {
		hook(acl, secrets)
	}
	return nil
}

func (a *access) saveLocked() error {
	b, err := json.MarshalIndent(&a.doc, "", "  ")
	if err != nil {
		return err
	}
	return durable.WriteFile(a.path, append(b, '\n'), 0o600)
}

func (a *access) ACL() admin.ACL {
	a.mu.Lock()
	defer a.mu.Unlock()
	return admin.ACL{DenyByDefault: a.doc.DenyByDefault, Rules: append([]admin.ACLRule{}, a.doc.Rules...)}
}

func (a *access) SetRule(r admin.ACLRule) error {
	if r.Initiator == "" || r.Volume == "" {
		return admin.Errorf(admin.ErrInvalid, "an ACL rule needs an initiator and a volume (\"*\" matches any)")
	}
	if r.Initiator == target.SourcePrefix {
		return admin.Errorf(admin.ErrInvalid, "a source rule names the host SRP sessions connect from: %sHOST, e.g. %s10.0.2.15", target.SourcePrefix, target.SourcePrefix)
	}
	if r.Volume != "*" {
		// A rule no volume can match would grant or deny nothing,
		// silently.
		if err := block.CheckName(r.Volume); err != nil {
			return admin.Errorf(admin.ErrInvalid, "an ACL rule names a volume, a snapshot as VOLUME@SNAPSHOT, or \"*\": %s", blockMsg(err))
		}
	}
	acc, err := parseAccess(r.Access)
	if err != nil {
		return err
	}
	r.Access = map[target.Access]string{target.AccessNone: "none", target.AccessReadOnly: "ro", target.AccessReadWrite: "rw"}[acc]
	return a.update(false, func(d *accessDoc) error {
		for i := range d.Rules {
			if d.Rules[i].Initiator == r.Initiator && d.Rules[i].Volume == r.Volume {
				d.Rules[i] = r
				return nil
			}
		}
		d.Rules = append(d.Rules, r)
		sort.Slice(d.Rules, func(i, j int) bool {
			if d.Rules[i].Initiator != d.Rules[j].Initiator {
				return d.Rules[i].Initiator < d.Rules[j].Initiator
			}
			return d.Rules[i].Volume < d.Rules[j].Volume
		})
		return nil
	})
}

func (a *access) DeleteRule(initiator, volume string) error {
	return a.update(false, func(d *accessDoc) error {
		for i := range d.Rules {
			if d.Rules[i].Initiator == initiator && d.Rules[i].Volume == volume {
				d.Rules = append(d.Rules[:i], d.Rules[i+1:]...)
				return nil
			}
		}
		return admin.Errorf(admin.ErrNotFound, "no ACL rule for initiator %q on volume %q", initiator, volume)
	})
}

func (a *access) SetDefault(deny bool) error {
	return a.update(false, func(d *accessDoc) error { d.DenyByDefault = deny; return nil })
}

func (a *access) Secrets() []admin.SecretInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []admin.SecretInfo{}
	for k, v := range a.doc.Secrets {
		out = append(out, admin.SecretInfo{Initiator: k, Required: v.Required})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Initiator < out[j].Initiator })
	return out
}

func (a *access) SetSecret(initiator string, s admin.SetSecret) error {
	if initiator == "" || initiator == "*" {
		return admin.Errorf(admin.ErrInvalid, "a secret needs an initiator name")
	}
	if s.Secret == "" {
		return admin.Errorf(admin.ErrInvalid, "empty secret for %q", initiator)
	}
	return a.update(true, func(d *accessDoc) error {
		d.Secrets[initiator] = secretEntry{Secret: s.Secret, Required: s.Required}
		return nil
	})
}

func (a *access) DeleteSecret(initiator string) error {
	return a.update(true, func(d *accessDoc) error {
		if _, ok := d.Secrets[initiator]; !ok {
			return admin.Errorf(admin.ErrNotFound, "no secret for initiator %q", initiator)
		}
		delete(d.Secrets, initiator)
		return nil
	})
}
