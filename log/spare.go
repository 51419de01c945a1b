package log

import (
	"os"

	"github.com/replog/replog/internal/vfs"
)

// spareName is the file a Log's flusher creates ahead of the next roll,
// so that the append that rolls only renames it to the new segment's
// name. Creating a file allocates an inode, which can cost milliseconds
// of kernel time (ext4 without a journal scans recently freed inodes);
// a rename does not. Being a temporary file, a spare left by a crash is
// removed by the next Open.
const spareName = "next-segment.log" + tmpSuffix

// prepareSpare creates the spare segment file if one was asked for (the
// active segment is half full, or a roll found none) and none is ready.
// Logs that never fill a segment never get one. Failures only mean that
// the next roll creates its file itself.
func (f *flusher) prepareSpare() {
	if !f.wantSpare.Load() {
		return
	}
	l := f.l
	f.spareMu.Lock()
	defer f.spareMu.Unlock()
	if f.spare != nil || l.failedErr() != nil || l.closed.Load() {
		return
	}
	file, err := l.seg.openFile(l.path(spareName), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		l.opts.Logger.Warn("replog/log: creating the spare segment file", "dir", l.dir, "err", err)
		return
	}
	// A hint: without the space, the segment's writes allocate it.
	if err := vfs.Preallocate(file, l.opts.PreallocateBytes); err != nil {
		l.opts.Logger.Warn("replog/log: preallocating the spare segment file", "dir", l.dir, "err", err)
	}
	f.spare = file
	f.wantSpare.Store(false)
}

// prepareSpareSoon has a goroutine prepare the spare in an urgent turn
// of the FlushGroup, unless one is at it already. Not the flusher itself:
// its step may be waiting for a turn to flush, behind many other logs'
// flushes, and the spare must not wait for that. stop waits for it. A
// Manager's log has its scheduler's next step prepare it instead.
func (f *flusher) prepareSpareSoon() {
	if f.sched != nil {
		// A Manager's logs start no goroutines: a worker of its
		// scheduler runs the step, which prepares it.
		f.wake()
		return
	}
	if !f.spareRunning.CompareAndSwap(false, true) {
		return
	}
	f.spareWG.Add(1)
	go func() {
		defer f.spareWG.Done()
		defer f.spareRunning.Store(false)
		release := f.l.opts.FlushGroup.acquire(true)
		defer release()
		f.prepareSpare()
	}()
}

// takeSpare renames the spare file, if one is ready, to the segment file
// name and returns it; else nil, and the caller creates the file. It
// never waits for a spare being created.
func (f *flusher) takeSpare(name string) vfs.File {
	f.wantSpare.Store(true)
	if !f.spareMu.TryLock() {
		return nil
	}
	defer f.spareMu.Unlock()
	file := f.spare
	if file == nil {
		return nil
	}
	f.spare = nil
	var err error
	if cf, ok := file.(*cachedFile); ok {
		err = cf.renameFile(f.l.opts.FS, name)
	} else {
		err = f.l.opts.FS.Rename(f.l.path(spareName), name)
	}
	if err != nil {
		_ = file.Close()
		return nil
	}
	return file
}

// dropSpare closes and removes the spare file (Close).
func (f *flusher) dropSpare() {
	f.spareMu.Lock()
	defer f.spareMu.Unlock()
	if f.spare == nil {
		return
	}
	_ = f.spare.Close()
	f.spare = nil
	if err := f.l.opts.FS.Remove(f.l.path(spareName)); err == nil {
		f.l.dirDirty.Store(true)
	}
}

// releasePreallocated frees the disk space allocated past the end of s's
// data (Options.PreallocateBytes) by truncating s's file to its size,
// once s is full (its roll flush) or at Close, if at least minUnused
// bytes of the allocation went unused. The data is untouched, so a
// failure only costs the space, and the log goes on. The roll flush
// calls it under flushMu, which a truncation of s waits for; Close under
// Log.mu, with the flusher stopped.
func (l *Log) releasePreallocated(s *segment, minUnused int64) {
	size := s.size.Load()
	if l.opts.PreallocateBytes <= 0 || l.opts.PreallocateBytes-size < max(minUnused, 1) {
		return
	}
	if err := s.file.Truncate(size); err != nil {
		l.opts.Logger.Warn("replog/log: releasing a segment's preallocated space", "segment", s.path(logSuffix), "err", err)
	}
}
