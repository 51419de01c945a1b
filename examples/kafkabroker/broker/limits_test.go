package broker

import (
	"encoding/binary"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	replog "github.com/replog/replog/log"
)

// fetchV4 builds a Fetch v4 body asking n times for partition 0 of topic
// from offset, with the given MinBytes and MaxWaitMillis.
func fetchV4(topic string, n int, offset int64, minBytes, maxWaitMs int32) []byte {
	be := binary.BigEndian
	b := be.AppendUint32(nil, 0xffffffff) // replica id -1
	b = be.AppendUint32(b, uint32(maxWaitMs))
	b = be.AppendUint32(b, uint32(minBytes))
	b = be.AppendUint32(b, 1<<20) // max bytes
	b = append(b, 0)              // isolation level
	b = be.AppendUint32(b, 1)     // one topic
	b = be.AppendUint16(b, uint16(len(topic)))
	b = append(b, topic...)
	b = be.AppendUint32(b, uint32(n))
	for range n {
		b = be.AppendUint32(b, 0)
		b = be.AppendUint64(b, uint64(offset))
		b = be.AppendUint32(b, 1<<20)
	}
	return b
}

// peakGoroutines samples the goroutine count until stop is closed.
func peakGoroutines(stop <-chan struct{}) <-chan int {
	out := make(chan int, 1)
	go func() {
		peak := 0
		for {
			peak = max(peak, runtime.NumGoroutine())
			select {
			case <-stop:
				out <- peak
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return out
}

func oneRecordBatch(t *testing.T) []byte {
	t.Helper()
	bb := replog.NewBatchBuilder()
	bb.Reset(replog.BatchOptions{})
	bb.Add(1_700_000_000_000, nil, []byte("v"))
	batch, err := bb.Build(nil)
	if err != nil {
		t.Fatal(err)
	}
	return batch
}

// A long-polled fetch naming one partition 100,000 times starts no
// goroutine per entry, and an append still ends its wait.
func TestLongPollOfManyEntries(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("t", 1); code != errNone {
		t.Fatal(code)
	}
	g0 := runtime.NumGoroutine()
	stop := make(chan struct{})
	peak := peakGoroutines(stop)
	rc := dial(t, b)
	rc.corr = 1
	rc.write(frame(1, 4, 1, fetchV4("t", 100_000, 0, 1, 60_000)))
	for b.fetchWaits.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // a poll's goroutines would have started
	p := b.partition("t", 0)
	if _, err := p.log.AppendAsLeader(oneRecordBatch(t), leaderEpoch); err != nil {
		t.Fatal(err)
	}
	p.advanceHighWatermark()
	body, err := rc.readResponse() // well before the minute of max wait
	if err != nil {
		t.Fatal(err)
	}
	close(stop)
	if got := <-peak; got > g0+50 {
		t.Errorf("%d goroutines while the fetch waited, %d before", got, g0)
	}
	resp := kmsg.NewPtrFetchResponse()
	resp.Version = 4
	if err := resp.ReadFrom(body); err != nil {
		t.Fatal(err)
	}
	if hw := resp.Topics[0].Partitions[0].HighWatermark; hw != 1 {
		t.Errorf("high watermark %d in the answer, want 1", hw)
	}
}

// An acks=-1 produce naming one partition 30,000 times fsyncs it from one
// goroutine, not one per entry, and answers every entry.
func TestAcksAllSyncsEachLogOnce(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("t", 1); code != errNone {
		t.Fatal(code)
	}
	batch := oneRecordBatch(t)
	req := kmsg.NewPtrProduceRequest()
	req.Version = 7
	req.Acks = -1
	req.TimeoutMillis = 30_000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = "t"
	for range 30_000 {
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Records = batch
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	g0 := runtime.NumGoroutine()
	stop := make(chan struct{})
	peak := peakGoroutines(stop)
	body := dial(t, b).request(req)
	close(stop)
	if got := <-peak; got > g0+50 {
		t.Errorf("%d goroutines during the produce, %d before", got, g0)
	}
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = req.Version
	if err := resp.ReadFrom(body); err != nil {
		t.Fatal(err)
	}
	parts := resp.Topics[0].Partitions
	if len(parts) != 30_000 || parts[29_999].ErrorCode != errNone || parts[29_999].BaseOffset != 29_999 {
		t.Errorf("%d answers, the last %+v", len(parts), parts[len(parts)-1])
	}
}

// A connection that sends nothing for IdleTimeout is closed.
func TestIdleConnectionClosed(t *testing.T) {
	b, err := Start(Config{Addr: "127.0.0.1:0", DataDir: t.TempDir(), IdleTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dial(t, b).expectClosed()
}

// A connection drops a response buffer of many MiB once the response is
// sent, and the fetch builder's copy of its headers.
func TestConnectionDropsLargeResponseBuffers(t *testing.T) {
	b := startBroker(t, t.TempDir())
	rc := dial(t, b)
	heap := func() int64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return int64(m.HeapInuse)
	}
	before := heap()
	rc.corr = 1
	rc.write(frame(1, 4, 1, fetchV4("nope", 1_200_000, 0, 0, 0))) // a 34 MiB answer
	if _, err := rc.readResponse(); err != nil {
		t.Fatal(err)
	}
	rc.r.Reset(rc.c) // forget the test's own buffered bytes
	// Goroutines of earlier tests may still be finishing (on a loaded
	// machine): look a few times before concluding the heap stays larger.
	kept := heap() - before
	for i := 0; i < 20 && kept > 8<<20; i++ {
		time.Sleep(50 * time.Millisecond)
		kept = heap() - before
	}
	if kept > 8<<20 {
		t.Errorf("heap %d MiB larger with the connection idle", kept>>20)
	}
}

// While a topic's thousands of logs are created, requests for other topics
// are answered: the broker's lock is not held meanwhile.
func TestCreateTopicLetsOtherRequestsThrough(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("other", 1); code != errNone {
		t.Fatal(code)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		if code := b.createTopic("big", 3000); code != errNone {
			t.Error(code)
		}
	})
	creating := func() bool {
		b.mu.RLock()
		defer b.mu.RUnlock()
		return b.creating["big"]
	}
	for !creating() {
		time.Sleep(time.Millisecond)
	}
	if code := b.createTopic("big", 1); code != errTopicAlreadyExists {
		t.Errorf("creating a topic being created: code %d", code)
	}
	if b.partition("other", 0) == nil || b.partition("big", 0) != nil {
		t.Error("lookups during the creation")
	}
	if !creating() {
		t.Skip("the creation ended before the checks; they prove nothing")
	}
}
