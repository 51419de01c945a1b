package broker

import (
	"bytes"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	replog "github.com/replog/replog/log"
)

// bigBatch returns an uncompressed batch of one record whose value is
// valueLen bytes.
func bigBatch(t *testing.T, valueLen int) []byte {
	t.Helper()
	bb := replog.NewBatchBuilder()
	bb.Reset(replog.BatchOptions{})
	bb.Add(1_700_000_000_000, nil, bytes.Repeat([]byte{'x'}, valueLen))
	batch, err := bb.Build(nil)
	if err != nil {
		t.Fatal(err)
	}
	return batch
}

// appendCommitted appends batch to topic/p as a produce does.
func appendCommitted(t *testing.T, b *Broker, topic string, p int32, batch []byte) {
	t.Helper()
	part := b.partition(topic, p)
	if _, err := part.log.AppendAsLeader(bytes.Clone(batch), leaderEpoch); err != nil {
		t.Fatal(err)
	}
	part.advanceHighWatermark()
}

// fetchRequest is a Fetch v11 for partitions ps of topic from offset 0,
// with MinBytes 1 and no wait.
func fetchRequest(topic string, ps []int32, maxBytes, partMaxBytes int32) *kmsg.FetchRequest {
	req := kmsg.NewPtrFetchRequest()
	req.Version = 11
	req.MaxBytes = maxBytes
	req.MinBytes = 1
	req.MaxWaitMillis = 0
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic = topic
	for _, p := range ps {
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.Partition = p
		fp.PartitionMaxBytes = partMaxBytes
		ft.Partitions = append(ft.Partitions, fp)
	}
	req.Topics = append(req.Topics, ft)
	return req
}

// fetch sends req on rc and returns the decoded response.
func fetch(t *testing.T, rc *rawConn, req *kmsg.FetchRequest) *kmsg.FetchResponse {
	t.Helper()
	resp := kmsg.NewPtrFetchResponse()
	resp.Version = req.Version
	if err := resp.ReadFrom(rc.request(req)); err != nil {
		t.Error(err)
	}
	return resp
}

// fetchFromZero fetches partitions ps of topic from offset 0 on rc.
func fetchFromZero(t *testing.T, rc *rawConn, topic string, ps []int32, maxBytes, partMaxBytes int32) *kmsg.FetchResponse {
	t.Helper()
	return fetch(t, rc, fetchRequest(topic, ps, maxBytes, partMaxBytes))
}

// TestFetchMaxBytesBoundsLaterPartitions: only the first batch of the first
// non-empty partition may exceed the fetch's MaxBytes (KIP-74, and the
// comment on readFetch). A second partition whose next batch does not fit
// in what is left must not add that batch.
func TestFetchMaxBytesBoundsLaterPartitions(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("maxbytes", 2); code != errNone {
		t.Fatal(code)
	}
	batch := bigBatch(t, 10_000)
	appendCommitted(t, b, "maxbytes", 0, batch)
	appendCommitted(t, b, "maxbytes", 1, batch)

	const maxBytes = 15_000 // room for the first batch and 5 KB more
	resp := fetchFromZero(t, dial(t, b), "maxbytes", []int32{0, 1}, maxBytes, 1<<20)
	parts := resp.Topics[0].Partitions
	p0, p1 := len(parts[0].RecordBatches), len(parts[1].RecordBatches)
	if p0 != len(batch) {
		t.Fatalf("partition 0: %d record bytes, want its whole first batch (%d)", p0, len(batch))
	}
	if p0+p1 > maxBytes {
		t.Errorf("fetch MaxBytes %d: response holds %d record bytes (partition 0: %d, partition 1: %d); "+
			"only the first partition's first batch may exceed the limit", maxBytes, p0+p1, p0, p1)
	}
}

// TestFetchPartitionMaxBytesBoundsLaterPartitions: a partition other than the
// first non-empty one must respect its PartitionMaxBytes.
func TestFetchPartitionMaxBytesBoundsLaterPartitions(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("partbytes", 2); code != errNone {
		t.Fatal(code)
	}
	batch := bigBatch(t, 10_000)
	appendCommitted(t, b, "partbytes", 0, batch)
	appendCommitted(t, b, "partbytes", 1, batch)

	const partMax = 100
	resp := fetchFromZero(t, dial(t, b), "partbytes", []int32{0, 1}, 1<<20, partMax)
	parts := resp.Topics[0].Partitions
	if got := len(parts[1].RecordBatches); got > partMax {
		t.Errorf("partition 1 (not the first non-empty one) with PartitionMaxBytes %d: %d record bytes returned", partMax, got)
	}
}

// TestFetchEpochErrorReportsNoOffsets: a partition answered with a leader
// epoch error reports high watermark and log start -1, as Kafka does, not
// 0 (an offset a client could take as real).
func TestFetchEpochErrorReportsNoOffsets(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("epochs", 1); code != errNone {
		t.Fatal(code)
	}
	appendCommitted(t, b, "epochs", 0, bigBatch(t, 10))
	req := fetchRequest("epochs", []int32{0}, 1<<20, 1<<20)
	req.Topics[0].Partitions[0].CurrentLeaderEpoch = leaderEpoch + 1
	p := fetch(t, dial(t, b), req).Topics[0].Partitions[0]
	if p.ErrorCode != errUnknownLeaderEpoch || p.HighWatermark != -1 || p.LogStartOffset != -1 {
		t.Errorf("error %d, high watermark %d, log start %d; want %d, -1, -1", p.ErrorCode, p.HighWatermark, p.LogStartOffset, errUnknownLeaderEpoch)
	}
}

// TestFetchLongPollBoundedByMaxFetchWait: a fetch asking to wait a day for
// records that never come is answered, empty, after Config.MaxFetchWait.
func TestFetchLongPollBoundedByMaxFetchWait(t *testing.T) {
	b, err := Start(Config{Addr: "127.0.0.1:0", DataDir: t.TempDir(), MaxFetchWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if code := b.createTopic("idle", 1); code != errNone {
		t.Fatal(code)
	}
	req := fetchRequest("idle", []int32{0}, 1<<20, 1<<20)
	req.MaxWaitMillis = 24 * 3600 * 1000
	rc := dial(t, b)
	done := make(chan *kmsg.FetchResponse, 1)
	go func() { done <- fetch(t, rc, req) }()
	select {
	case resp := <-done:
		if p := resp.Topics[0].Partitions[0]; p.ErrorCode != errNone || len(p.RecordBatches) != 0 {
			t.Errorf("error %d, %d record bytes; want an empty answer", p.ErrorCode, len(p.RecordBatches))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a day's long poll was still held after 20 s (MaxFetchWait 100 ms)")
	}
}
