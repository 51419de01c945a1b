package broker

import (
	"errors"

	replog "github.com/replog/replog/log"
)

// Kafka error codes this broker uses.
const (
	errNone                       int16 = 0
	errOffsetOutOfRange           int16 = 1
	errCorruptMessage             int16 = 2
	errUnknownTopicOrPartition    int16 = 3
	errNotLeader                  int16 = 6
	errMessageTooLarge            int16 = 10
	errOffsetMetadataTooLarge     int16 = 12
	errInvalidTopic               int16 = 17
	errInvalidRequiredAcks        int16 = 21
	errIllegalGeneration          int16 = 22
	errInconsistentGroupProtocol  int16 = 23
	errInvalidGroupID             int16 = 24
	errUnknownMemberID            int16 = 25
	errInvalidSessionTimeout      int16 = 26
	errRebalanceInProgress        int16 = 27
	errUnsupportedVersion         int16 = 35
	errTopicAlreadyExists         int16 = 36
	errInvalidPartitions          int16 = 37
	errInvalidReplicationFactor   int16 = 38
	errInvalidCommitOffsetSize    int16 = 28
	errInvalidRequest             int16 = 42
	errOutOfOrderSequence         int16 = 45
	errInvalidProducerEpoch       int16 = 47
	errStorage                    int16 = 56
	errFencedLeaderEpoch          int16 = 74
	errUnknownLeaderEpoch         int16 = 75
	errUnsupportedCompressionType int16 = 76
	errInvalidRecord              int16 = 87
)

// appendErrorCode maps an error of Log.AppendAsLeader to a produce error code.
func appendErrorCode(err error) int16 {
	switch {
	case errors.Is(err, replog.ErrCorrupt):
		return errCorruptMessage
	case errors.Is(err, replog.ErrInvalidRecord):
		return errInvalidRecord
	case errors.Is(err, replog.ErrBatchTooLarge):
		return errMessageTooLarge
	case errors.Is(err, replog.ErrOutOfOrderSequence):
		return errOutOfOrderSequence
	case errors.Is(err, replog.ErrProducerFenced):
		return errInvalidProducerEpoch
	case errors.Is(err, replog.ErrClosed):
		return errNotLeader // shutting down: the client retries elsewhere or later
	default:
		return errStorage
	}
}

// leaderEpochError checks a request's current leader epoch against this
// node's, which is always 0; -1 means the client does not know it.
func leaderEpochError(epoch int32) int16 {
	switch {
	case epoch < 0 || epoch == leaderEpoch:
		return errNone
	case epoch < leaderEpoch:
		return errFencedLeaderEpoch
	default:
		return errUnknownLeaderEpoch
	}
}

// leaderEpoch is the epoch of every partition: a single node never changes
// leader.
const leaderEpoch int32 = 0

// nodeID is this broker's id in metadata and coordinator answers.
const nodeID int32 = 0
