package replication

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
	"github.com/replog/replog/log"
)

// Role changes that race with a Produce, reopened logs and bad
// assignments: what a node must refuse or leave unchanged.

// An acks=all Produce whose fsync ends after StopPartition must not move
// the high watermark: the node no longer leads, and its ISR's followers
// never fetched the batch (regression: the stopped partition's ISR was
// kept, with no follower states, and counted as the leader alone).
func TestStopPartitionDuringProduceKeepsTheHighWatermark(t *testing.T) {
	r, l, gate, release := newGatedLeader(t)
	done := make(chan error, 1)
	gate.armed.Store(true)
	go func() {
		_, err := r.Produce(context.Background(), ntp, testBatch(t, "R"), AcksAll)
		done <- err
	}()
	<-gate.entered // the batch is at offset 0, its fsync held
	r.StopPartition(ntp)
	release()
	require.ErrorIs(t, <-done, ErrNotLeader)
	require.Equal(t, int64(0), l.HighWatermark(), "no follower has offset 0")
}

// A reopened log's newest epoch fences roles at older epochs, as a node
// that never restarted would (regression: AddPartition started every
// partition at NoLeaderEpoch, and a stale leader appended epoch-5 batches
// after epoch-7 ones).
func TestAddPartitionStartsAtTheLogsEpoch(t *testing.T) {
	fs := vfs.NewMem()
	l, err := log.Open("/log", log.Options{FS: fs})
	require.NoError(t, err)
	_, err = l.AppendAsLeader(testBatch(t, "a"), 7)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	l, err = log.Open("/log", log.Options{FS: fs})
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Close()) }()

	n, err := NewNode(Config{ReplicaID: 0, ClusterID: "c"})
	require.NoError(t, err)
	require.NoError(t, n.AddPartition(ntp, l))
	both := []int32{0, 1}
	require.ErrorIs(t, n.BecomeLeader(ntp, 5, both, both, ntime), ErrStaleEpoch)
	require.ErrorIs(t, n.BecomeFollower(ntp, 6, 1), ErrStaleEpoch)
	require.Equal(t, int32(7), l.LatestEpoch())
	require.NoError(t, n.BecomeLeader(ntp, 8, both, both, ntime))
	require.Equal(t, int32(8), l.LatestEpoch())
}

// BecomeLeader refuses an ISR that is not a subset of the replicas or
// lacks this node, and duplicate ids: an unknown id would count toward
// MinInsyncReplicas without holding data. And fewer replicas than
// MinInsyncReplicas, whose high watermark could never move, and negative
// ids, which no node has (they were accepted).
func TestBecomeLeaderChecksTheAssignment(t *testing.T) {
	r := newTestReplica(t, 0, Config{MinInsyncReplicas: 3})
	for _, c := range []struct {
		name          string
		replicas, isr []int32
	}{
		{"unknown ISR member", []int32{0, 1}, []int32{0, 1, 9}},
		{"leader not a replica", []int32{1, 2}, []int32{1, 2}},
		{"leader not in ISR", []int32{0, 1, 2}, []int32{1, 2}},
		{"replica twice", []int32{0, 1, 1}, []int32{0, 1}},
		{"ISR member twice", []int32{0, 1, 2}, []int32{0, 1, 1}},
		{"fewer replicas than MinInsyncReplicas", []int32{0, 1}, []int32{0, 1}},
		{"negative replica id", []int32{0, 1, -1}, []int32{0, 1}},
	} {
		err := r.node.BecomeLeader(ntp, 1, c.replicas, c.isr, ntime)
		require.ErrorIs(t, err, ErrInvalidAssignment, c.name)
	}
	p := r.node.partition(ntp)
	require.Equal(t, RoleNone, p.role, "a refused assignment changes nothing")
	require.NoError(t, r.node.BecomeLeader(ntp, 1, []int32{0, 1, 2}, []int32{2, 0, 1}, ntime))
}

// Two goroutines building fetches for the same leader, as tests and
// applications driving a Node directly may do: the fair order's walk
// moves its cursor, so it must hold the node's lock for writing (the
// race detector reported the read lock).
func TestBuildFetchConcurrently(t *testing.T) {
	f := newTestReplica(t, 1, Config{})
	require.NoError(t, f.node.BecomeFollower(ntp, 1, 0))
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range 500 {
				req := f.node.BuildFetch(0, ntime)
				if req == nil || len(req.Partitions) != 1 {
					t.Errorf("fetch request %+v", req)
					return
				}
			}
		})
	}
	wg.Wait()
}

