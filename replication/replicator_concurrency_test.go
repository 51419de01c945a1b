package replication

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
	"github.com/replog/replog/log"
)

// fetcherLoops returns the leaders r runs fetchers for, sorted.
func fetcherLoops(r *Replicator) []int32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.loops))
}

// Three nodes on a faulty in-memory network, with role changes of every
// kind (failover from the persisted ISR, leader to leader at a newer
// epoch, StopPartition, RemovePartition and AddPartition on a follower)
// concurrent with acks 0/1/all producers, Stats readers, fetchers and
// held fetches: no Produce outlives its context by much, every
// acknowledged acks=all record stays, the logs converge, each node runs
// exactly one fetcher per leader it follows, OnISRChange is never
// concurrent for one partition nor called after Close, and no goroutine
// survives Close. The seed is logged; scheduling is not reproducible.
func TestReplicatorRoleChurn(t *testing.T) {
	checkGoroutines(t)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewSource(seed))
	netw := NewMemNetwork(uint64(seed))
	netw.SetFaults(Faults{DropRate: 0.02, DuplicateRate: 0.05, MaxDelay: 2 * time.Millisecond})
	const n, np = 3, 3
	all := []int32{0, 1, 2}
	tps := make([]TopicPartition, np)
	for i := range tps {
		tps[i] = TopicPartition{Topic: "z", Partition: int32(i)}
	}
	type ctrlState struct {
		leader, epoch int32
		isr           []int32
	}
	var (
		ctrlMu    sync.Mutex
		ctrl      = map[TopicPartition]*ctrlState{}
		inflight  sync.Map // tp -> *atomic.Int32
		violation atomic.Value
		closedAll atomic.Bool
	)
	for _, tp := range tps {
		ctrl[tp] = &ctrlState{leader: -1, epoch: 0, isr: slices.Clone(all)}
		inflight.Store(tp, new(atomic.Int32))
	}
	onISR := func(tp TopicPartition, ep int32, isr []int32) error {
		if closedAll.Load() {
			violation.Store("OnISRChange after Close")
		}
		c, _ := inflight.Load(tp)
		if c.(*atomic.Int32).Add(1) > 1 {
			violation.Store(fmt.Sprintf("OnISRChange concurrent for %s", tp))
		}
		defer c.(*atomic.Int32).Add(-1)
		time.Sleep(time.Duration(rand.Int63n(int64(200*time.Microsecond) + 1)))
		ctrlMu.Lock()
		defer ctrlMu.Unlock()
		s := ctrl[tp]
		if ep < s.epoch {
			return errors.New("stale epoch")
		}
		s.isr = slices.Clone(isr)
		return nil
	}
	reps := make([]*Replicator, n)
	logs := make([][]*log.Log, n)
	for i := range n {
		r, err := New(Config{ReplicaID: int32(i), ClusterID: "c", MinInsyncReplicas: 2, FetchMaxWait: 20 * time.Millisecond,
			ReplicaLagTime: 300 * time.Millisecond, FetchBackoff: 5 * time.Millisecond, OnISRChange: onISR}, netw.Transport(int32(i)))
		require.NoError(t, err)
		reps[i] = r
		netw.Register(int32(i), r)
		for _, tp := range tps {
			l, err := log.Open("/l", log.Options{FS: vfs.NewMem(), SegmentBytes: 16 << 10})
			require.NoError(t, err)
			logs[i] = append(logs[i], l)
			require.NoError(t, r.AddPartition(tp, l))
		}
	}
	closed := false
	closeAll := func() {
		if closed {
			return
		}
		closed = true
		for i := range n {
			require.NoError(t, reps[i].Close())
		}
		closedAll.Store(true)
		for i := range n {
			for _, l := range logs[i] {
				require.NoError(t, l.Close())
			}
		}
	}
	defer closeAll()

	// elect makes cand lead tp at a new epoch with the persisted ISR.
	elect := func(ti int, cand int32, stopOld bool) {
		tp := tps[ti]
		ctrlMu.Lock()
		s := ctrl[tp]
		old := s.leader
		s.epoch++
		s.leader = cand
		ep, isr := s.epoch, slices.Clone(s.isr)
		if !slices.Contains(isr, cand) {
			isr = append(isr, cand) // only at start, with the full ISR
		}
		s.isr = isr
		ctrlMu.Unlock()
		if stopOld && old >= 0 && old != cand {
			reps[old].StopPartition(tp)
		}
		require.NoError(t, reps[cand].BecomeLeader(tp, ep, all, isr))
		for i := range n {
			if int32(i) != cand {
				require.NoError(t, reps[i].BecomeFollower(tp, ep, cand))
			}
		}
	}
	for ti := range tps {
		elect(ti, int32(ti%n), false)
	}

	type ack struct {
		tp  TopicPartition
		off int64
		v   string
	}
	var (
		ackMu sync.Mutex
		acks  []ack
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for ti, tp := range tps {
		for w := range 2 {
			wg.Go(func() {
				prnd := rand.New(rand.NewSource(seed + int64(ti*10+w)))
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					ctrlMu.Lock()
					ld := ctrl[tp].leader
					ctrlMu.Unlock()
					acks3 := []Acks{AcksNone, AcksLeader, AcksAll, AcksAll}[prnd.Intn(4)]
					v := fmt.Sprintf("%s-w%d-%d", tp, w, i)
					const timeout = 300 * time.Millisecond
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					start := time.Now()
					info, err := reps[ld].Produce(ctx, tp, testBatch(t, v), acks3)
					took := time.Since(start)
					cancel()
					if took > timeout+2*time.Second {
						violation.Store(fmt.Sprintf("Produce acks %d on %s took %v (err %v)", acks3, tp, took, err))
					}
					if err == nil && acks3 == AcksAll {
						ackMu.Lock()
						acks = append(acks, ack{tp, info.FirstOffset, v})
						ackMu.Unlock()
					}
				}
			})
		}
	}
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			for i := range n {
				_ = reps[i].Stats()
			}
		}
	})

	deadline := time.Now().Add(4 * time.Second)
	var actions [5]int
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(2+rnd.Intn(15)) * time.Millisecond)
		ti := rnd.Intn(np)
		tp := tps[ti]
		ctrlMu.Lock()
		s := ctrl[tp]
		ld, ep := s.leader, s.epoch
		var cands []int32
		for _, id := range s.isr {
			if id != ld {
				cands = append(cands, id)
			}
		}
		ctrlMu.Unlock()
		follower := int32(rnd.Intn(n))
		for follower == ld {
			follower = int32(rnd.Intn(n))
		}
		switch x := rnd.Intn(10); {
		case x < 4 && len(cands) > 0:
			actions[0]++
			elect(ti, cands[rnd.Intn(len(cands))], rnd.Intn(2) == 0)
		case x < 5:
			actions[1]++
			elect(ti, ld, false) // leader to leader at a newer epoch
		case x < 7:
			actions[2]++
			reps[follower].StopPartition(tp)
			time.Sleep(time.Duration(rnd.Intn(3)) * time.Millisecond)
			require.NoError(t, reps[follower].BecomeFollower(tp, ep, ld))
		case x < 9:
			actions[3]++
			reps[follower].RemovePartition(tp)
			require.NoError(t, reps[follower].AddPartition(tp, logs[follower][ti]))
			time.Sleep(time.Duration(rnd.Intn(3)) * time.Millisecond)
			require.NoError(t, reps[follower].BecomeFollower(tp, ep, ld))
		default:
			actions[4]++
			// a partition moves its leader while another keeps it, so
			// fetchers retire and start
			elect(ti, ld, true)
		}
	}
	close(stop)
	wg.Wait()
	netw.HealAll()
	if v := violation.Load(); v != nil {
		t.Fatal(v)
	}
	// Converge.
	require.Eventually(t, func() bool {
		for ti, tp := range tps {
			ctrlMu.Lock()
			ld := ctrl[tp].leader
			ctrlMu.Unlock()
			for i := range n {
				if logs[i][ti].LogEndOffset() != logs[ld][ti].LogEndOffset() {
					return false
				}
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "replicas did not converge")
	for ti, tp := range tps {
		ctrlMu.Lock()
		ld := ctrl[tp].leader
		ctrlMu.Unlock()
		values := recordValues(t, logs[ld][ti])
		for _, a := range acks {
			if a.tp == tp {
				require.Equal(t, a.v, values[a.off], "%s acked at %d", tp, a.off)
			}
		}
		for i := range n {
			require.Equal(t, readAllBatches(t, logs[ld][ti]), readAllBatches(t, logs[i][ti]), "%s replica %d", tp, i)
		}
	}
	// One fetcher per followed leader, none other.
	for i := range n {
		require.Eventually(t, func() bool {
			return slices.Equal(fetcherLoops(reps[i]), reps[i].Node().Leaders())
		}, 2*time.Second, 5*time.Millisecond, "node %d fetchers %v, leaders %v", i, fetcherLoops(reps[i]), reps[i].Node().Leaders())
	}
	closeAll()
	if v := violation.Load(); v != nil {
		t.Fatal(v)
	}
	t.Logf("acked %d; actions %v", len(acks), actions)
}

// waitForStack waits until some goroutine's stack holds fn.
func waitForStack(t *testing.T, fn string) {
	t.Helper()
	require.Eventually(t, func() bool {
		buf := make([]byte, 1<<20)
		return strings.Contains(string(buf[:runtime.Stack(buf, true)]), fn)
	}, 5*time.Second, time.Millisecond, "no goroutine in %s", fn)
}

// A HandleFetch that passed holdFetch's closing check but waits for the
// partition's lock (held by another fetch's OnISRChange) when Close
// begins must not grow the ISR through OnISRChange: it returns ErrClosed
// having changed nothing, as TestHandleFetchInProgressDuringCloseChangesNothing
// requires of a fetch stopped earlier (in the leader's fsync).
func TestHeldFetchDuringCloseChangesNoISR(t *testing.T) {
	checkGoroutines(t)
	var r *Replicator
	entered, release := make(chan struct{}), make(chan struct{})
	var calls, whileClosing atomic.Int32
	cfg := Config{ReplicaID: 0, ClusterID: "c", RelaxedDurability: true, OnISRChange: func(_ TopicPartition, _ int32, isr []int32) error {
		if r.ctx.Err() != nil {
			whileClosing.Add(1)
		}
		if calls.Add(1) == 1 {
			close(entered)
			<-release
		}
		return nil
	}}
	r, err := New(cfg, idleTransport{})
	require.NoError(t, err)
	l, err := log.Open("/l", log.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, r.AddPartition(ntp, l))
	require.NoError(t, r.BecomeLeader(ntp, 1, []int32{0, 1, 2}, []int32{0}))
	fetch := func(id int32) error {
		_, err := r.HandleFetch(context.Background(), &FetchRequest{ClusterID: "c", ReplicaID: id, MaxBytes: 1 << 20, MaxWaitMs: 100,
			Partitions: []FetchPartition{{TopicPartition: ntp, CurrentLeaderEpoch: 1, LastFetchedEpoch: log.NoLeaderEpoch}}})
		return err
	}
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { first <- fetch(1) }()
	<-entered // follower 1 joins: OnISRChange runs under the partition's lock
	go func() { second <- fetch(2) }()
	waitForStack(t, "replication.(*Node).handleFetchPartition") // follower 2's fetch waits for the lock
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	require.Eventually(t, func() bool { return r.ctx.Err() != nil }, 5*time.Second, time.Millisecond)
	close(release)
	require.NoError(t, <-closed)
	<-first
	require.ErrorIs(t, <-second, ErrClosed)
	require.Zero(t, whileClosing.Load(), "OnISRChange called after Close began, for a fetch that Close ended")
	require.Equal(t, []int32{0, 1}, r.Stats().Partitions[0].ISR, "a fetch that Close ended changed the ISR")
}

// A role change of a partition whose lock is held for long (a follower's
// fsync of fetched records, which endPartition runs under that lock)
// waits for the lock without holding Replicator.mu or Node.mu, which
// every Produce and fetch takes: a Produce to another partition meanwhile
// returns by its context's deadline at the latest.
func TestRoleChangeWaitingForOnePartitionStallsNoOther(t *testing.T) {
	checkGoroutines(t)
	a, b := TopicPartition{Topic: "a", Partition: 0}, TopicPartition{Topic: "b", Partition: 0}
	netw := NewMemNetwork(1)
	var armed atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	var released atomic.Bool
	unblock := func() {
		if released.CompareAndSwap(false, true) {
			close(release)
		}
	}
	defer unblock()
	slowFS := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpSync && strings.HasSuffix(op.Path, ".log") && armed.CompareAndSwap(true, false) {
			close(entered)
			<-release // a slow disk
		}
		return vfs.Fault{}
	}))
	cfg := Config{ClusterID: "c", FetchMaxWait: 20 * time.Millisecond}
	var reps []*Replicator
	var logs []*log.Log
	for id := range int32(2) {
		c := cfg
		c.ReplicaID = id
		r, err := New(c, netw.Transport(id))
		require.NoError(t, err)
		netw.Register(id, r)
		reps = append(reps, r)
		fs := vfs.FS(vfs.NewMem())
		if id == 1 {
			fs = slowFS
		}
		la, err := log.Open("/a", log.Options{FS: fs})
		require.NoError(t, err)
		lb, err := log.Open("/b", log.Options{FS: vfs.NewMem()})
		require.NoError(t, err)
		logs = append(logs, la, lb)
		require.NoError(t, r.AddPartition(a, la))
		require.NoError(t, r.AddPartition(b, lb))
	}
	defer func() {
		unblock()
		for _, r := range reps {
			require.NoError(t, r.Close())
		}
		for _, l := range logs {
			require.NoError(t, l.Close())
		}
	}()
	// Node 0 leads a, node 1 follows it; node 1 leads b alone.
	require.NoError(t, reps[0].BecomeLeader(a, 1, []int32{0, 1}, []int32{0, 1}))
	require.NoError(t, reps[1].BecomeFollower(a, 1, 0))
	require.NoError(t, reps[1].BecomeLeader(b, 1, []int32{1}, []int32{1}))

	armed.Store(true)
	_, err := reps[0].Produce(context.Background(), a, testBatch(t, "a"), AcksLeader)
	require.NoError(t, err)
	<-entered // node 1's fetcher fsyncs a's fetched records, under a's lock

	go func() { _ = reps[1].BecomeFollower(a, 2, 0) }() // the controller moves on to epoch 2
	waitForStack(t, "replication.(*Node).BecomeFollower")
	time.Sleep(10 * time.Millisecond) // let it reach a's lock

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := reps[1].Produce(ctx, b, testBatch(t, "b"), AcksLeader)
		done <- err
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		buf := make([]byte, 1<<20)
		t.Log(string(buf[:runtime.Stack(buf, true)]))
		t.Fatal("a Produce to partition b, with a 100 ms context, still blocked after 2 s by a role change of partition a waiting for a's fsync")
	}
}

