package replication

// Deterministic simulation of replication (RELIABILITY.md S10-S16).
//
// A sim drives several Nodes (the synchronous protocol core) step by step
// from one seed, without goroutines of its own and without the wall clock:
// every fetch request, fetch response and role change is a message in a
// pool, and each step the seeded rng picks what happens next: deliver a
// message (chosen at random, so messages are delayed and reordered; in the
// chaos phase also dropped or duplicated), send fetches, produce with
// acks=all, run a produce's fsync, advance the simulated clock and tick,
// crash a node (its MemFS crash-cloned) or restart it, move leadership,
// cut or heal links. A simulated controller holds each partition's
// epoch, leader and ISR (persisted through OnISRChange) and elects leaders
// only from live ISR members. Then the network heals and the sim runs
// until the replicas converge, and the final logs are checked.
//
// Checked at every step: a leader's high watermark never decreases during
// its leadership and never passes the durable log end of a live member of
// its ISR; a node's epoch never decreases; at most one node accepts
// leadership of an epoch; an acknowledged offset is never acknowledged
// again with other data. Checked at the end: the logs are identical byte
// for byte; every acknowledged record is at its offset with its value;
// offsets are dense; no value and no (producer id, epoch, sequence) is
// stored twice. The same seed replays the same run (TestSimulationReplay).

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
	"github.com/replog/replog/log"
)

const (
	simTopic        = "sim"
	simMinISR       = 2
	simLagTime      = 300 * time.Millisecond
	simFetchTimeout = 50 * time.Millisecond
	// simEventsKept is how many of the last events a failure prints
	// (REPLOG_SIM_EVENTS overrides it).
	simEventsKept = 80
)

// simBase is the simulated clock's origin.
var simBase = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

var errSimRefused = errors.New("sim controller: ISR change refused")

// simParams is one run's configuration, derived from its seed.
type simParams struct {
	seed       uint64
	nodes      int
	partitions int
	chaosSteps int
	healRounds int
	// relaxed sets RelaxedDurability (scenario tests only: A1 then holds
	// only while one ISR member keeps its page cache).
	relaxed bool
	// rolls uses small segments (several rolls and multi-segment
	// truncations); the leader then fsyncs in the same step as it appends
	// and crashes keep only synced state, so that the log's background
	// flusher cannot change what a crash keeps.
	rolls bool
	// keepUnsynced lets crash clones keep part of the unsynced data, tear
	// sectors and keep unsynced directory entries.
	keepUnsynced bool

	dropRate, dupRate, ackLossRate float64
	crashes                        int
	wCrash, wFailover, wSplit      float64
	// wDelete weighs a leader's DeleteRecordsBefore of committed records.
	wDelete                   float64
	idemClients, plainClients int
	fetchMaxBytes             int32
	staleClientRate           float64
}

// simParamsFor derives a run's parameters from its seed, so that seeds
// differ in shape as well as in their choices.
func simParamsFor(seed uint64) simParams {
	r := rand.New(rand.NewPCG(seed, 0x51a1))
	// level scales the faults: some runs are mostly calm (long stretches
	// of acknowledged writes between faults), others violent.
	level := 0.15 + 0.85*r.Float64()
	p := simParams{
		seed:            seed,
		nodes:           3,
		partitions:      1 + r.IntN(2),
		chaosSteps:      150 + r.IntN(150),
		healRounds:      300,
		rolls:           r.IntN(3) == 0,
		dropRate:        level * r.Float64() * 0.2,
		dupRate:         level * r.Float64() * 0.1,
		ackLossRate:     r.Float64() * 0.2,
		crashes:         r.IntN(5),
		wCrash:          level * (0.5 + r.Float64()*2),
		wFailover:       level * r.Float64() * 3,
		wSplit:          level * r.Float64() * 2,
		idemClients:     1 + r.IntN(3),
		plainClients:    r.IntN(3),
		fetchMaxBytes:   int32(200 + r.IntN(2000)),
		staleClientRate: r.Float64() * 0.2,
	}
	p.keepUnsynced = !p.rolls
	if r.IntN(2) == 0 {
		p.wDelete = 0.5 + 2.5*r.Float64()
	}
	return p
}

type simMsgKind uint8

const (
	msgFetch simMsgKind = iota
	msgFetchResp
	msgRole
)

// simMsg is a message in flight.
type simMsg struct {
	id       int64
	kind     simMsgKind
	from, to int32
	// inc is the incarnation of the sender (fetch) or of the addressee
	// (response, role): a restarted node neither gets answers meant for
	// its previous life nor its old role changes.
	inc   int
	reqID int64 // the fetch a response answers
	req   *FetchRequest
	resp  *FetchResponse
	role  simRole
}

// simRole is a role change sent by the controller.
type simRole struct {
	tp       TopicPartition
	leader   bool
	epoch    int32
	leaderID int32
	replicas []int32
	isr      []int32
}

type simInflight struct {
	id   int64
	sent time.Time
}

// simNode is one replica: its filesystem survives crashes (as a crash
// clone), its Node and logs do not.
type simNode struct {
	id       int32
	inc      int
	up       bool
	fs       *vfs.MemFS
	node     *Node
	logs     map[TopicPartition]*log.Log
	inflight map[int32]simInflight // outstanding fetch per leader
	epochs   map[TopicPartition]int32
}

// simCtrl is the controller's view of a partition.
type simCtrl struct {
	epoch  int32
	leader int32 // -1: offline
	isr    []int32
}

// simClient is a producer with at most one batch in flight: an idempotent
// one (pid >= 0) retries a batch until it is acknowledged; a plain one
// retries only when the append certainly did not happen.
type simClient struct {
	id      int
	pid     int64
	tp      TopicPartition
	seq     int32
	batchNo int
	cur     *simBatch
	waiting *simProduce
}

type simBatch struct {
	bytes  []byte // as built, before a leader rewrote offsets and epoch
	values []string
	seq    int32
}

// simProduce is an append that Replicator.Produce would be handling.
type simProduce struct {
	client *simClient
	node   int32
	inc    int
	tp     TopicPartition
	info   log.AppendInfo
	p      *partition
	ctx    context.Context
	synced bool
}

// simStats counts what a run exercised.
type simStats struct {
	acks, dupAcks, crashes, elections, staleRoles, divergences, truncations, drops, dups int
	isrChanges, notEnoughReplicas, deletes                                               int
}

func (a *simStats) add(b simStats) {
	a.acks += b.acks
	a.dupAcks += b.dupAcks
	a.crashes += b.crashes
	a.elections += b.elections
	a.staleRoles += b.staleRoles
	a.divergences += b.divergences
	a.truncations += b.truncations
	a.drops += b.drops
	a.dups += b.dups
	a.isrChanges += b.isrChanges
	a.notEnoughReplicas += b.notEnoughReplicas
	a.deletes += b.deletes
}

type simLeaderKey struct {
	node, inc int
	tp        TopicPartition
	epoch     int32
}

type simEpochKey struct {
	tp    TopicPartition
	epoch int32
}

