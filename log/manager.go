package log

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// Manager defaults.
const (
	DefaultManagerWorkers         = 4
	DefaultManagerRecoveryWorkers = 4
	DefaultMaxOpenFiles           = 1024
	defaultSchedulerTick          = 100 * time.Millisecond
	defaultCheckpointInterval     = time.Second
	managerCheckpointFile         = "recovery-point-offset-checkpoint"
	managerHighWatermarkFile      = "replication-offset-checkpoint"
	managerCleanShutdownFile      = "clean-shutdown"
	deletedDirSuffix              = ".deleted"
)

// ErrLogExists, ErrNoSuchLog and ErrInvalidLogName are returned by
// Manager.Create and Manager.Delete.
var (
	ErrLogExists      = errors.New("replog/log: log already exists")
	ErrNoSuchLog      = errors.New("replog/log: no such log")
	ErrInvalidLogName = errors.New("replog/log: invalid log name")
)

// maxLogName is the longest log name: a directory name.
const maxLogName = 255

// validLogName reports whether name can name a log (a directory name,
// usually Kafka's "topic-partition"): 1 to 255 of [A-Za-z0-9._-], not
// "." or "..".
func validLogName(name string) bool {
	if len(name) == 0 || len(name) > maxLogName || name == "." || name == ".." {
		return false
	}
	for _, c := range []byte(name) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// reservedName reports whether name is, or may become, one of the
// Manager's own entries in the data directory: its checkpoint files,
// their temporary files, and deleted logs' directories.
func reservedName(name string) bool {
	return checkpointName(strings.TrimSuffix(name, tmpSuffix)) ||
		strings.HasSuffix(name, tmpSuffix) || filepath.Ext(name) == deletedDirSuffix
}

// checkpointName reports whether name is one of the Manager's checkpoint
// files.
func checkpointName(name string) bool {
	switch name {
	case managerCheckpointFile, managerHighWatermarkFile, managerCleanShutdownFile, lockFileName:
		return true
	}
	return false
}

// ManagerOptions configure a Manager.
type ManagerOptions struct {
	// Log is the template for every log (FS, Logger and Now included).
	Log Options
	// Workers run the background work of all logs (default 4): the
	// goroutine count does not grow with the number of logs.
	Workers int
	// RecoveryWorkers open (and recover) logs in parallel (default 4).
	RecoveryWorkers int
	// MaxOpenFiles bounds the segment files kept open across all logs
	// (default 1024); others are opened when used. A reopen that fails
	// for want of descriptors (EMFILE, ENFILE) or memory fails that read,
	// append or Sync only, not the log (but for the roll across a
	// follower's gap: see the package documentation). Idle files that
	// were fsynced since their last write are closed first; one with
	// unsynced writes is fsynced before it is closed, so that a failed
	// write back is not lost with the descriptor: its log's next Sync
	// fails with that error. Up to 16 such files are fsynced and closed
	// in the background, their descriptors open meanwhile; past that, the
	// call that needed a descriptor does it, and waits for the fsync.
	MaxOpenFiles int
	// CheckpointInterval is how often the recovery-point checkpoint of the
	// data directory is written when it changed (default 1 s).
	CheckpointInterval time.Duration
}

// Manager runs many logs under one data directory, one sub-directory per
// log (Kafka names them "topic-partition"), with shared machinery: a fixed
// pool of background workers, a bounded cache of open segment files, and
// one recovery-point checkpoint file for the directory (written
// atomically) instead of one per log. Logs keep the contract of Open.
//
//	<dir>/recovery-point-offset-checkpoint   0 / count / "<log name> <offset>" lines
//	<dir>/replication-offset-checkpoint      high watermarks at the last Close, same format
//	<dir>/clean-shutdown                     log end offsets of the logs closed cleanly
//	                                         by the last Close, same format; removed
//	                                         (durably) by OpenManager before it opens a log
//	<dir>/orders-0/00000000000000000000.log   a log, as log.Open lays it out
//	<dir>/orders-1/...
//
// A Manager is safe for concurrent use. Close closes every log and stops
// every goroutine.
type Manager struct {
	dir     string
	dirLock io.Closer // held until Close (lockDir)
	opts    ManagerOptions
	sched   *scheduler
	files   *fileCache

	mu   sync.Mutex
	logs map[string]*Log
	// folded counts the logs by name in lower case, for Create's check
	// of names that differ in case only (two such logs may exist, made
	// by an older version on a case-sensitive filesystem).
	folded map[string]int
	busy   map[string]bool // names being created or deleted, outside mu
	// undeleted are closed logs whose Delete failed before their
	// directory and recovery point were durably gone: Delete retries,
	// Create refuses (it would open the old data).
	undeleted map[string]bool
	closed    bool
	// ops counts the Creates and Deletes in progress, which Close waits
	// for; closeDone is closed when the first Close has finished.
	ops       sync.WaitGroup
	closeDone chan struct{}

	rp rpStore

	stop chan struct{}
	done chan struct{}
}

// OpenManager opens every log under dir (creating dir if needed),
// recovering them in parallel, and starts the shared workers. It locks
// dir until Close, as Open does a log's directory (ErrLocked).
func OpenManager(dir string, o ManagerOptions) (*Manager, error) {
	lo, err := o.Log.withDefaults()
	if err != nil {
		return nil, err
	}
	o.Log = lo
	if o.Workers <= 0 {
		o.Workers = DefaultManagerWorkers
	}
	if o.RecoveryWorkers <= 0 {
		o.RecoveryWorkers = DefaultManagerRecoveryWorkers
	}
	if o.MaxOpenFiles <= 0 {
		o.MaxOpenFiles = DefaultMaxOpenFiles
	}
	if o.CheckpointInterval <= 0 {
		o.CheckpointInterval = defaultCheckpointInterval
	}
	fs := lo.FS
	// The data directory's own entry, as Open does for a log's.
	if err := mkdirDurable(fs, dir); err != nil {
		return nil, err
	}
	dirLock, err := lockDir(fs, dir)
	if err != nil {
		return nil, err
	}
	opened := false
	defer func() {
		if !opened {
			_ = dirLock.Close()
		}
	}()
	m := &Manager{dir: dir, dirLock: dirLock, opts: o, files: newFileCache(fs, o.MaxOpenFiles), logs: map[string]*Log{}, folded: map[string]int{},
		busy: map[string]bool{}, undeleted: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{}), closeDone: make(chan struct{})}
	m.rp = newRPStore(m)
	cleanFile, err := m.rp.read()
	if err != nil {
		return nil, err
	}
	names, err := m.scanDir()
	if err != nil {
		return nil, err
	}
	// Entries of logs that are gone leave the checkpoint files now: a log
	// created again under the name must not be recovered from them.
	if m.rp.prune(names) {
		if err := m.rp.write(); err != nil {
			return nil, err
		}
	}
	// The clean-shutdown markers are in memory now: the file goes before
	// any log is opened (and may be written to), so that a crash from here
	// on makes the next OpenManager recover every log. (Neither step above
	// touches a live log.) An OpenManager that fails from here on writes
	// the markers of the logs it left as they were back (keepCleanShutdown).
	if cleanFile {
		if err := fs.Remove(filepath.Join(dir, managerCleanShutdownFile)); err != nil {
			return nil, err
		}
	}
	// One directory fsync makes the marker's removal, the removal of
	// half-deleted logs and every log directory's entry durable, so the
	// logs' Opens need not sync the data directory each.
	if err := fs.SyncDir(dir); err != nil {
		m.keepCleanShutdown(names)
		return nil, err
	}
	m.sched = newScheduler(o.Workers, defaultSchedulerTick, lo.Now)
	if unchanged, err := m.openAll(names); err != nil {
		m.closeLogs()
		m.keepCleanShutdown(unchanged)
		m.sched.close()
		return nil, err
	}
	m.rp.opened()
	go m.checkpointLoop()
	opened = true
	return m, nil
}

