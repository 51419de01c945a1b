package main

import (
	"context"
	"errors"
	"fmt"
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
	failoverAt          int64
	latencies           durations
	// ackedSeqs[p] is the number of records producer p had acknowledged;
	// producer p's records carry sequences 0..ackedSeqs[p]-1.
	ackedSeqs []int64
}

// produce runs the idempotent producers until records were acknowledged,
// failing over halfway.
func produce(c *cluster, records, producers int) (*result, error) {
	res := &result{ackedSeqs: make([]int64, producers)}
	var mu sync.Mutex
	var acked atomic.Int64
	perProducer := records / producers
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat, bytes, retries, dups, err := runProducer(c, p, perProducer, &acked, res)
			mu.Lock()
			res.bytes += bytes
			res.latencies = append(res.latencies, lat...)
			res.retries += retries
			res.duplicates += dups
			mu.Unlock()
			if err != nil {
				errs <- err
			}
		}()
	}
	// The "controller": fail over once half the records are acknowledged.
	go func() {
		for acked.Load() < int64(records/2) {
			time.Sleep(time.Millisecond)
		}
		res.failoverAt = acked.Load()
		if err := c.failover(); err != nil {
			errs <- err
		}
	}()
	done := make(chan struct{})
	progressDone := make(chan struct{})
	go func() { // a progress line while it runs
		defer close(progressDone)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				fmt.Print("\r\033[K")
				return
			case <-t.C:
				fmt.Printf("\rproducing: %d/%d records acknowledged", acked.Load(), records)
			}
		}
	}()
	wg.Wait()
	close(done)
	<-progressDone
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	res.acked = acked.Load()
	slices.Sort(res.latencies)
	return res, nil
}

// runProducer sends perProducer records as an idempotent producer (id
// 1000+p), retrying each batch with the same sequence numbers until it is
// acknowledged: after a failover the new leader recognises a batch the old
// one had already replicated and returns its original offsets.
func runProducer(c *cluster, p, perProducer int, acked *atomic.Int64, res *result) (lat durations, bytes, retries, dups int64, err error) {
	local := compression.NewLocal(compression.Options{})
	lz4, err := replog.CompressWith(local, compression.LZ4, 0)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	b := replog.NewBatchBuilder()
	var batch []byte
	for seq := 0; seq < perProducer; seq += recordsPerBatch {
		n := min(recordsPerBatch, perProducer-seq)
		b.Reset(replog.BatchOptions{ProducerID: int64(1000 + p), ProducerEpoch: 0, BaseSequence: int32(seq), Compressor: lz4})
		for i := 0; i < n; i++ {
			b.Add(time.Now().UnixMilli(), fmt.Appendf(nil, "producer-%d", p), recordValue(p, seq+i))
		}
		if batch, err = b.Build(batch[:0]); err != nil {
			return lat, bytes, retries, dups, err
		}
		for attempt := 0; ; attempt++ {
			leader, changed := c.current()
			if leader < 0 {
				<-changed
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			t0 := time.Now()
			info, err := c.reps[leader].Produce(ctx, topic, batch, replication.AcksAll)
			cancel()
			if err == nil {
				lat = append(lat, time.Since(t0))
				if attempt > 0 {
					retries++
				}
				if info.Duplicate {
					dups++
				}
				acked.Add(int64(n))
				bytes += int64(b.BodySize())
				res.ackedSeqs[p] = int64(seq + n)
				break
			}
			if !retriable(err) || attempt > 100 {
				return lat, bytes, retries, dups, fmt.Errorf("producer %d: %w", p, err)
			}
			select {
			case <-changed:
			case <-time.After(10 * time.Millisecond):
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
