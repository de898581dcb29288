package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/clock"
)

// Op indices of per-operation arrays.
const (
	opRead  = 0
	opWrite = 1
	numOps  = 2
)

var opNames = [numOps]string{"read", "write"}

// opFlush marks a slot carrying a --fsync FLUSH. Flushes are kept out of
// the per-operation arrays and reported apart, as fio's sync section.
const opFlush = numOps

// Run phases, in order. I/O completing outside phaseMeasure is not counted.
const (
	phaseRamp int32 = iota
	phaseMeasure
	phaseStop
)

// intervalHist is a job's latency histogram for the current report
// interval: the job records into it, the reporter swaps it for an empty
// one once an interval. The mutex is taken once per I/O by one goroutine
// and once per interval by the reporter, so it is never contended for
// long and never allocates.
type intervalHist struct {
	mu  sync.Mutex
	cur *Histogram
}

func (h *intervalHist) record(ns int64) {
	h.mu.Lock()
	h.cur.Record(ns)
	h.mu.Unlock()
}

// swap installs fresh (empty) and returns the interval's histogram.
func (h *intervalHist) swap(fresh *Histogram) *Histogram {
	h.mu.Lock()
	old := h.cur
	h.cur = fresh
	h.mu.Unlock()
	return old
}

// slot is one of a job's --iodepth requests with its registered buffer.
type slot struct {
	req    initiator.Request
	op     int
	lba    int64 // block index in the region
	gen    uint64
	t0, t1 int64 // clock.Nanos before and after Submit
	// covers are the writes a FLUSH in this slot makes durable once it
	// succeeds (--verify-state).
	covers []blockGen
}

// job is one --numjobs worker: its own session (or Multipath), volume
// handle, requests, random source and histograms.
type job struct {
	id    int
	ctx   context.Context // bounds the final FLUSH
	o     *Options
	vol   benchVolume
	vs    *verifyState // nil without --verify
	phase *atomic.Int32
	abort func(error)
	// finished is called once, when the job has done --number_ios I/Os.
	finished func()

	rng      *rand.Rand
	nblocks  int64 // blocks of --bs in the region
	base     int64 // first block of the region (offset / bs)
	seqNext  int64
	readPct  int
	unsynced int // writes submitted since the last FLUSH (--fsync)
	// acked are the writes acknowledged since the last FLUSH was issued,
	// which the next one covers (--verify-state). The slice is reused,
	// so steady state allocates nothing.
	acked []blockGen
	// lossSeen: a FLUSH reported that the target lost acknowledged
	// writes. A FLUSH answered after that report covers only what was
	// written since (initiator's package doc, "Target restarts"), and
	// the job cannot tell which of its acknowledged writes those are, so
	// it records no more as flushed.
	lossSeen bool
	slots    []slot
	bySlot   map[*initiator.Request]*slot
	done     chan *initiator.Request
	interval [numOps]intervalHist
	// Job-owned totals of the measured phase, read after the job ends.
	slat, clat, lat [numOps]Histogram
	syncLat         Histogram // FLUSH latencies
	measured        int64     // I/Os completed in the measured phase
	// lastDone is when the job's latest I/O completed (clock.Nanos),
	// maxGap the longest time between two consecutive completions, the
	// later one in the measured phase: the stall a failover (or a target
	// restart) cost the job.
	lastDone int64
	maxGap   time.Duration
	gapEnd   int64 // clock.Nanos of the completion that ended maxGap
	err      error
}

func newJob(ctx context.Context, id int, o *Options, c *conn, vs *verifyState,
	phase *atomic.Int32, nblocks, seed uint64, abort func(error), finished func()) (*job, error) {
	j := &job{
		id: id, ctx: ctx, o: o, vol: c.vol, vs: vs, phase: phase, abort: abort, finished: finished,
		rng:     rand.New(rand.NewPCG(seed, uint64(id)+1)),
		nblocks: int64(nblocks), base: o.Offset / o.BS, readPct: o.readPercent(),
		slots:  make([]slot, o.IODepth),
		bySlot: make(map[*initiator.Request]*slot, o.IODepth),
		done:   make(chan *initiator.Request, o.IODepth),
	}
	// Sequential jobs start at staggered points of the region so that
	// several jobs do not read the same blocks in lock step.
	j.seqNext = j.nblocks * int64(id) / int64(o.NumJobs)
	for i := range j.interval {
		j.interval[i].cur = new(Histogram)
	}
	bs := int(o.BS)
	mem, err := c.buffer(o.IODepth * bs)
	if err != nil {
		return nil, err
	}
	// A recognisable, non-zero payload for writes without --verify.
	for i := range mem {
		mem[i] = byte(i*131 + id + 1)
	}
	for i := range j.slots {
		s := &j.slots[i]
		s.req.Buf = mem[i*bs : (i+1)*bs : (i+1)*bs]
		s.req.Done = j.done
		j.bySlot[&s.req] = s
	}
	return j, nil
}

