package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/cli"
	"github.com/gosrp/gosrp/internal/gateway"
	"github.com/gosrp/gosrp/target"
)

// service implements admin.Service over a store and an access file; with
// a target (a running daemon) it also reports live statistics.
type service struct {
	store  block.Store
	access *access
	tgt    *target.Target // nil when offline
	status admin.Status   // static part of Status (daemon only)
	// cat is the gateway catalog the target serves (nil when offline):
	// Status reports each volume's path state from it.
	cat *gateway.Catalog
}

// blockErr maps a block error to the admin kinds, with a short message.
func blockErr(what string, err error) error {
	if err == nil {
		return nil
	}
	var kind error
	switch {
	case errors.Is(err, block.ErrNotFound):
		return admin.Errorf(admin.ErrNotFound, "%s does not exist", what)
	case errors.Is(err, block.ErrExists):
		return admin.Errorf(admin.ErrExists, "%s already exists", what)
	case errors.Is(err, block.ErrBusy):
		return admin.Errorf(admin.ErrBusy, "%s is in use (open by an initiator, or has an open snapshot)", what)
	case errors.Is(err, block.ErrInvalid), errors.Is(err, block.ErrMisaligned), errors.Is(err, block.ErrOutOfRange),
		errors.Is(err, block.ErrNoSpace):
		kind = admin.ErrInvalid
	case errors.Is(err, block.ErrUnsupported):
		return admin.Errorf(admin.ErrInvalid, "%s: not supported by this backend", what)
	}
	msg := blockMsg(err)
	if kind != nil {
		return admin.Errorf(kind, "%s: %s", what, msg)
	}
	return fmt.Errorf("%s: %s", what, msg)
}

// blockMsg is a store's error as an operator reads it: without the
// package prefix, nor the sentinel's own text at the end (": block:
// invalid argument"), which says nothing the message did not.
func blockMsg(err error) string {
	msg := strings.TrimPrefix(err.Error(), "block: ")
	for _, s := range []error{block.ErrInvalid, block.ErrMisaligned, block.ErrOutOfRange, block.ErrNoSpace} {
		if errors.Is(err, s) {
			msg = strings.TrimSuffix(msg, ": "+s.Error())
		}
	}
	return msg
}

// spaceErr is blockErr, except that a size refused by the store's
// thin-provisioning bound (block.ErrOvercommit) gets a one-line message
// with the totals in readable units; before is the size a resize
// replaces. A store refusing for want of space itself (a file system
// something else filled: block's walFloor) gets blockErr's "no space".
func (s *service) spaceErr(what string, before, size int64, err error) error {
	sr, ok := s.store.(block.SpaceReporter)
	if !errors.Is(err, block.ErrOvercommit) || !ok {
		return blockErr(what, err)
	}
	info, serr := sr.Space()
	if serr != nil || !info.Known || info.MaxOvercommit <= 0 {
		return admin.Errorf(admin.ErrInvalid, "%s: %s", what, blockMsg(err))
	}
	total := info.Provisioned - before + size
	return admin.Errorf(admin.ErrInvalid, "%s: %s would bring the volumes to %s, over --max-overcommit %g × the %s file system = %s",
		what, cli.FormatSize(size), cli.FormatSize(total), info.MaxOvercommit, cli.FormatSize(info.Total),
		cli.FormatSize(int64(info.MaxOvercommit*float64(info.Total))))
}

// maxNameLen is the store's bound on volume and snapshot names
// (block/check.go); a longer name is refused here, without quoting it, so
// that a runaway argument does not become a runaway message.
const maxNameLen = 200

func checkNameLen(what, name string) error {
	if len(name) > maxNameLen {
		return admin.Errorf(admin.ErrInvalid, "a %s name of %d bytes is too long: the limit is %d", what, len(name), maxNameLen)
	}
	return nil
}

// notFound names what is missing when a snapshot operation finds nothing:
// the volume itself, or only its snapshot.
func (s *service) notFound(volume, snap string, err error) error {
	if !errors.Is(err, block.ErrNotFound) {
		return nil
	}
	if _, verr := s.volume(volume); verr != nil {
		return verr
	}
	return admin.Errorf(admin.ErrNotFound, "snapshot %s@%s does not exist", volume, snap)
}

func (s *service) snapper() (block.Snapshotter, error) {
	sn, ok := s.store.(block.Snapshotter)
	if !ok {
		return nil, admin.Errorf(admin.ErrInvalid, "this backend has no snapshots (use pebble)")
	}
	return sn, nil
}

