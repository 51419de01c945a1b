package replication

import (
	"cmp"
	"maps"
	"slices"
	"time"
)

// Stats is a snapshot of a Node: every partition it hosts and its
// counters since NewNode. Counters only grow, so a rate (fetches or bytes
// per second) is the difference between two snapshots divided by the
// difference of their At. Each partition is read under its lock, then the
// node's totals: a fetch or response being counted meanwhile may show in
// one and not yet in the other.
type Stats struct {
	// At is the time the snapshot was taken for (the now passed to
	// Node.Stats; Replicator.Stats passes Config.Now).
	At time.Time

	// Leader side: fetch requests answered (HandleFetch), including
	// those with nothing to send, and the record bytes sent.
	FetchesServed, BytesServed int64
	// Follower side: fetch responses applied and the record bytes they
	// appended.
	FetchesApplied, BytesFetched int64
	// ISRChanges counts ISR changes applied on partitions led here;
	// Truncations, follower truncations (a diverging epoch, or a fetch
	// offset out of the leader's range).
	ISRChanges, Truncations int64

	// Partitions are sorted by topic, then partition.
	Partitions []PartitionStats
}

// PartitionStats describes one partition hosted by a node.
type PartitionStats struct {
	TopicPartition
	// Role is the partition's role on this node.
	Role Role
	// Epoch is the current leader epoch.
	Epoch int32
	// Leader is the last known leader's replica id (this node's when
	// leading, and after StopPartition still the last one), -1 when
	// none is known.
	Leader int32

	// LogStartOffset, LogEndOffset and HighWatermark are this node's
	// log's.
	LogStartOffset, LogEndOffset, HighWatermark int64

	// Leader only: the assignment, the in-sync replicas (this node
	// included) and what the leader knows of each follower.
	Replicas, ISR []int32
	Followers     []FollowerStats // sorted by replica id

	// Follower only: the leader's log end offset in its last response
	// (-1 before the first), and Lag, how many offsets this log ends
	// behind it (0 when caught up, -1 unknown).
	LeaderLogEndOffset, Lag int64

	// Fetches and Bytes count, for this partition, the follower fetches
	// answered and the record bytes sent while leading, plus the leader
	// responses applied and the record bytes appended while following.
	Fetches, Bytes int64
}

// FollowerStats is what a leader knows of one follower of a partition.
type FollowerStats struct {
	// ReplicaID is the follower's node id.
	ReplicaID int32
	// LogEndOffset is the follower's log end: the offset of its last
	// fetch (-1 before the first fetch at this epoch).
	LogEndOffset int64
	// Lag is how many offsets the follower's log ends behind the
	// leader's (-1 unknown).
	Lag int64
	// LastFetch is when it last fetched; LastCaughtUp, when it was last
	// caught up, as Kafka counts it: at a fetch of the leader's log end,
	// or, at a fetch reaching the log end the leader had at the previous
	// fetch, that previous fetch's time (before any fetch, the role
	// change's time for an ISR member, zero for a follower out of the
	// ISR). Its ISR membership runs out ReplicaLagTime after
	// LastCaughtUp; out of the ISR, the high watermark waits for it while
	// it is caught up (at the leader's log end, or within ReplicaLagTime
	// of LastCaughtUp) and its log starts no lower than the leader's.
	LastFetch, LastCaughtUp time.Time
	// InSync says the follower is in the ISR.
	InSync bool
}

// Stats returns a snapshot of the node for the time now.
func (n *Node) Stats(now time.Time) Stats {
	n.mu.RLock()
	parts := slices.Collect(maps.Values(n.parts))
	n.mu.RUnlock()
	slices.SortFunc(parts, func(a, b *partition) int {
		return cmp.Or(cmp.Compare(a.tp.Topic, b.tp.Topic), cmp.Compare(a.tp.Partition, b.tp.Partition))
	})
	st := Stats{At: now, Partitions: make([]PartitionStats, 0, len(parts))}
	for _, p := range parts {
		st.Partitions = append(st.Partitions, p.stats())
	}
	// The totals after the partitions, so that they include, at least,
	// what the leader side counted in them (it counts the totals first).
	st.FetchesServed, st.BytesServed = n.stats.fetches.Load(), n.stats.servedBytes.Load()
	st.FetchesApplied, st.BytesFetched = n.stats.responses.Load(), n.stats.fetchedBytes.Load()
	st.ISRChanges, st.Truncations = n.stats.isrChanges.Load(), n.stats.truncations.Load()
	return st
}

// stats describes p now.
func (p *partition) stats() PartitionStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.log
	ps := PartitionStats{TopicPartition: p.tp, Role: p.role, Epoch: p.epoch, Leader: p.leader,
		LogStartOffset: l.LogStartOffset(), LogEndOffset: l.LogEndOffset(), HighWatermark: l.HighWatermark(),
		LeaderLogEndOffset: -1, Lag: -1, Fetches: p.fetches.Load(), Bytes: p.fetchBytes.Load()}
	switch p.role {
	case RoleLeader:
		ps.Replicas, ps.ISR = slices.Clone(p.replicas), slices.Clone(p.isr)
		for _, id := range slices.Sorted(maps.Keys(p.followers)) {
			rs := p.followers[id]
			fs := FollowerStats{ReplicaID: id, LogEndOffset: rs.leo, Lag: -1,
				LastFetch: rs.lastFetchTime, LastCaughtUp: rs.lastCaughtUp, InSync: p.inISR(id)}
			if rs.leo >= 0 {
				fs.Lag = max(ps.LogEndOffset-rs.leo, 0)
			}
			ps.Followers = append(ps.Followers, fs)
		}
	case RoleFollower:
		ps.LeaderLogEndOffset = p.leaderLEO
		if p.leaderLEO >= 0 {
			ps.Lag = max(p.leaderLEO-ps.LogEndOffset, 0)
		}
	}
	return ps
}

// Stats returns a snapshot of the replicator's node (Node.Stats at
// Config.Now).
func (r *Replicator) Stats() Stats { return r.node.Stats(r.cfg.Now()) }