// pick chooses the next operation and block of s and, with --verify,
// locks the block and fills a write's buffer.
func (j *job) pick(s *slot) {
	if j.o.Fsync > 0 && j.unsynced >= j.o.Fsync {
		j.unsynced = 0
		s.op, s.req.Op, s.req.Offset = opFlush, initiator.OpFlush, 0
		// A flush covers the writes acknowledged before it was issued
		// (initiator's package doc, "Target restarts").
		s.covers, j.acked = j.acked, s.covers[:0]
		return
	}
	s.op = opRead
	switch {
	case j.readPct == 0:
		s.op = opWrite
	case j.readPct < 100 && j.rng.IntN(100) >= j.readPct:
		s.op = opWrite
	}
	for {
		var lba int64
		if j.o.random() {
			lba = j.rng.Int64N(j.nblocks)
		} else {
			lba = j.seqNext
			j.seqNext++
			if j.seqNext == j.nblocks {
				j.seqNext = 0
			}
		}
		if j.vs == nil || j.vs.tryLock(lba) {
			s.lba = lba
			break
		}
	}
	if s.op == opWrite {
		s.req.Op = initiator.OpWrite
		j.unsynced++
		if j.vs != nil {
			s.gen = j.vs.gen(s.lba) + 1
			fillBlock(s.req.Buf, j.vs.stamp(s.lba), s.gen, j.vs.run)
			if j.vs.recording() {
				j.vs.submit(s.lba, s.gen)
			}
		}
	} else {
		s.req.Op = initiator.OpRead
	}
	s.req.Offset = (j.base + s.lba) * j.o.BS
}

func (j *job) submit(s *slot) error {
	j.pick(s)
	s.t0 = clock.Nanos()
	err := j.vol.Submit(&s.req)
	s.t1 = clock.Nanos()
	if err != nil && j.vs != nil && s.op != opFlush {
		j.vs.unlock(s.lba, j.vs.gen(s.lba))
	}
	return err
}

// run keeps --iodepth I/Os in flight until the phase is phaseStop, then
// drains. The loop allocates nothing per I/O.
func (j *job) run() {
	inflight := 0
	for i := range j.slots {
		if err := j.submit(&j.slots[i]); err != nil {
			j.fail(err)
			break
		}
		inflight++
	}
	for inflight > 0 {
		r := <-j.done
		inflight--
		t2 := clock.Nanos()
		s := j.bySlot[r]
		if r.Err != nil && s.op == opFlush {
			if errors.Is(r.Err, initiator.ErrWriteCacheLost) {
				j.lossSeen = true
			}
			j.fail(fmt.Errorf("job %d: flush: %w", j.id, r.Err))
			continue
		}
		if r.Err != nil {
			if j.vs != nil {
				j.vs.unlock(s.lba, j.vs.gen(s.lba)) // the block's state is unknown; no longer checked exactly
			}
			j.fail(fmt.Errorf("job %d: %s of %d bytes at %d: %w", j.id, opNames[s.op], len(s.req.Buf), s.req.Offset, r.Err))
			continue
		}
		switch {
		case j.vs == nil:
		case s.op == opFlush && j.vs.recording() && !j.lossSeen:
			j.vs.flush(s.covers)
		case s.op == opRead:
			j.vs.check(s.req.Buf, s.lba)
			j.vs.unlock(s.lba, j.vs.gen(s.lba))
		case s.op == opWrite:
			j.vs.unlock(s.lba, s.gen)
			if j.vs.recording() {
				j.acked = append(j.acked, blockGen{s.lba, s.gen})
			}
		}
		ph := j.phase.Load()
		if g := time.Duration(t2 - j.lastDone); ph == phaseMeasure && j.lastDone != 0 && g > j.maxGap {
			j.maxGap, j.gapEnd = g, t2
		}
		j.lastDone = t2
		if ph == phaseMeasure && s.op == opFlush {
			j.syncLat.Record(t2 - s.t0)
		} else if ph == phaseMeasure {
			total := t2 - s.t0
			j.lat[s.op].Record(total)
			j.slat[s.op].Record(s.t1 - s.t0)
			j.clat[s.op].Record(t2 - s.t1)
			j.interval[s.op].record(total)
		}
		if ph == phaseMeasure {
			j.measured++
			if j.measured == j.o.NumberIOs {
				j.finished()
			}
		}
		if ph == phaseStop || j.err != nil || (j.o.NumberIOs > 0 && j.measured >= j.o.NumberIOs) {
			continue
		}
		if err := j.submit(s); err != nil {
			j.fail(err)
			continue
		}
		inflight++
	}
	j.endFlush()
}

// endFlush is fio's end_fsync: with --fsync the run ends with one more
// FLUSH once the job's I/O has drained, so that exit status 0 says every
// write it acknowledged is durable. A FLUSH that fails here (after a
// target restart lost writes, say) fails the run.
func (j *job) endFlush() {
	if j.o.Fsync == 0 || !j.o.writes() || j.err != nil || j.ctx.Err() != nil {
		return
	}
	if err := j.vol.Flush(j.ctx); err != nil {
		j.fail(fmt.Errorf("job %d: final flush: %w", j.id, err))
		return
	}
	if j.vs != nil && j.vs.recording() {
		j.vs.flush(j.acked)
	}
}

func (j *job) fail(err error) {
	if j.err == nil {
		j.err = err
		j.abort(err)
	}
}
