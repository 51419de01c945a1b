package log

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestReaderBufferSmallerThanAHeader: a BufferBytes under a batch
// header's size made a Reader report every batch as corrupt (a partial
// header); it is now raised to a header, and a larger batch read whole.
func TestReaderBufferSmallerThanAHeader(t *testing.T) {
	_, o := memLog()
	l, err := Open("/log", o)
	require.NoError(t, err)
	defer l.Close()
	bb := NewBatchBuilder()
	_, err = l.Append(seqBatch(t, bb, 1, 3, 16))
	require.NoError(t, err)
	r := l.NewReader(0, ReaderOptions{BufferBytes: 32})
	b, err := r.TryNext()
	require.NoError(t, err)
	require.NotNil(t, b)
	require.EqualValues(t, 0, b.BaseOffset())
}

// TestReaderAtAStraddlingBatchSeesTheLogStartPassIt: a Reader held back
// at a batch that straddles the high watermark waits for the high
// watermark to pass the batch; when DeleteRecordsBefore moved the log
// start past its position meanwhile, it went on waiting (forever, if the
// high watermark never moved) instead of reporting an OutOfRangeError.
func TestReaderAtAStraddlingBatchSeesTheLogStartPassIt(t *testing.T) {
	_, o := memLog()
	l, err := Open("/log", o)
	require.NoError(t, err)
	defer l.Close()
	bb := NewBatchBuilder()
	_, err = l.Append(seqBatch(t, bb, 1, 10, 16)) // offsets 0..9
	require.NoError(t, err)
	l.SetHighWatermark(5)
	r := l.NewReader(0, ReaderOptions{UpToHighWatermark: true})
	done := nextWithin(r, 3*time.Second)
	awaitWaiting(t, 1)
	require.NoError(t, l.DeleteRecordsBefore(5))
	err = <-done
	_, tryErr := r.TryNext()
	var oor *OutOfRangeError
	require.True(t, errors.As(err, &oor), "Next returned %v, want *OutOfRangeError (position 0 < log start %d); TryNext now says %v", err, l.LogStartOffset(), tryErr)
}

// TestFailedTruncateFullyWakesReaders: a TruncateFullyAndStartAt that
// failed writing its recovery point (the log fails, but the truncation
// happened: segments, log end, generation) returned without waking the
// waiters: a Reader at the old log end was never told.
func TestFailedTruncateFullyWakesReaders(t *testing.T) {
	var armed atomic.Bool
	efs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if armed.Load() && op.Kind == vfs.OpRename && strings.HasSuffix(op.NewPath, "/"+recoveryPointFile) {
			return vfs.Fault{Err: syscall.EIO}
		}
		return vfs.Fault{}
	}))
	l, err := Open("/log", testLogOptions(efs))
	require.NoError(t, err)
	defer l.Close()
	bb := NewBatchBuilder()
	_, err = l.Append(seqBatch(t, bb, 1, 10, 16)) // offsets 0..9
	require.NoError(t, err)
	r := l.NewReader(10, ReaderOptions{})
	done := nextWithin(r, 3*time.Second)
	awaitWaiting(t, 1)
	armed.Store(true)
	terr := l.TruncateFullyAndStartAt(2)
	require.Error(t, terr)
	require.EqualValues(t, 2, l.LogEndOffset(), "the truncation took effect")
	err = <-done
	require.False(t, errors.Is(err, context.DeadlineExceeded), "Reader at 10 still waiting after the log end fell to 2: %v", err)
}

// TestCloseWakesWaitersBeforeTheFlusherStops: Close woke the waiters
// only after the flusher's step in progress ended: a step waiting for its
// FlushGroup turn (or in a long fsync) kept every Reader and WaitForData
// blocked, though they return ErrClosed once woken. Closing's channel is
// closed as early.
func TestCloseWakesWaitersBeforeTheFlusherStops(t *testing.T) {
	g := NewFlushGroup(1)
	release := g.acquire(false) // another log's long roll flush holds the only turn
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	_, o := memLog()
	o.SegmentBytes = 1 << 10
	o.FlushGroup = g
	l, err := Open("/log", o)
	require.NoError(t, err)
	bb := NewBatchBuilder()
	for i := 0; len(l.segments()) < 2; i++ {
		_, err = l.Append(seqBatch(t, bb, uint64(i), 4, 64))
		require.NoError(t, err)
	}
	// The flusher's step now waits for a turn to flush the rolled segment.
	deadline := time.Now().Add(5 * time.Second)
	for waitingIn("(*FlushGroup).acquire(") == 0 {
		require.True(t, time.Now().Before(deadline), "flusher never waited for its turn")
		time.Sleep(time.Millisecond)
	}
	done := make(chan error, 1)
	go func() {
		done <- l.WaitForData(context.Background(), l.LogEndOffset(), false)
	}()
	awaitWaiting(t, 1)
	select {
	case <-l.Closing():
		t.Fatal("Closing's channel is closed before Close began")
	default:
	}
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrClosed)
		select {
		case <-l.Closing():
		case <-time.After(2 * time.Second):
			t.Fatal("Closing's channel still open 2s after Close began")
		}
	case <-time.After(2 * time.Second):
		release()
		released = true
		<-closed
		t.Fatalf("WaitForData still blocked 2s after Close began (log closed: %v)", l.closed.Load())
	}
	release()
	released = true
	require.NoError(t, <-closed)
}

// nextWithin runs r.Next with a context of d in a goroutine and returns
// the channel of its error.
func nextWithin(r *Reader, d time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := r.Next(ctx)
		done <- err
	}()
	return done
}
