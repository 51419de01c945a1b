package log

import (
	"fmt"
	"math/rand"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// readModel is the list of batches a log should hold, in order.
type readModel struct{ batches [][]byte }

func (m *readModel) end(start int64) int64 {
	if len(m.batches) == 0 {
		return start
	}
	return Batch(m.batches[len(m.batches)-1]).NextOffset()
}

// first returns the index of the first batch whose last offset >= off.
func (m *readModel) first(off int64) int {
	for i, b := range m.batches {
		if Batch(b).LastOffset() >= off {
			return i
		}
	}
	return -1
}

func (m *readModel) truncate(off int64) {
	for i, b := range m.batches {
		if Batch(b).LastOffset() >= off {
			m.batches = m.batches[:i]
			return
		}
	}
}

func (m *readModel) dropBefore(start int64) {
	// Only whole batches below start can no longer be read; keep the rest.
	i := 0
	for i < len(m.batches) && Batch(m.batches[i]).LastOffset() < start {
		i++
	}
	m.batches = m.batches[i:]
}

// checkReadsAgainstModel reads every offset of the log with Read and ReadRegion
// and compares the first batch returned with the model.
func checkReadsAgainstModel(t *testing.T, l *Log, m *readModel, step int) {
	t.Helper()
	start, leo := l.LogStartOffset(), l.LogEndOffset()
	for off := start; off < leo; off++ {
		i := m.first(off)
		require.GreaterOrEqual(t, i, 0, "step %d offset %d: model has no batch", step, off)
		want := m.batches[i]
		for _, max := range []int{1, 1 << 20} {
			buf, err := l.Read(nil, off, ReadOptions{MaxBytes: max})
			require.NoError(t, err, "step %d Read(%d)", step, off)
			got := splitAll(t, buf)
			require.NotEmpty(t, got, "step %d Read(%d)", step, off)
			require.Equal(t, want, got[0], "step %d Read(%d, max %d) first batch", step, off, max)
			for k, b := range got {
				require.Equal(t, m.batches[i+k], b, "step %d Read(%d) batch %d", step, off, k)
			}
			r, err := l.ReadRegion(off, ReadOptions{MaxBytes: max})
			require.NoError(t, err, "step %d ReadRegion(%d)", step, off)
			rb := regionBytes(t, r)
			got = splitAll(t, rb)
			require.NotEmpty(t, got)
			for k, b := range got {
				require.Equal(t, m.batches[i+k], b, "step %d ReadRegion(%d) batch %d", step, off, k)
			}
			require.Equal(t, Batch(got[0]).BaseOffset(), r.FirstOffset)
			require.Equal(t, Batch(got[len(got)-1]).NextOffset(), r.NextOffset)
		}
	}
}

// A follower's log through appends (gaps, leaps, several batches at
// once), rolls, truncations, failed appends whose part landed, a moving
// log start and reopens: Read and ReadRegion at every offset return the
// batches the log holds, whether or not the remembered last batch
// answers.
func TestReadsFollowTheModel(t *testing.T) {
	for _, manager := range []bool{false, true} {
		for seed := int64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("manager=%v/seed=%d", manager, seed), func(t *testing.T) {
				runReadModel(t, manager, seed)
			})
		}
	}
}