// A leader holds an empty fetch no longer than its own FetchMaxWait,
// whatever the request asks, and answers a fetch of no partitions at
// once: a peer must not pin a connection and its goroutine for days.
func TestHandleFetchBoundsTheLongPoll(t *testing.T) {
	l, err := log.Open("/log", log.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Close()) }()
	r, err := New(Config{ReplicaID: 0, ClusterID: "c", FetchMaxWait: 50 * time.Millisecond}, idleTransport{})
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	require.NoError(t, r.AddPartition(ntp, l))
	both := []int32{0, 1}
	require.NoError(t, r.BecomeLeader(ntp, 1, both, both))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fetch := func(parts []FetchPartition) {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			_, err := r.HandleFetch(ctx, &FetchRequest{ClusterID: "c", ReplicaID: 1, MaxBytes: 1 << 20,
				MaxWaitMs: 1<<31 - 1, Partitions: parts})
			done <- err
		}()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-ctx.Done():
			t.Fatal("the fetch was held for the time it asked for")
		}
	}
	fetch(nil)
	fetch([]FetchPartition{{TopicPartition: ntp, CurrentLeaderEpoch: 1, FetchOffset: 0, LastFetchedEpoch: log.NoLeaderEpoch}})
}

// Materialize reports a region the file cannot fill instead of handing
// out zeros.
func TestMaterializeShortRead(t *testing.T) {
	fs := vfs.NewMem()
	l, err := log.Open("/log", log.Options{FS: fs})
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Close()) }()
	_, err = l.AppendAsLeader(testBatch(t, "a"), 1)
	require.NoError(t, err)
	reg, err := l.ReadRegion(0, log.ReadOptions{MaxBytes: 1 << 20})
	require.NoError(t, err)
	require.Positive(t, reg.Length)
	reg.Length += 10 // past the end of the file
	resp := &FetchResponse{Partitions: []FetchPartitionResponse{{TopicPartition: ntp, Region: reg}}}
	require.ErrorIs(t, resp.Materialize(), ErrStorage)
}

