package log

import (
	"container/list"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/replog/replog/internal/vfs"
)

// fileCache bounds the number of segment files a Manager keeps open: a
// segment's file is opened when used and closed again, least recently
// used first, when more than max are open and idle. Files written since
// their last successful fsync are closed only when no other idle file is
// left, and are fsynced first, in the background (closeEvicted): while a
// descriptor is open, Linux keeps a failed writeback's error for the next
// fsync, and once none is, the inode may leave memory with the error, and
// a later fsync through a new descriptor would succeed. That fsync's
// error is kept for the file's next Sync (see cachedFile.evictErr). Safe
// for concurrent use.
type fileCache struct {
	fs  vfs.FS
	max int

	mu    sync.Mutex
	idle  list.List // open, unused, synced files; most recently used at the front
	dirty list.List // open, unused files written since their last fsync
	open  int
	opens atomic.Int64
	// evicted is signalled when an evicted file's fsync ends (see
	// cachedFile.evictSyncs).
	evicted sync.Cond
	// closing holds the dirty evicted files closeLoop is to fsync and
	// close; closerRunning is set while it runs, closers counts it.
	closing       []eviction
	closerRunning bool
	closers       sync.WaitGroup
}

func newFileCache(fs vfs.FS, max int) *fileCache {
	c := &fileCache{fs: fs, max: max}
	c.evicted.L = &c.mu
	return c
}

// eviction is a file evictLocked took off the cache, to be closed outside
// the lock; a dirty one is fsynced first, covering its first covers
// writes.
type eviction struct {
	cf     *cachedFile
	f      vfs.File
	dirty  bool
	covers uint64
}

// openFiles is how many files the cache holds open.
func (c *fileCache) openFiles() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open
}

// openFile opens name and returns a handle whose file may be closed and
// reopened (without O_CREATE, O_TRUNC, O_EXCL) behind it. An existing
// file (flag without O_CREATE) is only checked for with a Stat and
// opened at its first use: opening thousands of logs opens none of their
// segment files.
func (c *fileCache) openFile(name string, flag int, perm os.FileMode) (*cachedFile, error) {
	cf := &cachedFile{c: c, name: name, flag: flag &^ (os.O_CREATE | os.O_TRUNC | os.O_EXCL)}
	if flag&os.O_CREATE == 0 {
		info, err := c.fs.Stat(name)
		if err != nil {
			return nil, err
		}
		cf.info = info
		return cf, nil
	}
	f, err := c.fs.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	c.opens.Add(1)
	c.mu.Lock()
	cf.f = f
	c.open++
	cf.pushIdleLocked()
	evicted := c.evictLocked()
	c.mu.Unlock()
	c.closeEvicted(evicted)
	return cf, nil
}

// evictLocked takes idle files off the list while too many are open and
// returns them to be closed (closeEvicted) outside the lock.
func (c *fileCache) evictLocked() []eviction {
	var out []eviction
	for c.open > c.max && c.idle.Len()+c.dirty.Len() > 0 {
		from := &c.idle
		if from.Len() == 0 {
			from = &c.dirty
		}
		cf := from.Remove(from.Back()).(*cachedFile)
		cf.elem, cf.list = nil, nil
		ev := eviction{cf: cf, f: cf.f}
		if from == &c.dirty {
			// Idle: no write is in progress, so the fsync covers all.
			ev.dirty, ev.covers = true, cf.writes
			cf.evictSyncs++
		}
		out = append(out, ev)
		cf.f = nil
		c.open--
	}
	return out
}

// maxBackgroundCloses bounds the dirty files evicted and not yet fsynced
// and closed in the background: past it, the call that evicts one does
// that itself, so that descriptors stay bounded when the disk falls
// behind.
const maxBackgroundCloses = 16

// closeEvicted closes the files evictLocked took. A dirty one is fsynced
// first, by a goroutine of the cache (closeLoop), so that the call that
// needed a descriptor (another log's append or read) does not wait for
// that fsync, unless maxBackgroundCloses are queued already.
func (c *fileCache) closeEvicted(evicted []eviction) {
	for _, ev := range evicted {
		if !ev.dirty || !c.closeLater(ev) {
			c.finishEviction(ev)
		}
	}
}

