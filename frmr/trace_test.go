package frmr

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/gosrp/gosrp/transport"
)

// The pool's traces (testdata/pool): the pool driven against a fake PD,
// one call per command, with no device, no QP and no clock. Each command
// prints what the pool did and the state of every slot; the pool's Check
// runs after every command and its violation, if any, is printed too.
//
//	new mech=frmr|mw size=N sq=N [tag] [signal=N] [quarantine=N] [cyclic]
//	get name=A [len=N] [off=N] [dir=write|read]   Get; prints key and iova
//	cancel A | done A | invalidate A              Cancel, Done, Invalidate
//	chain name=C wrs=reg(A);send(7);caller(9)
//	                                              Admit; prints the flags
//	post C [n=N]                                  Posted(chain, n)
//	complete id=send(7)|reg(A)|inv(A)|caller(9)|marker [status=ok|flush|err]
//	remote-inv A [key=A|B|0xKEY]                  OnRemoteInvalidate
//	cycle n=N [dir=write]                         N whole I/Os at QD1
//	qp-error | reset | recover | tick [n=N] | marker | stats
//	prologue name=P                               Prologue; a chain to post
//
// With fence on new (Config.FenceRegistrations), a chain's wrs may hold
// fence: the two WRs AppendFence puts in front of a registration.
func TestPoolTraces(t *testing.T) {
	datadriven.Walk(t, "testdata/pool", func(t *testing.T, path string) {
		var h *traceHarness
		defer func() {
			if h != nil {
				h.close()
			}
		}()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "new" {
				if h != nil {
					h.close()
				}
				var err error
				if h, err = newTraceHarness(t, d); err != nil {
					return "error: " + err.Error()
				}
				return h.slots()
			}
			if h == nil {
				d.Fatalf(t, "%s before new", d.Cmd)
			}
			out := h.run(t, d)
			if err := h.p.Check(); err != nil {
				out += "\nCHECK FAILED: " + err.Error()
			}
			return out + "\n" + h.slots()
		})
	})
}

type traceHarness struct {
	p      *Pool
	pd     *fakePD
	arena  *transport.Arena
	regs   map[string]Reg
	chains map[string][]transport.SendWR
	// seen is every (key, iova) the cycles advertised, and at which I/O.
	seen map[[2]uint64]int
	ios  int
}

