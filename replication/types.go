package replication

import (
	"errors"
	"fmt"

	"github.com/replog/replog/log"
)

// TopicPartition names a partition.
type TopicPartition struct {
	// Topic is the topic's name.
	Topic string
	// Partition is the partition's number within the topic.
	Partition int32
}

// String renders tp as Kafka does: topic-partition.
func (tp TopicPartition) String() string { return fmt.Sprintf("%s-%d", tp.Topic, tp.Partition) }

// Errors returned by the Replicator and the Node; the first seven, and
// ErrRecordTooLarge, are also carried in fetch responses, as ErrorCodes.
// Match them with errors.Is.
var (
	// ErrNotLeader: this node does not lead the partition (Produce, a
	// fetch), or stopped leading it before an acks=all produce was
	// acknowledged.
	ErrNotLeader = errors.New("replication: not the leader of the partition")
	// ErrFencedLeaderEpoch: a fetch carries an epoch older than the
	// partition's.
	ErrFencedLeaderEpoch = errors.New("replication: leader epoch is older than the current one")
	// ErrUnknownLeaderEpoch: a fetch carries an epoch newer than the
	// partition's (the leader has not heard of it yet).
	ErrUnknownLeaderEpoch = errors.New("replication: leader epoch is newer than the current one")
	// ErrOffsetOutOfRange: a fetch offset outside the leader's log.
	ErrOffsetOutOfRange = errors.New("replication: fetch offset out of range")
	// ErrUnknownPartition: the partition is not hosted here.
	ErrUnknownPartition = errors.New("replication: unknown partition")
	// ErrNotReplica: a fetch from a node that is not in the partition's
	// replica set.
	ErrNotReplica = errors.New("replication: not a replica of the partition")
	// ErrStorage wraps a log error (a failed append, read or fsync).
	ErrStorage = errors.New("replication: storage error")
	// ErrNotEnoughReplicas: an acks=all produce while the ISR is smaller
	// than MinInsyncReplicas; nothing was appended.
	ErrNotEnoughReplicas = errors.New("replication: fewer in-sync replicas than MinInsyncReplicas")
	// ErrStaleEpoch: a role change (BecomeLeader, BecomeFollower) at an
	// epoch older than the partition's.
	ErrStaleEpoch = errors.New("replication: role change with an epoch older than the current one")
	// ErrClusterMismatch: a fetch from a node of another cluster.
	ErrClusterMismatch = errors.New("replication: request from another cluster")
	// ErrClosed: the Replicator (or transport) is closed.
	ErrClosed = errors.New("replication: closed")
	// ErrInvalidAssignment: a role change with an inconsistent replica
	// set or ISR.
	ErrInvalidAssignment = errors.New("replication: invalid replica assignment")
	// ErrInvalidAcks: Produce with an acks value other than AcksNone,
	// AcksLeader or AcksAll.
	ErrInvalidAcks = errors.New("replication: acks must be AcksNone (0), AcksLeader (1) or AcksAll (-1)")
	// ErrInvalidConfig: New or NewNode with a Config out of range; the
	// message names the field.
	ErrInvalidConfig = errors.New("replication: invalid config")
	// ErrPartitionExists: AddPartition of a partition already hosted.
	ErrPartitionExists = errors.New("replication: partition already added")
	// ErrRecordTooLarge: the leader cannot send the batch at a follower's
	// fetch offset, which alone exceeds the transport's frame limit
	// (TCPOptions.MaxFrameBytes). The follower backs the partition off and
	// reports it, and cannot replicate past it until the limit is raised.
	ErrRecordTooLarge = errors.New("replication: batch larger than the transport's frame limit")
)

// ErrorCode is a partition error in a fetch response.
type ErrorCode int16

// Error codes; each maps to one of the sentinel errors (ErrorCode.Err).
const (
	CodeNone               ErrorCode = iota // CodeNone: no error
	CodeNotLeader                           // CodeNotLeader: ErrNotLeader
	CodeFencedLeaderEpoch                   // CodeFencedLeaderEpoch: ErrFencedLeaderEpoch
	CodeUnknownLeaderEpoch                  // CodeUnknownLeaderEpoch: ErrUnknownLeaderEpoch
	CodeOffsetOutOfRange                    // CodeOffsetOutOfRange: ErrOffsetOutOfRange
	CodeUnknownPartition                    // CodeUnknownPartition: ErrUnknownPartition
	CodeNotReplica                          // CodeNotReplica: ErrNotReplica
	CodeStorage                             // CodeStorage: ErrStorage
	CodeRecordTooLarge                      // CodeRecordTooLarge: ErrRecordTooLarge
)

