package log

// loadCheckpoints is what load reads from the checkpoint files (or from a
// Manager's recovery point store) before it opens the segments.
type loadCheckpoints struct {
	marker   int64 // the clean-shutdown marker's log end offset
	clean    bool  // a marker was read and a recovery point is trusted
	rp       int64 // the recovery point; 0 when none is trustworthy
	rpOK     bool  // a recovery point was read
	rpLeft   bool  // some recovery point is on disk, readable or not
	logStart int64 // the checkpointed log start offset
}

// rpKnown reports whether rp is the recovery point last checkpointed: read,
// or none ever written (a log that never checkpointed one has no gap
// below it), rather than 0 in place of an unreadable one.
func (cp loadCheckpoints) rpKnown() bool { return cp.rpOK || !cp.rpLeft }

// readLoadCheckpoints reads the clean-shutdown marker, the recovery point
// and the log start offset. An unreadable marker or recovery point makes
// load recover; an unreadable log start offset is an error.
func (l *Log) readLoadCheckpoints() (loadCheckpoints, error) {
	var cp loadCheckpoints
	cp.marker, cp.clean = l.readCleanMarker()
	rp, ok, err := l.loadRecoveryPoint()
	cp.rpLeft = err != nil || ok // some recovery point is on disk
	if err != nil || !ok {
		rp, cp.clean = 0, false // no trustworthy recovery point: scan everything
	}
	cp.rp, cp.rpOK = rp, ok
	logStart, _, err := readOffsetCheckpoint(l.opts.FS, l.path(logStartOffsetFile))
	if err != nil {
		return cp, err
	}
	cp.logStart = logStart
	return cp, nil
}

// readCleanMarker returns the log end offset of the clean-shutdown marker
// and whether there is one, from a Manager's store if the log has one,
// otherwise from the marker file. An unreadable marker file is logged and
// counts as none.
func (l *Log) readCleanMarker() (int64, bool) {
	if store := l.opts.recoveryPoints; store != nil {
		return store.loadClean(l.dir)
	}
	marker, clean, err := readCleanShutdown(l.opts.FS, l.path(cleanShutdownFile))
	if err != nil {
		l.opts.Logger.Warn("replog/log: unreadable clean-shutdown marker; recovering", "dir", l.dir, "err", err)
	}
	return marker, clean
}

// readHighWatermark returns the high watermark of the last clean close,
// from a Manager's store if it recorded one, otherwise from the high
// watermark file (0 if missing or unreadable).
func (l *Log) readHighWatermark() int64 {
	if store := l.opts.recoveryPoints; store != nil {
		if hw, ok := store.loadHighWatermark(l.dir); ok {
			return hw
		}
	}
	hw, _, _ := readOffsetCheckpoint(l.opts.FS, l.path(highWatermarkFile))
	return hw
}