// closeLater queues a dirty eviction for closeLoop, starting it if none
// runs, and reports whether it did (false: the queue is full).
func (c *fileCache) closeLater(ev eviction) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.closing) >= maxBackgroundCloses {
		return false
	}
	c.closing = append(c.closing, ev)
	if !c.closerRunning {
		c.closerRunning = true
		c.closers.Add(1)
		go c.closeLoop()
	}
	return true
}

// closeLoop finishes the queued evictions, and returns once none is left.
func (c *fileCache) closeLoop() {
	defer c.closers.Done()
	for {
		c.mu.Lock()
		if len(c.closing) == 0 {
			c.closerRunning = false
			c.mu.Unlock()
			return
		}
		ev := c.closing[0]
		c.closing[0] = eviction{} // not kept reachable by the array
		c.closing = c.closing[1:]
		c.mu.Unlock()
		c.finishEviction(ev)
	}
}

// waitClosed waits until the evictions queued for closeLoop are done. The
// Manager calls it once its logs are closed: no eviction comes after.
func (c *fileCache) waitClosed() { c.closers.Wait() }

// finishEviction closes an evicted file, fsyncing a dirty one first: an
// error is kept in the file's evictErr, for its next Sync.
func (c *fileCache) finishEviction(ev eviction) {
	if ev.dirty {
		err := ev.f.Sync()
		c.mu.Lock()
		if err != nil && ev.cf.evictErr == nil {
			ev.cf.evictErr = fmt.Errorf("replog/log: fsync of idle segment file %s before closing it: %w", ev.cf.name, err)
		} else if err == nil {
			ev.cf.synced = max(ev.cf.synced, ev.covers)
		}
		ev.cf.evictSyncs--
		c.evicted.Broadcast()
		c.mu.Unlock()
	}
	_ = ev.f.Close() // data stays in the page cache (see fileCache)
}

// reopenError is the error of an operation on a cached file that could
// not be reopened for a shortage that passes (transientOpenError): the
// operation did nothing to the file, so it neither wrote part of a batch
// nor consumed a write-back error that an fsync would have reported, and
// a retry may succeed. Sync and Append therefore return it without
// failing the log. Other open failures (the file gone, a read-only
// remount) are returned as they are, and fail the log as before.
type reopenError struct{ err error }

func (e *reopenError) Error() string { return "replog/log: reopen segment file: " + e.err.Error() }
func (e *reopenError) Unwrap() error { return e.err }

// Is makes every reopenError match errReopen.
func (e *reopenError) Is(target error) bool { return target == errReopen }

// errReopen matches any reopenError (errors.As would allocate on the
// append path).
var errReopen = errors.New("replog/log: reopen segment file")

// openErr is the error of an open that did nothing: a reopenError for a
// shortage that passes (transientOpenError), so that a caller that would
// fail the log for a write error retries instead.
func openErr(err error) error {
	if transientOpenError(err) {
		return &reopenError{err: err}
	}
	return err
}

// transientOpenError reports whether an open failed for want of
// descriptors (the process's or the system's) or kernel memory.
func transientOpenError(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOMEM)
}

// isReopenError reports whether err is, or wraps, a reopenError that did
// not fail the log: once wrapped in ErrSyncFailed (a truncation whose
// reopen failed fails the log, say), the failure is sticky, not
// transient, and nothing retries it.
func isReopenError(err error) bool {
	return err != nil && errors.Is(err, errReopen) && !errors.Is(err, ErrSyncFailed)
}

// cachedFile is a segment file whose descriptor the cache may close when
// idle; every operation reopens it if needed. It satisfies vfs.File.
type cachedFile struct {
	c    *fileCache
	flag int

	// guarded by c.mu
	name   string
	f      vfs.File
	refs   int
	elem   *list.Element // in list, while open and idle
	list   *list.List    // c.idle or c.dirty
	closed bool
	// writing counts WriteAt calls in progress (counted in writes, not
	// yet in the file: an fsync does not cover them).
	writing uint64
	// writes counts WriteAt calls, synced how many of them the last
	// successful fsync covered: the file is dirty while they differ.
	writes, synced uint64
	// info is the Stat of a file opened lazily: it answers the first
	// Stat (openSegment's, right after the open) unless the file was used
	// before.
	info os.FileInfo
	// evictSyncs counts the fsyncs in progress of this file's evicted
	// descriptors, and evictErr is the first of them that failed: sticky,
	// every later Sync returns it, since the failed writeback's pages
	// may be clean in the page cache now, and an fsync through a new
	// descriptor would succeed.
	evictSyncs int
	evictErr   error
}