func newTraceHarness(t *testing.T, d *datadriven.TestData) (*traceHarness, error) {
	a, err := transport.NewArena(64*transport.PageSize, transport.ArenaOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := &traceHarness{pd: &fakePD{cyclic: d.HasArg("cyclic"), next: 1}, arena: a,
		regs: map[string]Reg{}, chains: map[string][]transport.SendWR{}, seen: map[[2]uint64]int{}}
	cfg := Config{PD: h.pd, Size: argInt(t, d, "size", 2), SQDepth: argInt(t, d, "sq", 8), MaxPages: 4,
		IOVATag: d.HasArg("tag"), SignalEvery: argInt(t, d, "signal", 0), WindowQuarantine: argInt(t, d, "quarantine", 0),
		FenceRegistrations: d.HasArg("fence")}
	cfg.Mechanism = FRMR
	if argStr(t, d, "mech", "frmr") == "mw" {
		cfg.Mechanism = MW
		cfg.BaseMR = &fakeMR{arena: a}
	}
	if h.p, err = New(cfg); err != nil {
		a.Close()
		return nil, err
	}
	return h, nil
}

func (h *traceHarness) close() {
	h.p.Close()
	h.arena.Close()
}

func (h *traceHarness) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "get":
		name := argStr(t, d, "name", "")
		seg := Segment{Arena: h.arena, Off: argInt(t, d, "off", 0), Len: argInt(t, d, "len", transport.PageSize)}
		dir := PeerWrites
		if argStr(t, d, "dir", "write") == "read" {
			dir = PeerReads
		}
		r, err := h.p.Get(seg, dir)
		if err != nil {
			return "error: " + err.Error()
		}
		h.regs[name] = r
		return fmt.Sprintf("%s: slot %d key %s iova %s len %d", name, r.Slot(), r.RKey(), h.iova(r.IOVA()), r.Len())
	case "cancel":
		return errText(h.p.Cancel(h.reg(t, d, 0)))
	case "done":
		return strconv.FormatBool(h.p.Done(h.reg(t, d, 0)))
	case "invalidate":
		wr, err := h.p.Invalidate(h.reg(t, d, 0))
		if err != nil {
			return "error: " + err.Error()
		}
		name := d.CmdArgs[0].Key
		h.chains["inv("+name+")"] = []transport.SendWR{wr}
		return fmt.Sprintf("chain inv(%s): LOCAL_INV key %s", name, wr.InvalidateKey)
	case "chain":
		name := argStr(t, d, "name", "")
		var wrs []transport.SendWR
		for _, w := range strings.Split(argStr(t, d, "wrs", ""), ";") {
			if w == "fence" {
				wrs = h.p.AppendFence(wrs)
				continue
			}
			wrs = append(wrs, h.wr(t, d, w))
		}
		if err := h.p.Admit(wrs); err != nil {
			return "error: " + err.Error()
		}
		h.chains[name] = wrs
		return h.describe(wrs)
	case "marker":
		h.chains["marker"] = []transport.SendWR{h.p.DrainMarker()}
		return "chain marker"
	case "prologue":
		wrs := h.p.Prologue(nil)
		if err := h.p.Admit(wrs); err != nil {
			return "error: " + err.Error()
		}
		h.chains[argStr(t, d, "name", "")] = wrs
		return h.describe(wrs)
	case "post":
		name := d.CmdArgs[0].Key
		c, ok := h.chains[name]
		if !ok {
			d.Fatalf(t, "no chain %q", name)
		}
		n := argInt(t, d, "n", len(c))
		h.p.Posted(c, n)
		return fmt.Sprintf("posted %d of %d", n, len(c))
	case "complete":
		wc := transport.WC{ID: h.wr(t, d, argStr(t, d, "id", "")).ID, Status: transport.StatusSuccess}
		switch argStr(t, d, "status", "ok") {
		case "flush":
			wc.Status = transport.StatusWRFlushErr
		case "err":
			wc.Status = transport.StatusGeneralErr
		}
		tracked := h.p.OnSendCompletion(&wc)
		return fmt.Sprintf("tracked %v; err: %s", tracked, errText(h.p.Err()))
	case "remote-inv":
		r := h.reg(t, d, 0)
		key := r.RKey()
		if s := argStr(t, d, "key", ""); s != "" {
			if other, ok := h.regs[s]; ok {
				key = other.RKey()
			} else {
				v, err := strconv.ParseUint(s, 0, 32)
				if err != nil {
					d.Fatalf(t, "key %q", s)
				}
				key = transport.Key(v)
			}
		}
		return errText(h.p.OnRemoteInvalidate(r, key))
	case "cycle":
		return h.cycle(t, argInt(t, d, "n", 1), argStr(t, d, "dir", "write") == "write")
	case "qp-error":
		h.p.OnQPError()
		return "ok"
	case "reset":
		h.p.Reset()
		return "ok"
	case "recover":
		return errText(h.p.Recover())
	case "tick":
		var err error
		for range argInt(t, d, "n", 1) {
			if e := h.p.Tick(); e != nil && err == nil {
				err = e
			}
		}
		return errText(err)
	case "waiting":
		return fmt.Sprintf("waiting %v", h.p.Waiting())
	case "stats":
		st := h.p.Stats()
		return fmt.Sprintf("registrations %d local-inv %d/%d remote-inv %d bogus %d taints %d replacements %d rotations %d lost %d post-failures %d horizon %d",
			st.Registrations, st.LocalInvalidationsOK, st.LocalInvalidations, st.RemoteInvalidations, st.BogusInvalidations,
			st.Taints, st.Replacements, st.Rotations, st.LostCompletions, st.PostFailures, st.KeyHorizon)
	}
	d.Fatalf(t, "unknown command %q", d.Cmd)
	return ""
}

