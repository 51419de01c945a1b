package replication

import (
	"fmt"
	"log/slog"
	"time"
)

// Acks is how much replication a produce waits for, as Kafka's acks.
type Acks int8

// Acks values.
const (
	// AcksNone returns once appended; the client does not wait (Kafka
	// acks=0).
	AcksNone Acks = 0
	// AcksLeader returns once appended on the leader.
	AcksLeader Acks = 1
	// AcksAll returns once the high watermark passed the batch.
	AcksAll Acks = -1
)

// Config configures a Node or Replicator. Zero fields get defaults; NewNode
// and New refuse negative numbers and durations, and a FetchMaxWait not
// shorter than ReplicaLagTime, with ErrInvalidConfig naming the field.
type Config struct {
	// ReplicaID is this node's id (required, >= 0).
	ReplicaID int32
	// ClusterID is carried in every request; requests from another
	// cluster are refused.
	ClusterID string
	// MinInsyncReplicas: acks=all produces fail with ErrNotEnoughReplicas
	// when fewer replicas are in sync, and the high watermark does not
	// advance then (default 1).
	MinInsyncReplicas int
	// ReplicaLagTime drops a follower from the ISR when it has not caught
	// up with the leader's log end for this long (default 30 s); a
	// follower whose log end is the leader's is caught up however long
	// ago it fetched, as in Kafka. It must be longer than FetchMaxWait.
	ReplicaLagTime time.Duration
	// RelaxedDurability counts unsynced data toward the high watermark, as
	// Kafka does by default. By default (false) the leader and followers
	// fsync before their data counts, so an acks=all record survives the
	// power loss of all but one in-sync replica.
	RelaxedDurability bool
	// FetchMaxBytes bounds a follower's fetch response (default 8 MiB).
	// Over TCP, the fetcher of each leader keeps its last response's
	// buffer, up to about this size, for the next response.
	FetchMaxBytes int32
	// FetchMaxWait is the long-poll time a follower asks for in its
	// fetches, and the longest a leader holds a fetch it has nothing for,
	// whatever the fetch asks (default 500 ms, or half of ReplicaLagTime
	// if that is less). It must be shorter than ReplicaLagTime, as Kafka
	// requires of replica.fetch.wait.max.ms: a caught-up follower whose
	// fetch is held would otherwise fall out of the ISR on an idle
	// partition and rejoin on every long poll.
	FetchMaxWait time.Duration
	// FetchBackoff is how long a follower waits after a fetch error
	// (default 100 ms).
	FetchBackoff time.Duration
	// OnISRChange is called when the leader wants to change a partition's
	// ISR; the change is applied only if it returns nil. Applications
	// persist the ISR here, as Kafka's controller does, and must refuse
	// a change whose leaderEpoch is older than the partition's newest
	// (a deposed leader's: accepting it can acknowledge records the new
	// leader never had; see the package documentation). It runs with the
	// partition's lock held, which keeps a partition's ISR changes in
	// order, so it must be short and must not call into the Node or
	// Replicator (Stats, role changes, Produce...): that deadlocks the
	// partition. Hand such work to another goroutine. A follower whose
	// joining is refused but that keeps fetching stays caught up, and the
	// high watermark keeps waiting for its fetches (see the package
	// documentation): stop a replica that must not join from fetching,
	// or drop it from the replicas with BecomeLeader. A Replicator
	// refuses ISR changes once its Close began, without calling it.
	OnISRChange func(tp TopicPartition, leaderEpoch int32, isr []int32) error
	// Logger receives warnings; nil discards them.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() (Config, error) {
	if c.ReplicaID < 0 {
		return c, fmt.Errorf("%w: Config.ReplicaID is %d, must not be negative", ErrInvalidConfig, c.ReplicaID)
	}
	if c.MinInsyncReplicas == 0 {
		c.MinInsyncReplicas = 1
	}
	if c.ReplicaLagTime == 0 {
		c.ReplicaLagTime = 30 * time.Second
	}
	if c.FetchMaxBytes == 0 {
		c.FetchMaxBytes = 8 << 20
	}
	if c.FetchMaxWait == 0 {
		c.FetchMaxWait = min(500*time.Millisecond, c.ReplicaLagTime/2)
	}
	if c.FetchBackoff == 0 {
		c.FetchBackoff = 100 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	for _, f := range []struct {
		field string
		value any
		bad   bool
	}{
		{"MinInsyncReplicas", c.MinInsyncReplicas, c.MinInsyncReplicas < 1},
		{"ReplicaLagTime", c.ReplicaLagTime, c.ReplicaLagTime < 0},
		{"FetchMaxBytes", c.FetchMaxBytes, c.FetchMaxBytes < 0},
		{"FetchMaxWait", c.FetchMaxWait, c.FetchMaxWait < 0},
		{"FetchBackoff", c.FetchBackoff, c.FetchBackoff < 0},
	} {
		if f.bad {
			return c, fmt.Errorf("%w: Config.%s is %v, must not be negative", ErrInvalidConfig, f.field, f.value)
		}
	}
	if c.FetchMaxWait >= c.ReplicaLagTime {
		return c, fmt.Errorf("%w: Config.FetchMaxWait %v must be shorter than ReplicaLagTime %v", ErrInvalidConfig, c.FetchMaxWait, c.ReplicaLagTime)
	}
	return c, nil
}
