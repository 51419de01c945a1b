package replication

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/testlog"
	"github.com/replog/replog/internal/vfs"
	"github.com/replog/replog/log"
)

// What the API does with a caller's mistakes: each is an error, not a
// panic (a panic in a fetcher goroutine would take the process down).

// nilAnswerTransport answers every fetch with neither a response nor an
// error, counting them.
type nilAnswerTransport struct{ calls atomic.Int32 }

func (n *nilAnswerTransport) Fetch(ctx context.Context, _ int32, _ *FetchRequest) (*FetchResponse, error) {
	n.calls.Add(1)
	return nil, ctx.Err()
}

// TestNilTransportAnswerIsMalformed: a Transport returning (nil, nil) made
// the fetcher goroutine apply a nil response and panic, killing the
// process; it is now a failed fetch, logged, after which the fetcher
// backs off and fetches again.
func TestNilTransportAnswerIsMalformed(t *testing.T) {
	checkGoroutines(t)
	var logs testlog.Buffer
	tr := &nilAnswerTransport{}
	r, err := New(Config{ReplicaID: 1, ClusterID: "c", FetchBackoff: time.Millisecond, Logger: testlog.New(&logs)}, tr)
	require.NoError(t, err)
	l, err := log.Open("/log", log.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, r.AddPartition(ntp, l))
	require.NoError(t, r.BecomeFollower(ntp, 1, 0))
	require.Eventually(t, func() bool { return tr.calls.Load() >= 3 }, 10*time.Second, time.Millisecond)
	require.NoError(t, r.Close())
	require.Contains(t, logs.String(), ErrMalformedFrame.Error())

	n := newTestReplica(t, 2, Config{})
	_, err = n.node.HandleFetchResponse(0, &FetchRequest{}, nil, ntime)
	require.ErrorIs(t, err, ErrMalformedFrame)
	_, err = n.node.HandleFetchResponse(0, nil, &FetchResponse{}, ntime)
	require.ErrorIs(t, err, ErrMalformedFrame)
}

// TestNilArgumentsAreErrors: AddPartition with a nil log, HandleFetch and
// TCPTransport.Fetch with a nil request panicked; a partition added twice
// is ErrPartitionExists.
func TestNilArgumentsAreErrors(t *testing.T) {
	checkGoroutines(t)
	r, err := New(Config{ReplicaID: 0, ClusterID: "c"}, idleTransport{})
	require.NoError(t, err)
	defer r.Close()
	require.Error(t, r.AddPartition(ntp, nil))
	_, err = r.HandleFetch(context.Background(), nil)
	require.ErrorIs(t, err, ErrMalformedFrame)

	l, err := log.Open("/log", log.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, r.AddPartition(ntp, l))
	require.ErrorIs(t, r.AddPartition(ntp, l), ErrPartitionExists)

	_, err = newTransport(t, "127.0.0.1:1", TCPOptions{}).Fetch(context.Background(), 0, nil)
	require.ErrorIs(t, err, ErrMalformedFrame)
}