func (s *service) Volumes() ([]admin.Volume, error) {
	infos, err := s.store.List()
	if err != nil {
		return nil, blockErr("list volumes", err)
	}
	sn, _ := s.store.(block.Snapshotter)
	out := make([]admin.Volume, 0, len(infos))
	for _, v := range infos {
		av := admin.Volume{Name: v.Name, Size: v.Size, BlockSize: v.BlockSize, Created: v.Created}
		if sn != nil {
			if snaps, err := sn.Snapshots(v.Name); err == nil {
				av.Snapshots = len(snaps)
			}
		}
		out = append(out, av)
	}
	return out, nil
}

func (s *service) volume(name string) (admin.Volume, error) {
	vols, err := s.Volumes()
	if err != nil {
		return admin.Volume{}, err
	}
	for _, v := range vols {
		if v.Name == name {
			return v, nil
		}
	}
	return admin.Volume{}, admin.Errorf(admin.ErrNotFound, "volume %q does not exist", name)
}

func (s *service) CreateVolume(req admin.CreateVolume) (admin.Volume, error) {
	if req.Name == "" {
		return admin.Volume{}, admin.Errorf(admin.ErrInvalid, "a volume needs a name")
	}
	if err := checkNameLen("volume", req.Name); err != nil {
		return admin.Volume{}, err
	}
	if strings.Contains(req.Name, "@") {
		return admin.Volume{}, admin.Errorf(admin.ErrInvalid, "volume name %q: '@' separates volume and snapshot names", req.Name)
	}
	if req.Size <= 0 {
		return admin.Volume{}, admin.Errorf(admin.ErrInvalid, "volume %q needs a size > 0 (e.g. --size 256MiB)", req.Name)
	}
	bs := req.BlockSize
	if bs == 0 {
		bs = DefaultBlockSize
	}
	if req.Size%int64(bs) != 0 {
		return admin.Volume{}, admin.Errorf(admin.ErrInvalid, "volume %q: size %d is not a multiple of the block size %d", req.Name, req.Size, bs)
	}
	v, err := s.store.Create(req.Name, req.Size, bs)
	if err != nil {
		return admin.Volume{}, s.spaceErr(fmt.Sprintf("volume %q", req.Name), 0, req.Size, err)
	}
	s.catalogChanged()
	if err := v.Close(); err != nil {
		return admin.Volume{}, blockErr(fmt.Sprintf("volume %q", req.Name), err)
	}
	return s.volume(req.Name)
}

func (s *service) ResizeVolume(name string, req admin.ResizeVolume) (admin.Volume, error) {
	size := req.Size
	what := fmt.Sprintf("volume %q", name)
	v, err := s.store.Open(name)
	if err != nil {
		return admin.Volume{}, blockErr(what, err)
	}
	if size <= 0 || size%int64(v.BlockSize()) != 0 {
		v.Close()
		return admin.Volume{}, admin.Errorf(admin.ErrInvalid, "%s: size %d must be > 0 and a multiple of the block size %d", what, size, v.BlockSize())
	}
	before := v.Size()
	if size < before && !req.Force && s.tgt != nil {
		if n := s.tgt.OpenSessions(name); n > 0 {
			v.Close()
			have, them := "1 session has", "it"
			if n > 1 {
				have, them = fmt.Sprintf("%d sessions have", n), "them"
			}
			return admin.Volume{}, admin.Errorf(admin.ErrBusy, "%s: shrinking from %s to %s is refused: %s it open (close %s, or pass --force)",
				what, cli.FormatSize(before), cli.FormatSize(size), have, them)
		}
	}
	// Sessions learn a shrink before the store makes it, and a grow after,
	// so that none of their commands reaches a block the store lacks.
	if size < before {
		s.tellSessions(name, size)
	}
	err = v.Resize(size)
	if cerr := v.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil && size < before:
		s.tellSessions(name, before)
	case err == nil && size > before:
		s.tellSessions(name, size)
	}
	if err != nil {
		return admin.Volume{}, s.spaceErr(what, before, size, err)
	}
	return s.volume(name)
}

// tellSessions tells the sessions that have volume open its new size
// (target.Target.VolumeResized), if srpd serves any; a connection that
// takes longer than resizeNotifyTimeout to hear it is left to learn it
// from its next command's out-of-range answer.
func (s *service) tellSessions(volume string, size int64) {
	if s.tgt == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), resizeNotifyTimeout)
	defer cancel()
	s.tgt.VolumeResized(ctx, volume, size)
}

// resizeNotifyTimeout bounds how long a resize waits for the connections'
// run loops, which take a signal within microseconds unless stuck.
const resizeNotifyTimeout = 5 * time.Second

