package log

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/replog/replog/internal/vfs"
)

// highWatermarkFile keeps the high watermark across clean restarts.
const highWatermarkFile = "high-watermark"

// load opens the segments in l.dir, recovering them if the last shutdown
// was not clean, and sets the offsets. It runs before the flusher starts.
// An error before it changed any file is an unchangedOpen.
func (l *Log) load() (err error) {
	unchanged := true
	defer func() {
		if err != nil && unchanged {
			err = unchangedOpen{err}
		}
	}()
	bases, obsolete, err := l.listDirectory()
	if err != nil {
		return err
	}
	cp, err := l.readLoadCheckpoints()
	if err != nil {
		return err
	}
	if len(bases) == 0 {
		// A fresh segment is about to be created: no index file of an
		// earlier segment at its base may be left for it.
		unchanged = false
		if err := l.removeObsolete(obsolete); err != nil {
			return err
		}
		obsolete = nil
	}
	fresh, err := l.openSegments(bases, cp.logStart)
	if err != nil {
		return err
	}
	clean, err := l.recoverOrTrust(cp, fresh)
	unchanged = unchanged && clean // recovery writes
	if err != nil {
		return err
	}
	leo, err := l.setLoadedOffsets(cp.logStart, clean)
	if err != nil {
		// After a clean shutdown it writes only to restart the log
		// empty, with TruncateAtCorruption.
		unchanged = unchanged && !l.opts.TruncateAtCorruption
		return err
	}
	unchanged = false // what follows may write
	if err := l.loadEpochs(l.logStart.Load(), leo); err != nil {
		return err
	}
	if err := l.loadProducerState(leo); err != nil {
		return err
	}
	// Only now: an Open that refuses damage leaves every file as it was.
	if err := l.removeObsolete(obsolete); err != nil {
		return err
	}
	return l.removeCleanShutdown(clean)
}

// openSegments opens the segments with the given base offsets, or creates
// an empty one at logStart (0 if unknown) when there is none, which makes
// the log fresh, and links each segment's next offset to the following
// segment's base.
func (l *Log) openSegments(bases []int64, logStart int64) (bool, error) {
	segs := make([]*segment, 0, len(bases))
	l.setSegments(segs)
	for _, base := range bases {
		s, err := openSegment(l.seg, base)
		if err != nil {
			return false, err
		}
		segs = append(segs, s)
		l.setSegments(segs)
	}
	fresh := len(segs) == 0
	if fresh {
		s, err := createSegment(l.seg, max(logStart, 0), l.now())
		if err != nil {
			return false, err
		}
		segs = append(segs, s)
		l.setSegments(segs)
		l.dirDirty.Store(true)
	}
	for i, s := range segs[:len(segs)-1] {
		s.next.Store(segs[i+1].base)
	}
	return fresh, nil
}

// recoverOrTrust chooses how load treats the opened segments: it trusts
// them after a clean shutdown (loadClean), sets up a fresh log
// (loadFresh), or recovers from the recovery point. It reports whether the
// log was loaded as cleanly shut down: not if the marker came without any
// segment or disagrees with the segments, which are then recovered.
func (l *Log) recoverOrTrust(cp loadCheckpoints, fresh bool) (clean bool, err error) {
	clean = cp.clean
	if clean && fresh {
		// A marker without any segment file describes some other state
		// of the directory (segments lost or removed): do not trust it.
		l.opts.Logger.Warn("replog/log: clean-shutdown marker but no segment; recovering", "dir", l.dir, "marker", cp.marker)
		clean = false
	}
	switch {
	case clean:
		err = l.loadClean(cp.marker)
		if errors.Is(err, errUntrustedMarker) {
			l.opts.Logger.Warn("replog/log: clean-shutdown marker disagrees with the segments; recovering", "dir", l.dir, "err", err)
			clean = false
			err = l.recover(cp.rp, cp.rpKnown())
		}
	case fresh:
		err = l.loadFresh(cp.rpLeft && (cp.rp != l.segments()[0].base || !cp.rpOK))
	default:
		err = l.recover(cp.rp, cp.rpKnown())
	}
	return clean, err
}

