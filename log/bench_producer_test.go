package log

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkAppendIdempotent (issue 3; names and metrics are a contract)
// measures what the idempotent-producer checks cost on the append path:
// producers=off appends batches without producer id, producers=on the same
// batches from 1,000 producer ids round-robin, each continuing its own
// sequence, so every append looks up, checks and updates a producer's
// state, and every roll snapshots 1,000 producers. Batches as in
// BenchmarkAppend: 16 records of 1 KiB random (incompressible) values,
// 16 MiB segments, no fsync per append. producers=on also reports
// ratio-vs-off, its MB/s over that of producers=off in the same run.
// Goal: ratio-vs-off >= 0.90.
//
//	go test -run='^$' -bench=BenchmarkAppendIdempotent -benchtime=3s ./log/
//
// The producer fields of a batch lie inside its CRC, so producers=on needs
// new bytes for every append. The batches are appended from a pool in
// chunks of the pool's size; before each chunk, with the timer stopped,
// the pool's batches are re-stamped with the next producer id and sequence
// and their CRC recomputed. producers=off stops and restarts the timer
// around the same chunks, so both pay the same timer overhead and time
// only the Append calls.
func BenchmarkAppendIdempotent(b *testing.B) {
	const (
		producers     = 1000
		recordsPerB   = 16
		recordBytes   = 1 << 10
		segmentBytes  = 16 << 20
		poolBatches   = 256 // 4 MiB of distinct batches
		benchEpoch    = int16(0)
		firstProducer = int64(1) << 40
	)
	build := func(opts BatchOptions) [][]byte {
		var seed [32]byte
		rng := rand.NewChaCha8(seed)
		bb := NewBatchBuilder()
		val := make([]byte, recordBytes)
		pool := make([][]byte, poolBatches)
		ts := time.Now().UnixMilli()
		for i := range pool {
			bb.Reset(opts)
			for range recordsPerB {
				_, _ = rng.Read(val)
				bb.Add(ts, nil, val)
			}
			p, err := bb.Build(nil)
			if err != nil {
				b.Fatal(err)
			}
			pool[i] = p
		}
		return pool
	}
	plain := build(BatchOptions{ProducerID: NoProducerID, ProducerEpoch: NoProducerEpoch, BaseSequence: NoSequence})
	withPID := build(BatchOptions{Idempotent: true, ProducerID: firstProducer, ProducerEpoch: benchEpoch, BaseSequence: 0})
	batchBytes := int64(len(plain[0]))

	// stamp makes batch the next one of producer n (of producers).
	stamp := func(batch []byte, n int, seq int32) {
		be := binary.BigEndian
		be.PutUint64(batch[offProducerID:], uint64(firstProducer+int64(n)))
		be.PutUint16(batch[offProducerEpoch:], uint16(benchEpoch))
		be.PutUint32(batch[offBaseSequence:], uint32(seq))
		be.PutUint32(batch[offCRC:], Batch(batch).ComputeCRC())
	}

	var offMBps float64
	for _, on := range []bool{false, true} {
		name, pool := "producers=off", plain
		if on {
			name, pool = "producers=on", withPID
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(batchBytes)
			l, err := Open(b.TempDir(), Options{SegmentBytes: segmentBytes})
			if err != nil {
				b.Fatal(err)
			}
			seqs := make([]int32, producers)
			var appendTime time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; {
				n := min(len(pool), b.N-i)
				b.StopTimer()
				if on {
					for j := range n {
						p := (i + j) % producers
						stamp(pool[j], p, seqs[p])
						seqs[p] += recordsPerB
					}
				}
				b.StartTimer()
				t0 := time.Now()
				for j := range n {
					info, err := l.Append(pool[j])
					if err != nil {
						b.Fatal(err)
					}
					if info.Duplicate {
						b.Fatal("a new batch was taken for a retry")
					}
				}
				appendTime += time.Since(t0)
				i += n
			}
			b.StopTimer()
			mbps := float64(b.N) * float64(batchBytes) / 1e6 / appendTime.Seconds()
			if !on {
				offMBps = mbps
			} else if offMBps > 0 {
				b.ReportMetric(mbps/offMBps, "ratio-vs-off")
			}
			if on && b.N >= producers {
				if got := l.Stats().Producers; got != producers {
					b.Fatalf("%d producers tracked, want %d", got, producers)
				}
			}
			if err := l.Close(); err != nil {
				b.Fatal(err)
			}
		})
	}
}
