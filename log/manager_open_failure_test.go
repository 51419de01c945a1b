package log

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// A failed OpenManager writes back the clean-shutdown markers of the logs
// it left as they were (Manager.keepCleanShutdown): these tests fail it in
// several ways, around a log whose log start was moved past its end, which
// Open refuses after a clean shutdown and restarts empty after a crash.

// closedManager writes 6 batches to each of n logs of a Manager, sets
// their high watermarks at 4 and closes it.
func closedManager(t *testing.T, mem *vfs.MemFS, n int) map[string][][]byte {
	m, want := mgrWriteAll(t, mem, n, 6)
	for _, n := range m.Names() {
		l, _ := m.Get(n)
		l.SetHighWatermark(4)
	}
	require.NoError(t, m.Close())
	return want
}

// closedManagerWithLogStartPastEnd closes a Manager of 3 logs, their high
// watermarks at 4, and moves log-0's log start past its end.
func closedManagerWithLogStartPastEnd(t *testing.T, mem *vfs.MemFS) (map[string][][]byte, string) {
	want := closedManager(t, mem, 3)
	end := Batch(want["log-0"][len(want["log-0"])-1]).NextOffset()
	startFile := filepath.Join(mgrCrashDir, "log-0", logStartOffsetFile)
	require.NoError(t, writeOffsetCheckpoint(mem, startFile, end+1000))
	return want, startFile
}

// failFirstOp fails with EIO the first operation of kind on a path
// starting with p.
func failFirstOp(kind vfs.OpKind, p string) vfs.Injector {
	var done atomic.Bool
	return vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind&kind != 0 && strings.HasPrefix(op.Path, p) && done.CompareAndSwap(false, true) {
			return vfs.Fault{Err: syscall.EIO}
		}
		return vfs.Fault{}
	})
}

// TestManagerKeepsARefusedLogsMarkerAfterItsIOError: when the damaged
// log's own Open failed with an I/O error before it reached the refusal,
// its marker was dropped, and the retry restarted it empty. An Open that
// fails before it could have changed a file keeps its marker now.
func TestManagerKeepsARefusedLogsMarkerAfterItsIOError(t *testing.T) {
	mem := vfs.NewMem()
	_, startFile := closedManagerWithLogStartPastEnd(t, mem)
	efs := vfs.NewErrorFS(mem, failFirstOp(vfs.OpOpen, startFile))
	_, err := OpenManager(mgrCrashDir, mgrCrashOptions(efs))
	require.Error(t, err)
	t.Logf("first OpenManager: %v", err)
	m, err := OpenManager(mgrCrashDir, mgrCrashOptions(mem))
	if err == nil {
		l, _ := m.Get("log-0")
		t.Logf("log-0 after retry: start %d end %d", l.LogStartOffset(), l.LogEndOffset())
		m.Close()
	}
	require.ErrorIs(t, err, ErrCorrupt, "the retry must refuse log-0 again, not restart it empty")
}

// TestManagerKeepsMarkersAfterAFailureBeforeOpeningLogs: OpenManager
// failed after it removed the clean-shutdown file but before it opened any
// log (a half-deleted log's removal failed), wrote no marker back, and the
// retry restarted the damaged log empty and recovered every other one,
// starting their high watermarks over. The file now goes after those
// steps.
func TestManagerKeepsMarkersAfterAFailureBeforeOpeningLogs(t *testing.T) {
	mem := vfs.NewMem()
	_, _ = closedManagerWithLogStartPastEnd(t, mem)
	del := filepath.Join(mgrCrashDir, "log-9"+deletedDirSuffix)
	require.NoError(t, mem.MkdirAll(del, 0o755))
	efs := vfs.NewErrorFS(mem, failFirstOp(vfs.OpRemoveAll, del))
	_, err := OpenManager(mgrCrashDir, mgrCrashOptions(efs))
	require.Error(t, err)
	t.Logf("first OpenManager: %v", err)
	_, serr := mem.Stat(filepath.Join(mgrCrashDir, managerCleanShutdownFile))
	t.Logf("clean-shutdown file after failure: stat err %v", serr)
	m, err := OpenManager(mgrCrashDir, mgrCrashOptions(mem))
	if err == nil {
		l, _ := m.Get("log-0")
		t.Logf("log-0 after retry: start %d end %d", l.LogStartOffset(), l.LogEndOffset())
		l1, _ := m.Get("log-1")
		t.Logf("log-1 hw %d", l1.HighWatermark())
		m.Close()
	}
	require.ErrorIs(t, err, ErrCorrupt, "the retry must refuse log-0 again, not restart it empty")
}