type sim struct {
	p       simParams
	rng     *rand.Rand
	clock   atomic.Int64 // nanoseconds since simBase; read by the logs' flushers
	step    int
	healing bool

	tps      []TopicPartition
	replicas []int32
	nodes    []*simNode
	ctrl     map[TopicPartition]*simCtrl
	pool     []*simMsg
	msgID    int64
	split    map[[2]int32]bool

	refuseISR bool
	crashes   int

	clients []*simClient
	syncs   []*simProduce // appended, their Sync not yet run

	acked       map[TopicPartition]map[int64]string
	deleted     map[TopicPartition]int64 // the highest DeleteRecordsBefore offset
	stats       simStats
	leaderHW    map[simLeaderKey]int64
	epochLeader map[simEpochKey]int32

	trace  hash.Hash64
	events []string
	keep   int // events kept for the failure report
	// held collects events whose order is not the simulation's: Node.Tick
	// visits partitions in map order, so its ISR changes are sorted.
	held *[]string
	err  error
}

func newSim(p simParams) *sim {
	s := &sim{
		p:           p,
		rng:         rand.New(rand.NewPCG(p.seed, 0x5eed)),
		ctrl:        map[TopicPartition]*simCtrl{},
		split:       map[[2]int32]bool{},
		acked:       map[TopicPartition]map[int64]string{},
		deleted:     map[TopicPartition]int64{},
		leaderHW:    map[simLeaderKey]int64{},
		epochLeader: map[simEpochKey]int32{},
		trace:       fnv.New64a(),
		keep:        simEventsKept,
	}
	if v, err := strconv.Atoi(os.Getenv("REPLOG_SIM_EVENTS")); err == nil && v > 0 {
		s.keep = v
	}
	for i := 0; i < p.partitions; i++ {
		tp := TopicPartition{Topic: simTopic, Partition: int32(i)}
		s.tps = append(s.tps, tp)
		s.acked[tp] = map[int64]string{}
	}
	for i := 0; i < p.nodes; i++ {
		s.replicas = append(s.replicas, int32(i))
		s.nodes = append(s.nodes, &simNode{id: int32(i), fs: vfs.NewMem()})
	}
	for i := 0; i < p.idemClients+p.plainClients; i++ {
		c := &simClient{id: i, pid: log.NoProducerID, tp: s.tps[i%len(s.tps)]}
		if i < p.idemClients {
			c.pid = int64(1000 + i)
		}
		s.clients = append(s.clients, c)
	}
	return s
}

func (s *sim) now() time.Time { return simBase.Add(time.Duration(s.clock.Load())) }

func (s *sim) advance(d time.Duration) { s.clock.Add(int64(d)) }

// logf records an event in the trace hash and in the recent events.
func (s *sim) logf(format string, args ...any) {
	e := fmt.Sprintf("%d %s ", s.step, s.now().Sub(simBase)) + fmt.Sprintf(format, args...)
	if s.held != nil {
		*s.held = append(*s.held, e)
		return
	}
	s.record(e)
}

func (s *sim) record(e string) {
	s.trace.Write([]byte(e))
	if len(s.events) == s.keep {
		copy(s.events, s.events[1:])
		s.events = s.events[:s.keep-1]
	}
	s.events = append(s.events, e)
}

// failf records the first violation; the run stops after the step.
func (s *sim) failf(format string, args ...any) {
	if s.err == nil {
		s.err = fmt.Errorf("step %d: "+format, append([]any{s.step}, args...)...)
		s.logf("VIOLATION: %v", s.err)
	}
}

func (s *sim) hashInts(vs ...int64) {
	var b [8]byte
	for _, v := range vs {
		binary.LittleEndian.PutUint64(b[:], uint64(v))
		s.trace.Write(b[:])
	}
}

// openNode opens a node's logs on its filesystem and makes its Node.
func (s *sim) openNode(n *simNode) error {
	inc := n.inc
	cfg := Config{ReplicaID: n.id, ClusterID: "sim", MinInsyncReplicas: simMinISR,
		ReplicaLagTime: simLagTime, RelaxedDurability: s.p.relaxed, FetchMaxBytes: s.p.fetchMaxBytes,
		FetchBackoff: 20 * time.Millisecond, Now: s.now,
		OnISRChange: func(tp TopicPartition, epoch int32, isr []int32) error {
			return s.onISRChange(n.id, inc, tp, epoch, isr)
		}}
	node, err := NewNode(cfg)
	if err != nil {
		return err
	}
	n.node, n.logs = node, map[TopicPartition]*log.Log{}
	n.inflight, n.epochs = map[int32]simInflight{}, map[TopicPartition]int32{}
	opts := log.Options{FS: n.fs, SegmentBytes: 1 << 20, IndexIntervalBytes: 256, Now: s.now,
		ProducerIDExpiration: 365 * 24 * time.Hour}
	if s.p.rolls {
		opts.SegmentBytes = 1500
	}
	for _, tp := range s.tps {
		l, err := log.Open("/"+tp.String(), opts)
		if err != nil {
			return err
		}
		n.logs[tp] = l
		if err := node.AddPartition(tp, l); err != nil {
			return err
		}
	}
	return nil
}

func (s *sim) closeLogs(n *simNode) {
	if n.node != nil {
		s.stats.truncations += int(n.node.stats.truncations.Load())
	}
	for _, tp := range s.tps {
		if l := n.logs[tp]; l != nil {
			_ = l.Close() // the old incarnation's filesystem is discarded
		}
	}
	n.logs = nil
}

func (s *sim) close() {
	for _, n := range s.nodes {
		if n.up {
			s.closeLogs(n)
		}
	}
}

// start opens every node and makes node 0 the leader of every partition
// at epoch 1, delivering the role changes at once.
func (s *sim) start() {
	for _, n := range s.nodes {
		n.up = true
		if err := s.openNode(n); err != nil {
			s.failf("open node %d: %v", n.id, err)
			return
		}
	}
	for _, tp := range s.tps {
		s.ctrl[tp] = &simCtrl{epoch: 1, leader: 0, isr: slices.Clone(s.replicas)}
		s.sendRoles(tp)
	}
	s.deliverAll()
}

// --- controller ---

func (s *sim) onISRChange(id int32, inc int, tp TopicPartition, epoch int32, isr []int32) error {
	c := s.ctrl[tp]
	switch {
	case epoch != c.epoch || c.leader != id || s.nodes[id].inc != inc:
		s.logf("ctrl: stale ISR change from %d epoch %d refused (epoch %d leader %d)", id, epoch, c.epoch, c.leader)
		return errSimRefused
	case s.refuseISR:
		s.logf("ctrl: ISR change %v from %d refused", isr, id)
		return errSimRefused
	case !slices.Contains(isr, id):
		s.failf("leader %d of %s proposed ISR %v without itself", id, tp, isr)
		return errSimRefused
	}
	c.isr = slices.Clone(isr)
	s.stats.isrChanges++
	s.logf("ctrl: %s ISR %v", tp, c.isr)
	return nil
}

// elect moves tp's leadership to a live ISR member other than exclude, at
// the next epoch; the ISR keeps its live members. It reports whether a
// leader was elected.
func (s *sim) elect(tp TopicPartition, exclude int32) bool {
	c := s.ctrl[tp]
	var cands, isr []int32
	for _, id := range c.isr {
		if s.nodes[id].up {
			isr = append(isr, id)
			if id != exclude {
				cands = append(cands, id)
			}
		}
	}
	if len(cands) == 0 {
		if c.leader >= 0 && !s.nodes[c.leader].up {
			c.leader = -1
			s.logf("ctrl: %s offline, ISR %v", tp, c.isr)
		}
		return false
	}
	s.lead(tp, cands[s.rng.IntN(len(cands))], isr)
	return true
}