// setLoadedOffsets sets the log end, log start and high watermark offsets
// from the loaded segments and the checkpointed logStart, restarting the
// log empty at logStart if it lies past the log end after a crash (after
// a clean shutdown that is damage: ErrCorrupt, changing nothing, unless
// TruncateAtCorruption), and, if clean, the
// recovery point and durable offset at the log end. It returns the log
// end offset. The high watermark checkpointed by the last clean Close is
// used only after a clean shutdown: since then a truncation may have
// lowered the high watermark and new, uncommitted records taken the
// offsets below the old one; after a crash it restarts at the log start
// (replication raises it again as followers fetch, as for a new leader).
func (l *Log) setLoadedOffsets(logStart int64, clean bool) (int64, error) {
	segs := l.segments()
	if end := segs[len(segs)-1].next.Load(); logStart > end {
		if clean && !l.opts.TruncateAtCorruption {
			// A clean Close synced everything, and a live log's start
			// never passes its end: this is damage, not lost data.
			return 0, fmt.Errorf("replog/log: the log start offset %d in %s is past the log end %d after a clean shutdown; not deleting the log (see Options.TruncateAtCorruption): %w",
				logStart, logStartOffsetFile, end, ErrCorrupt)
		}
		if err := l.restartEmptyAt(logStart, end); err != nil {
			return 0, err
		}
		segs = l.segments()
	}
	act := segs[len(segs)-1]
	act.rollBase = l.now()
	l.setJitter(act)
	leo := act.next.Load()
	l.leo.Store(leo)
	l.logStart.Store(min(max(logStart, segs[0].base), leo))
	hw := l.logStart.Load()
	if clean {
		hw = min(max(l.readHighWatermark(), hw), leo)
	}
	l.hw.Store(hw)
	if clean {
		l.recoveryPt.Store(leo)
		l.sync.durable = leo
	}
	return leo, nil
}

// unchangedOpen is an error of an Open that changed no file of the log:
// the clean-shutdown marker it read still describes the log, and must
// survive the failure (a Manager's, see Manager.keepCleanShutdown), or
// the next Open would take the log for crashed (and one refused for a log
// start past its end restart empty).
type unchangedOpen struct{ error }

func (e unchangedOpen) Unwrap() error { return e.error }

// removeCleanShutdown removes the clean-shutdown marker, so that a crash
// from now on is recovered, and makes the directory durable. clean tells
// whether load trusted a marker.
func (l *Log) removeCleanShutdown(clean bool) error {
	fs := l.opts.FS
	err := fs.Remove(l.path(cleanShutdownFile))
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if l.opts.recoveryPoints != nil && clean && err != nil {
		// A Manager's log loaded from the Manager's marker, with no marker
		// file of its own to remove: the directory is as it was, nothing
		// to make durable (the Manager removed its marker already).
		return nil
	}
	return fs.SyncDir(l.dir)
}

// restartEmptyAt replaces every segment with an empty one at logStart. It
// runs when the checkpointed log start offset lies past the recovered log
// end (the start was moved, by DeleteRecordsBefore or a follower, past
// data that was never fsynced and is now lost): as Kafka's LogLoader
// does, the log restarts empty at its start instead of handing out again
// offsets below it.
func (l *Log) restartEmptyAt(logStart, end int64) error {
	l.opts.Logger.Warn("replog/log: log end below the log start offset; restarting empty at the log start",
		"dir", l.dir, "logEnd", end, "logStart", logStart)
	for _, s := range l.segments() {
		if err := s.close(); err != nil {
			return err
		}
		for _, suffix := range []string{logSuffix, indexSuffix, timeIndexSuffix} {
			if err := l.opts.FS.Remove(s.path(suffix)); err != nil && !os.IsNotExist(err) {
				return err
			}
		}
	}
	s, err := createSegment(l.seg, logStart, l.now())
	if err != nil {
		return err
	}
	l.setSegments([]*segment{s})
	if err := l.opts.FS.SyncDir(l.dir); err != nil {
		return err
	}
	if err := l.persistRecoveryPoint(logStart, true); err != nil {
		return err
	}
	l.recoveryPt.Store(logStart)
	l.sync.durable = logStart
	return nil
}

