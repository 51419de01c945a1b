package replication

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replog/replog/log"
)

// Role is what a node does for a partition.
type Role uint8

// The roles of a partition on a node.
const (
	// RoleNone: hosted, neither leading nor following (after AddPartition
	// or StopPartition).
	RoleNone Role = iota
	// RoleLeader: this node leads the partition.
	RoleLeader
	// RoleFollower: this node fetches the partition from its leader.
	RoleFollower
)

// String returns "none", "leader" or "follower".
func (r Role) String() string {
	switch r {
	case RoleLeader:
		return "leader"
	case RoleFollower:
		return "follower"
	case RoleNone:
		return "none"
	}
	return fmt.Sprintf("Role(%d)", uint8(r))
}

// replicaState is what a leader knows of one follower.
type replicaState struct {
	leo                int64 // the follower's log end offset (its last fetch offset); -1 unknown
	logStart           int64 // the follower's log start offset, as its last fetch gave it
	lastCaughtUp       time.Time
	lastFetchLeaderLEO int64
	lastFetchTime      time.Time
}

// caughtUp says whether the follower is caught up at now as Kafka counts
// it (Replica.isCaughtUp): its log ends at the leader's, leo, or it was
// last caught up at most lag ago.
func (rs *replicaState) caughtUp(leo int64, now time.Time, lag time.Duration) bool {
	return rs.leo == leo || !rs.lastCaughtUp.IsZero() && now.Sub(rs.lastCaughtUp) <= lag
}

// partition is one replicated partition on this node. Its mutex guards
// the role state; the log has its own locking.
type partition struct {
	tp  TopicPartition
	log *log.Log

	mu     sync.Mutex
	role   Role
	epoch  int32
	leader int32 // current leader id (self when leading), -1 unknown
	// followed and led are the newest epochs this node followed another
	// leader at and led (kept by StopPartition): it never leads the one,
	// nor follows another node at the other, nor follows at followed a
	// leader other than followedLeader, or two leaders of one epoch
	// could write different batches at the same offsets, which no
	// divergence check tells apart.
	followed, led  int32
	followedLeader int32

	// leader state
	replicas   []int32
	isr        []int32
	followers  map[int32]*replicaState
	epochStart int64 // log end offset when this node became leader
	// leadCtx is canceled when this node stops leading at this epoch, to
	// release acks=all waiters.
	leadCtx    context.Context
	leadCancel context.CancelFunc
	// hwAdvanced wakes acks=all waiters when this node, as leader, moves
	// the high watermark (maybeAdvanceHW).
	hwAdvanced waitBroadcast

	// follower state
	backoffUntil time.Time
	// lastFetch is the seq of the newest fetch request built with this
	// partition: only its response applies (see responseApplier.stale).
	lastFetch uint64
	leaderLEO int64 // the leader's log end in its last response, -1 none yet

	// Counters for Stats. As leader: follower fetches answered and the
	// record bytes sent; as follower: responses applied and the record
	// bytes appended.
	fetches, fetchBytes atomic.Int64
}

// endLeadership cancels the current leadership, if any. Callers hold p.mu.
func (p *partition) endLeadership() {
	if p.leadCancel != nil {
		p.leadCancel()
		p.leadCtx, p.leadCancel = nil, nil
	}
}

// stopRole leaves the partition with no role and no leader state.
// Callers hold p.mu.
func (p *partition) stopRole() {
	p.endLeadership()
	p.role = RoleNone
	p.followers, p.isr, p.replicas = nil, nil, nil
}

func (p *partition) inISR(id int32) bool { return slices.Contains(p.isr, id) }

// leaderEnd is the leader's own contribution to the high watermark: its
// durable offset when acks must be durable, else its log end offset.
func (p *partition) leaderEnd(durable bool) int64 {
	if durable {
		return p.log.DurableOffset()
	}
	return p.log.LogEndOffset()
}

// candidateHW is min(log end) over the ISR and over the followers out of
// it that are caught up at now (within lag) and could join it (their log
// starts no lower than the leader's), as in Kafka
// (Partition.maybeIncrementLeaderHW): a follower that left the ISR must
// reach the high watermark to join again, and one that the high
// watermark always ran ahead of, by the appends made since its last
// fetch, would never join while producers write. Holding the high
// watermark at such a follower only delays it, by a fetch. Callers hold
// p.mu.
func (p *partition) candidateHW(durable bool, now time.Time, lag time.Duration) int64 {
	hw := p.leaderEnd(durable)
	leo, start := p.log.LogEndOffset(), p.log.LogStartOffset()
	for id, rs := range p.followers {
		if !p.inISR(id) {
			if rs.leo >= 0 && rs.logStart >= start && rs.caughtUp(leo, now, lag) {
				hw = min(hw, rs.leo)
			}
			continue
		}
		if rs.leo < 0 {
			return -1
		}
		hw = min(hw, rs.leo)
	}
	return hw
}
