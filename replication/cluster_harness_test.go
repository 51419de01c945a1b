package replication

// An in-process cluster for integration tests (cluster_test.go): three
// nodes, each with its own log.Manager (few open files, small segments,
// retention), Replicator, TCPServer and TCPTransport on loopback. A test
// controller, driven by a seeded rng from the test goroutine, holds each
// partition's leader, epoch and ISR (persisted through OnISRChange), moves
// leaderships, restarts nodes (closing and reopening their Manager) and
// deletes records, while one idempotent acks=all producer per partition
// writes. The invariants are checked in cluster_check_test.go.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/log"
)

// errStaleISREpoch is the test controller's refusal of an ISR change made
// at an epoch older than the partition's current one.
var errStaleISREpoch = errors.New("test controller: ISR change at an old epoch")

// loggedLine is one WARN or ERROR record logged by a node.
type loggedLine struct {
	node  int32
	level slog.Level
	msg   string
	err   error  // the record's "err" attribute, nil without one
	text  string // the whole record, for failure messages
}

// lineRecorder collects the WARN and ERROR records of every node.
type lineRecorder struct {
	mu    sync.Mutex
	lines []loggedLine
}

// all returns a copy of the records collected so far.
func (r *lineRecorder) all() []loggedLine {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lines)
}

// recordingHandler is an slog.Handler handing one node's WARN and ERROR
// records to a lineRecorder, keeping their "err" attribute as an error so
// that the checks can classify it with errors.Is.
type recordingHandler struct {
	node int32
	rec  *lineRecorder
}

// Enabled keeps WARN and above.
func (h recordingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

// Handle records r with its attributes.
func (h recordingHandler) Handle(_ context.Context, r slog.Record) error {
	line := loggedLine{node: h.node, level: r.Level, msg: r.Message}
	var sb strings.Builder
	fmt.Fprintf(&sb, "node %d %s %q", h.node, r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && a.Key == "err" {
			line.err = err
		}
		fmt.Fprintf(&sb, " %s=%v", a.Key, a.Value)
		return true
	})
	line.text = sb.String()
	h.rec.mu.Lock()
	h.rec.lines = append(h.rec.lines, line)
	h.rec.mu.Unlock()
	return nil
}

// WithAttrs and WithGroup are unused by the package: they return h.
func (h recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordingHandler) WithGroup(string) slog.Handler      { return h }

// clusterOptions configures a testCluster.
type clusterOptions struct {
	nodes, partitions int
	maxOpenFiles      int         // each node's Manager's MaxOpenFiles
	logOpts           log.Options // every log's options
	cfg               Config      // every Replicator's (ReplicaID, OnISRChange and Logger are set per node)
}

// defaultClusterOptions is three nodes hosting partitions partitions on
// 2 KiB segments with 12 KiB retention, MinInsyncReplicas 2, and short
// fetch waits and backoffs so that failovers settle quickly.
func defaultClusterOptions(partitions int) clusterOptions {
	return clusterOptions{
		nodes: 3, partitions: partitions, maxOpenFiles: 3,
		logOpts: log.Options{SegmentBytes: 2 << 10, IndexIntervalBytes: 256, PreallocateBytes: -1,
			RetentionBytes: 12 << 10, RetentionCheckInterval: 50 * time.Millisecond, FileDeleteDelay: 30 * time.Millisecond},
		cfg: Config{ClusterID: "c", MinInsyncReplicas: 2, FetchMaxWait: 50 * time.Millisecond,
			ReplicaLagTime: time.Second, FetchBackoff: 10 * time.Millisecond},
	}
}

// clusterNode is one node of a testCluster; its fields but id and dir
// change when it restarts and are guarded by testCluster.mu.
type clusterNode struct {
	id    int32
	dir   string
	mgr   *log.Manager
	rep   *Replicator
	tr    *TCPTransport
	srv   *TCPServer
	alive bool
}

