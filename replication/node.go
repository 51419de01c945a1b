package replication

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replog/replog/log"
	"github.com/replog/replog/partitionstate"
)

// Node is the synchronous protocol core of one replica: the partitions it
// hosts, their roles, the leader-side fetch handling and the
// follower-side fetch state. It starts no goroutines and never blocks on
// the network; time is passed in. Replicator wraps it with goroutines and
// a Transport; tests drive it step by step for seeded simulations.
//
// A Node is safe for concurrent use.
type Node struct {
	id     int32
	cfg    Config
	logger *slog.Logger

	mu       sync.RWMutex
	parts    map[TopicPartition]*partition
	fetchers map[int32]*partitionstate.Map[TopicPartition, *partition] // by leader id

	stats    nodeCounters
	fetchSeq atomic.Uint64 // the last FetchRequest.seq BuildFetch gave
}

// nodeCounters are the node's Stats counters, over all partitions.
type nodeCounters struct {
	fetches, servedBytes    atomic.Int64 // leader side
	responses, fetchedBytes atomic.Int64 // follower side
	isrChanges, truncations atomic.Int64
}

// NewNode returns a node with no partitions.
func NewNode(cfg Config) (*Node, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Node{id: c.ReplicaID, cfg: c, logger: c.Logger,
		parts:    map[TopicPartition]*partition{},
		fetchers: map[int32]*partitionstate.Map[TopicPartition, *partition]{}}, nil
}

// ID is the node's replica id.
func (n *Node) ID() int32 { return n.id }

func (n *Node) partition(tp TopicPartition) *partition {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.parts[tp]
}

// AddPartition hosts tp on this node, backed by l (which the application
// opened and will close after RemovePartition). It has no role until
// BecomeLeader or BecomeFollower, and starts at the newest epoch in l:
// roles at older epochs are refused with ErrStaleEpoch, so a reopened log
// never takes batches of an epoch older than those it holds. It calls
// l.RetainAboveHighWatermark: retention and DeleteRecordsBefore then
// never delete records that are not committed. A partition already hosted
// is refused with ErrPartitionExists, a nil l with an error.
func (n *Node) AddPartition(tp TopicPartition, l *log.Log) error {
	if l == nil {
		return fmt.Errorf("replication: AddPartition %s with a nil log", tp)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.parts[tp]; ok {
		return fmt.Errorf("%w: %s", ErrPartitionExists, tp)
	}
	l.RetainAboveHighWatermark()
	n.parts[tp] = &partition{tp: tp, log: l, epoch: l.LatestEpoch(), leader: -1, leaderLEO: -1,
		followed: log.NoLeaderEpoch, led: log.NoLeaderEpoch, followedLeader: -1}
	return nil
}

// RemovePartition stops replicating tp and forgets it; its log is left
// to the application.
func (n *Node) RemovePartition(tp TopicPartition) { n.stop(tp, true) }

// Log returns the log of a hosted partition.
func (n *Node) Log(tp TopicPartition) (*log.Log, bool) {
	p := n.partition(tp)
	if p == nil {
		return nil, false
	}
	return p.log, true
}

// BecomeLeader makes this node the leader of tp at epoch, with the given
// replica set (including this node, at least MinInsyncReplicas replicas,
// no id twice or negative, else ErrInvalidAssignment) and ISR (a subset
// including this node). Followers are expected to
// fetch; until they do, the high watermark waits for the ISR members. A
// stale epoch returns ErrStaleEpoch, and so does the epoch this node
// followed another leader at, even after StopPartition: an epoch has one
// leader. (A node knows only the roles it had since AddPartition: the
// application must never give one epoch to two nodes, across restarts
// too.) Repeating the epoch this node leads
// changes nothing: the ISR it carries may predate changes persisted since
// through OnISRChange (change the ISR or replicas with a newer epoch).
// Leading at a newer epoch fails the acks=all produces waiting at the
// older one with ErrNotLeader, although their records stay in the log
// and may yet be committed.
func (n *Node) BecomeLeader(tp TopicPartition, epoch int32, replicas, isr []int32, now time.Time) error {
	if err := n.checkAssignment(replicas, isr); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInvalidAssignment, tp, err)
	}
	// Lock order p.mu, n.mu (see lockHosted): a stale epoch must be
	// refused before the partition leaves its fetcher, or it stops
	// following.
	p := n.lockHosted(tp)
	if p == nil {
		return fmt.Errorf("%w: %s", ErrUnknownPartition, tp)
	}
	defer p.mu.Unlock()
	if epoch < p.epoch || (epoch == p.epoch && (p.role != RoleLeader && p.role != RoleNone || p.followed == epoch)) {
		n.mu.Unlock()
		return fmt.Errorf("%w: %s epoch %d, current %d", ErrStaleEpoch, tp, epoch, p.epoch)
	}
	if epoch == p.epoch && p.role == RoleLeader {
		n.mu.Unlock()
		return nil
	}
	n.unfollowLocked(p)
	n.mu.Unlock()
	if err := p.log.BeginLeaderEpoch(epoch); err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	p.endLeadership()
	p.leadCtx, p.leadCancel = context.WithCancel(context.Background())
	p.role, p.epoch, p.leader, p.led = RoleLeader, epoch, n.id, epoch
	p.replicas, p.isr = slices.Clone(replicas), slices.Clone(isr)
	slices.Sort(p.isr)
	p.followers = map[int32]*replicaState{}
	for _, id := range replicas {
		if id != n.id {
			// As in Kafka, an ISR member counts as caught up now, one
			// out of it as never, until it fetches (candidateHW does not
			// wait for it before then).
			rs := &replicaState{leo: -1, lastFetchLeaderLEO: -1}
			if p.inISR(id) {
				rs.lastCaughtUp = now
			}
			p.followers[id] = rs
		}
	}
	p.epochStart = p.log.LogEndOffset()
	n.maybeAdvanceHW(p, now)
	return nil
}

