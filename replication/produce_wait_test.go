package replication

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/log"
)

// TestAcksAllWaitEnds checks each way an acks=all Produce's wait for the
// high watermark ends other than success: its context ending, this node
// ceasing to lead, the Replicator closing, and the partition's log
// closing. Each must return its own error at once, not wait for a high
// watermark that can no longer move (the follower here never fetches).
func TestAcksAllWaitEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(cancel context.CancelFunc, r *Replicator, l *log.Log)
		want error
	}{
		{"context", func(cancel context.CancelFunc, _ *Replicator, _ *log.Log) { cancel() }, context.Canceled},
		{"leadership", func(_ context.CancelFunc, r *Replicator, _ *log.Log) {
			require.NoError(t, r.BecomeFollower(ntp, 2, 1))
		}, ErrNotLeader},
		{"replicator-close", func(_ context.CancelFunc, r *Replicator, _ *log.Log) { require.NoError(t, r.Close()) }, ErrClosed},
		{"log-close", func(_ context.CancelFunc, _ *Replicator, l *log.Log) { require.NoError(t, l.Close()) }, log.ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := log.Open(t.TempDir(), log.Options{})
			require.NoError(t, err)
			defer l.Close()
			r, err := New(Config{ReplicaID: 0, ClusterID: "c", MinInsyncReplicas: 2, RelaxedDurability: true}, idleTransport{})
			require.NoError(t, err)
			defer r.Close()
			require.NoError(t, r.AddPartition(ntp, l))
			require.NoError(t, r.BecomeLeader(ntp, 1, []int32{0, 1}, []int32{0, 1}))

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := r.Produce(ctx, ntp, testBatch(t, "a"), AcksAll)
				done <- err
			}()
			require.Eventually(t, func() bool { return l.LogEndOffset() > 0 }, 10*time.Second, time.Millisecond, "the batch was not appended")
			select {
			case err := <-done:
				t.Fatalf("Produce returned %v before its high watermark could pass the batch", err)
			case <-time.After(20 * time.Millisecond):
			}
			tc.end(cancel, r, l)
			select {
			case err := <-done:
				require.ErrorIs(t, err, tc.want)
			case <-time.After(10 * time.Second):
				t.Fatal("Produce still waits 10 s after its wait was ended")
			}
		})
	}
}