// partitionState is the controller's view of a partition.
type partitionState struct {
	leader int32 // -1: offline (no live ISR member to lead)
	epoch  int32
	isr    []int32
}

// hwKey names a leadership: a node leading a partition at an epoch.
type hwKey struct {
	node  int32
	tp    TopicPartition
	epoch int32
}

// testCluster is the nodes, the controller's state and what the checks
// collect while a scenario runs.
type testCluster struct {
	t     *testing.T
	opts  clusterOptions
	tps   []TopicPartition
	all   []int32        // every node id: each partition's assignment
	addrs []atomic.Value // node id -> its server's address ("" while down)

	mu    sync.Mutex // guards nodes' fields and ctrl
	nodes []*clusterNode
	ctrl  map[TopicPartition]*partitionState

	logged lineRecorder

	hwMu    sync.Mutex
	hwSeen  map[hwKey]int64 // the highest high watermark seen per leadership
	hwDrops []string
}

// logName is the Manager's name of tp's log.
func logName(tp TopicPartition) string { return fmt.Sprintf("%s-%d", tp.Topic, tp.Partition) }

// newTestCluster starts the nodes with empty logs and makes node i%nodes
// the leader of partition i at epoch 1 with every node in the ISR. The
// cleanup closes every live node.
func newTestCluster(t *testing.T, o clusterOptions) *testCluster {
	c := &testCluster{t: t, opts: o, addrs: make([]atomic.Value, o.nodes),
		ctrl: map[TopicPartition]*partitionState{}, hwSeen: map[hwKey]int64{}}
	for i := 0; i < o.partitions; i++ {
		c.tps = append(c.tps, TopicPartition{Topic: "t", Partition: int32(i)})
	}
	c.nodes = make([]*clusterNode, o.nodes)
	for i := range c.nodes {
		c.all = append(c.all, int32(i))
		c.nodes[i] = &clusterNode{id: int32(i), dir: t.TempDir()}
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			c.closeNode(n)
		}
	})
	for _, n := range c.nodes {
		c.openNode(n, true)
	}
	for i, tp := range c.tps {
		ld := int32(i % o.nodes)
		c.ctrl[tp] = &partitionState{leader: ld, epoch: 1, isr: slices.Clone(c.all)}
		require.NoError(t, c.nodes[ld].rep.BecomeLeader(tp, 1, c.all, c.all))
		for _, n := range c.nodes {
			if n.id != ld {
				require.NoError(t, n.rep.BecomeFollower(tp, 1, ld))
			}
		}
	}
	return c
}

// onISRChange is every node's OnISRChange: it persists the ISR of the
// partition's current epoch and refuses a change at an older one.
func (c *testCluster) onISRChange(tp TopicPartition, epoch int32, isr []int32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.ctrl[tp]
	if p == nil { // during setup
		return nil
	}
	if epoch < p.epoch {
		return fmt.Errorf("%w: %d < %d", errStaleISREpoch, epoch, p.epoch)
	}
	p.isr = slices.Clone(isr)
	return nil
}

// resolve is the transports' Resolve: a node's current server address.
func (c *testCluster) resolve(id int32) (string, error) {
	if id < 0 || int(id) >= len(c.addrs) {
		return "", fmt.Errorf("unknown node %d", id)
	}
	a, _ := c.addrs[id].Load().(string)
	if a == "" {
		return "", fmt.Errorf("node %d has no address", id)
	}
	return a, nil
}