// TestManagerRefusedLogWithAnotherLogFailing: while another log fails with
// an I/O error, the refused log keeps its marker, high watermark and
// recovery point; the other is recovered; nothing is lost.
func TestManagerRefusedLogWithAnotherLogFailing(t *testing.T) {
	mem := vfs.NewMem()
	want, startFile := closedManagerWithLogStartPastEnd(t, mem)
	efs := vfs.NewErrorFS(mem, failFirstOp(vfs.OpOpen, filepath.Join(mgrCrashDir, "log-1")+"/"))
	_, err := OpenManager(mgrCrashDir, mgrCrashOptions(efs))
	require.Error(t, err)
	_, err = OpenManager(mgrCrashDir, mgrCrashOptions(mem))
	require.ErrorIs(t, err, ErrCorrupt)
	require.NoError(t, writeOffsetCheckpoint(mem, startFile, 0))
	m, err := OpenManager(mgrCrashDir, mgrCrashOptions(mem))
	require.NoError(t, err)
	defer m.Close()
	requireMgrHolds(t, m, want)
	l, _ := m.Get("log-0")
	require.Equal(t, int64(4), l.HighWatermark(), "refused log's hw")
}

// TestManagerMarkerOfALogRecoveredInAFailedOpen: a log without a marker
// (crashed) that the failed OpenManager recovered and closed gets a marker
// at its log end.
func TestManagerMarkerOfALogRecoveredInAFailedOpen(t *testing.T) {
	mem := vfs.NewMem()
	want, startFile := closedManagerWithLogStartPastEnd(t, mem)
	cleanPath := filepath.Join(mgrCrashDir, managerCleanShutdownFile)
	data := readFileFS(t, mem, cleanPath)
	marks, err := decodeNamedCheckpoint(data)
	require.NoError(t, err)
	delete(marks, "log-1")
	writeFileFS(t, mem, cleanPath, encodeNamedCheckpoint(marks))
	_, err = OpenManager(mgrCrashDir, mgrCrashOptions(mem))
	require.ErrorIs(t, err, ErrCorrupt)
	marks2, err := decodeNamedCheckpoint(readFileFS(t, mem, cleanPath))
	require.NoError(t, err)
	t.Logf("markers after failed open: %v", marks2)
	end1 := Batch(want["log-1"][len(want["log-1"])-1]).NextOffset()
	require.Equal(t, end1, marks2["log-1"])
	require.NoError(t, writeOffsetCheckpoint(mem, startFile, 0))
	m, err := OpenManager(mgrCrashDir, mgrCrashOptions(mem))
	require.NoError(t, err)
	defer m.Close()
	requireMgrHolds(t, m, want)
}

// TestManagerCrashDuringAFailedOpen: after a power loss or kill at every
// operation of a failed OpenManager, and the damaged log start mended,
// every log holds all its synced data, whatever markers the crash left. (A
// crash before the markers are written back still restarts the damaged log
// empty if it is not mended: the Manager's one marker file goes before its
// logs open.)
func TestManagerCrashDuringAFailedOpen(t *testing.T) {
	for _, kill := range []bool{false, true} {
		lost := 0
		for n := int64(0); ; n++ {
			mem := vfs.NewMem()
			want, startFile := closedManagerWithLogStartPastEnd(t, mem)
			c := &vfs.Crash{N: n, Mem: mem, Opts: vfs.CrashOptions{Kill: kill}}
			efs := vfs.NewErrorFS(mem, c)
			_, err := OpenManager(mgrCrashDir, mgrCrashOptions(efs))
			require.Error(t, err)
			img := c.Clone()
			if img == nil {
				t.Logf("kill=%v: %d crash points, log-0 restarted empty without mending at %d", kill, n, lost)
				break
			}
			desc := fmt.Sprintf("kill=%v crash at %d", kill, n)
			// Unmended: either refused or (crash before the marker) restarted.
			img2 := img.CrashClone(vfs.CrashOptions{Kill: true})
			if m, err := OpenManager(mgrCrashDir, mgrCrashOptions(img2)); err == nil {
				lost++
				m.Close()
			} else {
				require.ErrorIs(t, err, ErrCorrupt, desc)
			}
			require.NoError(t, writeOffsetCheckpoint(img, startFile, 0))
			m, err := OpenManager(mgrCrashDir, mgrCrashOptions(img))
			require.NoError(t, err, desc)
			requireMgrHolds(t, m, want)
			l, _ := m.Get("log-0")
			require.LessOrEqual(t, l.HighWatermark(), int64(4), desc)
			require.NoError(t, m.Close(), desc)
		}
	}
}

// TestManagerKeepsHighWatermarksAfterAFailedOpen: a transient I/O error in
// one log's Open (no damage anywhere) made the retry recover that log and
// start its high watermark over at the log start.
func TestManagerKeepsHighWatermarksAfterAFailedOpen(t *testing.T) {
	mem := vfs.NewMem()
	closedManager(t, mem, 2)
	efs := vfs.NewErrorFS(mem, failFirstOp(vfs.OpOpen, filepath.Join(mgrCrashDir, "log-1")+"/"))
	_, err := OpenManager(mgrCrashDir, mgrCrashOptions(efs))
	require.Error(t, err)
	m, err := OpenManager(mgrCrashDir, mgrCrashOptions(mem))
	require.NoError(t, err)
	defer m.Close()
	for _, n := range m.Names() {
		l, _ := m.Get(n)
		t.Logf("%s hw %d", n, l.HighWatermark())
	}
	l, _ := m.Get("log-1")
	require.Equal(t, int64(4), l.HighWatermark(), "log-1 closed cleanly, its Open failed transiently and changed nothing")
}

