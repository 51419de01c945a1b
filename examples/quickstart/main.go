// Command quickstart shows replog's log in a few seconds: it opens a Log
// in a temporary directory, appends batches across several segment rolls,
// syncs, closes, reopens, reads everything back and verifies it.
//
//	go run ./examples/quickstart [-dir DIR] [-records N]
package main

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"time"

	replog "github.com/replog/replog/log"
)

func main() {
	dir := flag.String("dir", "", "data directory to keep (default: a temporary directory, removed at exit)")
	records := flag.Int("records", 200_000, "records to append")
	flag.Parse()
	if err := run(*dir, *records); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

const (
	recordsPerBatch = 100
	valueSize       = 200
)

// value is the deterministic content of record i, so reads can be checked.
func value(i int) []byte {
	v := bytes.Repeat([]byte{byte(i)}, valueSize)
	binary.BigEndian.PutUint64(v, uint64(i))
	return v
}

func run(dir string, records int) error {
	if dir == "" {
		tmp, err := os.MkdirTemp("", "replog-quickstart-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	opts := replog.Options{SegmentBytes: 4 << 20}
	l, err := replog.Open(dir, opts)
	if err != nil {
		return err
	}
	first := l.LogEndOffset()

	start := time.Now()
	b := replog.NewBatchBuilder()
	var batch []byte
	for i := 0; i < records; i += recordsPerBatch {
		b.Reset(replog.BatchOptions{ProducerID: replog.NoProducerID, ProducerEpoch: replog.NoProducerEpoch, BaseSequence: replog.NoSequence})
		for j := i; j < min(i+recordsPerBatch, records); j++ {
			b.Add(time.Now().UnixMilli(), fmt.Appendf(nil, "key-%d", j), value(j))
		}
		if batch, err = b.Build(batch[:0]); err != nil {
			return err
		}
		if _, err := l.Append(batch); err != nil {
			return err
		}
	}
	if err := l.Sync(); err != nil {
		return err
	}
	elapsed := time.Since(start)
	st := l.Stats()
	fmt.Printf("appended %d records (%.1f MB) in %v: %.0f MB/s, %d segments (%d rolls), synced\n",
		records, float64(st.AppendedBytes)/1e6, elapsed.Round(time.Millisecond),
		float64(st.AppendedBytes)/1e6/elapsed.Seconds(), st.Segments, st.Rolls)
	if err := l.Close(); err != nil {
		return err
	}

	l, err = replog.Open(dir, opts)
	if err != nil {
		return err
	}
	defer l.Close()
	start = time.Now()
	n, err := verify(l, first, records)
	if err != nil {
		return err
	}
	fmt.Printf("reopened %s: read back and verified %d records in %v\n", dir, n, time.Since(start).Round(time.Millisecond))
	return nil
}

// verify reads every record from first and checks it.
func verify(l *replog.Log, first int64, records int) (int, error) {
	var buf []byte
	var it replog.RecordIterator
	n := 0
	for off := first; off < l.LogEndOffset(); {
		var err error
		buf, err = l.Read(buf[:0], off, replog.ReadOptions{MaxBytes: 1 << 20})
		if err != nil {
			return n, err
		}
		for rest := buf; len(rest) > 0; {
			batch, r, err := replog.SplitBatch(rest)
			if err != nil {
				return n, err
			}
			it.Reset(batch, batch.RecordsBody())
			for it.Next() {
				rec := it.Record()
				i := int(rec.Offset - first)
				if !bytes.Equal(rec.Value, value(i)) {
					return n, fmt.Errorf("record at offset %d: wrong value", rec.Offset)
				}
				n++
			}
			if err := it.Err(); err != nil {
				return n, err
			}
			off, rest = batch.NextOffset(), r
		}
	}
	if n != records {
		return n, fmt.Errorf("read %d records, appended %d", n, records)
	}
	return n, nil
}
