package vfs

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
)

// ErrInjected is wrapped by every error that an ErrorFS injects, together
// with the Fault's own error (syscall.EIO, syscall.ENOSPC, ErrCrashed...),
// so errors.Is matches both.
var ErrInjected = errors.New("vfs: injected error")

// ErrCrashed is the cause of the errors a Crash injector returns once the
// simulated power loss happened.
var ErrCrashed = errors.New("vfs: simulated crash")

// OpKind is a kind of filesystem operation, or a set of kinds OR'ed
// together.
type OpKind uint32

// The operations an ErrorFS counts: one per FS method and per File method
// (File.Name is not counted), and Preallocate (its Files have a Preallocate
// method, which the function Preallocate calls).
const (
	OpOpen        OpKind = 1 << iota // FS.OpenFile
	OpRemove                         // FS.Remove
	OpRemoveAll                      // FS.RemoveAll
	OpRename                         // FS.Rename
	OpMkdirAll                       // FS.MkdirAll
	OpReadDir                        // FS.ReadDir
	OpStat                           // FS.Stat
	OpSyncDir                        // FS.SyncDir
	OpRead                           // File.ReadAt
	OpWrite                          // File.WriteAt
	OpSync                           // File.Sync
	OpTruncate                       // File.Truncate
	OpFileStat                       // File.Stat
	OpClose                          // File.Close
	OpPreallocate                    // Preallocate

	// OpSyncs is the set of operations that make data durable.
	OpSyncs = OpSync | OpSyncDir
	// OpWrites is the set of operations that change file data.
	OpWrites = OpWrite | OpTruncate
	// OpMutations is the set of operations that may change the
	// filesystem (OpenFile may create or truncate; Preallocate allocates
	// space, so it can fail with ENOSPC).
	OpMutations = OpOpen | OpRemove | OpRemoveAll | OpRename | OpMkdirAll |
		OpSyncDir | OpWrite | OpSync | OpTruncate | OpPreallocate
)

var opNames = [...]string{
	"open", "remove", "removeall", "rename", "mkdirall", "readdir", "stat",
	"syncdir", "read", "write", "sync", "truncate", "filestat", "close",
	"preallocate",
}

// String returns the kind's name, or the names of a set joined by '|'.
func (k OpKind) String() string {
	var names []string
	for i, name := range opNames {
		if k&(1<<i) != 0 {
			names = append(names, name)
		}
	}
	if rest := k &^ (1<<len(opNames) - 1); rest != 0 || len(names) == 0 {
		names = append(names, fmt.Sprintf("OpKind(%#x)", uint32(rest)))
	}
	return strings.Join(names, "|")
}

// Op describes an operation about to run on an ErrorFS.
type Op struct {
	// Index counts the ErrorFS's operations from 0, from its creation or
	// last Reset.
	Index int64
	// Kind is the operation's kind.
	Kind OpKind
	// Path is the name operated on: for File methods the file's current
	// name, which follows an FS.Rename of the file or of a directory
	// above it, as the kernel's name of an open file does
	// (/proc/self/fd), though File.Name keeps the opened name as
	// os.File.Name does; for Rename the old name.
	Path string
	// NewPath is the new name for Rename.
	NewPath string
	// Off is the offset of ReadAt and WriteAt, and the size for Truncate
	// and Preallocate.
	Off int64
	// Len is len(p) for ReadAt and WriteAt.
	Len int
}

// Fault is an Injector's verdict on an operation. The zero Fault lets the
// operation run.
type Fault struct {
	// Err, when not nil, fails the operation: the operation does not run
	// (except as said of Written and Close) and returns an error wrapping
	// both ErrInjected and Err.
	Err error
	// Written is, for a failing OpWrite, how many bytes of p are written
	// before the error (clamped to [0, len(p)]): a short write, as on a
	// full disk.
	Written int
}

// Injector decides which operations of an ErrorFS fail. Inject is called
// before each operation, possibly from several goroutines at once.
type Injector interface {
	// Inject returns the verdict on op: the zero Fault lets it run.
	Inject(op Op) Fault
}