// scanDir lists the log directories, removing logs left half-deleted.
func (m *Manager) scanDir() ([]string, error) {
	fs := m.opts.Log.FS
	entries, err := fs.ReadDir(m.dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, n := range entries {
		p := filepath.Join(m.dir, n)
		st, err := fs.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue // removed since ReadDir
		}
		if err != nil {
			return nil, err // a log skipped now would lose its checkpoint entries
		}
		if !st.IsDir() {
			continue
		}
		if filepath.Ext(n) == deletedDirSuffix {
			if err := fs.RemoveAll(p); err != nil {
				return nil, err
			}
			continue
		}
		switch {
		case strings.HasSuffix(n, tmpSuffix) && checkpointName(strings.TrimSuffix(n, tmpSuffix)):
			// Where a checkpoint's temporary file goes: every checkpoint
			// write, and so Close, would fail.
			return nil, fmt.Errorf("replog/log: %s is a directory where the Manager writes a checkpoint's temporary file", p)
		case reservedName(n):
			// A name Create refuses (the Manager's temporary files): not
			// a log, nor to be written into as one.
			m.opts.Log.Logger.Warn("replog/log: ignoring a directory with a reserved name", "dir", p)
		case validLogName(n):
			names = append(names, n)
		}
	}
	return names, nil
}