// cycle runs n I/Os at QD1 the way an initiator does with remote
// invalidation: register, send, the SEND's completion, the answer naming
// the key. It reports how many distinct (key, iova) descriptors the
// cycles since new have advertised, and the first repeat in this one.
func (h *traceHarness) cycle(t *testing.T, n int, write bool) string {
	dir := PeerReads
	if write {
		dir = PeerWrites
	}
	seen := h.seen
	repeat := ""
	for range n {
		i := h.ios
		h.ios++
		r, err := h.p.Get(Segment{Arena: h.arena, Len: transport.PageSize}, dir)
		if err != nil {
			return fmt.Sprintf("I/O %d: get: %v", i, err)
		}
		d := [2]uint64{uint64(r.RKey()), r.IOVA()}
		if j, ok := seen[d]; ok && repeat == "" {
			repeat = fmt.Sprintf("; I/O %d advertised I/O %d's descriptor %s@%s again", i, j, r.RKey(), h.iova(r.IOVA()))
		}
		seen[d] = i
		send := transport.SendWR{ID: uint64(1000 + i), Opcode: transport.OpSend}
		chain := []transport.SendWR{r.WR(), send}
		if err := h.p.Admit(chain); err != nil {
			return fmt.Sprintf("I/O %d: admit: %v", i, err)
		}
		h.p.Posted(chain, 2)
		if !h.p.OnSendCompletion(&transport.WC{ID: send.ID, Status: transport.StatusSuccess}) {
			return fmt.Sprintf("I/O %d: the SEND's completion was not tracked", i)
		}
		if err := h.p.OnRemoteInvalidate(r, r.RKey()); err != nil {
			return fmt.Sprintf("I/O %d: %v", i, err)
		}
		if !h.p.Done(r) {
			return fmt.Sprintf("I/O %d: not done after the SEND and the invalidation", i)
		}
	}
	return fmt.Sprintf("%d I/Os, %d in all, %d distinct descriptors%s", n, h.ios, len(seen), repeat)
}

// wr builds a work request from its trace name: reg(A) is A's
// registration, inv(A) the LOCAL_INV chain made by invalidate A, send(N)
// and caller(N) the caller's WR with ID N (a SEND or an RDMA READ), marker
// the drain marker.
func (h *traceHarness) wr(t *testing.T, d *datadriven.TestData, s string) transport.SendWR {
	kind, arg, _ := strings.Cut(strings.TrimSuffix(s, ")"), "(")
	switch kind {
	case "reg":
		r := h.regs[arg]
		return r.WR()
	case "inv":
		if c := h.chains["inv("+arg+")"]; len(c) == 1 {
			return c[0]
		}
	case "marker":
		return h.chains["marker"][0]
	case "send", "caller":
		id, err := strconv.ParseUint(arg, 10, 64)
		if err == nil {
			op := transport.OpSend
			if kind == "caller" {
				op = transport.OpRDMARead
			}
			return transport.SendWR{ID: id, Opcode: op}
		}
	}
	d.Fatalf(t, "bad work request %q", s)
	return transport.SendWR{}
}

func (h *traceHarness) describe(wrs []transport.SendWR) string {
	var b strings.Builder
	for i, w := range wrs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(w.Opcode.String())
		if w.Flags&transport.FlagSignaled != 0 {
			b.WriteString(" signaled")
		}
		if k, _, _, own := decodeID(w.ID); own && k == kindFence {
			switch w.Opcode {
			case transport.OpLocalInv:
				fmt.Fprintf(&b, " of the fence %s", w.InvalidateKey)
				if w.Flags&transport.FlagFence != 0 {
					b.WriteString(" fenced")
				}
			case transport.OpBindMW:
				fmt.Fprintf(&b, " of the fence %s access %s", w.Bind.Key, w.Bind.Access)
			case transport.OpRegMR:
				fmt.Fprintf(&b, " of the fence %s access %s", w.Reg.Key, w.Reg.Access)
			}
		}
	}
	return b.String()
}

func (h *traceHarness) reg(t *testing.T, d *datadriven.TestData, i int) Reg {
	if len(d.CmdArgs) <= i {
		d.Fatalf(t, "%s needs a registration name", d.Cmd)
	}
	r, ok := h.regs[d.CmdArgs[i].Key]
	if !ok {
		d.Fatalf(t, "no registration %q", d.CmdArgs[i].Key)
	}
	return r
}

// iova prints an address inside the arena relative to it (the arena's
// own address changes from run to run), and a tagged iova as it is.
func (h *traceHarness) iova(v uint64) string {
	if base := h.arena.Addr(); v >= base && v < base+uint64(h.arena.Len()) {
		return fmt.Sprintf("arena+%#x", v-base)
	}
	return fmt.Sprintf("%#x", v)
}

// slots prints every slot and the device objects the fake PD holds.
func (h *traceHarness) slots() string {
	var b strings.Builder
	h.p.Slots(func(s SlotInfo) {
		fmt.Fprintf(&b, "slot %d: %s index %d key %s", s.Slot, s.State, s.Index, s.DevKey)
		if s.Pending > 0 {
			fmt.Fprintf(&b, " pending %d", s.Pending)
		}
		b.WriteString("\n")
	})
	if h.p.fenceOn() {
		f := &h.p.fence
		fmt.Fprintf(&b, "fence: key %s bound %v broken %v pending %d\n", f.key, f.bound, f.broken, f.pending)
	}
	fmt.Fprintf(&b, "device: %s", h.pd.live())
	return b.String()
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return "error: " + err.Error()
}