// acquire returns the open file, opening it if it was evicted.
func (cf *cachedFile) acquire() (vfs.File, error) { return cf.acquireFor(false) }

// acquireWrite is acquire for a WriteAt.
func (cf *cachedFile) acquireWrite() (vfs.File, error) { return cf.acquireFor(true) }

// acquireFor is acquire; write counts the use as a write, before it
// happens, so that the file counts as dirty from now on, and as one in
// progress until releaseWrite, so that a concurrent fsync does not count
// it as covered.
func (cf *cachedFile) acquireFor(write bool) (vfs.File, error) {
	c := cf.c
	c.mu.Lock()
	if cf.closed {
		c.mu.Unlock()
		return nil, os.ErrClosed
	}
	if write {
		cf.writes++
		cf.writing++
	}
	cf.unlinkIdleLocked()
	cf.info = nil // the file may change from now on
	cf.refs++
	if cf.f != nil {
		c.mu.Unlock()
		return cf.f, nil
	}
	var extra vfs.File
	for cf.f == nil {
		name := cf.name
		c.mu.Unlock()
		f, err := c.fs.OpenFile(name, cf.flag, 0)
		c.mu.Lock()
		if err == nil && cf.closed {
			// Closed meanwhile: its name may be another file's by now (a
			// deleted log's directory renamed away and a log of the same
			// name created; a deleted segment's file removed and its
			// name given to a later one's), which the open took.
			c.mu.Unlock()
			_ = f.Close()
			cf.releaseFor(write)
			return nil, os.ErrClosed
		}
		if err == nil && cf.name != name {
			// Renamed meanwhile (renameFile): another file may have
			// taken the old name before the open, so open the new one.
			c.mu.Unlock()
			_ = f.Close()
			c.mu.Lock()
			continue
		}
		if err == nil {
			c.opens.Add(1)
			if cf.f == nil {
				cf.f = f
				c.open++
			} else {
				extra = f // another goroutine reopened it meanwhile
			}
			break
		}
		if cf.f != nil {
			break // another goroutine reopened it meanwhile
		}
		if cf.name != name {
			continue // renamed meanwhile (renameFile): open the new name
		}
		cf.refs--
		if write {
			cf.writing-- // no write follows (writes stays: dirty until synced)
		}
		c.mu.Unlock()
		if transientOpenError(err) {
			return nil, &reopenError{err: err}
		}
		return nil, err
	}
	f := cf.f
	evicted := c.evictLocked()
	c.mu.Unlock()
	if extra != nil {
		_ = extra.Close()
	}
	c.closeEvicted(evicted)
	return f, nil
}

// pushIdleLocked puts an open, unused file on its idle list. Callers
// hold c.mu.
func (cf *cachedFile) pushIdleLocked() {
	cf.list = &cf.c.idle
	if cf.writes != cf.synced {
		cf.list = &cf.c.dirty
	}
	cf.elem = cf.list.PushFront(cf)
}

// unlinkIdleLocked takes the file off its idle list, if on one. Callers
// hold c.mu.
func (cf *cachedFile) unlinkIdleLocked() {
	if cf.elem != nil {
		cf.list.Remove(cf.elem)
		cf.elem, cf.list = nil, nil
	}
}

// acquireSync is acquire for an fsync; done, called after it, records
// which writes a successful one covered.
func (cf *cachedFile) acquireSync() (f vfs.File, done func(error), err error) {
	cf.c.mu.Lock()
	covers := cf.writes - cf.writing
	cf.c.mu.Unlock()
	f, err = cf.acquire()
	if err != nil {
		return nil, nil, err
	}
	// In use now, the file cannot be evicted again: wait for the fsyncs
	// of descriptors evicted before, whose errors this fsync would miss.
	cf.c.mu.Lock()
	for cf.evictSyncs > 0 {
		cf.c.evicted.Wait()
	}
	evictErr := cf.evictErr
	cf.c.mu.Unlock()
	if evictErr != nil {
		cf.release()
		return nil, nil, evictErr
	}
	done = func(err error) {
		if err == nil {
			cf.c.mu.Lock()
			cf.synced = max(cf.synced, covers)
			cf.c.mu.Unlock()
		}
		cf.release()
	}
	return f, done, err
}