// openAll opens logs with RecoveryWorkers goroutines.
func (m *Manager) openAll(names []string) (unchanged []string, err error) {
	o := m.logOptions()
	o.dirSynced = true // by OpenManager
	var mu sync.Mutex
	err = inParallel(names, m.opts.RecoveryWorkers, func(name string) error {
		l, err := Open(filepath.Join(m.dir, name), o)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if errors.As(err, &unchangedOpen{}) {
				unchanged = append(unchanged, name)
			}
			return fmt.Errorf("log %s: %w", name, err)
		}
		m.addLogLocked(name, l)
		return nil
	})
	return unchanged, err
}

// keepCleanShutdown writes, after OpenManager failed and closed the logs
// it opened, the checkpoint files as Close would: those logs were closed
// cleanly, and the logs in unchanged, whose files it left as they were,
// keep the clean-shutdown markers they had. Else the next OpenManager
// would take them for crashed, recover them and start their high
// watermarks over, and restart empty one it refused for a log start past
// its end. Other logs that failed to open are recovered. (A crash before
// this write still loses the markers.)
func (m *Manager) keepCleanShutdown(unchanged []string) {
	m.rp.keepClean(unchanged)
	// The markers go even if the recovery points could not: a log whose
	// marker is trusted does not use its recovery point, and those of the
	// logs in unchanged are the file's already.
	err := errors.Join(m.rp.write(), m.rp.writeClosed())
	if err != nil {
		m.opts.Log.Logger.Error("replog/log: writing the checkpoints after a failed OpenManager", "dir", m.dir, "err", err)
	}
}

