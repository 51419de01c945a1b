package log

import "errors"

// Sentinel errors returned by the log. Returned errors wrap one of these
// with context (file, offset); match them with errors.Is.
var (
	// ErrCorrupt reports bytes that are not a valid record batch, index or
	// checkpoint: bad magic, CRC mismatch, impossible lengths or counts
	// (such as an uncompressed batch whose last offset delta is not its
	// record count - 1), an unknown codec id.
	ErrCorrupt = errors.New("replog/log: corrupt data")
	// ErrInvalidRecord reports a batch that is well-formed but cannot be
	// appended: offsets or leader epochs a follower append does not
	// allow, a leader batch with no records or a compressed one whose last
	// offset delta is not its record count - 1, a compressed stream using
	// a feature package compression does not implement.
	ErrInvalidRecord = errors.New("replog/log: invalid record batch")
	// ErrBatchTooLarge reports a batch larger than Options.MaxBatchBytes,
	// or an append (all its batches) larger than a segment.
	ErrBatchTooLarge = errors.New("replog/log: record batch too large")
	// ErrOffsetOutOfRange reports an offset outside [LogStartOffset,
	// LogEndOffset] given to a read (with ReadOptions.UpToHighWatermark
	// too: between the high watermark and the log end a read returns
	// nothing), a negative one or one past LogEndOffset given to
	// DeleteRecordsBefore (past HighWatermark after
	// RetainAboveHighWatermark), or one below LogStartOffset given to
	// TruncateTo (at or past the end, TruncateTo does nothing).
	ErrOffsetOutOfRange = errors.New("replog/log: offset out of range")
	// ErrClosed reports a call on a closed Log or Reader.
	ErrClosed = errors.New("replog/log: closed")
	// ErrSyncFailed reports that an earlier fsync failed, or another
	// write to durable state that left the files out of step with the
	// Log (a checkpoint, a rename or removal of segment files, a
	// truncation undoing a failed write). It is sticky: the Log refuses
	// appends and syncs until it is reopened, because the state of the
	// page cache after a failed fsync is unknown (fsyncgate), and a
	// reopen's recovery goes by what the files hold.
	ErrSyncFailed = errors.New("replog/log: an earlier fsync or durable write failed; reopen the log")
	// ErrInvalidOptions reports Options that Open (or OpenManager, in
	// ManagerOptions.Log) refuses; the message names the field.
	ErrInvalidOptions = errors.New("replog/log: invalid options")
	// ErrLocked reports a directory that another Log or Manager, in this
	// process or another, has open: Open and OpenManager lock it (a
	// ".lock" file, as Kafka's log directories have) until Close, since
	// two writers on one log corrupt it (each recovers and appends at its
	// own idea of the end).
	ErrLocked = errors.New("replog/log: directory in use by another Log or Manager")
)