// releaseWrite ends a use by a WriteAt, now in the file.
func (cf *cachedFile) releaseWrite() { cf.releaseFor(true) }

// release ends a use; an idle file goes back on the list.
func (cf *cachedFile) release() { cf.releaseFor(false) }

// releaseFor is release; write ends a WriteAt's use.
func (cf *cachedFile) releaseFor(write bool) {
	c := cf.c
	c.mu.Lock()
	if write {
		cf.writing--
	}
	cf.refs--
	var evicted []eviction
	if cf.refs == 0 && cf.f != nil {
		if cf.closed {
			evicted = []eviction{{cf: cf, f: cf.f}}
			cf.f = nil
			c.open--
		} else {
			cf.pushIdleLocked()
			evicted = c.evictLocked()
		}
	}
	c.mu.Unlock()
	c.closeEvicted(evicted)
}

// renameFile renames the file on disk and in the handle together, under
// the cache's lock: a reopen that finds the old name gone then finds the
// new one (see acquire).
func (cf *cachedFile) renameFile(fs vfs.FS, name string) error {
	c := cf.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := fs.Rename(cf.name, name); err != nil {
		return err
	}
	cf.name = name
	return nil
}

// ReadAt implements io.ReaderAt.
func (cf *cachedFile) ReadAt(p []byte, off int64) (int, error) {
	f, err := cf.acquire()
	if err != nil {
		return 0, err
	}
	defer cf.release()
	return f.ReadAt(p, off)
}

// WriteAt implements io.WriterAt.
func (cf *cachedFile) WriteAt(p []byte, off int64) (int, error) {
	f, err := cf.acquireWrite()
	if err != nil {
		return 0, err
	}
	defer cf.releaseWrite()
	return f.WriteAt(p, off)
}

// Sync fsyncs the file.
func (cf *cachedFile) Sync() error {
	f, done, err := cf.acquireSync()
	if err != nil {
		return err
	}
	err = f.Sync()
	done(err)
	return err
}

// Datasync fdatasyncs the file (see vfs.Datasync).
func (cf *cachedFile) Datasync() error {
	f, done, err := cf.acquireSync()
	if err != nil {
		return err
	}
	err = vfs.Datasync(f)
	done(err)
	return err
}

// Preallocate allocates disk space for the file (see vfs.Preallocate).
func (cf *cachedFile) Preallocate(size int64) error {
	f, err := cf.acquire()
	if err != nil {
		return err
	}
	defer cf.release()
	return vfs.Preallocate(f, size)
}

// Truncate changes the file's size.
func (cf *cachedFile) Truncate(size int64) error {
	f, err := cf.acquire()
	if err != nil {
		return err
	}
	defer cf.release()
	return f.Truncate(size)
}

// Stat returns the file's metadata; a file not open is not opened for it
// but looked up by name.
func (cf *cachedFile) Stat() (os.FileInfo, error) {
	c := cf.c
	c.mu.Lock()
	if info := cf.info; info != nil && !cf.closed {
		cf.info = nil // an idle log keeps no per-file memory it need not
		c.mu.Unlock()
		return info, nil
	}
	if cf.f == nil && !cf.closed {
		name := cf.name
		c.mu.Unlock()
		return c.fs.Stat(name)
	}
	c.mu.Unlock()
	f, err := cf.acquire()
	if err != nil {
		return nil, err
	}
	defer cf.release()
	return f.Stat()
}

// Name returns the file's current name.
func (cf *cachedFile) Name() string {
	cf.c.mu.Lock()
	defer cf.c.mu.Unlock()
	return cf.name
}

// Close closes the file now, or when its last use ends.
func (cf *cachedFile) Close() error {
	c := cf.c
	c.mu.Lock()
	if cf.closed {
		c.mu.Unlock()
		return os.ErrClosed
	}
	cf.closed = true
	var f vfs.File
	if cf.refs == 0 && cf.f != nil {
		cf.unlinkIdleLocked()
		f, cf.f = cf.f, nil
		c.open--
	}
	c.mu.Unlock()
	if f != nil {
		return f.Close()
	}
	return nil
}
