package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replog/replog/compression"
	replog "github.com/replog/replog/log"
	"github.com/replog/replog/replication"
)

const recordsPerBatch = 100

// result is what the producers did.
type result struct {
	acked, bytes        int64
	retries, duplicates int64
	failedOver          bool  // the failover happened
	failoverAt          int64 // records acknowledged when node 0 was deposed
	afterFailover       int64 // records acknowledged by node 1, the new leader
	latencies           durations
	// ackedSeqs[p] is the number of records producer p had acknowledged;
	// producer p's records carry sequences 0..ackedSeqs[p]-1.
	ackedSeqs []int64
}

// produce runs the idempotent producers until records were acknowledged
// (rounded down to a multiple of producers), failing over halfway.
//
// The acknowledgement that crosses half the records deposes node 0 at once,
// so that every batch sent after it waits for the new leader; the
// "controller" goroutine then closes node 0 and elects node 1 while other
// producers' batches are in flight. With two batches or more per producer
// (see checkFlags), more records remain at that point than can be in
// flight, so the new leader always acknowledges some. The producers stop
// when ctx ends (an interrupt).
func produce(ctx context.Context, c *cluster, records, producers int) (*result, error) {
	perProducer := records / producers
	total := int64(perProducer * producers)
	res := &result{ackedSeqs: make([]int64, producers)}
	var mu sync.Mutex
	var acked atomic.Int64
	half := make(chan struct{}) // closed when half the records are acknowledged
	onAck := func(n int64) {
		if now := acked.Add(n); now >= total/2 && now-n < total/2 {
			res.failoverAt = now // read once the producers are done
			c.depose()
			close(half)
		}
	}

	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := 0; p < producers; p++ {
		wg.Go(func() {
			lat, bytes, retries, dups, err := runProducer(ctx, c, p, perProducer, onAck, res)
			mu.Lock()
			res.bytes += bytes
			res.latencies = append(res.latencies, lat...)
			res.retries += retries
			res.duplicates += dups
			mu.Unlock()
			if err != nil {
				errs <- err
			}
		})
	}
	producersDone := make(chan struct{})
	go func() { wg.Wait(); close(producersDone) }()

	// The "controller": fails over once half the records are acknowledged,
	// or does nothing if the producers stop before (a producer failed).
	var ctrl sync.WaitGroup
	ctrlErr := make(chan error, 1)
	ctrl.Go(func() {
		select {
		case <-half:
		case <-producersDone:
			return
		}
		if err := c.failover(); err != nil {
			ctrlErr <- fmt.Errorf("failover: %w", err)
			return
		}
		res.failedOver = true // read after ctrl.Wait
	})

	defer showProgress(&acked, total)()

	// Wait for the producers, or for a failed failover: the producers then
	// stop too (they see the error when they wake), but one may still be in
	// a Produce call, which ends within its 10 s timeout.
	select {
	case <-producersDone:
		ctrl.Wait()
	case err := <-ctrlErr:
		ctrl.Wait()
		select {
		case <-producersDone:
		case <-time.After(15 * time.Second):
		}
		return nil, err
	}
	select {
	case err := <-ctrlErr:
		return nil, err
	case err := <-errs:
		return nil, err
	default:
	}
	res.acked = acked.Load()
	slices.Sort(res.latencies)
	return res, nil
}

// runProducer sends perProducer records as an idempotent producer (id
// 1000+p), retrying each batch with the same sequence numbers until it is
// acknowledged: after a failover the new leader recognises a batch the old
// one had already replicated and returns its original offsets.
func runProducer(ctx context.Context, c *cluster, p, perProducer int, onAck func(n int64), res *result) (lat durations, bytes, retries, dups int64, err error) {
	local := compression.NewLocal(compression.Options{})
	lz4, err := replog.CompressWith(local, compression.LZ4, 0)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	b := replog.NewBatchBuilder()
	var batch []byte
	for seq := 0; seq < perProducer; seq += recordsPerBatch {
		n := min(recordsPerBatch, perProducer-seq)
		b.Reset(replog.BatchOptions{Idempotent: true, ProducerID: int64(1000 + p), ProducerEpoch: 0, BaseSequence: int32(seq), Compressor: lz4})
		for i := 0; i < n; i++ {
			b.Add(time.Now().UnixMilli(), fmt.Appendf(nil, "producer-%d", p), recordValue(p, seq+i))
		}
		if batch, err = b.Build(batch[:0]); err != nil {
			return lat, bytes, retries, dups, err
		}
		for attempt := 0; ; attempt++ {
			leader, changed, err := c.current()
			for err == nil && leader < 0 { // failing over: wait for the new leader
				select {
				case <-changed:
				case <-ctx.Done():
					return lat, bytes, retries, dups, ctx.Err()
				}
				leader, changed, err = c.current()
			}
			if err != nil {
				return lat, bytes, retries, dups, fmt.Errorf("producer %d: no leader: %w", p, err)
			}
			callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			t0 := time.Now()
			info, err := c.reps[leader].Produce(callCtx, topic, batch, replication.AcksAll)
			cancel()
			if err == nil {
				lat = append(lat, time.Since(t0))
				if attempt > 0 {
					retries++
				}
				if info.Duplicate {
					dups++
				}
				if leader == 1 {
					atomic.AddInt64(&res.afterFailover, int64(n))
				}
				bytes += int64(b.BodySize())
				res.ackedSeqs[p] = int64(seq + n)
				onAck(int64(n))
				break
			}
			if ctx.Err() != nil {
				return lat, bytes, retries, dups, ctx.Err()
			}
			if !retriable(err) || attempt > 100 {
				return lat, bytes, retries, dups, fmt.Errorf("producer %d: %w", p, err)
			}
			select {
			case <-changed:
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
				return lat, bytes, retries, dups, ctx.Err()
			}
		}
	}
	return lat, bytes, retries, dups, nil
}

func retriable(err error) bool {
	return errors.Is(err, replication.ErrNotLeader) || errors.Is(err, replication.ErrClosed) ||
		errors.Is(err, replication.ErrNotEnoughReplicas) || errors.Is(err, replog.ErrClosed) ||
		errors.Is(err, context.DeadlineExceeded)
}

// recordValue is the deterministic content of producer p's record seq.
func recordValue(p, seq int) []byte {
	return fmt.Appendf(nil, `{"producer":%d,"seq":%d,"item":"widget-%d","qty":%d,"note":"replicated with acks=all and lz4"}`, p, seq, seq%97, seq%13+1)
}

// durations are sorted latencies.
type durations []time.Duration

func (d durations) at(q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(int(q*float64(len(d))), len(d)-1)].Round(time.Microsecond)
}

// showProgress rewrites a progress line on the terminal every 200 ms until
// the function it returns is called, which erases it. Output that is not
// a terminal gets no progress line (and no control characters).
func showProgress(acked *atomic.Int64, total int64) (stop func()) {
	if st, err := os.Stdout.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return func() {}
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				fmt.Print("\r\033[K")
				return
			case <-t.C:
				fmt.Printf("\rproducing: %d/%d records acknowledged", acked.Load(), total)
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}