// lead makes id the leader of tp at the next epoch with the given ISR,
// and sends the roles.
func (s *sim) lead(tp TopicPartition, id int32, isr []int32) {
	c := s.ctrl[tp]
	c.epoch++
	s.stats.elections++
	c.leader, c.isr = id, isr
	s.logf("ctrl: %s leader %d epoch %d ISR %v", tp, c.leader, c.epoch, c.isr)
	s.sendRoles(tp)
}

// sendRoles sends tp's current roles to every live node.
func (s *sim) sendRoles(tp TopicPartition) {
	for _, n := range s.nodes {
		if n.up {
			s.sendRole(tp, n)
		}
	}
}

func (s *sim) sendRole(tp TopicPartition, n *simNode) {
	c := s.ctrl[tp]
	if c.leader < 0 {
		return
	}
	r := simRole{tp: tp, leader: c.leader == n.id, epoch: c.epoch, leaderID: c.leader}
	if r.leader {
		r.replicas, r.isr = slices.Clone(s.replicas), slices.Clone(c.isr)
	}
	s.push(&simMsg{kind: msgRole, to: n.id, inc: n.inc, role: r})
}

func (s *sim) electDead() {
	for _, tp := range s.tps {
		if c := s.ctrl[tp]; c.leader < 0 || !s.nodes[c.leader].up {
			s.elect(tp, -1)
		}
	}
}

// --- network ---

func (s *sim) push(m *simMsg) int64 {
	s.msgID++
	m.id = s.msgID
	s.pool = append(s.pool, m)
	return m.id
}

func (s *sim) isSplit(a, b int32) bool { return s.split[[2]int32{min(a, b), max(a, b)}] }

// deliver takes message i out of the pool and delivers it; in the chaos
// phase a fetch or a response may be dropped, and any message duplicated
// (the copy stays in the pool, to arrive later).
func (s *sim) deliver(i int) {
	m := s.pool[i]
	s.pool = slices.Delete(s.pool, i, i+1)
	if !s.healing {
		if m.kind != msgRole && s.rng.Float64() < s.p.dropRate {
			s.stats.drops++
			s.logf("net: drop msg %d kind %d %d->%d", m.id, m.kind, m.from, m.to)
			return
		}
		if s.rng.Float64() < s.p.dupRate {
			s.pool = append(s.pool, m)
			s.stats.dups++
			s.logf("net: duplicate msg %d", m.id)
		}
	}
	switch m.kind {
	case msgFetch:
		s.deliverFetch(m)
	case msgFetchResp:
		s.deliverResp(m)
	case msgRole:
		s.deliverRole(m)
	}
}

func (s *sim) deliverAll() {
	for i := 0; len(s.pool) > 0 && s.err == nil; i++ {
		if i > 10000 {
			s.failf("message pool does not drain")
			return
		}
		s.deliver(0)
	}
}

func (s *sim) deliverFetch(m *simMsg) {
	to := s.nodes[m.to]
	if !to.up || s.isSplit(m.from, m.to) {
		s.logf("net: fetch %d %d->%d lost (down or split)", m.id, m.from, m.to)
		return
	}
	resp, err := to.node.HandleFetch(m.req, s.now())
	if err != nil {
		s.failf("node %d HandleFetch: %v", m.to, err)
		return
	}
	if err := resp.Materialize(); err != nil {
		s.failf("node %d Materialize: %v", m.to, err)
		return
	}
	var sb strings.Builder
	for i, pr := range resp.Partitions {
		fp := m.req.Partitions[i]
		fmt.Fprintf(&sb, " [%d e%d off%d last%d -> err%d hw%d leo%d bytes%d", fp.Partition, fp.CurrentLeaderEpoch,
			fp.FetchOffset, fp.LastFetchedEpoch, pr.Error, pr.HighWatermark, pr.LogEndOffset, len(pr.Records))
		if pr.Diverging != nil {
			s.stats.divergences++
			fmt.Fprintf(&sb, " div%d@%d", pr.Diverging.Epoch, pr.Diverging.EndOffset)
		}
		sb.WriteString("]")
	}
	s.logf("fetch %d %d->%d:%s", m.id, m.from, m.to, sb.String())
	s.push(&simMsg{kind: msgFetchResp, from: m.to, to: m.from, inc: m.inc, reqID: m.id, req: m.req, resp: resp})
}

func (s *sim) deliverResp(m *simMsg) {
	to := s.nodes[m.to]
	if !to.up || to.inc != m.inc || s.isSplit(m.from, m.to) {
		s.logf("net: response %d %d->%d lost", m.reqID, m.from, m.to)
		return
	}
	if inf, ok := to.inflight[m.from]; ok && inf.id == m.reqID {
		delete(to.inflight, m.from)
	}
	n, err := to.node.HandleFetchResponse(m.from, m.req, m.resp, s.now())
	if err != nil {
		s.failf("node %d HandleFetchResponse from %d: %v", m.to, m.from, err)
		return
	}
	s.logf("node %d applied response %d: %d bytes", m.to, m.reqID, n)
}

func (s *sim) deliverRole(m *simMsg) {
	to := s.nodes[m.to]
	if !to.up || to.inc != m.inc {
		return
	}
	r := m.role
	var err error
	if r.leader {
		err = to.node.BecomeLeader(r.tp, r.epoch, r.replicas, r.isr, s.now())
	} else {
		err = to.node.BecomeFollower(r.tp, r.epoch, r.leaderID)
	}
	switch {
	case errors.Is(err, ErrStaleEpoch):
		s.stats.staleRoles++
		s.logf("node %d refused stale role %+v", m.to, r)
		return
	case err != nil:
		s.failf("node %d role %+v: %v", m.to, r, err)
		return
	}
	s.logf("node %d role %+v", m.to, r)
	if r.leader {
		k := simEpochKey{r.tp, r.epoch}
		if prev, ok := s.epochLeader[k]; ok && prev != m.to {
			s.failf("%s epoch %d has two leaders: %d and %d", r.tp, r.epoch, prev, m.to)
		}
		s.epochLeader[k] = m.to
	}
}

// fetch sends n's fetches to every leader it follows that has no fetch
// outstanding (or only a timed-out one), as its fetchers would.
func (s *sim) fetch(n *simNode) {
	for _, leader := range n.node.Leaders() {
		if inf, ok := n.inflight[leader]; ok && s.now().Sub(inf.sent) < simFetchTimeout {
			continue
		}
		req := n.node.BuildFetch(leader, s.now())
		if req == nil {
			continue
		}
		id := s.push(&simMsg{kind: msgFetch, from: n.id, to: leader, inc: n.inc, req: req})
		n.inflight[leader] = simInflight{id: id, sent: s.now()}
	}
}

// --- clients ---

func (s *sim) newBatch(c *simClient) *simBatch {
	bb := log.NewBatchBuilder()
	if c.pid != log.NoProducerID {
		bb.Reset(log.BatchOptions{Idempotent: true, ProducerID: c.pid, ProducerEpoch: 0, BaseSequence: c.seq})
	}
	b := &simBatch{seq: c.seq}
	ts := s.now().UnixMilli()
	for i, n := 0, 1+s.rng.IntN(3); i < n; i++ {
		v := fmt.Sprintf("c%d.b%d.r%d", c.id, c.batchNo, i)
		if s.p.rolls {
			v += "." + strings.Repeat("x", s.rng.IntN(120))
		}
		b.values = append(b.values, v)
		bb.Add(ts, nil, []byte(v))
	}
	c.batchNo++
	var err error
	if b.bytes, err = bb.Build(nil); err != nil {
		s.failf("build batch: %v", err)
	}
	return b
}