// InjectorFunc adapts a function to an Injector.
type InjectorFunc func(op Op) Fault

// Inject calls f(op).
func (f InjectorFunc) Inject(op Op) Fault { return f(op) }

// FailAt is an Injector that fails the first operation with Index >= N whose
// kind is in Kinds or, if Sticky, every such operation. The zero Kinds means
// all kinds. A FailAt is safe for concurrent use; it must not be copied after
// first use. Typical use, after pebble's errorfs tests: for n := 0; ; n++,
// run the workload on NewErrorFS(NewMem(), &FailAt{N: n, Err: syscall.EIO})
// until Injected() == 0.
type FailAt struct {
	// N is the index of the first operation that may fail.
	N int64
	// Err is the cause wrapped in the injected error (for example
	// syscall.EIO or syscall.ENOSPC); nil gives ErrInjected alone.
	Err error
	// Kinds restricts failures to these kinds of operations; 0 means all.
	Kinds OpKind
	// Sticky fails every matching operation from N on instead of one.
	Sticky bool
	// ShortWrite is, for a failing OpWrite, how many bytes are written
	// before the error (see Fault.Written).
	ShortWrite int

	injected atomic.Int64
}

// Inject implements Injector.
func (f *FailAt) Inject(op Op) Fault {
	if op.Index < f.N || (f.Kinds != 0 && op.Kind&f.Kinds == 0) {
		return Fault{}
	}
	if f.Sticky {
		f.injected.Add(1)
	} else if !f.injected.CompareAndSwap(0, 1) {
		return Fault{}
	}
	err := f.Err
	if err == nil {
		err = ErrInjected
	}
	return Fault{Err: err, Written: f.ShortWrite}
}

// Injected returns how many faults f has injected so far.
func (f *FailAt) Injected() int64 { return f.injected.Load() }

// Crash is an Injector that simulates a power loss just before operation N
// of an ErrorFS wrapping Mem: the operation with Index N and every later
// one fail with ErrCrashed, so the workload cannot change what the crash
// kept. Once the workload has stopped, Clone returns Mem.CrashClone(Opts).
// The image is taken then, not when operation N arrives, because another
// goroutine may at that moment still be inside an operation with a smaller
// index, whose success its caller sees (an fsync it acknowledges data
// by). Reopen the log on Clone() to check recovery. Safe for concurrent
// use.
type Crash struct {
	// N is the index of the first operation that does not run.
	N int64
	// Mem is the filesystem to clone.
	Mem *MemFS
	// Opts are passed to CrashClone.
	Opts CrashOptions

	mu      sync.Mutex
	crashed bool
	clone   *MemFS
}

// Inject implements Injector.
func (c *Crash) Inject(op Op) Fault {
	if op.Index < c.N {
		return Fault{}
	}
	c.mu.Lock()
	c.crashed = true
	c.mu.Unlock()
	return Fault{Err: ErrCrashed}
}

// Clone returns the filesystem as the crash left it, or nil if the workload
// ran fewer than N+1 operations (the crash never happened). Call it once
// the workload has stopped (every operation returned); the first call
// takes the image and later calls return the same one.
func (c *Crash) Clone() *MemFS {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.crashed && c.clone == nil {
		c.clone = c.Mem.CrashClone(c.Opts)
	}
	return c.clone
}

// ErrorFS wraps an FS and the Files it opens, counts their operations and
// asks an Injector before each whether it should fail. Multiple goroutines
// may invoke methods on an ErrorFS and its Files simultaneously; operation
// indices are then handed out in the order calls reach the ErrorFS.
type ErrorFS struct {
	inner    FS
	ops      atomic.Int64
	disabled atomic.Bool
	inj      atomic.Pointer[injectorBox]

	openMu sync.Mutex
	open   map[*errorFile]struct{} // open files, renamed with their names
}

type injectorBox struct{ inj Injector }

// NewErrorFS returns an ErrorFS over inner consulting inj; a nil inj injects
// nothing (the ErrorFS then only counts).
func NewErrorFS(inner FS, inj Injector) *ErrorFS {
	e := &ErrorFS{inner: inner}
	e.SetInjector(inj)
	return e
}