var codeErrors = [...]error{nil, ErrNotLeader, ErrFencedLeaderEpoch, ErrUnknownLeaderEpoch,
	ErrOffsetOutOfRange, ErrUnknownPartition, ErrNotReplica, ErrStorage, ErrRecordTooLarge}

// Err returns the sentinel error for the code, or nil for CodeNone.
func (c ErrorCode) Err() error {
	if int(c) < len(codeErrors) && c >= 0 {
		return codeErrors[c]
	}
	return fmt.Errorf("%w: unknown error code %d", ErrStorage, c)
}

// FetchRequest is what a follower sends its leader: for each partition it
// follows there, where its log ends and the epoch of its last batch.
type FetchRequest struct {
	// ClusterID must be the leader's (Config.ClusterID).
	ClusterID string
	// ReplicaID is the follower's node id.
	ReplicaID int32
	// MaxBytes bounds the records in the whole response (at least one
	// batch is always returned for the first partition with data).
	MaxBytes int32
	// MaxWaitMs is how long the leader may hold the request when it has
	// no data (long poll), at most the leader's own Config.FetchMaxWait;
	// 0 answers at once.
	MaxWaitMs int32
	// Partitions are the partitions the follower fetches from this
	// leader, in the order it walks them.
	Partitions []FetchPartition

	// seq numbers the requests a Node builds (BuildFetch), from 1; it
	// is not sent. A response applies only to the newest request built
	// for its partition; requests made otherwise (0) are not checked.
	seq uint64
}

// FetchPartition is one partition of a FetchRequest.
type FetchPartition struct {
	TopicPartition
	// CurrentLeaderEpoch is the epoch the follower knows; the leader
	// fences older ones and refuses newer ones.
	CurrentLeaderEpoch int32
	// FetchOffset is the follower's log end offset.
	FetchOffset int64
	// LastFetchedEpoch is the epoch of the follower's last batch, or
	// log.NoLeaderEpoch; the leader checks it for divergence.
	LastFetchedEpoch int32
	// LogStartOffset is the follower's log start offset. The leader
	// admits the follower to the ISR only once it is at or above the
	// leader's: below its own start the leader has deleted the epochs it
	// would check the follower's records against.
	LogStartOffset int64
}

// EpochEndOffset is a diverging epoch: the largest epoch of the leader at
// or below the follower's last fetched epoch, and where it ends.
type EpochEndOffset struct {
	// Epoch is the leader's epoch.
	Epoch int32
	// EndOffset is where Epoch ends in the leader's log (the start of
	// the next epoch, or the log end).
	EndOffset int64
}

// FetchResponse answers a FetchRequest, partition by partition in the
// request's order.
type FetchResponse struct {
	// Partitions answer the request's partitions, one each, in order.
	Partitions []FetchPartitionResponse
}

// FetchPartitionResponse is one partition of a FetchResponse.
type FetchPartitionResponse struct {
	TopicPartition
	// Error is CodeNone, or why there are no records.
	Error ErrorCode
	// HighWatermark is the leader's high watermark (-1 with an error
	// that leaves it unknown).
	HighWatermark int64
	// LogStartOffset is the leader's log start offset (-1 if unknown).
	LogStartOffset int64
	// LogEndOffset is the leader's log end offset (-1 if unknown).
	LogEndOffset int64
	// Diverging is set when the follower's log diverges from the leader's:
	// it must truncate (see the package documentation) before fetching on.
	Diverging *EpochEndOffset
	// Records are whole batches from FetchOffset on. On the leader side
	// they may instead be described by Region (zero-copy, until sent).
	Records []byte
	// Region describes the records in the leader's segment file, when
	// Records is nil (see Materialize).
	Region log.Region
}

// Materialize replaces every Region by its bytes, as an in-memory
// transport does before handing the response to another node.
func (r *FetchResponse) Materialize() error {
	for i := range r.Partitions {
		p := &r.Partitions[i]
		if p.Region.Length == 0 {
			continue
		}
		buf := make([]byte, p.Region.Length)
		n, err := p.Region.File.ReadAt(buf, p.Region.Position)
		if n < len(buf) {
			// io.EOF included: the region promised bytes the file lacks.
			return fmt.Errorf("%w: read %d of the %d bytes at %d: %v", ErrStorage, n, len(buf), p.Region.Position, err)
		}
		p.Records, p.Region = buf, log.Region{}
	}
	return nil
}