// produce sends c's batch (a new one, or the one to retry) to the node c
// believes leads its partition, as Replicator.Produce with acks=all: the
// append, then (in a later step, see runSync) the leader's fsync and high
// watermark update, then the wait for the high watermark (checkAcks).
func (s *sim) produce(c *simClient) {
	if c.waiting != nil {
		return
	}
	if c.cur == nil {
		if s.healing {
			return
		}
		c.cur = s.newBatch(c)
	}
	ctl := s.ctrl[c.tp]
	target := ctl.leader
	if !s.healing && s.rng.Float64() < s.p.staleClientRate {
		target = int32(s.rng.IntN(len(s.nodes)))
	}
	if target < 0 || !s.nodes[target].up {
		s.clientFailed(c, true, "no leader reachable")
		return
	}
	n := s.nodes[target]
	info, p, ctx, err := n.node.appendAsLeader(c.tp, bytes.Clone(c.cur.bytes), AcksAll, s.now())
	switch {
	case errors.Is(err, ErrNotLeader), errors.Is(err, ErrNotEnoughReplicas):
		if errors.Is(err, ErrNotEnoughReplicas) {
			s.stats.notEnoughReplicas++
		}
		s.clientFailed(c, true, fmt.Sprintf("node %d: %v", target, err))
		return
	case errors.Is(err, log.ErrOutOfOrderSequence):
		np := n.node.partition(c.tp)
		np.mu.Lock()
		current := np.role == RoleLeader && np.epoch == ctl.epoch && target == ctl.leader
		np.mu.Unlock()
		if current {
			s.failf("current leader %d of %s refused client %d seq %d: %v", target, c.tp, c.id, c.cur.seq, err)
			return
		}
		s.clientFailed(c, true, fmt.Sprintf("node %d (not the current leader): %v", target, err))
		return
	case err != nil:
		s.failf("node %d produce: %v", target, err)
		return
	}
	if got, want := info.LastOffset-info.FirstOffset+1, int64(len(c.cur.values)); got != want {
		s.failf("append of %d records got offsets %d..%d", want, info.FirstOffset, info.LastOffset)
		return
	}
	s.logf("client %d produced seq %d to node %d: offsets %d..%d dup=%v", c.id, c.cur.seq, target,
		info.FirstOffset, info.LastOffset, info.Duplicate)
	w := &simProduce{client: c, node: target, inc: n.inc, tp: c.tp, info: info, p: p, ctx: ctx}
	c.waiting = w
	s.syncs = append(s.syncs, w)
	if s.p.rolls {
		s.runSync(len(s.syncs) - 1)
	}
}

// runSync is the rest of Replicator.Produce after the append: the
// leader's fsync, then the high watermark update under the partition
// lock.
func (s *sim) runSync(i int) {
	w := s.syncs[i]
	s.syncs = slices.Delete(s.syncs, i, i+1)
	n := s.nodes[w.node]
	if !n.up || n.inc != w.inc {
		return
	}
	if !s.p.relaxed {
		if err := w.p.log.Sync(); err != nil {
			s.failf("node %d sync: %v", w.node, err)
			return
		}
		w.p.mu.Lock()
		n.node.maybeAdvanceHW(w.p, s.now())
		w.p.mu.Unlock()
	}
	w.synced = true
	s.logf("node %d synced produce of client %d (durable %d)", w.node, w.client.id, w.p.log.DurableOffset())
}

// checkAcks answers the produces whose high watermark passed, and fails
// those whose leader crashed or lost the leadership first.
func (s *sim) checkAcks() {
	for _, c := range s.clients {
		w := c.waiting
		if w == nil {
			continue
		}
		n := s.nodes[w.node]
		switch {
		case !n.up || n.inc != w.inc:
			s.clientFailed(c, false, "leader crashed")
		case !w.synced:
		case w.ctx.Err() != nil:
			s.clientFailed(c, false, "leadership lost")
		case w.p.log.HighWatermark() > w.info.LastOffset:
			s.ack(c, w)
		}
	}
}

func (s *sim) ack(c *simClient, w *simProduce) {
	acked := s.acked[w.tp]
	for i, v := range c.cur.values {
		off := w.info.FirstOffset + int64(i)
		if prev, ok := acked[off]; ok && prev != v {
			s.failf("%s offset %d acknowledged as %q, earlier as %q", w.tp, off, v, prev)
		}
		acked[off] = v
	}
	s.stats.acks++
	if w.info.Duplicate {
		s.stats.dupAcks++
	}
	if !s.healing && s.rng.Float64() < s.p.ackLossRate {
		s.logf("client %d: ack of seq %d at %d lost", c.id, c.cur.seq, w.info.FirstOffset)
		s.clientFailed(c, false, "ack lost")
		return
	}
	s.logf("client %d: acked seq %d at %d..%d", c.id, c.cur.seq, w.info.FirstOffset, w.info.LastOffset)
	if c.pid != log.NoProducerID {
		c.seq += int32(len(c.cur.values))
	}
	c.cur, c.waiting = nil, nil
}

// clientFailed ends c's wait. definite says the append certainly did not
// happen; otherwise only an idempotent producer may send the batch again.
func (s *sim) clientFailed(c *simClient, definite bool, why string) {
	s.logf("client %d: seq %d failed: %s", c.id, c.cur.seq, why)
	c.waiting = nil
	if !definite && c.pid == log.NoProducerID {
		c.cur = nil
	}
}

// deleteRecords has a partition's leader delete its records below a
// committed offset, as Kafka's DeleteRecords does; its followers delete
// them as they fetch. The records may come back if another replica, one
// that had not yet deleted them, becomes leader.
func (s *sim) deleteRecords() {
	tp := s.tps[s.rng.IntN(len(s.tps))]
	id := s.ctrl[tp].leader
	if id < 0 || !s.nodes[id].up {
		return
	}
	n := s.nodes[id]
	p := n.node.partition(tp)
	p.mu.Lock()
	lead := p.role == RoleLeader
	p.mu.Unlock()
	l := n.logs[tp]
	start, hw := l.LogStartOffset(), l.HighWatermark()
	if !lead || hw <= start {
		return
	}
	off := start + 1 + s.rng.Int64N(hw-start)
	if err := l.DeleteRecordsBefore(off); err != nil {
		s.failf("node %d: %s: delete records before %d: %v", n.id, tp, off, err)
		return
	}
	s.deleted[tp] = max(s.deleted[tp], off)
	s.stats.deletes++
	s.logf("node %d: %s: records before %d deleted", n.id, tp, off)
}

// --- faults ---

func (s *sim) crash(n *simNode) {
	opts := vfs.CrashOptions{Seed: s.rng.Int64()}
	if s.p.keepUnsynced && s.rng.IntN(2) == 0 {
		opts.KeepUnsynced = s.rng.Float64()
		opts.ZeroSectors = s.rng.Float64() * 0.3
		opts.KeepDirOps = s.rng.Float64()
	}
	clone := n.fs.CrashClone(opts)
	s.closeLogs(n)
	n.fs, n.up, n.node = clone, false, nil
	n.inc++
	s.crashes++
	s.stats.crashes++
	s.logf("node %d crashed (%+v)", n.id, opts)
}

