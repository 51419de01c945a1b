package log

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/replog/replog/internal/vfs"
)

// Defaults for Options fields left zero.
const (
	DefaultSegmentBytes       = 1 << 30
	DefaultSegmentAge         = 7 * 24 * time.Hour
	DefaultIndexIntervalBytes = 4096
	DefaultMaxIndexBytes      = 10 << 20
	DefaultMaxBatchBytes      = 8 << 20
	DefaultFileDeleteDelay    = time.Minute
	DefaultReadMaxBytes       = 1 << 20
	DefaultCheckpointInterval = time.Minute
	DefaultPreallocateBytes   = 128 << 20

	DefaultProducerIDExpiration        = 7 * 24 * time.Hour
	DefaultProducerExpiryCheckInterval = 10 * time.Minute
)

// Options configure a Log. The zero value gives Kafka's defaults: 1 GiB
// segments rolled after 7 days, an index entry every 4096 bytes, no
// time- or count-based fsync (data is fsynced on roll, by Sync and on
// Close), no retention. Open refuses a negative size, count or duration
// (but for SegmentAge, CheckpointInterval and PreallocateBytes, where
// negative means something of its own), SegmentBytes over 2^31-1, and
// SegmentBytes or MaxBatchBytes below a batch header (61 bytes) or
// MaxIndexBytes below 32, with ErrInvalidOptions naming the field.
type Options struct {
	// SegmentBytes is the size at which a segment is rolled. Appends do
	// not wait for the background fsyncs of rolled segments, which queue
	// without bound: segments so small that appends roll them faster
	// than the disk fsyncs them leave the recovery point behind, and
	// Close waits for the whole queue.
	SegmentBytes int64
	// SegmentAge rolls a non-empty active segment at the first append
	// this long after it was created (for the segment active at Open,
	// after the Open); negative disables age-based rolling.
	SegmentAge time.Duration
	// SegmentJitter subtracts a random duration in [0, SegmentJitter) from
	// SegmentAge, chosen once per segment, so that many logs do not roll
	// at once. It is capped at SegmentAge, as in Kafka.
	SegmentJitter time.Duration
	// IndexIntervalBytes is how many bytes are appended, at least, between
	// two offset index entries (default 4096).
	IndexIntervalBytes int
	// MaxIndexBytes is the size at which an offset index is full; the
	// segment is then rolled.
	MaxIndexBytes int
	// MaxBatchBytes is the largest batch accepted by Append. It is capped
	// at SegmentBytes. Recovery and Readers accept larger batches written
	// under a larger limit.
	MaxBatchBytes int

	// SyncEveryAppend makes each Append return only after its data was
	// fsynced (sharing fsyncs with concurrent appenders).
	SyncEveryAppend bool
	// SyncEveryMessages fsyncs after this many records were appended since
	// the last fsync it made (0: off); other fsyncs do not restart its
	// count. The append that crosses it waits for it.
	SyncEveryMessages int
	// SyncInterval fsyncs in the background this often (0: off).
	SyncInterval time.Duration

	// RetentionBytes deletes the oldest segments while the log is larger
	// than this and stays at least this large without them, as Kafka
	// does (0: unlimited).
	RetentionBytes int64
	// RetentionAge deletes segments whose newest timestamp is older than
	// this (0: unlimited); a segment whose batches carry no timestamp
	// (NoTimestamp, or times before 1970) goes by its data file's
	// modification time, as in Kafka.
	RetentionAge time.Duration
	// RetentionCheckInterval applies retention in the background this
	// often (0: only when ApplyRetention is called).
	RetentionCheckInterval time.Duration
	// FileDeleteDelay is how long the files of a deleted segment stay open
	// (renamed to .deleted) so that readers holding regions can finish.
	FileDeleteDelay time.Duration

	// ProducerIDExpiration drops the state of producer ids whose newest
	// batch timestamp is older than this (default 7 days), at each
	// ProducerExpiryCheckInterval and whenever the state is loaded (Open,
	// TruncateTo); retries of their batches are then no longer recognised.
	// Timestamps are the batches' own, compared with Now: a log whose
	// producers write far-past timestamps needs a longer expiration. The
	// newest is the largest of a producer's batches, where Kafka takes its
	// last batch's: a batch stamped in the future keeps its producer until
	// that time has passed.
	ProducerIDExpiration time.Duration
	// ProducerExpiryCheckInterval is how often the background flusher
	// looks for expired producer ids (default 10 minutes).
	ProducerExpiryCheckInterval time.Duration

	// VerifyReadCRC makes Read also verify the CRC of every batch it
	// returns, so that a bit flip on disk is reported as ErrCorrupt
	// instead of being returned. By default Read does what Kafka's broker
	// does: it checks framing, header fields and offsets, but not the
	// CRC, which was verified when the batch was appended (or by recovery)
	// and which the consumer verifies end to end; computing it again
	// would cost about a third of the read throughput. A Reader, being
	// the consumer, verifies CRCs unless ReaderOptions.SkipCRC is set.
	// ReadRegion never verifies: its bytes go to the network unread.
	VerifyReadCRC bool

	// TruncateAtCorruption makes Open truncate the log at an invalid
	// batch found by recovery even when valid batches follow it,
	// dropping them, as Kafka's recovery does. By default Open refuses:
	// it fails with an error wrapping ErrCorrupt that names the segment
	// and position and changes no file, since the data after the damage
	// may have been acknowledged. Set it for a replica that can fetch
	// the dropped data again from its leader. Torn tails are truncated
	// either way (see the package documentation for how recovery tells
	// them from damage). Likewise a checkpointed log start offset past
	// the log end after a clean shutdown, which a live log never has, is
	// refused as ErrCorrupt by default, and restarts the log empty at
	// that start with TruncateAtCorruption, as it does after a crash
	// (when it means the start was moved past data never fsynced).
	TruncateAtCorruption bool

	// FlushGroup, shared by several Logs, bounds how many of them run
	// their background roll work (fsyncs, index, snapshot and spare
	// segment files) at once. A flusher spends its time in blocking
	// system calls, and a goroutine in one keeps its P until the Go
	// runtime's monitor takes it back (up to ~20 ms when idle); file
	// creation also costs kernel CPU. When many logs roll together, their
	// flushers would otherwise hold every P and core and stall the
	// appenders. Nil: no bound. A Manager's logs are bounded by its
	// scheduler instead.
	FlushGroup *FlushGroup

	// CheckpointInterval is the least time between two writes of the
	// recovery-point checkpoint after roll flushes (default one minute,
	// Kafka's log.flush.offset.checkpoint.interval.ms; negative: after
	// every roll flush). In between, the recovery point advances in memory
	// and the file keeps an older one, which only makes recovery after a
	// crash scan (and validate) the segments written since, up to a
	// minute of appends. Each write creates, fsyncs and renames a file and
	// fsyncs the directory: once a second, 100 logs that roll often spent
	// more on these writes than on the roll flushes themselves, and the
	// appenders' p99.9 latency showed it (BenchmarkRollLatency). Truncations
	// and Close write it at once. A Manager batches its logs' checkpoints
	// itself.
	CheckpointInterval time.Duration

	// PreallocateBytes is how much of the next segment's file the
	// flusher allocates on disk, off the append path, when it prepares
	// that file (fallocate, keeping the file's size; Linux only). Writing
	// into allocated space costs about a fifth less than growing a file
	// page by page (ext4, measured 23-27%). Default 128 MiB, capped at
	// SegmentBytes; negative: none. What a segment did not use is
	// released when it rolls and at Close, so a log holds at most two
	// such allocations at a time (its active segment's and the next
	// one's).
	PreallocateBytes int64

	// Logger receives warnings (recovery truncations) and errors of the
	// background flusher. Nil discards them.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	// FS is the filesystem; nil means the real one. Tests use the
	// crash-simulating and error-injecting filesystems of internal/vfs.
	FS vfs.FS

	// syncRollInline makes roll fsync on the append path, as Kafka did
	// before KAFKA-15046; only benchmarks set it, to measure the baseline.
	syncRollInline bool
	// sched, when set by a Manager, runs the background work on the
	// Manager's shared workers instead of a goroutine of the Log's own.
	sched *scheduler
	// files, when set by a Manager, bounds the open segment files.
	files *fileCache
	// recoveryPoints, when set by a Manager, keeps the recovery point in
	// the Manager's one checkpoint file instead of the log's own, and so
	// the clean-shutdown marker and the high watermark.
	recoveryPoints recoveryPointStore
	// dirSynced is set by a Manager that made the log directory's entry
	// durable itself: Open need not sync the parent directory.
	dirSynced bool
}