var _ FS = (*ErrorFS)(nil)

// Ops returns how many operations ran or were attempted since the ErrorFS
// was made or last Reset, including failed ones.
func (e *ErrorFS) Ops() int64 { return e.ops.Load() }

// Reset restarts the operation count at 0. It does not reset the injector.
func (e *ErrorFS) Reset() { e.ops.Store(0) }

// SetEnabled turns injection on (the default) or off. While off, operations
// are still counted but the injector is not consulted: space returns, the
// disk heals.
func (e *ErrorFS) SetEnabled(on bool) { e.disabled.Store(!on) }

// SetInjector replaces the injector; nil injects nothing.
func (e *ErrorFS) SetInjector(inj Injector) { e.inj.Store(&injectorBox{inj}) }

// Inner returns the wrapped FS.
func (e *ErrorFS) Inner() FS { return e.inner }

// check counts op and returns the fault to apply, with Err already wrapped.
func (e *ErrorFS) check(op Op) Fault {
	op.Index = e.ops.Add(1) - 1
	if e.disabled.Load() {
		return Fault{}
	}
	box := e.inj.Load()
	if box.inj == nil {
		return Fault{}
	}
	f := box.inj.Inject(op)
	if f.Err == nil {
		return Fault{}
	}
	if errors.Is(f.Err, ErrInjected) {
		f.Err = fmt.Errorf("%w (op %d %s)", f.Err, op.Index, op.Kind)
	} else {
		f.Err = fmt.Errorf("%w: op %d %s: %w", ErrInjected, op.Index, op.Kind, f.Err)
	}
	return f
}

func (e *ErrorFS) pathErr(kind OpKind, path string) error {
	if f := e.check(Op{Kind: kind, Path: path}); f.Err != nil {
		return &os.PathError{Op: kind.String(), Path: path, Err: f.Err}
	}
	return nil
}

// OpenFile implements FS.
func (e *ErrorFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	if err := e.pathErr(OpOpen, name); err != nil {
		return nil, err
	}
	f, err := e.inner.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	ef := &errorFile{fs: e, f: f}
	ef.name.Store(&name)
	e.openMu.Lock()
	if e.open == nil {
		e.open = map[*errorFile]struct{}{}
	}
	e.open[ef] = struct{}{}
	e.openMu.Unlock()
	return ef, nil
}

// renamed gives the open files named oldname, or under the directory
// oldname, their names after a rename to newname.
func (e *ErrorFS) renamed(oldname, newname string) {
	e.openMu.Lock()
	defer e.openMu.Unlock()
	for f := range e.open {
		switch p := f.path(); {
		case p == oldname:
			f.name.Store(&newname)
		case strings.HasPrefix(p, oldname+"/"):
			n := newname + p[len(oldname):]
			f.name.Store(&n)
		}
	}
}

// Remove implements FS.
func (e *ErrorFS) Remove(name string) error {
	if err := e.pathErr(OpRemove, name); err != nil {
		return err
	}
	return e.inner.Remove(name)
}

// RemoveAll implements FS.
func (e *ErrorFS) RemoveAll(name string) error {
	if err := e.pathErr(OpRemoveAll, name); err != nil {
		return err
	}
	return e.inner.RemoveAll(name)
}

// Rename implements FS.
func (e *ErrorFS) Rename(oldname, newname string) error {
	if f := e.check(Op{Kind: OpRename, Path: oldname, NewPath: newname}); f.Err != nil {
		return &os.LinkError{Op: OpRename.String(), Old: oldname, New: newname, Err: f.Err}
	}
	if err := e.inner.Rename(oldname, newname); err != nil {
		return err
	}
	e.renamed(oldname, newname)
	return nil
}

// MkdirAll implements FS.
func (e *ErrorFS) MkdirAll(dir string, perm os.FileMode) error {
	if err := e.pathErr(OpMkdirAll, dir); err != nil {
		return err
	}
	return e.inner.MkdirAll(dir, perm)
}