func (s *service) DeleteVolume(name string, req admin.DeleteVolume) error {
	if strings.Contains(name, "@") {
		return admin.Errorf(admin.ErrInvalid, "%q is a snapshot: use 'srpd snapshot delete'", name)
	}
	del := s.store.Delete
	if sn, ok := s.store.(block.Snapshotter); ok && !req.Snapshots {
		// The store's Delete takes a volume's snapshots with it; that is
		// for the user to ask for, not a side effect (admin.DeleteVolume).
		del = sn.DeleteIfNoSnapshots
	}
	if err := del(name); errors.Is(err, block.ErrHasSnapshots) {
		// The names are for the message; the refusal was the store's.
		which := ""
		if snaps, _ := s.store.(block.Snapshotter).Snapshots(name); len(snaps) > 0 {
			which = " (" + snapshotNames(name, snaps) + ")"
		}
		return admin.Errorf(admin.ErrBusy, "volume %q has snapshots%s: give --snapshots to delete them with it, or delete them first with 'srpd snapshot delete'",
			name, which)
	} else if err != nil {
		return blockErr(fmt.Sprintf("volume %q", name), err)
	}
	s.catalogChanged()
	if s.tgt != nil {
		// A new volume of the name must not inherit the old one's
		// registrations and reservation.
		if err := s.tgt.ForgetReservations(name); err != nil {
			return fmt.Errorf("volume %q deleted, but its reservations remain: %w", name, err)
		}
	}
	return nil
}

// catalogChanged tells the target, if srpd serves one, that volumes or
// snapshots came or went: SRP sessions get REPORTED LUNS DATA HAS
// CHANGED (target.Target.CatalogChanged).
func (s *service) catalogChanged() {
	if s.tgt != nil {
		s.tgt.CatalogChanged()
	}
}

func (s *service) Snapshots(volume string) ([]admin.Snapshot, error) {
	sn, err := s.snapper()
	if err != nil {
		return nil, err
	}
	var names []string
	if volume == "" {
		vols, err := s.store.List()
		if err != nil {
			return nil, blockErr("list volumes", err)
		}
		for _, v := range vols {
			names = append(names, v.Name)
		}
	} else {
		names = []string{volume}
	}
	out := []admin.Snapshot{}
	for _, n := range names {
		snaps, err := sn.Snapshots(n)
		if err != nil {
			return nil, blockErr(fmt.Sprintf("volume %q", n), err)
		}
		for _, x := range snaps {
			out = append(out, admin.Snapshot{Volume: x.Volume, Name: x.Name, Size: x.Size, BlockSize: x.BlockSize, Created: x.Created})
		}
	}
	return out, nil
}

func (s *service) CreateSnapshot(volume, name string) (admin.Snapshot, error) {
	sn, err := s.snapper()
	if err != nil {
		return admin.Snapshot{}, err
	}
	if err := checkNameLen("snapshot", name); err != nil {
		return admin.Snapshot{}, err
	}
	x, err := sn.Snapshot(volume, name)
	if nf := s.notFound(volume, name, err); nf != nil {
		return admin.Snapshot{}, nf
	}
	if err != nil {
		return admin.Snapshot{}, blockErr(fmt.Sprintf("snapshot %s@%s", volume, name), err)
	}
	s.catalogChanged()
	return admin.Snapshot{Volume: x.Volume, Name: x.Name, Size: x.Size, BlockSize: x.BlockSize, Created: x.Created}, nil
}

func (s *service) DeleteSnapshot(volume, name string) error {
	sn, err := s.snapper()
	if err != nil {
		return err
	}
	err = sn.DeleteSnapshot(volume, name)
	if nf := s.notFound(volume, name, err); nf != nil {
		return nf
	}
	if err == nil {
		s.catalogChanged()
	}
	return blockErr(fmt.Sprintf("snapshot %s@%s", volume, name), err)
}

func (s *service) CloneSnapshot(volume, snap, name string) (admin.Volume, error) {
	sn, err := s.snapper()
	if err != nil {
		return admin.Volume{}, err
	}
	if err := checkNameLen("volume", name); err != nil {
		return admin.Volume{}, err
	}
	v, err := sn.Clone(volume, snap, name)
	if nf := s.notFound(volume, snap, err); nf != nil {
		return admin.Volume{}, nf
	}
	if err != nil {
		return admin.Volume{}, blockErr(fmt.Sprintf("clone of %s@%s as %q", volume, snap, name), err)
	}
	v.Close()
	s.catalogChanged()
	return s.volume(name)
}