// openNode opens n's Manager (creating its logs when create, finding them
// again otherwise), Replicator, transport and server. It must be called
// without c.mu held.
func (c *testCluster) openNode(n *clusterNode, create bool) {
	t := c.t
	mgr, err := log.OpenManager(n.dir, log.ManagerOptions{Log: c.opts.logOpts, MaxOpenFiles: c.opts.maxOpenFiles,
		CheckpointInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	tr, err := NewTCPTransport(TCPOptions{Resolve: c.resolve})
	require.NoError(t, err)
	logger := slog.New(recordingHandler{node: n.id, rec: &c.logged})
	cfg := c.opts.cfg
	cfg.ReplicaID, cfg.OnISRChange, cfg.Logger = n.id, c.onISRChange, logger
	rep, err := New(cfg, tr)
	require.NoError(t, err)
	for _, tp := range c.tps {
		var l *log.Log
		if create {
			l, err = mgr.Create(logName(tp))
			require.NoError(t, err)
		} else {
			var ok bool
			l, ok = mgr.Get(logName(tp))
			require.True(t, ok, "log %s missing after reopening node %d", logName(tp), n.id)
		}
		require.NoError(t, rep.AddPartition(tp, l))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := NewTCPServer(rep, ln, TCPOptions{Logger: logger})
	require.NoError(t, err)
	c.addrs[n.id].Store(ln.Addr().String())
	c.mu.Lock()
	n.mgr, n.rep, n.tr, n.srv, n.alive = mgr, rep, tr, srv, true
	c.mu.Unlock()
}

// closeNode closes a live node: server, Replicator, transport, Manager.
func (c *testCluster) closeNode(n *clusterNode) {
	c.mu.Lock()
	if !n.alive {
		c.mu.Unlock()
		return
	}
	n.alive = false
	c.mu.Unlock()
	c.addrs[n.id].Store("")
	require.NoError(c.t, n.srv.Close())
	require.NoError(c.t, n.rep.Close())
	require.NoError(c.t, n.tr.Close())
	require.NoError(c.t, n.mgr.Close())
}

// replicator returns node id's Replicator, nil if id is -1 or the node is
// down.
func (c *testCluster) replicator(id int32) *Replicator {
	c.mu.Lock()
	defer c.mu.Unlock()
	if id < 0 || !c.nodes[id].alive {
		return nil
	}
	return c.nodes[id].rep
}

// leaderOf returns tp's leader for the controller, -1 when offline.
func (c *testCluster) leaderOf(tp TopicPartition) int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ctrl[tp].leader
}

// leaderChange is a leadership decided by the controller, to be sent to
// the nodes.
type leaderChange struct {
	tp        TopicPartition
	epoch     int32
	leader    int32
	isr       []int32
	newLeader *Replicator
	oldLeader *Replicator   // nil when the old leader is down or offline
	followers []*Replicator // every other live node
}

// elect moves tp's leadership to a live ISR member other than exclude
// (-1: any other than the current leader; the current one only if tp is
// offline). stopFirst stops the partition on the old leader before the
// new one leads. It reports whether the leadership changed; with no
// candidate and exclude leading, tp goes offline at a new epoch.
func (c *testCluster) elect(tp TopicPartition, exclude int32, stopFirst bool, rnd *rand.Rand) bool {
	ch := c.chooseLeader(tp, exclude, rnd)
	if ch == nil {
		return false
	}
	if stopFirst && ch.oldLeader != nil {
		ch.oldLeader.StopPartition(tp)
	}
	require.NoError(c.t, ch.newLeader.BecomeLeader(tp, ch.epoch, c.all, ch.isr), "BecomeLeader(%s, %d) on node %d", tp, ch.epoch, ch.leader)
	for _, r := range ch.followers {
		require.NoError(c.t, r.BecomeFollower(tp, ch.epoch, ch.leader), "BecomeFollower(%s, %d, %d)", tp, ch.epoch, ch.leader)
	}
	return true
}

// chooseLeader updates the controller's state of tp for elect and
// returns the change to send, nil if there is none.
func (c *testCluster) chooseLeader(tp TopicPartition, exclude int32, rnd *rand.Rand) *leaderChange {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.ctrl[tp]
	old := p.leader
	var cands []int32
	for _, id := range p.isr {
		if id != exclude && id != old && c.nodes[id].alive {
			cands = append(cands, id)
		}
	}
	if len(cands) == 0 {
		if old == exclude {
			p.leader = -1
			p.epoch++
		}
		return nil
	}
	ch := &leaderChange{tp: tp, leader: cands[rnd.Intn(len(cands))]}
	for _, id := range p.isr {
		if c.nodes[id].alive && id != exclude {
			ch.isr = append(ch.isr, id)
		}
	}
	p.epoch++
	p.leader, p.isr, ch.epoch = ch.leader, ch.isr, p.epoch
	for _, n := range c.nodes {
		switch {
		case !n.alive:
		case n.id == ch.leader:
			ch.newLeader = n.rep
		default:
			ch.followers = append(ch.followers, n.rep)
			if n.id == old {
				ch.oldLeader = n.rep
			}
		}
	}
	return ch
}

// restart closes node k and reopens it after down, then gives it its
// roles again. Its leaderships are moved away first, or, when crash is
// set, only once it is closed, as after a crash.
func (c *testCluster) restart(k int32, crash bool, down time.Duration, rnd *rand.Rand) {
	if crash {
		c.closeNode(c.nodes[k])
	}
	for _, tp := range c.tps {
		if c.leaderOf(tp) == k {
			c.elect(tp, k, rnd.Intn(2) == 0, rnd)
		}
	}
	c.closeNode(c.nodes[k])
	time.Sleep(down)
	c.openNode(c.nodes[k], false)
	c.giveRoles(k, rnd)
}

// giveRoles makes restarted node k follow every live leader, and elects
// a leader for every offline partition (k may be the only candidate).
func (c *testCluster) giveRoles(k int32, rnd *rand.Rand) {
	for _, tp := range c.tps {
		c.mu.Lock()
		p := c.ctrl[tp]
		ld, ep := p.leader, p.epoch
		c.mu.Unlock()
		switch {
		case ld < 0:
			c.elect(tp, -1, false, rnd)
		case ld != k:
			require.NoError(c.t, c.replicator(k).BecomeFollower(tp, ep, ld), "BecomeFollower(%s, %d, %d) on restarted node %d", tp, ep, ld, k)
		}
	}
}

// sampleHighWatermarks records every leader's high watermark and notes
// any that went down within a leadership.
func (c *testCluster) sampleHighWatermarks() {
	c.mu.Lock()
	var reps []*Replicator
	var ids []int32
	for _, n := range c.nodes {
		if n.alive {
			reps, ids = append(reps, n.rep), append(ids, n.id)
		}
	}
	c.mu.Unlock()
	for i, r := range reps {
		for _, ps := range r.Stats().Partitions {
			if ps.Role != RoleLeader {
				continue
			}
			k := hwKey{node: ids[i], tp: ps.TopicPartition, epoch: ps.Epoch}
			c.hwMu.Lock()
			if prev, ok := c.hwSeen[k]; ok && ps.HighWatermark < prev {
				c.hwDrops = append(c.hwDrops, fmt.Sprintf("node %d %s epoch %d: %d after %d", k.node, k.tp, k.epoch, ps.HighWatermark, prev))
			}
			c.hwSeen[k] = max(c.hwSeen[k], ps.HighWatermark)
			c.hwMu.Unlock()
		}
	}
}

// clusterProducer is one partition's idempotent producer and what it saw.
type clusterProducer struct {
	tp         TopicPartition
	pid        int64
	acks       []ackedBatch   // in sequence order
	duplicates int            // acknowledgements of a retry already stored
	errs       map[string]int // retried errors by errorClass
	bad        []string       // unexpected errors and acknowledgements
}

// errorClass names a produce error; the upper-case ones must not happen.
func errorClass(err error) string {
	switch {
	case errors.Is(err, ErrNotLeader):
		return "notleader"
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.Is(err, ErrNotEnoughReplicas):
		return "notenough"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, ErrUnknownPartition):
		return "unknown"
	case errors.Is(err, ErrStorage):
		return "STORAGE"
	case errors.Is(err, log.ErrOutOfOrderSequence):
		return "OUTOFORDER"
	case errors.Is(err, log.ErrProducerFenced):
		return "FENCED"
	}
	return "OTHER"
}

// produce writes batches of 1-3 records of about valueSize bytes until
// stop is closed, retrying each batch (same producer id and sequence)
// until it is acknowledged with acks=all.
func (c *testCluster) produce(pr *clusterProducer, stop <-chan struct{}, rnd *rand.Rand, valueSize int) {
	bb := log.NewBatchBuilder()
	pad := strings.Repeat("x", valueSize)
	for seq := int32(0); ; {
		values := make([]string, 1+rnd.Intn(3))
		bb.Reset(log.BatchOptions{Idempotent: true, ProducerID: pr.pid, ProducerEpoch: 0, BaseSequence: seq})
		for j := range values {
			values[j] = fmt.Sprintf("%s/s%d/r%d/%s", pr.tp, seq, j, pad)
			bb.Add(time.Now().UnixMilli(), nil, []byte(values[j]))
		}
		batch, err := bb.Build(nil)
		if err != nil {
			pr.bad = append(pr.bad, err.Error())
			return
		}
		if !c.sendUntilAcked(pr, batch, values, seq, stop, rnd) {
			return
		}
		seq += int32(len(values))
	}
}

// sendUntilAcked produces batch to the partition's current leader until
// it is acknowledged; it returns false once stop is closed, or after too
// many unexpected errors.
func (c *testCluster) sendUntilAcked(pr *clusterProducer, batch []byte, values []string, seq int32, stop <-chan struct{}, rnd *rand.Rand) bool {
	for attempt := 0; ; attempt++ {
		select {
		case <-stop:
			return false
		default:
		}
		r := c.replicator(c.leaderOf(pr.tp))
		if r == nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		info, err := r.Produce(ctx, pr.tp, batch, AcksAll)
		cancel()
		if err == nil {
			if info.FirstOffset < 0 || info.LastOffset-info.FirstOffset != int64(len(values)-1) {
				pr.bad = append(pr.bad, fmt.Sprintf("seq %d: bad offsets %+v", seq, info))
			}
			pr.acks = append(pr.acks, ackedBatch{first: info.FirstOffset, values: values})
			if info.Duplicate {
				pr.duplicates++
			}
			return true
		}
		cl := errorClass(err)
		pr.errs[cl]++
		if strings.ToUpper(cl) == cl {
			pr.bad = append(pr.bad, fmt.Sprintf("seq %d attempt %d: %v", seq, attempt, err))
			if len(pr.bad) > 20 {
				return false
			}
		}
		time.Sleep(time.Duration(5+rnd.Intn(20)) * time.Millisecond)
	}
}

// clusterScenario is one run: a cluster, how long its chaos lasts and
// the rng's seed.
type clusterScenario struct {
	opts             clusterOptions
	duration         time.Duration // of the produce-and-chaos phase
	seed             int64
	valueSize        int           // bytes of padding per record value
	maxDown          time.Duration // the longest a restarted node stays down
	convergeTimeout  time.Duration // for the replicas to catch up after the chaos
	highWatermarkGap time.Duration // between two samples of the leaders' high watermarks
}

// chaosCounts is how many of each action a run took.
type chaosCounts struct{ failovers, restarts, deletes int }

// runClusterScenario starts a cluster and its producers, runs the chaos
// for s.duration, brings every partition back online, waits for the
// replicas to converge and checks the invariants.
func runClusterScenario(t *testing.T, s clusterScenario) {
	checkGoroutines(t)
	c := newTestCluster(t, s.opts)
	rnd := rand.New(rand.NewSource(s.seed))
	stop := make(chan struct{})
	var producers sync.WaitGroup
	// Deferred too, so that a failing require stops the goroutines.
	stopProducers := sync.OnceFunc(func() { close(stop); producers.Wait() })
	defer stopProducers()
	prods := make([]*clusterProducer, len(c.tps))
	for i, tp := range c.tps {
		pr := &clusterProducer{tp: tp, pid: 1000 + int64(i), errs: map[string]int{}}
		prods[i] = pr
		prnd := rand.New(rand.NewSource(s.seed*1000 + int64(i)))
		producers.Go(func() { c.produce(pr, stop, prnd, s.valueSize) })
	}
	samplerStop := make(chan struct{})
	var sampler sync.WaitGroup
	stopSampler := sync.OnceFunc(func() { close(samplerStop); sampler.Wait() })
	defer stopSampler()
	sampler.Go(func() {
		for {
			select {
			case <-samplerStop:
				return
			case <-time.After(s.highWatermarkGap):
			}
			c.sampleHighWatermarks()
		}
	})
	counts := c.runChaos(s, rnd)
	stopProducers()
	for _, tp := range c.tps {
		if c.leaderOf(tp) < 0 {
			c.elect(tp, -1, false, rnd)
		}
	}
	err := c.waitConverged(s.convergeTimeout)
	stopSampler()
	require.NoError(t, err, "the replicas did not converge")
	c.checkInvariants(prods)
	c.logSummary(prods, counts)
}

// runChaos moves leaderships (60%), restarts a node (20%) or deletes
// records (20%) every 100-300 ms until s.duration has passed.
func (c *testCluster) runChaos(s clusterScenario, rnd *rand.Rand) chaosCounts {
	var n chaosCounts
	for end := time.Now().Add(s.duration); time.Now().Before(end); {
		time.Sleep(time.Duration(100+rnd.Intn(200)) * time.Millisecond)
		switch x := rnd.Intn(10); {
		case x < 6:
			for k := 0; k < 1+len(c.tps)/4; k++ {
				if c.elect(c.tps[rnd.Intn(len(c.tps))], -1, rnd.Intn(3) == 0, rnd) {
					n.failovers++
				}
			}
		case x < 8:
			k, crash := int32(rnd.Intn(c.opts.nodes)), rnd.Intn(2) == 0
			c.restart(k, crash, time.Duration(rnd.Int63n(int64(s.maxDown))), rnd)
			n.restarts++
		default:
			n.deletes += c.deleteSome(rnd)
		}
	}
	return n
}

// deleteSome deletes records below a random offset up to the high
// watermark on the leaders of a quarter of the partitions, as an
// application would; it returns how many deletions it made.
func (c *testCluster) deleteSome(rnd *rand.Rand) int {
	n := 0
	for k := 0; k < 1+len(c.tps)/4; k++ {
		tp := c.tps[rnd.Intn(len(c.tps))]
		r := c.replicator(c.leaderOf(tp))
		if r == nil {
			continue
		}
		l, _ := r.Node().Log(tp)
		start, hw := l.LogStartOffset(), l.HighWatermark()
		if hw <= start {
			continue
		}
		off := start + rnd.Int63n(hw-start+1)
		// The high watermark may have moved down meanwhile (a new role):
		// only a failure of range is expected.
		if err := l.DeleteRecordsBefore(off); err != nil {
			require.ErrorIs(c.t, err, log.ErrOffsetOutOfRange, "DeleteRecordsBefore(%d) on %s", off, tp)
			continue
		}
		n++
	}
	return n
}

// logSummary logs what the run did, to tell how much it exercised.
func (c *testCluster) logSummary(prods []*clusterProducer, n chaosCounts) {
	acked, dups := 0, 0
	errs := map[string]int{}
	for _, pr := range prods {
		acked += len(pr.acks)
		dups += pr.duplicates
		for k, v := range pr.errs {
			errs[k] += v
		}
	}
	var opens int64
	for _, node := range c.nodes {
		opens += node.mgr.Stats().FileOpens
	}
	c.t.Logf("acknowledged %d batches (%d duplicates); %d failovers, %d restarts, %d deletions; retried errors %v; %d file opens",
		acked, dups, n.failovers, n.restarts, n.deletes, errs, opens)
}