// listDirectory returns the segments' base offsets, sorted, and the
// names of the files load removes once the log is loaded: temporary and
// deleted files and index files without a segment.
func (l *Log) listDirectory() (bases []int64, obsolete []string, err error) {
	fs := l.opts.FS
	names, err := fs.ReadDir(l.dir)
	if err != nil {
		return nil, nil, err
	}
	l.scanSnapshots(names)
	logs := map[string]bool{}
	for _, n := range names {
		if b, ok := parseSegmentName(n, logSuffix); ok {
			logs[strings.TrimSuffix(n, logSuffix)] = true
			bases = append(bases, b)
		}
	}
	for _, n := range names {
		stem, isIndex := strings.CutSuffix(n, indexSuffix)
		if !isIndex {
			stem, isIndex = strings.CutSuffix(n, timeIndexSuffix)
		}
		if strings.HasSuffix(n, tmpSuffix) || strings.HasSuffix(n, deletedSuffix) ||
			strings.HasSuffix(n, ".cleaned") || strings.HasSuffix(n, ".swap") ||
			(isIndex && !logs[stem]) {
			obsolete = append(obsolete, n)
		}
	}
	sort.Slice(bases, func(i, j int) bool { return bases[i] < bases[j] })
	return bases, obsolete, nil
}