func (s *service) ACL() (admin.ACL, error)              { return s.access.ACL(), nil }
func (s *service) SetACLRule(r admin.ACLRule) error     { return s.access.SetRule(r) }
func (s *service) SetACLDefault(deny bool) error        { return s.access.SetDefault(deny) }
func (s *service) Secrets() ([]admin.SecretInfo, error) { return s.access.Secrets(), nil }
func (s *service) DeleteACLRule(initiator, volume string) error {
	return s.access.DeleteRule(initiator, volume)
}
func (s *service) SetSecret(initiator string, x admin.SetSecret) error {
	return s.access.SetSecret(initiator, x)
}
func (s *service) DeleteSecret(initiator string) error { return s.access.DeleteSecret(initiator) }

func ioStats(s target.IOStats) admin.IOStats {
	op := func(o target.OpStats) admin.OpStats {
		return admin.OpStats{Ops: o.Ops, Bytes: o.Bytes, Errors: o.Errors}
	}
	return admin.IOStats{Read: op(s.Read), Write: op(s.Write), Flush: op(s.Flush), Discard: op(s.Discard),
		WriteZeroes: op(s.WriteZeroes), P50us: s.Latency.Quantile(0.5), P99us: s.Latency.Quantile(0.99)}
}

func (s *service) Status() (admin.Status, error) {
	st := s.status
	st.PID = os.Getpid()
	vols, err := s.Volumes()
	if err != nil {
		return st, err
	}
	st.Volumes = vols
	if s.cat != nil && s.cat.Shared() {
		for i := range st.Volumes {
			st.Volumes[i].PathState = s.cat.State(st.Volumes[i].Name).String()
		}
	}
	st.VolumeStats = []admin.VolumeStats{}
	st.Conns = []admin.Conn{}
	if sr, ok := s.store.(block.SpaceReporter); ok {
		if info, err := sr.Space(); err == nil && info.Known {
			st.Space = &admin.Space{Total: info.Total, Free: info.Free, Reserve: info.Reserve, Full: info.Full,
				RefusedWrites: info.RefusedWrites, Provisioned: info.Provisioned, MaxOvercommit: info.MaxOvercommit}
		}
	}
	if s.tgt == nil {
		return st, nil
	}
	ts := s.tgt.Stats()
	st.Connections, st.Accepted, st.Rejected, st.Violations, st.CreditsInUse = ts.Connections, ts.Accepted, ts.Rejected, ts.Violations, ts.CreditsInUse
	// The target keeps the counters of every name it has served; a
	// volume or snapshot deleted since is no longer shown.
	live := map[string]bool{}
	for _, v := range vols {
		live[v.Name] = true
	}
	if snaps, err := s.Snapshots(""); err == nil {
		for _, x := range snaps {
			live[x.Volume+"@"+x.Name] = true
		}
	}
	for _, v := range ts.Volumes {
		if !live[v.Name] {
			continue
		}
		st.VolumeStats = append(st.VolumeStats, admin.VolumeStats{Name: v.Name, IOStats: ioStats(v.IOStats)})
	}
	for _, c := range ts.Conns {
		st.Conns = append(st.Conns, admin.Conn{ID: c.ID, Remote: c.Remote, Initiator: c.Initiator, State: c.State,
			Credits: c.Credits, CreditsInUse: c.CreditsInUse, OpenVolumes: c.OpenVolumes, IOStats: ioStats(c.IOStats)})
	}
	for name, r := range s.tgt.Reservations() {
		ar := admin.Reservation{Volume: name, Generation: r.Generation, Holder: r.Holder, Type: r.Type, Exclusive: r.ExclusiveHolder}
		for _, g := range r.Registrations {
			ar.Registrants = append(ar.Registrants, g.Initiator)
		}
		st.Reservations = append(st.Reservations, ar)
	}
	slices.SortFunc(st.Reservations, func(a, b admin.Reservation) int { return strings.Compare(a.Volume, b.Volume) })
	return st, nil
}

var _ admin.Service = (*service)(nil)

// snapshotNames lists a volume's snapshots as VOLUME@SNAPSHOT, the
// first three and how many more.
func snapshotNames(volume string, snaps []block.SnapshotInfo) string {
	names := make([]string, 0, 3)
	for _, x := range snaps[:min(len(snaps), 3)] {
		names = append(names, volume+"@"+x.Name)
	}
	if len(snaps) > 3 {
		names = append(names, fmt.Sprintf("and %d more", len(snaps)-3))
	}
	return strings.Join(names, ", ")
}