// checkAssignment checks BecomeLeader's replica set and ISR: this node
// among the replicas, no replica twice, at least MinInsyncReplicas
// replicas, and the ISR a subset of the replicas that includes this node.
// An unknown id in the ISR would count toward MinInsyncReplicas without
// holding any data; with fewer replicas than MinInsyncReplicas the high
// watermark could never move.
func (n *Node) checkAssignment(replicas, isr []int32) error {
	if slices.ContainsFunc(replicas, func(id int32) bool { return id < 0 }) {
		return fmt.Errorf("replicas %v include a negative id", replicas)
	}
	if !slices.Contains(replicas, n.id) {
		return fmt.Errorf("replicas %v lack this node (%d)", replicas, n.id)
	}
	if len(replicas) < n.cfg.MinInsyncReplicas {
		return fmt.Errorf("replicas %v are fewer than MinInsyncReplicas (%d)", replicas, n.cfg.MinInsyncReplicas)
	}
	if !slices.Contains(isr, n.id) {
		return fmt.Errorf("ISR %v lacks this node (%d), the leader", isr, n.id)
	}
	for _, ids := range [][]int32{replicas, isr} {
		sorted := slices.Sorted(slices.Values(ids))
		if len(slices.Compact(sorted)) != len(ids) {
			return fmt.Errorf("%v names a replica twice", ids)
		}
	}
	for _, id := range isr {
		if !slices.Contains(replicas, id) {
			return fmt.Errorf("ISR member %d is not among the replicas %v", id, replicas)
		}
	}
	return nil
}

// BecomeFollower makes this node a follower of tp, whose leader is node
// leader at epoch. Its log is reconciled with the leader's on the next
// fetch (divergence is detected by epoch and truncated). A stale epoch
// returns ErrStaleEpoch, and so does the epoch this node led, or followed
// another leader at, even after StopPartition (an epoch has one leader); a
// leader that is this node or negative, ErrInvalidAssignment.
func (n *Node) BecomeFollower(tp TopicPartition, epoch, leader int32) error {
	// Lock order p.mu, n.mu (as BecomeLeader): the role and the fetcher
	// change together, so that concurrent role changes leave the
	// partition in the fetcher of the leader it follows, and in none when
	// it leads or was removed.
	if leader < 0 || leader == n.id {
		return fmt.Errorf("%w: %s: leader %d for follower %d", ErrInvalidAssignment, tp, leader, n.id)
	}
	p := n.lockHosted(tp)
	if p == nil {
		return fmt.Errorf("%w: %s", ErrUnknownPartition, tp)
	}
	defer p.mu.Unlock()
	defer n.mu.Unlock()
	if epoch < p.epoch || (epoch == p.epoch && (p.role == RoleLeader || p.led == epoch)) {
		return fmt.Errorf("%w: %s epoch %d, current %d", ErrStaleEpoch, tp, epoch, p.epoch)
	}
	if epoch == p.followed && leader != p.followedLeader {
		return fmt.Errorf("%w: %s epoch %d already has leader %d, not %d", ErrStaleEpoch, tp, epoch, p.followedLeader, leader)
	}
	p.endLeadership()
	p.role, p.epoch, p.leader = RoleFollower, epoch, leader
	p.followed, p.followedLeader = epoch, leader
	p.followers, p.isr, p.replicas = nil, nil, nil
	p.backoffUntil, p.leaderLEO = time.Time{}, -1
	n.unfollowLocked(p)
	f := n.fetchers[leader]
	if f == nil {
		f = partitionstate.New[TopicPartition, *partition](16)
		n.fetchers[leader] = f
	}
	f.UpdateAndMoveToEnd(tp, p)
	return nil
}