// TestManagerRefusedLogWithMidLogDamageElsewhere: a crashed log whose
// recovery refuses damage in its middle, failing alongside the refused
// one, gets no marker and keeps its recovery point: the retry refuses both
// again, and the damaged segment is unchanged.
func TestManagerRefusedLogWithMidLogDamageElsewhere(t *testing.T) {
	mem := vfs.NewMem()
	_, _ = closedManagerWithLogStartPastEnd(t, mem)
	cleanPath := filepath.Join(mgrCrashDir, managerCleanShutdownFile)
	marks, err := decodeNamedCheckpoint(readFileFS(t, mem, cleanPath))
	require.NoError(t, err)
	delete(marks, "log-1")
	writeFileFS(t, mem, cleanPath, encodeNamedCheckpoint(marks))
	rpPath := filepath.Join(mgrCrashDir, managerCheckpointFile)
	rps, err := decodeNamedCheckpoint(readFileFS(t, mem, rpPath))
	require.NoError(t, err)
	rps["log-1"] = 0
	writeFileFS(t, mem, rpPath, encodeNamedCheckpoint(rps))
	seg := filepath.Join(mgrCrashDir, "log-1", segmentName(0)+logSuffix)
	data := readFileFS(t, mem, seg)
	data[80] ^= 0xff // inside the first batch, more follow
	writeFileFS(t, mem, seg, data)
	for i := range 2 {
		_, err := OpenManager(mgrCrashDir, mgrCrashOptions(mem))
		require.ErrorIs(t, err, ErrCorrupt)
		t.Logf("open %d: %v", i, err)
		marks, err := decodeNamedCheckpoint(readFileFS(t, mem, cleanPath))
		require.NoError(t, err)
		rps, err := decodeNamedCheckpoint(readFileFS(t, mem, rpPath))
		require.NoError(t, err)
		t.Logf("markers %v rps %v", marks, rps)
		require.NotContains(t, marks, "log-1")
		require.Contains(t, marks, "log-0")
		require.Equal(t, int64(0), rps["log-1"])
	}
	require.Equal(t, data, readFileFS(t, mem, seg))
}

// TestManagerKeepsMarkersAfterAMkdirFailure: Open's MkdirAll of a
// Manager's (existing) log directory runs before load, and its error was
// not taken for one that changed nothing: the failed OpenManager dropped
// the refused log's marker, and the retry restarted it empty; an undamaged
// log was recovered, its high watermark started over.
func TestManagerKeepsMarkersAfterAMkdirFailure(t *testing.T) {
	t.Run("refused log", func(t *testing.T) {
		mem := vfs.NewMem()
		closedManagerWithLogStartPastEnd(t, mem)
		efs := vfs.NewErrorFS(mem, failFirstOp(vfs.OpMkdirAll, mgrCrashDir+"/log-0"))
		_, err := OpenManager(mgrCrashDir, mgrCrashOptions(efs))
		require.Error(t, err)
		_, err = OpenManager(mgrCrashDir, mgrCrashOptions(mem))
		require.ErrorIs(t, err, ErrCorrupt, "the retry must refuse log-0 again, not restart it empty")
	})
	t.Run("undamaged log", func(t *testing.T) {
		mem := vfs.NewMem()
		closedManager(t, mem, 2)
		efs := vfs.NewErrorFS(mem, failFirstOp(vfs.OpMkdirAll, mgrCrashDir+"/log-1"))
		_, err := OpenManager(mgrCrashDir, mgrCrashOptions(efs))
		require.Error(t, err)
		m, err := OpenManager(mgrCrashDir, mgrCrashOptions(mem))
		require.NoError(t, err)
		defer m.Close()
		l, _ := m.Get("log-1")
		require.Equal(t, int64(4), l.HighWatermark())
	})
}

// TestManagerWritesMarkersBackDespiteARecoveryPointFailure: the markers
// were written back only if the recovery-point checkpoint was: one I/O
// error there (its rename) left no clean-shutdown file, and the retry
// restarted the refused log empty.
func TestManagerWritesMarkersBackDespiteARecoveryPointFailure(t *testing.T) {
	mem := vfs.NewMem()
	closedManagerWithLogStartPastEnd(t, mem)
	efs := vfs.NewErrorFS(mem, failFirstOp(vfs.OpRename, mgrCrashDir+"/"+managerCheckpointFile))
	_, err := OpenManager(mgrCrashDir, mgrCrashOptions(efs))
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = OpenManager(mgrCrashDir, mgrCrashOptions(mem))
	require.ErrorIs(t, err, ErrCorrupt, "the retry must refuse log-0 again, not restart it empty")
}
