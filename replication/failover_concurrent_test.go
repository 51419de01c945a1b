package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/log"
)

// TestConcurrentFailoversKeepAcknowledgedRecords runs back-to-back
// failovers in memory while producers send acks=all batches and Stats is
// read concurrently (run it with -race): every acknowledged record stays
// at its offset and the replicas' logs converge byte for byte.
func TestConcurrentFailoversKeepAcknowledgedRecords(t *testing.T) {
	checkGoroutines(t)
	netw := NewMemNetwork(7)
	const n = 3
	var (
		isrMu sync.Mutex
		isr   = []int32{0, 1, 2}
		isrEp int32
	)
	reps := make([]*Replicator, n)
	logs := make([]*log.Log, n)
	for i := range n {
		l, err := log.Open(t.TempDir(), log.Options{SegmentBytes: 8 << 10})
		require.NoError(t, err)
		logs[i] = l
		r, err := New(Config{ReplicaID: int32(i), ClusterID: "c", MinInsyncReplicas: 2, FetchMaxWait: 20 * time.Millisecond,
			ReplicaLagTime: 200 * time.Millisecond, FetchBackoff: 5 * time.Millisecond,
			OnISRChange: func(tp TopicPartition, ep int32, s []int32) error {
				isrMu.Lock()
				defer isrMu.Unlock()
				if ep < isrEp {
					return errors.New("stale")
				}
				isr, isrEp = s, ep
				return nil
			}}, netw.Transport(int32(i)))
		require.NoError(t, err)
		reps[i] = r
		netw.Register(int32(i), r)
		require.NoError(t, r.AddPartition(ntp, l))
	}
	defer func() {
		for i := range n {
			require.NoError(t, reps[i].Close())
			require.NoError(t, logs[i].Close())
		}
	}()
	all := []int32{0, 1, 2}
	leader := int32(0)
	epoch := int32(1)
	isrEp = 1
	require.NoError(t, reps[0].BecomeLeader(ntp, 1, all, all))
	require.NoError(t, reps[1].BecomeFollower(ntp, 1, 0))
	require.NoError(t, reps[2].BecomeFollower(ntp, 1, 0))

	type acked struct {
		off int64
		v   string
	}
	var (
		ackMu sync.Mutex
		acks  []acked
		cur   atomic.Int32
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				v := fmt.Sprintf("w%d-%d", w, i)
				ld := cur.Load()
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				info, err := reps[ld].Produce(ctx, ntp, testBatch(t, v), AcksAll)
				cancel()
				if err == nil {
					ackMu.Lock()
					acks = append(acks, acked{info.FirstOffset, v})
					ackMu.Unlock()
				}
			}
		})
	}
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			for i := range n {
				_ = reps[i].Stats()
			}
			time.Sleep(time.Millisecond)
		}
	})
	for round := 0; round < 15; round++ {
		time.Sleep(60 * time.Millisecond)
		isrMu.Lock()
		cand := -1
		for _, id := range isr {
			if id != leader {
				cand = int(id)
				break
			}
		}
		cisr := append([]int32(nil), isr...)
		isrMu.Unlock()
		if cand < 0 {
			continue
		}
		epoch++
		isrMu.Lock()
		isrEp = epoch
		isrMu.Unlock()
		require.NoError(t, reps[cand].BecomeLeader(ntp, epoch, all, cisr))
		cur.Store(int32(cand))
		for i := range n {
			if i != cand {
				require.NoError(t, reps[i].BecomeFollower(ntp, epoch, int32(cand)))
			}
		}
		leader = int32(cand)
	}
	close(stop)
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok := true
		for i := range n {
			if logs[i].LogEndOffset() != logs[leader].LogEndOffset() {
				ok = false
			}
		}
		if ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	values := recordValues(t, logs[leader])
	for _, a := range acks {
		require.Equal(t, a.v, values[a.off], "acked at %d", a.off)
	}
	for i := range n {
		require.Equal(t, readAllBatches(t, logs[leader]), readAllBatches(t, logs[i]), "replica %d", i)
	}
	t.Logf("acked %d, leo %d", len(acks), logs[leader].LogEndOffset())
}