// recoveryPointStore keeps the recovery points of many logs, and what a
// clean Close leaves: the log end offset (the clean-shutdown marker) and
// the high watermark.
type recoveryPointStore interface {
	// load returns dir's recovery point; lost says it has none because
	// the store's file was unreadable.
	load(dir string) (rp int64, ok, lost bool)
	// store records rp; with urgent it is durable before store returns.
	store(dir string, rp int64, urgent bool) error
	// loadClean returns the log end offset of a clean Close that Open may
	// trust.
	loadClean(dir string) (int64, bool)
	// storeClean records a clean Close at leo with high watermark hw, to
	// become durable later (at the Manager's Close).
	storeClean(dir string, leo, hw int64)
	// loadHighWatermark returns the high watermark of the last clean
	// Close.
	loadHighWatermark(dir string) (int64, bool)
	// fileHoldsAtLeast reports whether the durable checkpoint certainly
	// holds a recovery point of at least min for dir (lazy stores are
	// written later).
	fileHoldsAtLeast(dir string, min int64) bool
	// fileMayExceed reports whether the durable checkpoint may hold a
	// recovery point above off for dir.
	fileMayExceed(dir string, off int64) bool
}

// withDefaults returns a copy of o with zero fields set to their defaults,
// or an error for contradictory values.
func (o Options) withDefaults() (Options, error) {
	if o.SegmentBytes == 0 {
		o.SegmentBytes = DefaultSegmentBytes
	}
	if o.SegmentAge == 0 {
		o.SegmentAge = DefaultSegmentAge
	}
	if o.IndexIntervalBytes == 0 {
		o.IndexIntervalBytes = DefaultIndexIntervalBytes
	}
	if o.MaxIndexBytes == 0 {
		o.MaxIndexBytes = DefaultMaxIndexBytes
	}
	if o.MaxBatchBytes == 0 {
		o.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if int64(o.MaxBatchBytes) > o.SegmentBytes {
		o.MaxBatchBytes = int(o.SegmentBytes)
	}
	if o.ProducerIDExpiration == 0 {
		o.ProducerIDExpiration = DefaultProducerIDExpiration
	}
	if o.ProducerExpiryCheckInterval == 0 {
		o.ProducerExpiryCheckInterval = DefaultProducerExpiryCheckInterval
	}
	if o.CheckpointInterval == 0 {
		o.CheckpointInterval = DefaultCheckpointInterval
	}
	if o.FileDeleteDelay == 0 {
		o.FileDeleteDelay = DefaultFileDeleteDelay
	}
	if o.PreallocateBytes == 0 {
		o.PreallocateBytes = DefaultPreallocateBytes
	}
	o.PreallocateBytes = min(o.PreallocateBytes, o.SegmentBytes)
	if o.SegmentAge > 0 {
		// A larger jitter would make the age to roll at negative: a
		// roll at every append.
		o.SegmentJitter = min(o.SegmentJitter, o.SegmentAge)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, o.checkRanges()
}

// checkRanges returns ErrInvalidOptions naming the first field of o (with
// defaults applied) out of its range.
func (o Options) checkRanges() error {
	for _, c := range []struct {
		field string
		value any
		bad   bool
		want  string
	}{
		{"SegmentBytes", o.SegmentBytes, o.SegmentBytes < BatchHeaderSize || o.SegmentBytes > 1<<31-1, fmt.Sprintf("in [%d, 2^31-1]", BatchHeaderSize)},
		{"IndexIntervalBytes", o.IndexIntervalBytes, o.IndexIntervalBytes < 0, "not negative"},
		{"MaxIndexBytes", o.MaxIndexBytes, o.MaxIndexBytes < 4*offsetEntrySize, fmt.Sprintf("at least %d", 4*offsetEntrySize)},
		{"MaxBatchBytes", o.MaxBatchBytes, o.MaxBatchBytes < BatchHeaderSize, fmt.Sprintf("at least %d", BatchHeaderSize)},
		{"SyncEveryMessages", o.SyncEveryMessages, o.SyncEveryMessages < 0, "not negative"},
		{"SyncInterval", o.SyncInterval, o.SyncInterval < 0, "not negative"},
		{"RetentionBytes", o.RetentionBytes, o.RetentionBytes < 0, "not negative"},
		{"RetentionAge", o.RetentionAge, o.RetentionAge < 0, "not negative"},
		{"RetentionCheckInterval", o.RetentionCheckInterval, o.RetentionCheckInterval < 0, "not negative"},
		{"FileDeleteDelay", o.FileDeleteDelay, o.FileDeleteDelay < 0, "not negative"},
		{"SegmentJitter", o.SegmentJitter, o.SegmentJitter < 0, "not negative"},
		{"ProducerIDExpiration", o.ProducerIDExpiration, o.ProducerIDExpiration < 0, "not negative"},
		{"ProducerExpiryCheckInterval", o.ProducerExpiryCheckInterval, o.ProducerExpiryCheckInterval < 0, "not negative"},
	} {
		if c.bad {
			return fmt.Errorf("%w: Options.%s is %v, must be %s", ErrInvalidOptions, c.field, c.value, c.want)
		}
	}
	return nil
}
