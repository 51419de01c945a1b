// Package log is a segmented, append-only log of Kafka v2 record batches:
// the storage layer of replog.
//
// A Log lives in one directory. Its records are grouped in batches, stored
// byte for byte in Kafka's record batch v2 format, in segment files named
// by their first offset, with sparse offset and time indexes, exactly as a
// Kafka partition directory:
//
//	00000000000000000000.log        batches, back to back
//	00000000000000000000.index      offset index (8-byte entries)
//	00000000000000000000.timeindex  time index (12-byte entries)
//	00000000000000524288.log        next segment, first offset 524288
//	recovery-point                  checkpoint: offsets below are fsynced
//	log-start-offset                checkpoint: first readable offset
//	high-watermark                  checkpoint: high watermark at Close (used after a clean Close only)
//	clean-shutdown                  marker written by Close, removed by Open
//	00000000000000524288.snapshot   producer state as of offset 524288
//	leader-epoch-checkpoint         which leader epoch wrote which offsets
//	next-segment.log.tmp            empty file the next roll renames (spare),
//	                                its disk space allocated ahead
//	.lock                           locked while the Log is open (flock on
//	                                Unix, LockFileEx on Windows): a second
//	                                Open fails with ErrLocked
//
// # Using a Log
//
//	l, err := log.Open(dir, log.Options{})
//	b := log.NewBatchBuilder()
//	b.Add(time.Now().UnixMilli(), []byte("key"), []byte("value"))
//	batch, _ := b.Build(nil)
//	info, err := l.Append(batch) // info.FirstOffset is the record's offset
//	err = l.Sync()               // durable from here on
//	buf, err := l.Read(nil, info.FirstOffset, log.ReadOptions{})
//	err = l.Close()
//
// A Log is safe for concurrent use. Appends serialize on one lock; reads,
// syncs and waits run concurrently with them and, by themselves, never
// block an append for longer than a pointer swap. Calls that delete or
// cut segment files (retention, DeleteRecordsBefore, TruncateTo,
// TruncateFullyAndStartAt, a follower's append past an empty segment's
// range) wait for the reads in progress while holding the append lock:
// during one of them, an append can wait as long as a slow read's I/O.
//
// # Durability contract
//
//   - Append returns once the batches are written to the active segment
//     file (the page cache) and indexed: their offsets are final and
//     readers see them. It does not fsync.
//   - Sync returns once every batch appended before it is fsynced, with the
//     directory entries of new segments. Concurrent callers share one
//     fsync (group commit). Options.SyncEveryAppend, SyncEveryMessages and
//     SyncInterval fsync automatically.
//   - Rolling a segment does not fsync on the append path: the old segment,
//     its index files and the directory are fsynced by the Log's background
//     flusher, which then advances the recovery point (written atomically:
//     temporary file, fsync, rename, fsync of the directory; at most once
//     per Options.CheckpointInterval, a minute by default, the file lagging
//     in between). This is the fix of KAFKA-9693/KAFKA-15046. The one
//     exception is a follower append that leaves an offset gap between
//     segments: it flushes the earlier segments and writes the recovery
//     point before it returns, so that recovery never mistakes the gap for
//     lost data. Nor does a roll normally create a file: the flusher
//     creates the next segment's file ahead of time (next-segment.log.tmp,
//     once the active segment is half full) and the roll renames it (only
//     if none is ready does the roll create one), because
//     creating a file can cost milliseconds of kernel CPU (ext4 without a
//     journal scans recently freed inodes). The flusher also allocates the
//     file's first Options.PreallocateBytes on disk (Linux fallocate,
//     keeping its size 0): appends into allocated space cost about a fifth
//     less than appends that grow a file. What a segment did not use is
//     released when it rolls and at Close. Logs that roll together can
//     share an Options.FlushGroup so that their flushers do not take every
//     core.
//   - A failed fsync is sticky: the Log refuses appends and syncs with an
//     error wrapping ErrSyncFailed until it is reopened, and nothing after
//     the last successful Sync is reported durable. So is any other failed
//     write that leaves the files out of step with the Log (a checkpoint,
//     a segment rename or removal, the truncation undoing a failed write,
//     a write after a roll that moved the log start or recovery point).
//     Not so a segment file that a Manager's file cache cannot reopen for
//     want of descriptors or memory (EMFILE, ENFILE, ENOMEM) for an
//     append's write or a Sync's fsync: nothing reached the file and no
//     fsync ran, so the append or Sync returns that error, the Log stays
//     usable, and a pending roll flush is tried again a second later
//     (unless it protects a follower's gap: then the Log fails). So is a
//     roll flush, or a Close, that cannot open an index or snapshot file
//     for the same reasons: the flush is tried again, and a Close leaves
//     no clean-shutdown marker. Other open failures, and those of
//     truncations and checkpoint files, fail the Log.
//   - Open after a clean Close reads no segment data (it trusts the
//     clean-shutdown marker only if the active segment's size and index
//     files agree with it; see "Index files").
//     After a crash it scans the segments from the recovery point on,
//     validating each batch (framing, magic, CRC, offsets), truncates the
//     log at the first invalid batch when it is what a crash leaves (a torn
//     tail: a cut batch, whose records run past the end of the file; zeros,
//     as a whole 512-byte sector, the rest of a sector from a batch's start
//     or the start of a sector up to the end of the file; nothing valid
//     after it), deletes later segments and rebuilds the indexes; it then
//     writes the scanned data back in place before fsyncing it, because a
//     process before it may have died after a failed fsync, whose pages
//     Linux marks clean unwritten, so that no later fsync writes them
//     ("fsyncgate"; costs one write of the scanned bytes). Damage
//     that a crash does not leave is in the middle of the log: valid
//     batches after the invalid one (found past it when its length field is
//     damaged), a whole batch whose bytes match its CRC but whose base
//     offset, length or magic (outside the CRC) is damaged, offsets that go
//     backwards, or a next segment that continues the log after an invalid
//     last batch. Open then fails with an error wrapping ErrCorrupt that
//     names the segment and position, and changes no file
//     (Options.TruncateAtCorruption truncates there instead, as Kafka does,
//     for a replica that can fetch the rest again). Damage recovery cannot
//     tell from a torn tail: a flip in the log's last batch, one in a batch
//     followed by a hole of zeros, and one that zeroes a header's first
//     bytes up to a sector boundary. A flip that raises the base offset
//     (outside the CRC) of the last whole batch even keeps that batch, at
//     offsets it never had, since a follower's offsets may leap; in a log
//     whose offsets do leap, so does any flip that keeps the offsets
//     growing (FuzzRecovery). An empty last segment after a follower's
//     gap, left by a roll whose append was lost, is removed, so that the
//     log ends at its last batch (as it does after TruncateTo) rather than
//     claiming the gap. A gap between segments past the recovery point is
//     what a crash leaves (the earlier segment lost its tail), unless the
//     recovery point could not be read (a damaged file, or a Manager's
//     damaged checkpoint): a follower's gap below it looks the same, and
//     Open then fails with ErrCorrupt rather than delete the data after
//     it. Options.MaxBatchBytes limits appends only:
//     recovery and Readers accept any batch that fits in its segment file
//     and matches its CRC. Missing or invalid index files of other
//     segments are rebuilt when first used. What a reader sees after
//     recovery is a prefix of what was appended and contains everything
//     that was synced.
//   - Read checks each batch's framing, header fields and offsets; like
//     Kafka's broker it leaves the CRC, verified when the batch was
//     appended or recovered, to the consumer (Options.VerifyReadCRC
//     verifies it on Read too). A Reader is a consumer: it verifies every
//     batch's CRC (unless ReaderOptions.SkipCRC), so a bit flip on disk
//     is reported as ErrCorrupt, never returned as data.
//
// # Record batch v2
//
// All integers big-endian; the CRC-32C (Castagnoli) covers bytes 21 to the
// end, so a leader rewrites baseOffset and partitionLeaderEpoch without
// recomputing it.
//
//	offset  size  field
//	     0     8  baseOffset
//	     8     4  length                 (batch size - 12)
//	    12     4  partitionLeaderEpoch
//	    16     1  magic                  (2)
//	    17     4  crc                    (CRC-32C of bytes [21, end))
//	    21     2  attributes             (bits 0-2 codec, 3 LogAppendTime,
//	                                      4 transactional, 5 control)
//	    23     4  lastOffsetDelta
//	    27     8  baseTimestamp
//	    35     8  maxTimestamp
//	    43     8  producerId             (-1: none)
//	    51     2  producerEpoch
//	    53     4  baseSequence
//	    57     4  recordsCount
//	    61     -  records (plain, or one compressed stream)
//
// Each record (zigzag varints; varint at most 5 bytes, varlong 10):
//
//	length varint | attributes int8 | timestampDelta varlong |
//	offsetDelta varint | keyLength varint (-1 null) | key |
//	valueLength varint (-1 null) | value | headerCount varint |
//	headers: (keyLength varint | key | valueLength varint | value)*
//
// # Index files
//
// The offset index gets an entry each time at least IndexIntervalBytes
// were appended since the last one; the time index gets one at the same
// moments when the largest timestamp grew, and a final one when the
// segment is rolled. Lookups take the greatest entry at or below the
// target and scan batches forward.
//
//	.index entry (8 bytes):      relativeOffset int32 | position int32
//	.timeindex entry (12 bytes): timestamp int64 | relativeOffset int32
//
// In .index, relativeOffset is a batch's last offset minus the segment's
// base offset and position the batch's byte position in the .log file. In
// .timeindex, timestamp is the largest timestamp so far in the segment and
// relativeOffset that of the last offset of the batch holding it (as in
// Kafka).
//
// A sealed segment's index files are checked when used (entries in order,
// within the segment, the last one matching the batch it names) and
// rebuilt when they fail; a time index cut from outside to a shorter run
// of valid entries passes, and understates the segment's largest
// timestamp (OffsetForTimestamp may then answer past the records asked
// for, and age retention delete the segment early), as in Kafka. Likewise
// a clean open, which reads no segment data, believes a clean-shutdown
// marker altered to another offset that the active segment's size and
// index entries do not contradict.
//
// # Producer-state snapshots
//
// <offset>.snapshot holds the idempotent-producer state as of offset (the
// base offset of the segment rolled to, or the log end at Close). It is
// written to a temporary file, fsynced and renamed by the background
// flusher, not on the append path (except for a follower append that
// leaves a gap between segments, and at Close). Integers big-endian; the
// CRC-32C covers everything after it.
//
//	offset size  field
//	     0    2  version (1)
//	     2    4  crc
//	     6    4  producer count
//	    10    -  producers:
//	             pid i64 | epoch i16 | lastTimestamp i64 | batches i8 |
//	             batches x (firstSeq i32 | lastSeq i32 | lastOffset i64 |
//	                        offsetDelta i32 | timestamp i64)
//
// The layout is replog's own, not Kafka's (whose snapshot files share the
// name and version number): Kafka's tools cannot read it.
//
// Open loads the newest valid snapshot at or below the log end (corrupt
// ones are deleted and the next older one tried) and replays the batches
// after it. The snapshots Close writes stay until retention deletes
// their segment, one per Close, each the size of the producer state: each
// is the exact state at its offset, which a rebuild after TruncateTo
// there could not always reproduce (see below). Before segments are
// deleted, the first segment left gets a snapshot at its base if it has
// none (a crash lost its roll snapshot before the flush wrote it): the
// state is rebuilt from the segments about to go, since no later rebuild
// could read them. A retried batch (same producer epoch and sequence
// range as one of the producer's last five still in the log) is not
// written again:
// Append returns the original offsets with AppendInfo.Duplicate set. When
// the log start moves (DeleteRecordsBefore, retention), cached batches
// that end before it are dropped, and the producers left with none
// (not those a transaction marker left without one: their epoch stays
// fenced); this is Kafka's behaviour before KIP-360, which keeps every
// producer until it expires. A rebuild (Open after a crash, TruncateTo)
// applies that drop once, after its replay, so it can differ from the
// live state: a producer dropped live and then given a marker comes back
// fenced live, but dropped after a rebuild. Markers are not parsed: no
// coordinator epoch is checked. With
// SyncEveryAppend a retry returns once the original is durable.
//
// # Checkpoint files
//
// Small text files, replaced atomically:
//
//	<version>\n        0
//	<count>\n          number of entry lines
//	<v1> <v2> ...\n    count lines of space-separated decimal integers
//
// recovery-point, log-start-offset, high-watermark and clean-shutdown each
// hold one entry of one offset; leader-epoch-checkpoint holds one
// "<epoch> <startOffset>" entry per leader epoch. A Manager's data
// directory holds recovery-point-offset-checkpoint,
// replication-offset-checkpoint and clean-shutdown files of the same
// layout whose entries are "<log name> <offset>", one per log (see
// Manager), and the Manager's .lock; its logs then keep no
// recovery-point, high-watermark, clean-shutdown or .lock file of their
// own.
//
// # Errors
//
// Errors wrap the package's sentinels (ErrCorrupt, ErrInvalidRecord,
// ErrBatchTooLarge, ErrOffsetOutOfRange, ErrClosed, ErrSyncFailed,
// ErrLocked; leader appends also ErrOutOfOrderSequence and
// ErrProducerFenced, a Reader ErrTruncated, a Manager ErrLogExists,
// ErrNoSuchLog and ErrInvalidLogName); match them with errors.Is. Corrupt or hostile bytes
// never cause a panic, and a rejected append changes nothing.
package log