// inParallel calls fn for every item on at most workers goroutines and
// returns the first error; it runs every item regardless.
func inParallel[T any](items []T, workers int, fn func(T) error) error {
	work := make(chan T)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range min(workers, len(items)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for item := range work {
				if err := fn(item); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, item := range items {
		work <- item
	}
	close(work)
	wg.Wait()
	return firstErr
}

func (m *Manager) logOptions() Options {
	o := m.opts.Log
	o.sched, o.files, o.recoveryPoints = m.sched, m.files, &m.rp
	return o
}

// Dir is the data directory.
func (m *Manager) Dir() string { return m.dir }

// Create creates and opens a new, empty log called name. After Close it
// fails with ErrClosed.
//
// Names are compared without regard to case: on a case-insensitive
// filesystem (macOS, Windows) two names that differ in case only are one
// directory, so Create refuses a name that differs in case only from a
// log's (ErrLogExists) or from one of the Manager's own entries
// (ErrInvalidLogName), one longer than 247 bytes (a deleted log's
// directory takes 8 bytes more, and names are at most 255), and one
// ending in a dot (ErrInvalidLogName: Windows drops it, so "a." would be
// log a's directory). If the new log cannot be opened, its directory is
// removed again.
func (m *Manager) Create(name string) (*Log, error) {
	if !creatableName(name) {
		return nil, fmt.Errorf("%w %q", ErrInvalidLogName, name)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	if other, ok := m.sameNameLocked(name); ok {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: %s (%s)", ErrLogExists, name, other)
	}
	// Open runs outside mu (it fsyncs), so that creating one log does not
	// hold up Get, Names, Stats and other Creates. A Close meanwhile
	// waits, then closes the new log with the others.
	m.busy[name] = true
	m.ops.Add(1)
	defer m.ops.Done()
	m.mu.Unlock()
	l, err := m.create(name)
	m.mu.Lock()
	delete(m.busy, name)
	if err == nil {
		m.addLogLocked(name, l)
	}
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return l, nil
}

// creatableName reports whether Create takes name: a valid name that
// differs, even in case only, from the Manager's own entries, short
// enough for its deleted directory's name, and not ending in a dot
// (Windows drops a path component's trailing dots: "a." is the directory
// of log "a", and "..." the data directory).
func creatableName(name string) bool {
	return validLogName(name) && !reservedName(strings.ToLower(name)) && len(name) <= maxLogName-len(deletedDirSuffix) &&
		!strings.HasSuffix(name, ".")
}

// sameNameLocked returns the name of a log, being created, or not fully
// deleted, equal to name without regard to case (in lower case for a
// log). Callers hold m.mu.
func (m *Manager) sameNameLocked(name string) (string, bool) {
	if low := strings.ToLower(name); m.folded[low] > 0 {
		return low, true
	}
	for _, names := range []map[string]bool{m.busy, m.undeleted} {
		for n, ok := range names {
			if ok && strings.EqualFold(n, name) {
				return n, true
			}
		}
	}
	return "", false
}

// addLogLocked and removeLogLocked add and remove an open log. Callers
// hold m.mu (or, in openAll, its own lock before the Manager is shared).
func (m *Manager) addLogLocked(name string, l *Log) {
	m.logs[name] = l
	m.folded[strings.ToLower(name)]++
}

func (m *Manager) removeLogLocked(name string) {
	delete(m.logs, name)
	low := strings.ToLower(name)
	if m.folded[low]--; m.folded[low] <= 0 {
		delete(m.folded, low)
	}
}

func (m *Manager) create(name string) (*Log, error) {
	dir := filepath.Join(m.dir, name)
	// A recovery point kept for the name belongs to a deleted log (one
	// whose Delete was cut short by a crash after the rename): it must be
	// gone, durably, before the new log can be written, or a crash would
	// make recovery trust the old log's recovery point for the new log's
	// segments.
	stale := m.rp.has(dir) || m.rp.fileMayHold(dir)
	m.rp.forget(dir) // and a high watermark left by a deleted log
	if stale {
		if err := m.rp.write(); err != nil {
			return nil, err
		}
	}
	_, statErr := m.opts.Log.FS.Stat(dir)
	// Open makes the new directory's entry durable (it syncs m.dir).
	l, err := Open(dir, m.logOptions())
	if err != nil && errors.Is(statErr, os.ErrNotExist) {
		// Not left for the next OpenManager to take for a log.
		if rerr := m.opts.Log.FS.RemoveAll(dir); rerr == nil {
			_ = m.opts.Log.FS.SyncDir(m.dir)
		}
	}
	return l, err
}

// Get returns the open log called name.
func (m *Manager) Get(name string) (*Log, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.logs[name]
	return l, ok
}

// Names returns the logs' names, sorted.
func (m *Manager) Names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := make([]string, 0, len(m.logs))
	for n := range m.logs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Delete closes the log called name and removes its directory: it is
// renamed to "<name>.deleted" durably first, so a crash midway finishes
// the deletion at the next OpenManager. If it fails before the rename and
// the log's recovery point are durably gone, the name stays taken (Create
// fails with ErrLogExists) and Delete may be called again to finish.
// A name no log has is ErrNoSuchLog, or ErrInvalidLogName if Create would
// refuse it. A log of a name Create refuses, made by an older version,
// cannot be deleted if the name is longer than 247 bytes or its deleted
// directory's name is another log's without regard to case: Delete fails
// with ErrInvalidLogName and leaves the log open. After Close it fails
// with ErrClosed.
func (m *Manager) Delete(name string) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	l, ok := m.logs[name]
	retry := m.undeleted[name] && !m.busy[name]
	if !ok && !retry {
		m.mu.Unlock()
		if !creatableName(name) {
			return fmt.Errorf("%w %q", ErrInvalidLogName, name)
		}
		return fmt.Errorf("%w: %q", ErrNoSuchLog, name)
	}
	// A log of a name Create no longer takes (made by an older version):
	// its deleted directory's name would be too long, or, on a
	// case-insensitive filesystem, another log's directory, which the
	// removal of a leftover would destroy. Refused before the log closes.
	if len(name) > maxLogName-len(deletedDirSuffix) {
		m.mu.Unlock()
		return fmt.Errorf("%w %q: too long to delete (at most %d bytes)", ErrInvalidLogName, name, maxLogName-len(deletedDirSuffix))
	}
	if other, clash := m.sameNameLocked(name + deletedDirSuffix); clash {
		m.mu.Unlock()
		return fmt.Errorf("%w %q: its deleted directory's name is that of log %q", ErrInvalidLogName, name, other)
	}
	if ok {
		m.removeLogLocked(name)
	}
	// Create fails with ErrLogExists until the directory is gone: it
	// would open the old log's files.
	m.busy[name] = true
	m.ops.Add(1)
	defer m.ops.Done()
	m.mu.Unlock()
	if ok {
		_ = l.Close()
	}
	gone, err := m.removeLog(name)
	m.mu.Lock()
	delete(m.busy, name)
	if gone {
		delete(m.undeleted, name)
	} else {
		m.undeleted[name] = true
	}
	m.mu.Unlock()
	return err
}

// removeLog renames the closed log's directory aside durably, drops its
// recovery point from the checkpoint file and removes the directory.
// gone reports whether the log is gone for good (even if the final
// removal failed: the next Delete or OpenManager removes it). It may be
// called again after a failure.
func (m *Manager) removeLog(name string) (gone bool, err error) {
	fs := m.opts.Log.FS
	dir := filepath.Join(m.dir, name)
	aside := dir + deletedDirSuffix
	if _, err := fs.Stat(dir); err == nil {
		_ = fs.RemoveAll(aside) // left by an earlier Delete whose removal failed
		if err := fs.Rename(dir, aside); err != nil {
			return false, err
		}
	} else if !os.IsNotExist(err) {
		return false, err
	}
	if err := fs.SyncDir(m.dir); err != nil {
		return false, err
	}
	// The log's recovery point leaves the checkpoint file now, not at the
	// next timed write: a log created again under the name must never be
	// recovered from the old log's recovery point, which would skip its
	// unsynced segments below it.
	m.rp.forget(dir)
	if err := m.rp.write(); err != nil {
		return false, err
	}
	return true, fs.RemoveAll(aside)
}

// ManagerStats is a snapshot of a Manager.
type ManagerStats struct {
	// Logs is the number of logs open in the Manager.
	Logs int
	// OpenFiles is the number of segment files open in the shared cache.
	OpenFiles int
	// FileOpens counts segment file opens so far (cache misses).
	FileOpens int64
	// Bytes is the sum of all logs' sizes.
	Bytes int64
	// QueueLength is how many logs wait for a background worker.
	QueueLength int
}

// Stats returns a snapshot of the Manager.
func (m *Manager) Stats() ManagerStats {
	m.mu.Lock()
	logs := make([]*Log, 0, len(m.logs))
	for _, l := range m.logs {
		logs = append(logs, l)
	}
	m.mu.Unlock()
	st := ManagerStats{Logs: len(logs), OpenFiles: m.files.openFiles(), FileOpens: m.files.opens.Load(), QueueLength: m.sched.queueLen()}
	for _, l := range logs {
		for _, s := range l.segments() {
			st.Bytes += s.size.Load()
		}
	}
	return st
}

// Close closes every log (cleanly, in parallel), writes the checkpoint and
// stops the workers. Creates and Deletes in progress finish first (a log
// being created is then closed with the others); later ones fail with
// ErrClosed. A later or concurrent Close returns nil once the first has
// finished.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		<-m.closeDone
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	defer close(m.closeDone)
	m.ops.Wait()
	close(m.stop)
	<-m.done
	err := m.closeLogs()
	werr := m.rp.write()
	if werr == nil {
		// The clean-shutdown markers last, once everything else is durable.
		werr = m.rp.writeClosed()
	}
	if err == nil {
		err = werr
	}
	m.sched.close()
	if cerr := m.dirLock.Close(); err == nil {
		err = cerr
	}
	return err
}

// closeLogs closes all logs with RecoveryWorkers goroutines.
func (m *Manager) closeLogs() error {
	m.mu.Lock()
	logs := make([]*Log, 0, len(m.logs))
	for _, l := range m.logs {
		logs = append(logs, l)
	}
	m.logs, m.folded = map[string]*Log{}, map[string]int{}
	m.mu.Unlock()
	err := inParallel(logs, m.opts.RecoveryWorkers, (*Log).Close)
	m.files.waitClosed()
	return err
}

// checkpointLoop writes the recovery-point checkpoint when it changed.
func (m *Manager) checkpointLoop() {
	defer close(m.done)
	t := time.NewTicker(m.opts.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			if err := m.rp.writeIfDirty(); err != nil {
				m.opts.Log.Logger.Error("replog/log: writing the recovery-point checkpoint", "dir", m.dir, "err", err)
			}
		}
	}
}