// StopPartition drops tp's role (it neither leads nor follows) while
// keeping it hosted.
func (n *Node) StopPartition(tp TopicPartition) { n.stop(tp, false) }

// stop drops tp's role and takes it out of every fetcher, and with remove
// forgets it.
func (n *Node) stop(tp TopicPartition, remove bool) {
	p := n.lockHosted(tp)
	if p == nil {
		return
	}
	p.stopRole()
	n.unfollowLocked(p)
	if remove {
		delete(n.parts, tp)
	}
	n.mu.Unlock()
	p.mu.Unlock()
}

// lockHosted locks and returns tp's partition, nil if tp is not hosted,
// and then locks n.mu too; the caller unlocks both. The partition's lock
// comes first: it may be held long (a follower's fsync, OnISRChange), and
// a role change waiting for it must not hold n.mu meanwhile, which every
// Produce and fetch of every partition takes.
func (n *Node) lockHosted(tp TopicPartition) *partition {
	for {
		p := n.partition(tp)
		if p == nil {
			return nil
		}
		p.mu.Lock()
		n.mu.Lock()
		if n.parts[tp] == p {
			return p
		}
		// Removed, and maybe added again, meanwhile.
		n.mu.Unlock()
		p.mu.Unlock()
	}
}

// unfollowLocked removes p from every fetcher. Callers hold n.mu.
func (n *Node) unfollowLocked(p *partition) {
	for leader, f := range n.fetchers {
		if f.Remove(p.tp) && f.Len() == 0 {
			delete(n.fetchers, leader)
		}
	}
}

// Leaders returns the ids of the leaders this node fetches from.
func (n *Node) Leaders() []int32 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	ids := make([]int32, 0, len(n.fetchers))
	for id := range n.fetchers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// HandleFetch answers a follower's fetch on the leader side without
// waiting, and counts the answer in Stats: records are returned as file
// regions (see FetchResponse.Materialize).
func (n *Node) HandleFetch(req *FetchRequest, now time.Time) (*FetchResponse, error) {
	resp := &FetchResponse{}
	if err := n.handleFetch(req, now, resp); err != nil {
		return nil, err
	}
	n.countServed(resp)
	return resp, nil
}

// handleFetch is HandleFetch answering into resp, whose Partitions' array
// it reuses, without counting the answer in Stats: the Replicator
// computes a held fetch's answer again each time data arrives, and counts
// only the one it sends.
func (n *Node) handleFetch(req *FetchRequest, now time.Time, resp *FetchResponse) error {
	if req.ClusterID != n.cfg.ClusterID {
		return fmt.Errorf("%w: %q, this node is in %q", ErrClusterMismatch, req.ClusterID, n.cfg.ClusterID)
	}
	clear(resp.Partitions) // forget the last answer's segment files
	parts := resp.Partitions[:0]
	if parts == nil {
		parts = make([]FetchPartitionResponse, 0, len(req.Partitions)) // never nil
	}
	*resp = FetchResponse{Partitions: slices.Grow(parts, len(req.Partitions))}
	budget, sent := int64(req.MaxBytes), false
	for _, fp := range req.Partitions {
		pr, used := n.handleFetchPartition(req, fp, budget, !sent, now)
		budget -= used
		sent = sent || used > 0
		resp.Partitions = append(resp.Partitions, pr)
	}
	return nil
}

// Tick runs the time-based work: ISR shrinking on the partitions this
// node leads.
func (n *Node) Tick(now time.Time) {
	n.mu.RLock()
	parts := make([]*partition, 0, len(n.parts))
	for _, p := range n.parts {
		parts = append(parts, p)
	}
	n.mu.RUnlock()
	for _, p := range parts {
		p.mu.Lock()
		if p.role == RoleLeader {
			n.shrinkISR(p, now)
		}
		p.mu.Unlock()
	}
}