func runReadModel(t *testing.T, manager bool, seed int64) {
	var failWrite atomic.Bool
	efs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpWrite && strings.HasSuffix(op.Path, logSuffix) && failWrite.CompareAndSwap(true, false) {
			return vfs.Fault{Err: syscall.ENOSPC, Written: op.Len / 2}
		}
		return vfs.Fault{}
	}))
	opts := testLogOptions(efs)
	opts.SegmentBytes = 2 << 10
	var l *Log
	var mgr *Manager
	open := func() {
		if manager {
			var err error
			mgr, err = OpenManager("/data", ManagerOptions{Log: opts, MaxOpenFiles: 1, CheckpointInterval: time.Hour})
			require.NoError(t, err)
			t.Cleanup(func() { _ = mgr.Close() })
			if x, ok := mgr.Get("x"); ok {
				l = x
			} else {
				l, err = mgr.Create("x")
				require.NoError(t, err)
			}
			return
		}
		l = openLog(t, "/log", opts)
	}
	closeLog := func() {
		if manager {
			require.NoError(t, mgr.Close())
			return
		}
		require.NoError(t, l.Close())
	}
	open()
	var m readModel
	rng := rand.New(rand.NewSource(seed))
	for step := range 150 {
		leo, start := l.LogEndOffset(), l.LogStartOffset()
		switch k := rng.Intn(12); {
		case k < 5:
			base := leo
			if rng.Intn(4) == 0 {
				base += int64(1 + rng.Intn(20))
			}
			b := buildBatch(t, 1+rng.Intn(4), 10+rng.Intn(200), 1000+int64(step))
			Batch(b).setBaseOffset(base)
			Batch(b).setLeaderEpoch(1)
			_, err := l.AppendAsFollower(b)
			require.NoError(t, err)
			m.batches = append(m.batches, append([]byte(nil), b...))
		case k < 7:
			a := followerBatch(t, leo, 2, 1)
			c := followerBatch(t, leo+2, 1+rng.Intn(3), 1)
			_, err := l.AppendAsFollower(concat(a, c))
			require.NoError(t, err)
			m.batches = append(m.batches, a, c)
		case k < 8:
			if leo > start {
				to := start + rng.Int63n(leo-start)
				require.NoError(t, l.TruncateTo(to))
				m.truncate(to)
			}
		case k < 9:
			failWrite.Store(true)
			_, err := l.AppendAsFollower(followerBatch(t, leo, 3, 1))
			require.Error(t, err)
			failWrite.Store(false)
		case k < 10:
			if leo > start {
				to := start + rng.Int63n(leo-start+1)
				require.NoError(t, l.DeleteRecordsBefore(to))
				m.dropBefore(l.LogStartOffset())
			}
		case k < 11:
			closeLog()
			open()
		default:
			_ = l.Sync()
		}
		require.Equal(t, m.end(l.LogStartOffset()) <= l.LogEndOffset(), true)
		checkReadsAgainstModel(t, l, &m, step)
	}
}

// A tailing Reader and reads at the log end racing appends (with rolls,
// through a file cache of one descriptor) see every batch once, in order,
// as appended.
func TestTailingReaderRacesReadsAtTheEnd(t *testing.T) {
	opts := testLogOptions(vfs.NewMem())
	opts.SegmentBytes = 2 << 10
	m, err := OpenManager("/data", ManagerOptions{Log: opts, MaxOpenFiles: 1, CheckpointInterval: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	l, err := m.Create("x")
	require.NoError(t, err)
	const n = 400
	done := make(chan error, 2)
	go func() {
		r := l.NewReader(0, ReaderOptions{BufferBytes: 300})
		next := int64(0)
		for next < n*2 {
			b, err := r.Next(t.Context())
			if err != nil {
				done <- err
				return
			}
			if b.BaseOffset() != next {
				done <- fmt.Errorf("reader: batch at %d, want %d", b.BaseOffset(), next)
				return
			}
			next = b.NextOffset()
		}
		done <- nil
	}()
	go func() {
		for {
			leo := l.LogEndOffset()
			if leo >= n*2 {
				done <- nil
				return
			}
			if leo == 0 {
				continue
			}
			buf, err := l.Read(nil, leo-1, ReadOptions{MaxBytes: 1})
			if err != nil {
				done <- err
				return
			}
			b, _, err := SplitBatch(buf)
			if err != nil || b.BaseOffset() > leo-1 || b.LastOffset() < leo-1 {
				done <- fmt.Errorf("Read(%d): %v %v", leo-1, err, len(buf))
				return
			}
			r, err := l.ReadRegion(leo-1, ReadOptions{MaxBytes: 1})
			if err != nil || r.FirstOffset > leo-1 || r.NextOffset <= leo-1 {
				done <- fmt.Errorf("ReadRegion(%d): %+v %v", leo-1, r, err)
				return
			}
		}
	}()
	for i := range n {
		b := buildBatch(t, 2, 20+i%50, int64(i))
		_, err := l.Append(b)
		require.NoError(t, err)
	}
	for range 2 {
		require.NoError(t, <-done)
	}
}