// One node (0) follows partitions whose leaders (nodes 1-4) change
// concurrently from several goroutines, with StopPartition,
// RemovePartition+AddPartition and BecomeLeader mixed in. Afterwards it
// runs exactly one fetcher per leader it follows, and every partition it
// follows catches up with its leader.
func TestOneFetcherPerLeaderUnderConcurrentRoleChanges(t *testing.T) {
	checkGoroutines(t)
	netw := NewMemNetwork(3)
	netw.SetFaults(Faults{MaxDelay: time.Millisecond})
	const nodes, np = 5, 8
	cfg := Config{ClusterID: "c", FetchMaxWait: 10 * time.Millisecond, FetchBackoff: 2 * time.Millisecond, RelaxedDurability: true}
	reps := make([]*Replicator, nodes)
	logs := make([][]*log.Log, nodes)
	tps := make([]TopicPartition, np)
	for i := range tps {
		tps[i] = TopicPartition{Topic: "f", Partition: int32(i)}
	}
	for id := range reps {
		c := cfg
		c.ReplicaID = int32(id)
		r, err := New(c, netw.Transport(int32(id)))
		require.NoError(t, err)
		reps[id] = r
		netw.Register(int32(id), r)
		for _, tp := range tps {
			l, err := log.Open("/l", log.Options{FS: vfs.NewMem()})
			require.NoError(t, err)
			logs[id] = append(logs[id], l)
			require.NoError(t, r.AddPartition(tp, l))
		}
	}
	defer func() {
		for id := range reps {
			require.NoError(t, reps[id].Close())
			for _, l := range logs[id] {
				require.NoError(t, l.Close())
			}
		}
	}()
	// Node 0 never leads; a goroutine per partition moves its leadership.
	epochs := make([]int32, np)
	leaders := make([]int32, np)
	var wg sync.WaitGroup
	for ti, tp := range tps {
		wg.Go(func() {
			rnd := rand.New(rand.NewSource(int64(ti)))
			for range 60 {
				epochs[ti]++
				ep := epochs[ti]
				ld := int32(1 + rnd.Intn(nodes-1))
				switch rnd.Intn(6) {
				case 0:
					reps[0].StopPartition(tp)
				case 1:
					reps[0].RemovePartition(tp)
					require.NoError(t, reps[0].AddPartition(tp, logs[0][ti]))
				}
				// Leaders' logs differ: node 0 truncates by divergence.
				require.NoError(t, reps[ld].BecomeLeader(tp, ep, []int32{0, ld}, []int32{ld}))
				if rnd.Intn(3) == 0 {
					_, err := reps[ld].Produce(context.Background(), tp, testBatch(t, fmt.Sprint(ep)), AcksLeader)
					require.NoError(t, err)
				}
				require.NoError(t, reps[0].BecomeFollower(tp, ep, ld))
				leaders[ti] = ld
				time.Sleep(time.Duration(rnd.Intn(3)) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	want := []int32{}
	for _, ld := range leaders {
		if !slices.Contains(want, ld) {
			want = append(want, ld)
		}
	}
	slices.Sort(want)
	require.Eventually(t, func() bool {
		return slices.Equal(fetcherLoops(reps[0]), want) && slices.Equal(reps[0].Node().Leaders(), want)
	}, 5*time.Second, 5*time.Millisecond, "fetchers %v, leaders %v, want %v", fetcherLoops(reps[0]), reps[0].Node().Leaders(), want)
	for ti, tp := range tps {
		ld := leaders[ti]
		_, err := reps[ld].Produce(context.Background(), tp, testBatch(t, "last"), AcksLeader)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			return logs[0][ti].LogEndOffset() == logs[ld][ti].LogEndOffset()
		}, 5*time.Second, 5*time.Millisecond, "%s: follower at %d, leader %d at %d", tp, logs[0][ti].LogEndOffset(), ld, logs[ld][ti].LogEndOffset())
	}
}

// heldAnswerTransport answers through inner, then holds each answer
// with news until gate lets it go.
type heldAnswerTransport struct {
	inner    Transport
	answered chan struct{}
	gate     chan struct{}
}

func (g *heldAnswerTransport) Fetch(ctx context.Context, leader int32, req *FetchRequest) (*FetchResponse, error) {
	resp, err := g.inner.Fetch(ctx, leader, req)
	if err == nil && hasNews(resp) {
		select {
		case g.answered <- struct{}{}:
		default:
		}
		select {
		case <-g.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return resp, err
}

// Node 2 follows node 0; a
// response with node 0's records arrives after node 2 was told to follow
// node 1 (whose log differs) at a newer epoch: it must not be appended.
func TestResponseOfAFormerLeaderIsNotApplied(t *testing.T) {
	checkGoroutines(t)
	netw := NewMemNetwork(5)
	gate := &heldAnswerTransport{inner: netw.Transport(2), answered: make(chan struct{}, 1), gate: make(chan struct{})}
	var reps []*Replicator
	var logs []*log.Log
	for id := range int32(3) {
		var tr Transport = netw.Transport(id)
		if id == 2 {
			tr = gate
		}
		r, err := New(Config{ReplicaID: id, ClusterID: "c", FetchMaxWait: 20 * time.Millisecond, RelaxedDurability: true}, tr)
		require.NoError(t, err)
		netw.Register(id, r)
		l, err := log.Open("/l", log.Options{FS: vfs.NewMem()})
		require.NoError(t, err)
		require.NoError(t, r.AddPartition(ntp, l))
		reps, logs = append(reps, r), append(logs, l)
	}
	defer func() {
		for i := range reps {
			require.NoError(t, reps[i].Close())
			require.NoError(t, logs[i].Close())
		}
	}()
	require.NoError(t, reps[0].BecomeLeader(ntp, 1, []int32{0, 2}, []int32{0}))
	_, err := reps[0].Produce(context.Background(), ntp, testBatch(t, "old leader"), AcksLeader)
	require.NoError(t, err)
	require.NoError(t, reps[2].BecomeFollower(ntp, 1, 0))
	<-gate.answered // node 0's records are on their way
	require.NoError(t, reps[1].BecomeLeader(ntp, 2, []int32{1, 2}, []int32{1}))
	require.NoError(t, reps[2].BecomeFollower(ntp, 2, 1))
	close(gate.gate)
	// Node 1's log is empty: node 2 fetches from it, appending nothing,
	// and truncates nothing (it would after appending node 0's batch).
	require.Eventually(t, func() bool { return reps[1].Stats().FetchesServed >= 2 }, 5*time.Second, time.Millisecond)
	st := reps[2].Stats()
	require.Zero(t, st.BytesFetched, "node 2 appended node 0's records after it followed node 1")
	require.Zero(t, st.Truncations)
	require.Zero(t, logs[2].LogEndOffset())
}