func argInt(t *testing.T, d *datadriven.TestData, key string, def int) int {
	if !d.HasArg(key) {
		return def
	}
	var v int
	d.ScanArgs(t, key, &v)
	return v
}

func argStr(t *testing.T, d *datadriven.TestData, key, def string) string {
	if !d.HasArg(key) {
		return def
	}
	var v string
	d.ScanArgs(t, key, &v)
	return v
}

// fakePD hands out memory objects as a device would: indexes from 1, the
// index freed last first (a LIFO device) unless cyclic (rxe's
// xa_alloc_cyclic), each object's key starting at variant 0.
type fakePD struct {
	cyclic bool
	next   uint32
	free   []uint32
	objs   map[uint32]string
}

func (pd *fakePD) index(kind string) uint32 {
	if pd.objs == nil {
		pd.objs = map[uint32]string{}
	}
	var i uint32
	if n := len(pd.free); n > 0 && !pd.cyclic {
		i, pd.free = pd.free[n-1], pd.free[:n-1]
	} else {
		i = pd.next
		pd.next++
	}
	pd.objs[i] = kind
	return i
}

func (pd *fakePD) release(i uint32) {
	delete(pd.objs, i)
	pd.free = append(pd.free, i)
}

func (pd *fakePD) live() string {
	var idx []int
	for i := range pd.objs {
		idx = append(idx, int(i))
	}
	sort.Ints(idx)
	parts := make([]string, len(idx))
	for k, i := range idx {
		parts[k] = fmt.Sprintf("%s %d", pd.objs[uint32(i)], i)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// RegMR registers the page a fence window binds over.
func (pd *fakePD) RegMR(a *transport.Arena, off, length int, access transport.Access) (transport.MR, error) {
	if off != 0 || length != a.Len() {
		return nil, errors.New("fake PD: the pool registers whole arenas only")
	}
	return &fakeMR{arena: a, pd: pd, index: pd.index("mr")}, nil
}

func (pd *fakePD) AllocFastRegMR(maxPages int) (transport.FastRegMR, error) {
	return &fakeFR{pd: pd, key: transport.MakeKey(pd.index("frmr"), 0), maxPages: maxPages}, nil
}

func (pd *fakePD) AllocMW() (transport.MW, error) {
	return &fakeMW{pd: pd, key: transport.MakeKey(pd.index("mw"), 0)}, nil
}

func (pd *fakePD) CreateQP(transport.QPConfig) (transport.QP, error) {
	return nil, errors.New("fake PD: no QPs")
}

func (pd *fakePD) Close() error { return nil }

type fakeFR struct {
	pd       *fakePD
	key      transport.Key
	maxPages int
}

func (m *fakeFR) Key() transport.Key { return m.key }
func (m *fakeFR) MaxPages() int      { return m.maxPages }
func (m *fakeFR) Map(a *transport.Arena, off, length int, iova uint64) error {
	if length > m.maxPages*transport.PageSize {
		return transport.ErrInvalidArgument
	}
	return nil
}
func (m *fakeFR) Close() error { m.pd.release(m.key.Index()); return nil }

type fakeMW struct {
	pd  *fakePD
	key transport.Key
}

func (w *fakeMW) Key() transport.Key { return w.key }
func (w *fakeMW) Close() error       { w.pd.release(w.key.Index()); return nil }

// fakeMR is an MR windows are bound over: the trace's arena, or one the
// pool registered (pd set).
type fakeMR struct {
	arena *transport.Arena
	pd    *fakePD
	index uint32
}

func (m *fakeMR) LKey() transport.Key { return transport.MakeKey(0xfffff, 0) }
func (m *fakeMR) RKey() transport.Key { return transport.MakeKey(0xfffff, 0) }
func (m *fakeMR) Addr() uint64        { return m.arena.Addr() }
func (m *fakeMR) Len() int            { return m.arena.Len() }
func (m *fakeMR) Access() transport.Access {
	return transport.AccessLocalWrite | transport.AccessMWBind
}
func (m *fakeMR) Arena() *transport.Arena { return m.arena }
func (m *fakeMR) Close() error {
	if m.pd != nil {
		m.pd.release(m.index)
	}
	return nil
}