// removeObsolete removes the files listDirectory named obsolete.
func (l *Log) removeObsolete(names []string) error {
	for _, n := range names {
		if err := l.opts.FS.Remove(filepath.Join(l.dir, n)); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return nil
}

// parseSegmentName parses "<20 digits><suffix>": ASCII digits only, so
// that no other name (a sign, as ParseInt would take) stands for the same
// offset as a segment's.
func parseSegmentName(name, suffix string) (int64, bool) {
	stem, ok := strings.CutSuffix(name, suffix)
	if !ok || len(stem) != 20 || strings.ContainsFunc(stem, func(c rune) bool { return c < '0' || c > '9' }) {
		return 0, false
	}
	v, err := strconv.ParseInt(stem, 10, 64)
	return v, err == nil
}

// readCleanShutdown reads the clean-shutdown marker, which holds the log
// end offset at Close.
func readCleanShutdown(fs vfs.FS, path string) (leo int64, ok bool, err error) {
	return readOffsetCheckpoint(fs, path)
}

// errUntrustedMarker reports a clean-shutdown marker that disagrees with
// the segment files; load then recovers as after a crash.
var errUntrustedMarker = errors.New("replog/log: clean-shutdown marker disagrees with the active segment")

// loadClean trusts the files of a cleanly closed log: it reads the active
// segment's index files but no segment data. It returns an error wrapping
// errUntrustedMarker when what it can check without reading data
// contradicts leo, the marker's log end offset: leo below the active
// segment's base, an empty active segment not ending at its base or a
// non-empty one ending there, or index entries at or past leo.
func (l *Log) loadClean(leo int64) error {
	act := l.active()
	size := act.size.Load()
	switch {
	case leo < act.base:
		return fmt.Errorf("%w: marker offset %d below active segment %d", errUntrustedMarker, leo, act.base)
	case (size == 0) != (leo == act.base):
		return fmt.Errorf("%w: marker offset %d, active segment %d holds %d bytes", errUntrustedMarker, leo, act.base, size)
	}
	act.next.Store(leo)
	if err := act.loadIndexes(l.opts.MaxBatchBytes); err != nil {
		return err
	}
	if ts, rel, ok := act.timeIdx.last(); ok && act.base+int64(rel) >= leo {
		return fmt.Errorf("%w: marker offset %d, time index entry (%d, %d) past it", errUntrustedMarker, leo, ts, act.base+int64(rel))
	}
	if rel, _, ok := act.offIdx.lookupEntry(math.MaxInt32); ok && act.base+int64(rel) >= leo {
		return fmt.Errorf("%w: marker offset %d, offset index entry %d past it", errUntrustedMarker, leo, act.base+int64(rel))
	}
	act.next.Store(leo) // a rebuild of missing indexes sets it
	// Taken unchecked: checking would read the segment file, which a
	// clean open does not open (a Manager opens thousands of logs).
	if ts, rel, ok := act.timeIdx.last(); ok && act.maxTS.CompareAndSwap(NoTimestamp, ts) {
		act.relOfMaxTS = rel
	}
	return nil
}

// loadFresh sets up a log that had no segment (a new log): its one
// segment was just created empty, so there is nothing to scan or fsync
// (load's final directory fsync makes the new file's entry durable). A
// recovery point left on disk by an earlier log in the directory is
// replaced first when staleRP: recovery skips the segments below it.
func (l *Log) loadFresh(staleRP bool) error {
	base := l.active().base
	if staleRP {
		if err := l.persistRecoveryPoint(base, true); err != nil {
			return err
		}
	}
	l.recoveryPt.Store(base)
	l.sync.durable = base
	return nil
}

// loadSegmentMeta sets a sealed segment's max timestamp from its time
// index, unless one is known already. It writes relOfMaxTS, so callers
// must exclude each other: retention holds l.mu. Readers use
// readerMaxTimestamp instead, which stores nothing. An entry that does not
// match its batch (checkedLastTime) is not used: age retention then takes
// the segment's max timestamp from its batch headers (scanMaxTimestamp).
func (l *Log) loadSegmentMeta(s *segment) {
	if ts, rel, ok := l.checkedLastTime(s); ok && s.maxTS.CompareAndSwap(NoTimestamp, ts) {
		s.relOfMaxTS = rel
	}
}

// recover scans every segment from the one holding the recovery point on,
// rebuilding indexes, truncating at the first invalid batch and deleting
// the segments after it. Segments before stay as they are: their data was
// fsynced and checkpointed (bit flips there surface as ErrCorrupt on read).
// rpKnown says rp is the recovery point last checkpointed, not 0 for one
// that could not be read: only then is a gap between segments a lost tail.
func (l *Log) recover(rp int64, rpKnown bool) error {
	segs := l.segments()
	first := sort.Search(len(segs), func(i int) bool { return segs[i].base > rp }) - 1
	first = max(first, 0)
	for i := first; i < len(segs); i++ {
		s := segs[i]
		l.stats.recoveredSegments++
		// A segment past the recovery point must start where the previous
		// one ends: a gap means that the previous segment lost its unsynced
		// tail at a batch boundary while the next segment's entry survived
		// (gaps made on purpose by follower appends are moved below the
		// recovery point first; see makeGapDurable).
		if prev := segs[max(i-1, 0)]; i > first && s.base != prev.next.Load() {
			cause := fmt.Errorf("%w: segment %d does not continue the previous one, which ends at %d", ErrCorrupt, s.base, prev.next.Load())
			if s.base < prev.next.Load() || !rpKnown {
				// An overlap is no lost tail: the last batch of prev
				// claims offsets of s, so its base offset (outside the
				// CRC) is damaged. Nor is a gap known to be one when the
				// recovery point was unreadable: a follower's gap below
				// it, with synced data after, looks the same.
				if err := l.refuseTruncation(prev, prev.size.Load(), cause); err != nil {
					return err
				}
			}
			return l.truncateRecovered(segs, first, i-1, prev.size.Load(), cause)
		}
		res := s.rebuild(l.opts.MaxBatchBytes)
		if res.err != nil {
			return res.err // a failed read is no reason to truncate
		}
		if res.invalid != nil {
			v := damageVerdict{validAfter: res.backwards}
			if !res.backwards {
				var err error
				if v, err = s.judgeDamage(res.validEnd, s.next.Load(), s.size.Load(), l.opts.MaxBatchBytes); err != nil {
					return err // a failed read is no reason to truncate
				}
			}
			middle, err := l.damageInMiddle(segs, i, v)
			if err != nil {
				return err
			}
			if middle {
				if err := l.refuseTruncation(s, res.validEnd, res.invalid); err != nil {
					return err
				}
			}
			return l.truncateRecovered(segs, first, i, res.validEnd, res.invalid)
		}
	}
	return l.syncRecovered(segs[first:])
}

// refuseTruncation answers damage that a crash does not leave (valid data
// after an invalid batch, a whole batch whose framing is damaged, segments
// that overlap): truncating there would silently drop the data after it,
// acknowledged data included. It returns an error wrapping ErrCorrupt
// and cause, and recovery leaves the files as they are for the operator
// to decide, unless Options.TruncateAtCorruption asks to truncate anyway:
// then it logs a warning and returns nil.
func (l *Log) refuseTruncation(s *segment, pos int64, cause error) error {
	if !l.opts.TruncateAtCorruption {
		return fmt.Errorf("replog/log: recovery found damage that is no torn tail in segment %s at position %d; not truncating (see Options.TruncateAtCorruption): %w",
			s.path(logSuffix), pos, cause)
	}
	l.opts.Logger.Warn("replog/log: truncating at damage that is no torn tail (TruncateAtCorruption)",
		"segment", s.path(logSuffix), "position", pos, "err", cause)
	return nil
}

// damageInMiddle reports whether the invalid batch that stopped the scan
// of segs[i] (judged as res) is damage in the middle of the log rather
// than a torn tail: valid data follows it in the segment, or it is the
// segment's last batch, whole or framed to the end of the file, and the
// next segment continues the log past it.
func (l *Log) damageInMiddle(segs []*segment, i int, res damageVerdict) (bool, error) {
	switch {
	case res.validAfter:
		return true, nil
	case i+1 == len(segs):
		return false, nil
	case res.wholeAtEnd:
		return true, nil
	}
	n := segs[i+1]
	if !res.endsFile || n.base <= segs[i].next.Load() {
		return false, nil
	}
	sc := newBatchScanner(n, l.opts.MaxBatchBytes)
	b, _, err := sc.next()
	if err != nil {
		if errors.Is(err, ErrCorrupt) || errors.Is(err, io.EOF) {
			return false, nil
		}
		return false, err
	}
	return n.checkContinues(b, n.base) == nil, nil
}

// truncateRecovered cuts segment i at pos and deletes every later segment;
// segments from first on were scanned and are synced afterwards.
func (l *Log) truncateRecovered(segs []*segment, first, i int, pos int64, cause error) error {
	s := segs[i]
	dropped := s.size.Load() - pos
	if err := s.file.Truncate(pos); err != nil {
		return err
	}
	s.tail.forget()
	s.size.Store(pos)
	for _, later := range segs[i+1:] {
		dropped += later.size.Load()
		if err := later.close(); err != nil {
			return err
		}
		for _, suffix := range []string{logSuffix, indexSuffix, timeIndexSuffix} {
			if err := l.opts.FS.Remove(later.path(suffix)); err != nil && !os.IsNotExist(err) {
				return err
			}
		}
	}
	l.stats.truncatedBytes += dropped
	l.opts.Logger.Warn("replog/log: recovery truncated the log", "dir", l.dir,
		"segment", segmentName(s.base), "position", pos, "droppedBytes", dropped, "cause", cause)
	kept := segs[:i+1]
	l.setSegments(kept)
	if s.size.Load() == 0 && i > 0 && s.base != segs[i-1].next.Load() {
		// Keep the base offset: an empty segment still marks where the log
		// continues.
		s.next.Store(s.base)
	}
	return l.syncRecovered(kept[min(first, i):])
}

// syncRecovered makes the recovered state durable (the data may still be
// only in the page cache if just the process died) and moves the recovery
// point to the active segment. It writes the data back before its fsync:
// a page whose writeback failed before (see segment.rewriteData) would
// otherwise stay off the disk, and acknowledged appends after it with it.
func (l *Log) syncRecovered(segs []*segment) error {
	buf := make([]byte, rewriteChunk)
	for _, s := range segs {
		if err := s.rewriteData(buf); err != nil {
			return err
		}
		if err := vfs.Datasync(s.file); err != nil {
			return err
		}
		s.durable.Store(s.size.Load())
		if err := s.flushIndexes(true); err != nil {
			return err
		}
	}
	if err := l.opts.FS.SyncDir(l.dir); err != nil {
		return err
	}
	act := l.active()
	leo := act.next.Load()
	if err := l.persistRecoveryPoint(act.base, false); err != nil {
		return err
	}
	l.recoveryPt.Store(act.base)
	l.sync.durable = leo
	return nil
}

// rewriteChunk is how many bytes recovery reads and writes back at once.
const rewriteChunk = 1 << 20

// segmentAfter returns the base offset of the segment after s, or s's next
// offset if s is the last or no longer listed.
func (l *Log) segmentAfter(s *segment) int64 {
	segs := l.segments()
	for i, x := range segs {
		if x == s && i+1 < len(segs) {
			return segs[i+1].base
		}
	}
	return s.next.Load()
}
