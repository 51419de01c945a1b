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
	lastCaughtUp       time.Time
	lastFetchLeaderLEO int64
	lastFetchTime      time.Time
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

// candidateHW is min(log end) over the ISR. Callers hold p.mu.
func (p *partition) candidateHW(durable bool) int64 {
	hw := p.leaderEnd(durable)
	for _, id := range p.isr {
		rs := p.followers[id]
		if rs == nil {
			continue // self
		}
		if rs.leo < 0 {
			return -1
		}
		hw = min(hw, rs.leo)
	}
	return hw
}
