package log

import (
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/replog/replog/internal/vfs"
	"github.com/stretchr/testify/require"
)

// failCheckpointOpen opens a log whose log-start checkpoint's temporary
// file fails to open with the errno fault holds, while it holds one.
func failCheckpointOpen(t *testing.T) (*Log, *atomic.Uintptr) {
	t.Helper()
	var fault atomic.Uintptr
	efs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if errno := syscall.Errno(fault.Load()); errno != 0 && op.Kind == vfs.OpOpen &&
			strings.HasSuffix(op.Path, logStartOffsetFile+tmpSuffix) {
			return vfs.Fault{Err: errno}
		}
		return vfs.Fault{}
	}))
	opts := testLogOptions(efs)
	opts.RetentionBytes = 4 << 10
	l := openLog(t, "/log", opts)
	appendN(t, l, 100, 0)
	require.Greater(t, len(l.segments()), 3)
	return l, &fault
}

// Moving the log start writes its checkpoint first: one that cannot be
// written for want of descriptors changes nothing and leaves the log
// usable, for a retry; any other failure still fails the log.
func TestLogStartCheckpointOutOfDescriptors(t *testing.T) {
	for _, tc := range []struct {
		name string
		move func(l *Log) error
	}{
		{"DeleteRecordsBefore", func(l *Log) error { return l.DeleteRecordsBefore(l.segments()[2].base) }},
		{"ApplyRetention", func(l *Log) error { _, err := l.ApplyRetention(); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM} {
				l, fault := failCheckpointOpen(t)
				start, segs := l.LogStartOffset(), len(l.segments())
				fault.Store(uintptr(errno))
				require.ErrorIs(t, tc.move(l), errno)
				require.Equal(t, start, l.LogStartOffset(), "%v", errno)
				require.Len(t, l.segments(), segs, "%v: no segment deleted", errno)
				_, err := l.Append(buildBatch(t, 1, 10, 0))
				require.NoError(t, err, "%v: the log is not failed", errno)
				fault.Store(0)
				require.NoError(t, tc.move(l), "%v: a retry succeeds", errno)
				require.Greater(t, l.LogStartOffset(), start)
			}
			l, fault := failCheckpointOpen(t)
			fault.Store(uintptr(syscall.EIO))
			require.ErrorIs(t, tc.move(l), syscall.EIO)
			_, err := l.Append(buildBatch(t, 1, 10, 0))
			require.ErrorIs(t, err, ErrSyncFailed, "EIO fails the log")
		})
	}
}