func (s *sim) restart(n *simNode) {
	n.up = true
	if err := s.openNode(n); err != nil {
		s.failf("restart node %d: %v", n.id, err)
		return
	}
	var st strings.Builder
	for _, tp := range s.tps {
		l := n.logs[tp]
		fmt.Fprintf(&st, " %s leo %d epochs %v", tp, l.LogEndOffset(), l.LeaderEpochs())
	}
	s.logf("node %d restarted:%s", n.id, st.String())
	for _, tp := range s.tps {
		if c := s.ctrl[tp]; c.leader == n.id || c.leader < 0 || !s.nodes[c.leader].up {
			s.elect(tp, -1)
		} else {
			s.sendRole(tp, n)
		}
	}
}

func (s *sim) tick() {
	for _, n := range s.nodes {
		if n.up {
			var events []string
			s.held = &events
			n.node.Tick(s.now())
			s.held = nil
			slices.Sort(events)
			for _, e := range events {
				s.record(e)
			}
		}
	}
}

// --- invariants ---

func (s *sim) checkInvariants() {
	for _, n := range s.nodes {
		if !n.up {
			continue
		}
		for _, tp := range s.tps {
			p := n.node.partition(tp)
			p.mu.Lock()
			role, epoch, isr := p.role, p.epoch, slices.Clone(p.isr)
			p.mu.Unlock()
			l := n.logs[tp]
			s.hashInts(int64(n.id), int64(n.inc), int64(role), int64(epoch), l.LogEndOffset(), l.HighWatermark())
			if prev, ok := n.epochs[tp]; ok && epoch < prev {
				s.failf("node %d %s epoch went from %d to %d", n.id, tp, prev, epoch)
			}
			n.epochs[tp] = epoch
			if role != RoleLeader {
				continue
			}
			hw := l.HighWatermark()
			k := simLeaderKey{int(n.id), n.inc, tp, epoch}
			if prev, ok := s.leaderHW[k]; ok && hw < prev {
				s.failf("leader %d of %s epoch %d: high watermark went from %d to %d", n.id, tp, epoch, prev, hw)
			}
			s.leaderHW[k] = hw
			if s.p.relaxed {
				continue
			}
			for _, id := range isr {
				m := s.nodes[id]
				if !m.up {
					continue
				}
				// Records below the leader's start, or below any start a
				// leader deleted to (a later leader may not have followed
				// it), are deleted: a member may lack them.
				if d := m.logs[tp].DurableOffset(); hw > max(d, l.LogStartOffset(), s.deleted[tp]) {
					s.failf("leader %d of %s epoch %d: high watermark %d above the durable end %d of ISR member %d (ISR %v)",
						n.id, tp, epoch, hw, d, id, isr)
				}
			}
		}
	}
}

// --- the run ---

type simAction struct {
	weight float64
	do     func()
}

func (s *sim) chaosStep() {
	s.step++
	s.advance(time.Duration(s.rng.IntN(4)) * time.Millisecond)
	s.refuseISR = s.rng.Float64() < 0.03
	var live, dead []*simNode
	for _, n := range s.nodes {
		if n.up {
			live = append(live, n)
		} else {
			dead = append(dead, n)
		}
	}
	pick := func(ns []*simNode) *simNode { return ns[s.rng.IntN(len(ns))] }
	actions := []simAction{
		{35, func() {
			if len(s.pool) > 0 {
				s.deliver(s.rng.IntN(len(s.pool)))
			}
		}},
		{20, func() {
			if len(live) > 0 {
				s.fetch(pick(live))
			}
		}},
		{20, func() { s.produce(s.clients[s.rng.IntN(len(s.clients))]) }},
		{8, func() {
			if len(s.syncs) > 0 {
				s.runSync(s.rng.IntN(len(s.syncs)))
			}
		}},
		{6, func() {
			s.advance(time.Duration(10+s.rng.IntN(100)) * time.Millisecond)
			s.tick()
		}},
		{1, func() {
			if c := s.clients[s.rng.IntN(len(s.clients))]; c.waiting != nil {
				s.clientFailed(c, false, "timeout")
			}
		}},
		{s.p.wCrash, func() {
			if s.crashes < s.p.crashes && len(live) > 1 {
				s.crash(pick(live))
			}
		}},
		{3, func() {
			if len(dead) > 0 {
				s.restart(pick(dead))
			}
		}},
		{3, s.electDead},
		{s.p.wFailover, func() {
			tp := s.tps[s.rng.IntN(len(s.tps))]
			for i, n := 0, 1+s.rng.IntN(4); i < n; i++ { // S12: fast repeated failover
				s.elect(tp, s.ctrl[tp].leader)
			}
		}},
		{s.p.wDelete, s.deleteRecords},
		{s.p.wSplit, func() {
			a, b := int32(s.rng.IntN(len(s.nodes))), int32(s.rng.IntN(len(s.nodes)))
			if a != b {
				k := [2]int32{min(a, b), max(a, b)}
				s.split[k] = !s.split[k]
				s.logf("net: split %v %v", k, s.split[k])
			}
		}},
	}
	total := 0.0
	for _, a := range actions {
		total += a.weight
	}
	x := s.rng.Float64() * total
	for _, a := range actions {
		if x < a.weight {
			a.do()
			break
		}
		x -= a.weight
	}
	s.checkAcks()
	s.checkInvariants()
}

// healRound runs one round without faults: every node up, every message
// delivered in order, every produce synced, every client retrying.
func (s *sim) healRound() {
	s.step++
	s.advance(10 * time.Millisecond)
	for _, n := range s.nodes {
		if !n.up {
			s.restart(n)
		}
	}
	s.electDead()
	for len(s.syncs) > 0 {
		s.runSync(0)
	}
	s.tick()
	for _, c := range s.clients {
		s.produce(c)
	}
	s.deliverAll()
	for _, n := range s.nodes {
		s.fetch(n)
	}
	s.deliverAll()
	s.checkAcks()
	s.checkInvariants()
}

// converged reports whether every client is done and every partition has
// its leader, a full ISR and replicas at the same log end and high
// watermark.
func (s *sim) converged() bool {
	for _, c := range s.clients {
		if c.cur != nil {
			return false
		}
	}
	for _, tp := range s.tps {
		c := s.ctrl[tp]
		if c.leader < 0 || len(c.isr) != len(s.nodes) {
			return false
		}
		leo := s.nodes[c.leader].logs[tp].LogEndOffset()
		for _, n := range s.nodes {
			p := n.node.partition(tp)
			p.mu.Lock()
			ok := p.epoch == c.epoch && (p.role == RoleLeader) == (n.id == c.leader) && p.role != RoleNone
			p.mu.Unlock()
			l := n.logs[tp]
			if !ok || l.LogEndOffset() != leo || l.HighWatermark() != leo {
				return false
			}
		}
	}
	return true
}

// run executes the whole simulation and returns the first violation.
func (s *sim) run() error {
	defer s.close()
	s.start()
	for i := 0; i < s.p.chaosSteps && s.err == nil; i++ {
		s.chaosStep()
	}
	return s.healAndCheck()
}

// healAndCheck removes every fault, runs until convergence and checks the
// final logs.
func (s *sim) healAndCheck() error {
	s.healing, s.refuseISR = true, false
	s.split = map[[2]int32]bool{}
	s.logf("heal")
	ok := false
	for i := 0; i < s.p.healRounds && s.err == nil; i++ {
		s.healRound()
		if ok = s.converged(); ok {
			break
		}
	}
	if s.err != nil {
		return s.err
	}
	if !ok {
		s.describe()
		return fmt.Errorf("no convergence after %d heal rounds", s.p.healRounds)
	}
	s.finalCheck()
	return s.err
}

