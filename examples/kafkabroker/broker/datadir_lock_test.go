package broker

import (
	"sync"
	"sync/atomic"
	"testing"

	replog "github.com/replog/replog/log"
)

// A second broker on a running one's data directory (`go run . -data D`
// twice) is refused before it opens (and recovers, truncating) the logs
// the first one writes, whether it would listen on another port or fail
// on the same one; every acknowledged batch stays readable.
func TestDataDirInUseIsRefused(t *testing.T) {
	dir := t.TempDir()
	a := startBroker(t, dir)
	if code := a.createTopic("t", 1); code != errNone {
		t.Fatal(code)
	}
	// 1. A second broker on another port: it must not start.
	if b2, err := Start(Config{Addr: "127.0.0.1:0", DataDir: dir}); err == nil {
		b2.Close()
		t.Errorf("a second broker started on the data directory of a running one")
	}
	// 2. The CLI mistake: same -data and the same -listen. Start fails on
	// the taken port, after opening and closing every log.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var acked atomic.Int64
	for range 4 {
		rc := dial(t, a)
		wg.Go(func() {
			for !stop.Load() {
				if r := produceRecordsAt(t, rc, 8, "t", oneRecordBatch(t)); r.ErrorCode == errNone {
					acked.Add(1)
				}
			}
		})
	}
	for range 20 {
		if b2, err := Start(Config{Addr: a.Addr().String(), DataDir: dir}); err == nil {
			b2.Close()
		}
	}
	stop.Store(true)
	wg.Wait()
	a = restart(t, a)
	r := a.partition("t", 0).log.NewReader(0, replog.ReaderOptions{})
	n := int64(0)
	for {
		b, err := r.TryNext()
		if err != nil {
			t.Fatalf("after %d of %d acknowledged batches: %v", n, acked.Load(), err)
		}
		if b == nil {
			break
		}
		n++
	}
	if n != acked.Load() {
		t.Fatalf("read %d batches, %d acknowledged", n, acked.Load())
	}
}
