package log

import (
	"errors"
	"io"
)

// loadProducerState rebuilds the producer state for a log ending at end:
// snapshots past end are deleted, the newest valid one at or below end is
// loaded (corrupt or truncated ones are deleted and the next older one
// tried), the batches after it (or all the batches on disk, below the log
// start too, without one) are replayed, the cached batches below the log
// start dropped as truncateHead does live, and the producers idle longer
// than ProducerIDExpiration are dropped, as the background check would
// have dropped them (a reopened log must not bring back an expired
// producer). Callers hold l.mu or run before the Log is shared.
func (l *Log) loadProducerState(end int64) error {
	for _, off := range l.snapshots.list() {
		if off > end {
			if err := l.deleteSnapshot(off); err != nil {
				return err
			}
		}
	}
	ps, err := l.rebuildProducers(end)
	if err != nil {
		return err
	}
	l.producers = ps
	l.producers.truncateHead(l.logStart.Load())
	l.producers.expire(l.expiryCutoff())
	return nil
}

// rebuildProducers returns the producer state as of end from the newest
// valid snapshot at or below it (deleting the corrupt ones it meets) and
// the batches after it, or all the batches on disk without one; it
// neither drops cached batches below the log start nor expires
// producers, and leaves l.producers alone. Callers hold l.mu or run
// before the Log is shared.
func (l *Log) rebuildProducers(end int64) (*producerState, error) {
	ps := newProducerState()
	// From the first batch still on disk, not from the log start: the
	// batches between them were applied live before the log start passed
	// them (a marker's epoch among them), and truncateHead then treats
	// the rebuilt state as it treated the live one.
	from := l.segments()[0].base
	snaps := l.snapshots.list()
	for i := len(snaps) - 1; i >= 0; i-- {
		if snaps[i] > end {
			continue
		}
		data, err := readWholeFileMax(l.opts.FS, l.snapshotPath(snaps[i]), maxProducerSnapshotBytes)
		if err != nil && !errors.Is(err, ErrCorrupt) { // too large to be one: corrupt
			return nil, err
		}
		var producers map[int64]*producerEntry
		if err == nil {
			producers, err = decodeSnapshot(data)
		}
		if err != nil {
			l.opts.Logger.Warn("replog/log: deleting unreadable producer snapshot", "dir", l.dir, "err", err)
			if err := l.deleteSnapshot(snaps[i]); err != nil {
				return nil, err
			}
			continue
		}
		ps = producerStateOf(producers)
		from = max(snaps[i], from)
		break
	}
	return ps, l.replayProducers(ps, from, end)
}

// replayProducers applies the producer batches with offsets in
// [from, end) to ps, without sequence checks.
func (l *Log) replayProducers(ps *producerState, from, end int64) error {
	if from >= end {
		// Nothing to replay (a snapshot at the log end, as Close writes
		// it): opening a cleanly closed log reads no segment data.
		return nil
	}
	for _, s := range l.segments() {
		if s.base >= end || (s != l.active() && s.next.Load() <= from) {
			continue
		}
		pos := int64(0)
		if from > s.base {
			var hdr [BatchHeaderSize]byte
			p, ok, err := s.find(from, l.opts.MaxBatchBytes, &hdr)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			pos = p
		}
		sc := newBatchScanner(s, l.opts.MaxBatchBytes)
		sc.pos = pos
		for {
			b, _, err := sc.next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			if b.BaseOffset() >= end {
				break
			}
			if b.LastOffset() < from || !b.hasProducer() {
				continue
			}
			_ = ps.update(b, false)
			ps.commit()
		}
	}
	return nil
}

// expireProducers drops producers idle longer than ProducerIDExpiration.
func (l *Log) expireProducers() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.producers.expire(l.expiryCutoff())
}

// expiryCutoff is the timestamp (ms) below which a producer has expired.
func (l *Log) expiryCutoff() int64 {
	return l.now().Add(-l.opts.ProducerIDExpiration).UnixMilli()
}