// describe logs every node's state, for a failure report.
func (s *sim) describe() {
	for _, tp := range s.tps {
		c := s.ctrl[tp]
		s.logf("ctrl %s: epoch %d leader %d isr %v", tp, c.epoch, c.leader, c.isr)
		for _, n := range s.nodes {
			if !n.up {
				continue
			}
			p := n.node.partition(tp)
			p.mu.Lock()
			s.logf("node %d %s: role %d epoch %d leader %d isr %v leo %d hw %d durable %d epochs %v",
				n.id, tp, p.role, p.epoch, p.leader, p.isr, p.log.LogEndOffset(), p.log.HighWatermark(),
				p.log.DurableOffset(), p.log.LeaderEpochs())
			p.mu.Unlock()
		}
	}
	for _, c := range s.clients {
		if c.cur != nil {
			s.logf("client %d: seq %d not acknowledged", c.id, c.cur.seq)
		}
	}
}

// finalCheck compares the replicas' logs and checks every acknowledged
// record, dense offsets and at-most-once storage.
func (s *sim) finalCheck() {
	for _, tp := range s.tps {
		// Replicas may start at different offsets: one that deleted
		// records before it lost its leadership to one that had not.
		// They must agree from the highest start on.
		var start int64
		for _, n := range s.nodes {
			start = max(start, n.logs[tp].LogStartOffset())
		}
		var first []byte
		for _, n := range s.nodes {
			l := n.logs[tp]
			data, err := readAll(l)
			if err != nil {
				s.failf("node %d read %s: %v", n.id, tp, err)
				return
			}
			s.trace.Write(data)
			if n.id == 0 {
				s.checkLog(tp, l.LogStartOffset(), l.LogEndOffset(), data)
			}
			if data, err = batchesFrom(data, start); err != nil {
				s.failf("node %d read %s: %v", n.id, tp, err)
				return
			}
			if n.id == 0 {
				first = data
			} else if !bytes.Equal(first, data) {
				s.failf("%s: node %d's log differs from node 0's from offset %d (%d and %d bytes)", tp, n.id, start, len(data), len(first))
			}
		}
	}
}

// batchesFrom returns the batches of data that end at or after off.
func batchesFrom(data []byte, off int64) ([]byte, error) {
	for rest := data; len(rest) > 0; {
		b, r, err := log.SplitBatch(rest)
		if err != nil {
			return nil, err
		}
		if b.LastOffset() >= off {
			return rest, nil
		}
		rest = r
	}
	return nil, nil
}

// readAll returns every batch of l, across all its segments.
func readAll(l *log.Log) ([]byte, error) {
	var data []byte
	for off := l.LogStartOffset(); off < l.LogEndOffset(); {
		n := len(data)
		var err error
		if data, err = l.Read(data, off, log.ReadOptions{MaxBytes: 1 << 20}); err != nil {
			return nil, err
		}
		if len(data) == n {
			return nil, fmt.Errorf("read at %d returned nothing, log end %d", off, l.LogEndOffset())
		}
		for rest := data[n:]; len(rest) > 0; {
			b, r, err := log.SplitBatch(rest)
			if err != nil {
				return nil, err
			}
			off, rest = b.NextOffset(), r
		}
	}
	return data, nil
}

func (s *sim) checkLog(tp TopicPartition, start, end int64, data []byte) {
	values := map[int64]string{}
	seen := map[string]int64{}
	type pes struct {
		pid   int64
		epoch int16
		seq   int32
	}
	seqs := map[pes]int64{}
	next := start
	for rest := data; len(rest) > 0; {
		b, r, err := log.SplitBatch(rest)
		if err != nil {
			s.failf("%s: %v", tp, err)
			return
		}
		rest = r
		// The first batch may begin below a start that DeleteRecordsBefore
		// put inside it.
		if b.BaseOffset() != next && (next != start || b.BaseOffset() > start || b.LastOffset() < start) {
			s.failf("%s: batch [%d, %d], expected one at %d", tp, b.BaseOffset(), b.LastOffset(), next)
		}
		next = b.NextOffset()
		if b.ProducerID() != log.NoProducerID {
			k := pes{b.ProducerID(), b.ProducerEpoch(), b.BaseSequence()}
			if at, ok := seqs[k]; ok {
				s.failf("%s: producer %d epoch %d seq %d stored at %d and %d", tp, k.pid, k.epoch, k.seq, at, b.BaseOffset())
			}
			seqs[k] = b.BaseOffset()
		}
		it := b.Records()
		for it.Next() {
			rec := it.Record()
			v := string(rec.Value)
			if at, ok := seen[v]; ok {
				s.failf("%s: value %q stored at %d and %d", tp, v, at, rec.Offset)
			}
			seen[v] = rec.Offset
			values[rec.Offset] = v
		}
		if err := it.Err(); err != nil {
			s.failf("%s: %v", tp, err)
		}
	}
	if next != end {
		s.failf("%s: batches end at %d, log end offset %d", tp, next, end)
	}
	offs := make([]int64, 0, len(s.acked[tp]))
	for off := range s.acked[tp] {
		offs = append(offs, off)
	}
	slices.Sort(offs)
	for _, off := range offs {
		if off < s.deleted[tp] {
			continue // deleted, or back with a leader that had not deleted it
		}
		if got, want := values[off], s.acked[tp][off]; got != want {
			s.failf("%s: acknowledged record %q at offset %d lost (found %q)", tp, want, off, got)
		}
	}
}

// --- tests ---

// simSeeds is how many seeds a CI run covers (RELIABILITY.md: at least
// 500); REPLOG_SIM_SEEDS and REPLOG_SIM_SEED_BASE explore more.
func simSeeds(t *testing.T) (base, count uint64) {
	t.Helper()
	base, count = 1, 500
	if v := os.Getenv("REPLOG_SIM_SEEDS"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err)
		count = n
	}
	if v := os.Getenv("REPLOG_SIM_SEED_BASE"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err)
		base = n
	}
	return base, count
}

func reportSim(t *testing.T, s *sim, err error) {
	t.Helper()
	if err == nil {
		return
	}
	t.Errorf("seed %d: %v\nparams: %+v\nreplay: go test ./replication/ -run '^TestSimulation$/^seed=%d$' -v (REPLOG_SIM_EVENTS=100000 prints every event)\nlast events:\n  %s",
		s.p.seed, err, s.p, s.p.seed, strings.Join(s.events, "\n  "))
}

func TestSimulation(t *testing.T) {
	base, count := simSeeds(t)
	var mu sync.Mutex
	var total simStats
	t.Cleanup(func() { t.Logf("%d seeds from %d: %+v", count, base, total) })
	for seed := base; seed < base+count; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			s := newSim(simParamsFor(seed))
			reportSim(t, s, s.run())
			mu.Lock()
			total.add(s.stats)
			mu.Unlock()
		})
	}
}

// simRegressionSeeds are seeds, beyond the first simSeeds, that found
// bugs; every run checks them again.
var simRegressionSeeds = []uint64{
	60045560,  // a retry answered from a batch below the log start (log: truncateHead)
	150140823, // a follower joined the ISR with records below the leader's log start
}

func TestSimulationRegressions(t *testing.T) {
	for _, seed := range simRegressionSeeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			s := newSim(simParamsFor(seed))
			reportSim(t, s, s.run())
		})
	}
}

