package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/cli"
)

// served reports whether name is a volume or a VOLUME@SNAPSHOT the
// daemon serves (cmd/srpd catalog.go); a failed lookup counts as served,
// so that a rule is never reported missing on a guess.
func served(s admin.Service, name string) bool {
	if vol, snap, ok := strings.Cut(name, "@"); ok {
		snaps, err := s.Snapshots(vol)
		if err != nil {
			return !errors.Is(err, admin.ErrNotFound)
		}
		return slices.ContainsFunc(snaps, func(x admin.Snapshot) bool { return x.Name == snap })
	}
	vols, err := s.Volumes()
	return err != nil || slices.ContainsFunc(vols, func(v admin.Volume) bool { return v.Name == name })
}

// aclNote tells the user when an ACL change waits for a restart.
func (a *adminFlags) aclNote(err error) error {
	if err == nil && !a.aclLive {
		fmt.Fprintln(os.Stderr, "srpd: saved; the running srpd applies ACL changes when it restarts")
	}
	return err
}

func aclCommand() *cli.Command {
	var af adminFlags
	return af.group("acl", "manage which initiator may open which volume",
		adminCmd{
			name: "list", short: "show the access control list",
			run: show(&af, func(s admin.Service, _ []string) (admin.ACL, error) { return s.ACL() },
				func(w *tabwriter.Writer, acl admin.ACL) {
					def := "rw (allow)"
					if acl.DenyByDefault {
						def = "none (deny)"
					}
					fmt.Fprintf(w, "default: %s\n", def)
					fmt.Fprintln(w, "INITIATOR\tVOLUME\tACCESS")
					for _, r := range acl.Rules {
						fmt.Fprintf(w, "%s\t%s\t%s\n", r.Initiator, r.Volume, r.Access)
					}
				}),
		},
		adminCmd{
			name: "set", args: "INITIATOR VOLUME ACCESS", short: "grant an initiator access to a volume",
			long: `Add or replace the rule for (INITIATOR, VOLUME). ACCESS is none, ro or rw;
"*" as INITIATOR or VOLUME matches any name. The most specific rule wins:
an exact initiator beats "*", then an exact volume beats "*".

An SRP host (the kernel's ib_srp) is named by its 16-byte initiator port
identifier in hex, or by the host it connects from: INITIATOR addr:HOST
(addr:10.0.2.15, the RDMA CM source address) matches the SRP sessions
from HOST, below a rule naming the port and above "*". SRP carries no
secret, so either is only as trustworthy as the fabric.

Example: srpd acl default deny && srpd acl set host-a vol0 rw
         srpd acl set addr:10.0.2.15 vol0 rw`,
			check: func(args []string) error {
				if _, err := parseAccess(args[2]); err != nil {
					return cli.Usagef("%v", strings.TrimSuffix(err.Error(), ": "+admin.ErrInvalid.Error()))
				}
				return nil
			},
			run: func(s admin.Service, args []string) error {
				if err := s.SetACLRule(admin.ACLRule{Initiator: args[0], Volume: args[1], Access: args[2]}); err != nil {
					return err
				}
				if args[1] != "*" && !served(s, args[1]) {
					// A rule may be set before its volume exists; a typo
					// would otherwise go unnoticed until a login fails.
					fmt.Fprintf(os.Stderr, "srpd: saved, but there is no volume %q yet: the rule applies once it exists\n", args[1])
				}
				return af.aclNote(nil)
			},
		},
		adminCmd{
			name: "delete", args: "INITIATOR VOLUME", short: "remove the rule for an initiator and a volume",
			run: func(s admin.Service, args []string) error { return af.aclNote(s.DeleteACLRule(args[0], args[1])) },
		},
		adminCmd{
			name: "default", args: "allow|deny", short: "what an initiator gets when no rule matches",
			check: func(args []string) error {
				if args[0] != "allow" && args[0] != "deny" {
					return cli.Usagef("want allow or deny, got %q", args[0])
				}
				return nil
			},
			run: func(s admin.Service, args []string) error { return af.aclNote(s.SetACLDefault(args[0] == "deny")) },
		},
	)
}

func secretCommand() *cli.Command {
	var af adminFlags
	var secret, secretFile, sec string
	var optional bool
	return af.group("secret", "manage initiators' authentication secrets",
		adminCmd{
			name: "list", short: "list initiators that have a secret (never the secrets)",
			run: show(&af, func(s admin.Service, _ []string) ([]admin.SecretInfo, error) { return s.Secrets() },
				rows("INITIATOR\tREQUIRED", func(w io.Writer, x admin.SecretInfo) {
					fmt.Fprintf(w, "%s\t%v\n", x.Initiator, x.Required)
				})),
		},
		adminCmd{
			name: "set", args: "INITIATOR", short: "set an initiator's shared secret",
			long: `Set the shared secret INITIATOR must prove at login (HMAC-SHA256
challenge; the secret never crosses the wire). The initiator passes the same
secret with srpc --secret-file or SRPC_SECRET. Secrets are kept in
DIR/access.json (mode 0600).`,
			flags: func(fs *flag.FlagSet) {
				fs.StringVar(&secret, "secret", "", "the `SECRET` (visible in ps; prefer --secret-file or SRPD_SECRET)")
				fs.StringVar(&secretFile, "secret-file", "", "read the secret from `FILE` (- for stdin; one line)")
				fs.BoolVar(&optional, "optional", false, "let the initiator log in without authenticating")
			},
			check: func([]string) error {
				var err error
				if sec, err = readSecret(secret, secretFile, "SRPD_SECRET"); err != nil {
					return err
				}
				if sec == "" {
					return cli.Usagef("give the secret with --secret-file FILE, --secret or SRPD_SECRET")
				}
				return nil
			},
			run: func(s admin.Service, args []string) error {
				return s.SetSecret(args[0], admin.SetSecret{Secret: sec, Required: !optional})
			},
		},
		adminCmd{
			name: "delete", args: "INITIATOR", short: "remove an initiator's secret",
			run: func(s admin.Service, args []string) error { return s.DeleteSecret(args[0]) },
		},
	)
}

// readSecret returns the secret from a flag, a file or an environment variable.
func readSecret(flagVal, file, env string) (string, error) {
	if flagVal != "" {
		return flagVal, nil
	}
	if file != "" {
		var b []byte
		var err error
		if file == "-" {
			b, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<16))
		} else {
			b, err = os.ReadFile(file)
		}
		if err != nil {
			return "", fmt.Errorf("secret: %w", err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	return os.Getenv(env), nil
}
