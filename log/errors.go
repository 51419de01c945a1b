package log

import "errors"

// Sentinel errors returned by the log. Returned errors wrap one of these
// with context (file, offset); match them with errors.Is.
var (
	// ErrCorrupt reports bytes that are not a valid record batch, index or
	// checkpoint: bad magic, CRC mismatch, impossible lengths or counts.
	ErrCorrupt = errors.New("replog/log: corrupt data")
	// ErrInvalidRecord reports a batch that is well-formed but cannot be
	// appended: wrong offsets for a follower append, lastOffsetDelta that
	// does not match the record count, an unsupported codec.
	ErrInvalidRecord = errors.New("replog/log: invalid record batch")
	// ErrBatchTooLarge reports a batch larger than Options.MaxBatchBytes or
	// than a segment.
	ErrBatchTooLarge = errors.New("replog/log: record batch too large")
	// ErrOffsetOutOfRange reports a read or truncation outside
	// [LogStartOffset, LogEndOffset].
	ErrOffsetOutOfRange = errors.New("replog/log: offset out of range")
	// ErrClosed reports a call on a closed Log or Reader.
	ErrClosed = errors.New("replog/log: closed")
	// ErrSyncFailed reports that an earlier fsync failed. It is sticky: the
	// Log refuses appends and syncs until it is reopened, because the state
	// of the page cache after a failed fsync is unknown (fsyncgate).
	ErrSyncFailed = errors.New("replog/log: an earlier fsync failed; reopen the log")
)