// fetcherLeaders lists the leaders whose fetcher holds tp on n.
func fetcherLeaders(n *Node, tp TopicPartition) []int32 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var ids []int32
	for id, f := range n.fetchers {
		for k := range f.All() {
			if k == tp {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// A BecomeFollower racing another role change leaves the partition in the
// fetcher of the leader it follows, and in none when it leads, has no
// role or was removed (regression: BecomeFollower set the role, then
// updated the fetchers under the node's lock; the other change ran in
// between, and the partition was left leading, or removed, in a fetcher
// that never retired). The test holds the partition's lock until both
// calls wait for it, BecomeFollower first.
func TestBecomeFollowerRacingRoleChanges(t *testing.T) {
	both := []int32{0, 1}
	for _, other := range []string{"BecomeLeader", "RemovePartition", "StopPartition"} {
		t.Run(other, func(t *testing.T) {
			for range 5 {
				r := newTestReplica(t, 0, Config{})
				n := r.node
				p := n.partition(ntp)
				p.mu.Lock()
				var wg sync.WaitGroup
				wg.Go(func() { _ = n.BecomeFollower(ntp, 1, 1) })
				awaitGoroutineIn(t, "(*Node).BecomeFollower")
				time.Sleep(10 * time.Millisecond) // at the lock
				wg.Go(func() {
					switch other {
					case "BecomeLeader":
						assert.NoError(t, n.BecomeLeader(ntp, 2, both, both, ntime))
					case "RemovePartition":
						n.RemovePartition(ntp)
					case "StopPartition":
						n.StopPartition(ntp)
					}
				})
				awaitGoroutineIn(t, "(*Node)."+other)
				time.Sleep(10 * time.Millisecond) // at the lock
				p.mu.Unlock()
				wg.Wait()

				p.mu.Lock()
				role, leader := p.role, p.leader
				p.mu.Unlock()
				var want []int32
				if role == RoleFollower && n.partition(ntp) == p {
					want = []int32{leader}
				}
				require.Equal(t, want, fetcherLeaders(n, ntp), "role %v, hosted %v", role, n.partition(ntp) != nil)
				require.ElementsMatch(t, want, n.Leaders(), "the leaders fetched from")
			}
		})
	}
}

// BecomeFollower refuses a leader that is this node or none: the
// Replicator would run a fetcher that fetches from itself forever.
func TestBecomeFollowerChecksTheLeader(t *testing.T) {
	r := newTestReplica(t, 0, Config{})
	for _, leader := range []int32{0, -1} {
		require.ErrorIs(t, r.node.BecomeFollower(ntp, 1, leader), ErrInvalidAssignment, "leader %d", leader)
	}
	p := r.node.partition(ntp)
	require.Equal(t, RoleNone, p.role, "a refused role changes nothing")
	require.Empty(t, r.node.Leaders())
	require.NoError(t, r.node.BecomeFollower(ntp, 1, 1))
}

// After Close, Produce and role changes return ErrClosed and change
// nothing (regression: Produce appended, and acks=1 reported success;
// BecomeFollower changed the role before it found the Replicator
// closed).
func TestReplicatorAfterCloseChangesNothing(t *testing.T) {
	l, err := log.Open("/log", log.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Close()) }()
	r, err := New(Config{ReplicaID: 0, ClusterID: "c"}, idleTransport{})
	require.NoError(t, err)
	require.NoError(t, r.AddPartition(ntp, l))
	require.NoError(t, r.BecomeLeader(ntp, 1, []int32{0}, []int32{0}))
	require.NoError(t, r.Close())

	for _, acks := range []Acks{AcksNone, AcksLeader, AcksAll} {
		_, err := r.Produce(context.Background(), ntp, testBatch(t, "a"), acks)
		require.ErrorIs(t, err, ErrClosed, "acks %d", acks)
	}
	require.Zero(t, l.LogEndOffset(), "nothing appended")
	require.ErrorIs(t, r.BecomeLeader(ntp, 2, []int32{0, 1}, []int32{0, 1}), ErrClosed)
	require.ErrorIs(t, r.BecomeFollower(ntp, 2, 1), ErrClosed)
	ps := r.Stats().Partitions[0]
	require.Equal(t, RoleLeader, ps.Role)
	require.Equal(t, int32(1), ps.Epoch)
	require.Equal(t, []int32{0}, ps.Replicas)
	require.Equal(t, int32(1), l.LatestEpoch(), "no epoch 2 began in the log")
}

// A node that followed at epoch 5 refuses to lead epoch 5 after
// StopPartition too: it used to accept, and the two leaders of epoch 5
// then wrote different batches at the same offsets under the same epoch,
// which no divergence check tells apart (a third replica kept the other
// leader's batch).
func TestStoppedFollowerRefusesLeadershipAtItsEpoch(t *testing.T) {
	leader := newTestReplica(t, 0, Config{})
	f := newTestReplica(t, 1, Config{})
	all := []int32{0, 1, 2}
	require.NoError(t, leader.node.BecomeLeader(ntp, 5, all, all, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 5, 0))
	leader.produce(t, 2, AcksLeader)
	fetchOnce(t, f, leader, ntime)
	f.node.StopPartition(ntp)
	require.ErrorIs(t, f.node.BecomeLeader(ntp, 5, all, all, ntime), ErrStaleEpoch)
	require.NoError(t, f.node.BecomeLeader(ntp, 6, all, all, ntime), "a newer epoch is fine")
}

// The mirror case: a node that led epoch 5 refuses, after StopPartition
// too, to follow another leader at epoch 5.
func TestStoppedLeaderRefusesToFollowAtItsEpoch(t *testing.T) {
	l := newTestReplica(t, 0, Config{})
	all := []int32{0, 1, 2}
	require.NoError(t, l.node.BecomeLeader(ntp, 5, all, all, ntime))
	l.produce(t, 2, AcksLeader)
	l.node.StopPartition(ntp)
	require.ErrorIs(t, l.node.BecomeFollower(ntp, 5, 1), ErrStaleEpoch)
	require.NoError(t, l.node.BecomeFollower(ntp, 6, 1), "a newer epoch is fine")
}
