package target

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/wire"
)

// memPRStore is a ReservationStore in memory that can be told to fail.
type memPRStore struct {
	saved map[string]ReservationState
	fail  error
	saves int
}

func (m *memPRStore) LoadReservations() (map[string]ReservationState, error) {
	return maps.Clone(m.saved), nil
}

func (m *memPRStore) SaveReservation(vol string, st ReservationState) error {
	if m.fail != nil {
		return m.fail
	}
	m.saves++
	m.saved[vol] = st
	return nil
}

// TestReservationsPersist: every acknowledged change is saved before it
// is answered, a table loaded from the store has the same registrations,
// reservation and generation (and so refuses the same writes), a change
// the store cannot save is undone and fails, and a state file that
// does not hold together is refused at load, naming the volume.
func TestReservationsPersist(t *testing.T) {
	st := &memPRStore{saved: map[string]ReservationState{}}
	a := newPRTable()
	if err := a.load(st); err != nil {
		t.Fatal(err)
	}
	v := a.volume("v")
	applyAll(t, v, []prStep{{"A", wire.ActionRegister, 0, 0xa}, {"B", wire.ActionRegister, 0, 0xb}, {"A", wire.ActionReserve, 0xa, 0}})
	if st.saves != 3 {
		t.Fatalf("%d saves for 3 changes", st.saves)
	}
	b := newPRTable()
	if err := b.load(st); err != nil {
		t.Fatal(err)
	}
	w := b.volume("v")
	if got, want := w.String(), v.String(); got != want {
		t.Fatalf("after the reload: %s, want %s", got, want)
	}
	if w.allows("B", "sB", true) || !w.allows("A", "sA", true) {
		t.Fatal("the reloaded reservation does not fence B off, or fences A")
	}

	st.fail = errors.New("disk full")
	var told []prNotice
	w.notify = func(_ string, ns []prNotice) { told = append(told, ns...) }
	out, gen := w.apply("B", &wire.ControlRequest{Action: wire.ActionPreempt, Key: 0xb, NewKey: 0xa, Type: wire.ResWriteExclusive})
	if len(told) != 0 {
		t.Fatalf("a preempt that could not be saved told the hosts %v", told)
	}
	if out.sense != wire.SenseInternal || !strings.Contains(out.msg, "disk full") || gen != 2 {
		t.Fatalf("preempt that could not be saved: %s %q gen %d", out.sense, out.msg, gen)
	}
	if w.allows("B", "sB", true) || w.String() != v.String() {
		t.Fatalf("an unsaved preempt took effect: %s", w)
	}

	st.fail = nil
	tgt := &Target{pr: b}
	if err := tgt.ForgetReservations("v"); err != nil || !st.saved["v"].Empty() || !w.allows("B", "sB", true) || len(tgt.Reservations()) != 0 {
		t.Fatalf("forgotten: %v, saved %+v, state %s", err, st.saved["v"], w)
	}

	for name, bad := range map[string]ReservationState{
		"holder not registered": {Holder: "A", Type: "write-exclusive"},
		"bad type":              {Holder: "A", Type: "shared", Registrations: []Registration{{"A", 1}}},
		"key 0":                 {Registrations: []Registration{{"A", 0}}},
		"twice":                 {Registrations: []Registration{{"A", 1}, {"A", 2}}},
	} {
		err := newPRTable().load(&memPRStore{saved: map[string]ReservationState{"vol9": bad}})
		if err == nil || !strings.Contains(err.Error(), `"vol9"`) {
			t.Errorf("%s: load says %v", name, err)
		}
	}
}

// TestSetReservations: a state set from outside (what a gateway that
// takes a volume over read from the shared store) fences as the same
// state made by commands does, is not saved again, and a state that
// does not hold together is refused and changes nothing.
func TestSetReservations(t *testing.T) {
	st := &memPRStore{saved: map[string]ReservationState{}}
	tgt := &Target{pr: newPRTable()}
	if err := tgt.pr.load(st); err != nil {
		t.Fatal(err)
	}
	held := ReservationState{Generation: 7, Holder: "A", Type: "write-exclusive", Registrations: []Registration{{"A", 0xa}, {"B", 0xb}}}
	if err := tgt.SetReservations("v", held); err != nil {
		t.Fatal(err)
	}
	v := tgt.pr.volume("v")
	if v.allows("B", "sB", true) || !v.allows("A", "sA", true) || !v.allows("B", "sB", false) {
		t.Fatalf("after SetReservations: %s; want B's writes refused, its reads and A's writes allowed", v)
	}
	if st.saves != 0 {
		t.Fatalf("SetReservations saved %d times", st.saves)
	}
	if got := tgt.Reservations()["v"]; got.Generation != 7 || got.Holder != "A" || len(got.Registrations) != 2 {
		t.Fatalf("Reservations after SetReservations: %+v", got)
	}
	err := tgt.SetReservations("v", ReservationState{Holder: "C", Type: "write-exclusive"})
	if err == nil || !strings.Contains(err.Error(), `"v"`) {
		t.Fatalf("a holder that is not registered: %v", err)
	}
	if v.allows("B", "sB", true) {
		t.Fatal("a refused state changed the fence")
	}
	if err := tgt.SetReservations("v", ReservationState{}); err != nil || !v.allows("B", "sB", true) {
		t.Fatalf("an empty state: %v; B still fenced: %s", err, v)
	}
}

// readerStore is a memPRStore that also reads a volume's state as
// another target recorded it (ReservationReader).
type readerStore struct {
	memPRStore
	recorded ReservationState
	err      error
	reads    int
	during   func() // called inside each read
}

func (r *readerStore) ReadReservation(string) (ReservationState, error) {
	r.reads++
	if r.during != nil {
		r.during()
	}
	return r.recorded, r.err
}