// TestSimulationReplay runs seeds twice: the same seed gives the same
// trace (every event, and every node's state after every step). The
// seeds cover both crash models, one and two partitions.
func TestSimulationReplay(t *testing.T) {
	var seeds []uint64
	for _, want := range []func(p simParams) bool{
		func(p simParams) bool { return p.rolls && p.crashes > 1 && p.wDelete == 0 },
		func(p simParams) bool { return !p.rolls && p.crashes > 1 && p.partitions == 2 && p.wDelete == 0 },
		func(p simParams) bool {
			return !p.rolls && p.crashes > 1 && p.partitions == 1 && p.dupRate > 0.03 && p.wDelete == 0
		},
		func(p simParams) bool { return p.crashes > 2 && p.wDelete > 0.5 },
	} {
		seed := uint64(1)
		for !want(simParamsFor(seed)) {
			seed++
		}
		seeds = append(seeds, seed)
	}
	for _, seed := range seeds {
		var sums []uint64
		var stats []simStats
		for range 2 {
			s := newSim(simParamsFor(seed))
			reportSim(t, s, s.run())
			sums = append(sums, s.trace.Sum64())
			stats = append(stats, s.stats)
		}
		require.Equal(t, sums[0], sums[1], "seed %d replayed differently", seed)
		require.Equal(t, stats[0], stats[1], "seed %d replayed differently", seed)
		require.Positive(t, stats[0].acks, "seed %d acknowledged nothing", seed)
		require.Positive(t, stats[0].crashes, "seed %d crashed nothing", seed)
	}
}

// --- scripted scenarios ---

// newScenario returns a started sim for a scripted test: no random
// faults, one partition, node 0 leading at epoch 1.
func newScenario(t *testing.T, p simParams) *sim {
	t.Helper()
	p.partitions = 1
	if p.healRounds == 0 {
		p.healRounds = 300
	}
	if p.fetchMaxBytes == 0 {
		p.fetchMaxBytes = 1 << 20
	}
	s := newSim(p)
	t.Cleanup(s.close)
	s.start()
	s.requireOK(t)
	return s
}

// requireOK answers produces and checks the invariants, as a step does.
func (s *sim) requireOK(t *testing.T) {
	t.Helper()
	s.checkAcks()
	s.checkInvariants()
	if s.err != nil {
		t.Fatalf("%v\nlast events:\n  %s", s.err, strings.Join(s.events, "\n  "))
	}
}

// fetchRound has the given nodes fetch and delivers everything.
func (s *sim) fetchRound(ids ...int32) {
	for _, id := range ids {
		if n := s.nodes[id]; n.up {
			s.fetch(n)
		}
	}
	s.deliverAll()
}

func (s *sim) liveIDs() []int32 {
	var ids []int32
	for _, n := range s.nodes {
		if n.up {
			ids = append(ids, n.id)
		}
	}
	return ids
}

// deliverWhere delivers, in order, the messages now in the pool that
// match, and drops those that match drop.
func (s *sim) deliverWhere(deliver, drop func(*simMsg) bool) {
	pending := s.pool
	s.pool = nil
	for _, m := range pending {
		switch {
		case deliver(m):
			s.pool = append([]*simMsg{m}, s.pool...)
			s.deliver(0)
		case drop(m):
			s.logf("scenario: drop msg %d", m.id)
		default:
			s.pool = append(s.pool, m)
		}
	}
}

// produceAcked sends c's next batch and runs rounds until it is
// acknowledged.
func (s *sim) produceAcked(t *testing.T, c *simClient) {
	t.Helper()
	if c.cur == nil {
		c.cur = s.newBatch(c)
	}
	for i := 0; c.cur != nil; i++ {
		if i == 20 {
			t.Fatalf("client %d: batch not acknowledged\nlast events:\n  %s", c.id, strings.Join(s.events, "\n  "))
		}
		s.produce(c)
		for len(s.syncs) > 0 {
			s.runSync(0)
		}
		s.deliverAll()
		s.fetchRound(s.liveIDs()...)
		s.requireOK(t)
	}
}

// appendOn appends one record to node id's log as leader, bypassing the
// clients.
func (s *sim) appendOn(t *testing.T, id int32, value string, acks Acks) log.AppendInfo {
	t.Helper()
	bb := log.NewBatchBuilder()
	bb.Add(s.now().UnixMilli(), nil, []byte(value))
	b, err := bb.Build(nil)
	require.NoError(t, err)
	info, _, _, err := s.nodes[id].node.appendAsLeader(s.tps[0], b, acks, s.now())
	require.NoError(t, err)
	return info
}

// valueAt returns the value of the record at off in n's log.
func (s *sim) valueAt(t *testing.T, n *simNode, off int64) string {
	t.Helper()
	data, err := n.logs[s.tps[0]].Read(nil, off, log.ReadOptions{})
	require.NoError(t, err)
	b, _, err := log.SplitBatch(data)
	require.NoError(t, err)
	for it := b.Records(); it.Next(); {
		if it.Record().Offset == off {
			return string(it.Record().Value)
		}
	}
	t.Fatalf("node %d has no record at %d", n.id, off)
	return ""
}

// crashKeeping crashes n after its page cache was written back: every
// unsynced byte survives (the same on disk as an fsync just before the
// power loss).
func (s *sim) crashKeeping(t *testing.T, n *simNode) {
	t.Helper()
	for _, tp := range s.tps {
		require.NoError(t, n.logs[tp].Sync())
	}
	s.crash(n)
}

// requireReadersBelowHW checks that reads up to the high watermark return
// nothing above it, on every live node.
func (s *sim) requireReadersBelowHW(t *testing.T) {
	t.Helper()
	for _, n := range s.nodes {
		if !n.up {
			continue
		}
		l := n.logs[s.tps[0]]
		data, err := l.Read(nil, l.LogStartOffset(), log.ReadOptions{UpToHighWatermark: true})
		require.NoError(t, err)
		end := l.LogStartOffset()
		for rest := data; len(rest) > 0; {
			b, tail, err := log.SplitBatch(rest)
			require.NoError(t, err)
			end, rest = b.NextOffset(), tail
		}
		require.LessOrEqual(t, end, l.HighWatermark(), "node %d: a reader saw data above the high watermark", n.id)
	}
}

// S10, KIP-101 case 1: a follower has a record whose high watermark it
// has not learned, restarts, and leads once the leader dies: the record
// survives (truncation uses leader epochs, never the local high
// watermark).
func TestScenarioS10FollowerRestartsBeforeItsHighWatermark(t *testing.T) {
	s := newScenario(t, simParams{seed: 10, nodes: 2, idemClients: 1})
	tp, c := s.tps[0], s.clients[0]
	a, b := s.nodes[0], s.nodes[1]
	s.produceAcked(t, c) // m1
	end1 := a.logs[tp].LogEndOffset()

	s.produce(c) // m2
	s.runSync(0)
	end2 := a.logs[tp].LogEndOffset()
	s.fetchRound(1)
	require.Equal(t, end2, b.logs[tp].LogEndOffset())
	s.fetch(b) // reports end2: the leader's HW passes m2, but the answer is lost
	isFetch := func(m *simMsg) bool { return m.kind == msgFetch }
	isResp := func(m *simMsg) bool { return m.kind == msgFetchResp }
	s.deliverWhere(isFetch, func(*simMsg) bool { return false })
	s.deliverWhere(func(*simMsg) bool { return false }, isResp)
	s.requireOK(t)
	require.Nil(t, c.cur, "m2 acknowledged")
	require.Equal(t, end2, a.logs[tp].HighWatermark())
	require.Equal(t, end1, b.logs[tp].HighWatermark(), "b has not learned the high watermark")

	s.crash(b)
	s.restart(b)
	s.deliverAll()
	s.requireOK(t)
	require.Equal(t, end2, b.logs[tp].LogEndOffset(), "b keeps what it fsynced")

	s.crash(a)
	s.electDead()
	s.deliverAll()
	s.requireOK(t)
	require.Equal(t, int32(1), s.ctrl[tp].leader)
	for off := end1; off < end2; off++ {
		require.Equal(t, s.acked[tp][off], s.valueAt(t, b, off))
	}
	require.NoError(t, s.healAndCheck())
	for off := end1; off < end2; off++ {
		require.Equal(t, s.acked[tp][off], s.valueAt(t, a, off))
	}
}