// ReadDir implements FS.
func (e *ErrorFS) ReadDir(dir string) ([]string, error) {
	if err := e.pathErr(OpReadDir, dir); err != nil {
		return nil, err
	}
	return e.inner.ReadDir(dir)
}

// Stat implements FS.
func (e *ErrorFS) Stat(name string) (os.FileInfo, error) {
	if err := e.pathErr(OpStat, name); err != nil {
		return nil, err
	}
	return e.inner.Stat(name)
}

// SyncDir implements FS.
func (e *ErrorFS) SyncDir(dir string) error {
	if err := e.pathErr(OpSyncDir, dir); err != nil {
		return err
	}
	return e.inner.SyncDir(dir)
}

// errorFile wraps a File of the inner FS.
type errorFile struct {
	fs   *ErrorFS
	f    File
	name atomic.Pointer[string] // current name, for Op.Path
}

// path is the file's current name.
func (f *errorFile) path() string { return *f.name.Load() }

var _ File = (*errorFile)(nil)

func (f *errorFile) ReadAt(p []byte, off int64) (int, error) {
	if flt := f.fs.check(Op{Kind: OpRead, Path: f.path(), Off: off, Len: len(p)}); flt.Err != nil {
		return 0, &os.PathError{Op: OpRead.String(), Path: f.path(), Err: flt.Err}
	}
	return f.f.ReadAt(p, off)
}

// WriteAt writes p, or on a fault the first Fault.Written bytes of it.
func (f *errorFile) WriteAt(p []byte, off int64) (int, error) {
	flt := f.fs.check(Op{Kind: OpWrite, Path: f.path(), Off: off, Len: len(p)})
	if flt.Err == nil {
		return f.f.WriteAt(p, off)
	}
	var n int
	if w := min(max(flt.Written, 0), len(p)); w > 0 {
		var err error
		if n, err = f.f.WriteAt(p[:w], off); err != nil {
			return n, err
		}
	}
	return n, &os.PathError{Op: OpWrite.String(), Path: f.path(), Err: flt.Err}
}

// Sync syncs the inner file. On a fault it drops the writeback of the
// file's unsynced data if the inner file can model that (a MemFS file), as
// a failed fsync does on Linux: the data stays readable, yet a later
// successful Sync does not make it durable; only writing it again does.
func (f *errorFile) Sync() error {
	if err := f.fs.pathErr(OpSync, f.path()); err != nil {
		if lw, ok := f.f.(interface{ loseWriteback() }); ok {
			lw.loseWriteback()
		}
		return err
	}
	return f.f.Sync()
}

func (f *errorFile) Truncate(size int64) error {
	if flt := f.fs.check(Op{Kind: OpTruncate, Path: f.path(), Off: size}); flt.Err != nil {
		return &os.PathError{Op: OpTruncate.String(), Path: f.path(), Err: flt.Err}
	}
	return f.f.Truncate(size)
}

// Preallocate makes vfs.Preallocate on an errorFile an operation that can
// fail; unless it does, it preallocates the inner file.
func (f *errorFile) Preallocate(size int64) error {
	if flt := f.fs.check(Op{Kind: OpPreallocate, Path: f.path(), Off: size}); flt.Err != nil {
		return &os.PathError{Op: OpPreallocate.String(), Path: f.path(), Err: flt.Err}
	}
	return Preallocate(f.f, size)
}

func (f *errorFile) Stat() (os.FileInfo, error) {
	if err := f.fs.pathErr(OpFileStat, f.path()); err != nil {
		return nil, err
	}
	return f.f.Stat()
}

func (f *errorFile) Name() string { return f.f.Name() }

// Close closes the inner file even when a fault is injected (as close(2)
// releases the descriptor even when it reports an error), then returns the
// injected error.
func (f *errorFile) Close() error {
	f.fs.openMu.Lock()
	delete(f.fs.open, f)
	f.fs.openMu.Unlock()
	err := f.fs.pathErr(OpClose, f.path())
	if cerr := f.f.Close(); err == nil {
		err = cerr
	}
	return err
}