// TestReservationRefresh: a target that does not serve a volume reads
// its reservations from a store that keeps them where the serving
// target changes them (ReservationReader) before it reports them; the
// serving target does not (its state is the volume's); a read that
// fails is an error (ErrStandby kept), and a store that cannot read
// leaves the state as it is. The read holds the volume's lock.
func TestReservationRefresh(t *testing.T) {
	st := &readerStore{memPRStore: memPRStore{saved: map[string]ReservationState{}}}
	tb := newPRTable()
	if err := tb.load(st); err != nil {
		t.Fatal(err)
	}
	v := tb.volume("v")
	g := &fakeGateway{}
	vol := &pathVolume{name: "v", g: g}
	g.standby.Store(true)
	st.recorded = ReservationState{Generation: 3, Holder: "A", Type: "write-exclusive", Registrations: []Registration{{"A", 0xa}}}
	// The read holds the volume's lock: a change this target records
	// meanwhile (turned active) waits, and is not replaced by it.
	st.during = func() {
		if v.mu.TryLock() {
			v.mu.Unlock()
			t.Error("the volume's lock is free during the read")
		}
	}
	if err := v.refresh(vol); err != nil {
		t.Fatal(err)
	}
	if rep := v.report(); rep.Holder != "A" || rep.Generation != 3 || st.reads != 1 {
		t.Fatalf("standby report: %+v after %d reads; want A's reservation, read once", rep, st.reads)
	}
	g.standby.Store(false)
	st.recorded = ReservationState{}
	if err := v.refresh(vol); err != nil || st.reads != 1 || v.report().Holder != "A" {
		t.Fatalf("active: %v, %d reads, holder %q; want no read, the state kept", err, st.reads, v.report().Holder)
	}
	g.standby.Store(true)
	st.err = fmt.Errorf("%w: blocklisted", ErrStandby)
	if err := v.refresh(vol); !errors.Is(err, ErrStandby) {
		t.Fatalf("a read that failed: %v, want ErrStandby kept", err)
	}
	w := newPRTable()
	if err := w.load(&memPRStore{saved: map[string]ReservationState{}}); err != nil {
		t.Fatal(err)
	}
	if err := w.volume("v").refresh(vol); err != nil {
		t.Fatalf("a store that cannot read: %v", err)
	}
}

// prStep is one reservation action of a host, with write-exclusive as
// its type.
type prStep struct {
	ini      string
	act      wire.ReserveAction
	key, new uint64
}

// applyAll applies the steps to v and fails the test on a refusal.
func applyAll(t *testing.T, v *prVolume, steps []prStep) {
	t.Helper()
	for _, s := range steps {
		if out, _ := v.apply(s.ini, &wire.ControlRequest{Action: s.act, Key: s.key, NewKey: s.new, Type: wire.ResWriteExclusive}); out.sense != wire.SenseNone {
			t.Fatalf("%+v: %s", s, out.msg)
		}
	}
}

// TestRecordedNotices: the unit attentions a state records are the
// newest maxRecordedNotices, each with its change's serial; a target
// reading a state raises those newer than the last change it saw, and
// none a state could not have made (a serial past the state's own, a
// condition it does not know: the state is input).
func TestRecordedNotices(t *testing.T) {
	var ns []ReservationNotice
	for serial := uint64(1); serial <= 10; serial++ {
		ns = record(ns, serial, []prNotice{{"A", scsi.RegistrationsPreempted}, {"B", scsi.ReservationsReleased}, {"C", scsi.ReservationsPreempted}, {"D", scsi.ReservationsPreempted}, {"E", scsi.ReservationsPreempted}, {"F", scsi.ReservationsPreempted}, {"G", scsi.ReservationsPreempted}, {"H", scsi.ReservationsPreempted}})
	}
	if len(ns) != maxRecordedNotices || ns[len(ns)-1].Serial != 10 || ns[0].Serial != 10-maxRecordedNotices/8+1 {
		t.Fatalf("%d notices, from serial %d to %d; want the newest %d", len(ns), ns[0].Serial, ns[len(ns)-1].Serial, maxRecordedNotices)
	}
	st := ReservationState{Serial: 3, Notices: []ReservationNotice{
		{1, "A", "registrations-preempted"}, {2, "B", "reservations-released"}, {3, "C", "reservations-preempted"},
		{3, "D", "a-condition-of-tomorrow"}, {4, "E", "registrations-preempted"},
	}}
	// A record with more notices than any gateway writes: only the
	// newest count.
	flood := ReservationState{Serial: 2}
	for range 10 * maxRecordedNotices {
		flood.Notices = append(flood.Notices, ReservationNotice{1, "X", "registrations-preempted"})
	}
	flood.Notices = append(flood.Notices, ReservationNotice{2, "Y", "reservations-released"})
	if n := len(unseen(flood, 0)); n != maxRecordedNotices {
		t.Errorf("a record of %d notices raised %d, want the newest %d", len(flood.Notices), n, maxRecordedNotices)
	}
	for _, tc := range []struct {
		seen uint64
		want string
	}{
		{0, "[{A registrations-preempted} {B reservations-released} {C reservations-preempted}]"},
		{1, "[{B reservations-released} {C reservations-preempted}]"},
		{3, "[]"},
		{7, "[]"}, // a state recorded afresh
	} {
		var got []string
		for _, n := range unseen(st, tc.seen) {
			got = append(got, fmt.Sprintf("{%s %s}", n.initiator, n.what))
		}
		if got := fmt.Sprint(got); got != tc.want {
			t.Errorf("seen %d: %s, want %s", tc.seen, got, tc.want)
		}
	}
}