// S11, KIP-101 case 2: both replicas crash with different unsynced tails;
// the shorter comes back first and leads: the logs converge batch for
// batch.
func TestScenarioS11ShorterReplicaLeads(t *testing.T) {
	for _, relaxed := range []bool{false, true} {
		t.Run(fmt.Sprintf("relaxed=%v", relaxed), func(t *testing.T) {
			s := newScenario(t, simParams{seed: 11, nodes: 2, relaxed: relaxed, fetchMaxBytes: 1})
			tp := s.tps[0]
			a, b := s.nodes[0], s.nodes[1]
			s.appendOn(t, 0, "m1", AcksLeader)
			require.NoError(t, a.logs[tp].Sync())
			s.fetchRound(1)
			require.NoError(t, b.logs[tp].Sync())
			s.appendOn(t, 0, "m2", AcksLeader)
			s.appendOn(t, 0, "m3", AcksLeader) // a's tail: m2, m3, unsynced
			s.fetchRound(1)                    // one batch per fetch: b's tail is m2
			require.Equal(t, int64(2), b.logs[tp].LogEndOffset())
			require.Equal(t, int64(1), a.logs[tp].DurableOffset())

			s.crashKeeping(t, a)
			s.crash(b) // keeps only what b fsynced: m2 unless relaxed
			bEnd := int64(2)
			if relaxed {
				bEnd = 1
			}
			s.restart(b) // comes back first and is elected
			s.deliverAll()
			s.requireOK(t)
			require.Equal(t, int32(1), s.ctrl[tp].leader)
			require.Equal(t, bEnd, b.logs[tp].LogEndOffset())
			s.appendOn(t, 1, "m4", AcksLeader)
			require.NoError(t, b.logs[tp].Sync())

			s.restart(a)
			require.Equal(t, int64(3), a.logs[tp].LogEndOffset())
			require.NoError(t, s.healAndCheck())
			require.Equal(t, "m4", s.valueAt(t, a, bEnd))
		})
	}
}

// S12 (EpochDrivenReplicationProtocolAcceptanceTest.shouldSurviveFastLeaderChange):
// leadership moves three times back to back, the role changes arriving
// oldest first (each leader leads briefly, without appending) or newest
// first (the older ones are refused), with an unreplicated batch on the
// leader each time: the logs converge, no offset is reused for other
// data, and each idempotent batch is stored once.
func TestScenarioS12FastRepeatedFailover(t *testing.T) {
	s := newScenario(t, simParams{seed: 12, nodes: 3, idemClients: 2})
	tp := s.tps[0]
	for round := 0; round < 8; round++ {
		s.produceAcked(t, s.clients[0])
		s.produce(s.clients[1]) // appended on the leader only
		for len(s.syncs) > 0 {
			s.runSync(0)
		}
		for i := 0; i < 3; i++ {
			require.True(t, s.elect(tp, s.ctrl[tp].leader))
		}
		if round%2 == 1 {
			slices.Reverse(s.pool)
		}
		s.deliverAll()
		s.requireOK(t)
	}
	require.Positive(t, s.stats.staleRoles)
	require.NoError(t, s.healAndCheck())
	require.Equal(t, 24, s.stats.elections)
}

// S13: the leader's high watermark never decreases and never passes the
// durable end of an ISR member, and readers never see data above it,
// through empty fetch responses, diverging epochs and follower restarts.
func TestScenarioS13HighWatermarkEdges(t *testing.T) {
	s := newScenario(t, simParams{seed: 13, nodes: 3, idemClients: 1, fetchMaxBytes: 1})
	tp, c := s.tps[0], s.clients[0]
	step := func() {
		t.Helper()
		s.requireOK(t)
		s.requireReadersBelowHW(t)
	}
	s.produceAcked(t, c)
	s.produceAcked(t, c)
	leader := s.nodes[0]
	hw := leader.logs[tp].HighWatermark()
	for i := 0; i < 3; i++ { // empty fetch responses
		s.fetchRound(1, 2)
		step()
		require.Equal(t, hw, leader.logs[tp].HighWatermark())
	}

	// Diverging epochs: the leader appends a batch nobody fetched and
	// loses its leadership; as a follower it truncates the batch.
	s.produce(c)
	s.runSync(0)
	require.True(t, s.elect(tp, 0))
	s.deliverAll()
	step()
	for i := 0; i < 6; i++ {
		s.fetchRound(0, 1, 2)
		step()
	}
	require.Positive(t, s.stats.divergences)
	s.produceAcked(t, c)

	// A follower restarts: the leader keeps its high watermark while the
	// follower, still in the ISR, comes back with its durable log.
	newLeader := s.ctrl[tp].leader
	f := s.nodes[(newLeader+1)%3]
	hw = s.nodes[newLeader].logs[tp].HighWatermark()
	s.crash(f)
	step()
	s.restart(f)
	s.deliverAll()
	step()
	for i := 0; i < 6; i++ {
		s.fetchRound(s.liveIDs()...)
		step()
		require.GreaterOrEqual(t, s.nodes[newLeader].logs[tp].HighWatermark(), hw)
	}
	require.NoError(t, s.healAndCheck())
}

// S14: with the followers cut off, the ISR shrinks below
// MinInsyncReplicas: acks=all produces fail with ErrNotEnoughReplicas, the
// high watermark stops, and nothing acknowledged is lost once they return.
func TestScenarioS14ISRBelowMinISR(t *testing.T) {
	s := newScenario(t, simParams{seed: 14, nodes: 3, idemClients: 2})
	tp := s.tps[0]
	c, c2 := s.clients[0], s.clients[1]
	leader := s.nodes[0]
	for i := 0; i < 3; i++ {
		s.produceAcked(t, c)
	}
	s.produce(c) // appended and fsynced on the leader, never fetched
	s.runSync(0)
	s.split[[2]int32{0, 1}] = true
	s.split[[2]int32{0, 2}] = true
	for i := 0; i < 8; i++ {
		s.advance(100 * time.Millisecond)
		s.tick()
		s.fetchRound(1, 2)
		s.requireOK(t)
	}
	require.Equal(t, []int32{0}, s.ctrl[tp].isr)
	l := leader.logs[tp]
	require.NotNil(t, c.cur, "not acknowledged while the ISR is below MinInsyncReplicas")
	require.Less(t, l.HighWatermark(), l.LogEndOffset())

	end := l.LogEndOffset()
	_, _, _, err := leader.node.appendAsLeader(tp, testBatch(t, "refused"), AcksAll, ntime)
	require.ErrorIs(t, err, ErrNotEnoughReplicas)
	require.Equal(t, end, l.LogEndOffset(), "a refused append writes nothing")
	s.produce(c2)
	require.Equal(t, 1, s.stats.notEnoughReplicas)
	require.Nil(t, c2.waiting)

	require.NoError(t, s.healAndCheck())
	require.Nil(t, c.cur)
	require.Nil(t, c2.cur)
}
