package broker

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	replog "github.com/replog/replog/log"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const (
	testPartitions = 8
	// testTimeout bounds every wait of a test on the broker: a bug shows as
	// a failure, not a hang. Nothing asserts how long anything took.
	testTimeout = 3 * time.Minute
)

// startBroker starts a broker on a free loopback port with dir as its data
// directory, and closes it when the test ends (Close is idempotent, so a
// test may close it earlier to restart).
func startBroker(t testing.TB, dir string) *Broker {
	t.Helper()
	b, err := Start(Config{
		Addr:       "127.0.0.1:0",
		DataDir:    dir,
		Partitions: testPartitions,
		// Small segments, so that reads cross segment boundaries.
		Log:    replog.Options{SegmentBytes: 4 << 20},
		Logger: testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if n := b.panics.Load(); n != 0 {
			t.Errorf("%d panics while serving connections", n)
		}
	})
	return b
}

// testLogger logs the broker's debug messages to stderr when BROKER_LOG is
// set, for debugging a test.
func testLogger() *slog.Logger {
	if os.Getenv("BROKER_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// restart closes b and starts a new broker on the same data directory.
func restart(t testing.TB, b *Broker) *Broker {
	t.Helper()
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return startBroker(t, b.cfg.DataDir)
}

func newClient(t testing.TB, b *Broker, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(b.Addr().String()),
		kgo.AllowAutoTopicCreation(),
		kgo.RetryTimeout(testTimeout),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// Record i of a test topic: partition i%8, then a deterministic key, value
// (somewhat compressible) and header, so that consumers can check every byte.
func testKey(i int) []byte { return []byte("key-" + strconv.Itoa(i)) }

func testValue(i int) []byte {
	v := fmt.Appendf(nil, "value %08d ", i)
	for len(v) < 120 {
		v = append(v, byte('a'+(i+len(v))%26))
	}
	return v
}

func testRecord(topic string, i int) *kgo.Record {
	return &kgo.Record{
		Topic:     topic,
		Partition: int32(i % testPartitions),
		Key:       testKey(i),
		Value:     testValue(i),
		Headers:   []kgo.RecordHeader{{Key: "i", Value: []byte(strconv.Itoa(i))}},
	}
}

// produce sends records 0..n-1 to topic and checks that partition p got
// records p, p+8, p+16... at offsets 0, 1, 2...
func produce(t testing.TB, cl *kgo.Client, topic string, n int) {
	t.Helper()
	rs := make([]*kgo.Record, n)
	for i := range rs {
		rs[i] = testRecord(topic, i)
	}
	if err := cl.ProduceSync(testContext(t), rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	for i, r := range rs {
		if want := int64(i / testPartitions); r.Offset != want {
			t.Fatalf("record %d: partition %d offset %d, want %d", i, r.Partition, r.Offset, want)
		}
	}
}

// checkRecord checks that r is test record i where its partition and
// offset say it must be.
func checkRecord(t testing.TB, r *kgo.Record) {
	t.Helper()
	i := int(r.Offset)*testPartitions + int(r.Partition)
	if !bytes.Equal(r.Key, testKey(i)) || !bytes.Equal(r.Value, testValue(i)) ||
		len(r.Headers) != 1 || r.Headers[0].Key != "i" || string(r.Headers[0].Value) != strconv.Itoa(i) {
		t.Fatalf("partition %d offset %d: got key %q value %q headers %v, want record %d",
			r.Partition, r.Offset, r.Key, r.Value, r.Headers, i)
	}
}

// consume polls cl until it has n records of topic, checking that each
// partition's records arrive in order, each exactly once, starting at
// from[p] (0 when from is nil), and that each is the expected record. It
// returns the next offset of each partition.
func consume(t testing.TB, cl *kgo.Client, topic string, n int, from map[int32]int64) map[int32]int64 {
	t.Helper()
	ctx := testContext(t)
	next := make(map[int32]int64)
	for p := range int32(testPartitions) {
		next[p] = from[p]
	}
	got := 0
	for got < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records: %v", got, n, err)
		}
		fs.EachError(func(topic string, p int32, err error) {
			t.Fatalf("fetch %s/%d: %v", topic, p, err)
		})
		fs.EachRecord(func(r *kgo.Record) {
			if r.Topic != topic {
				t.Fatalf("record of topic %q, want %q", r.Topic, topic)
			}
			if r.Offset != next[r.Partition] {
				t.Fatalf("partition %d: offset %d, want %d", r.Partition, r.Offset, next[r.Partition])
			}
			next[r.Partition]++
			checkRecord(t, r)
			got++
		})
	}
	if got != n {
		t.Fatalf("consumed %d records, want %d", got, n)
	}
	return next
}

// allFrom returns the kgo offsets of partitions 0..7 at from[p].
func allFrom(topic string, from map[int32]int64) map[string]map[int32]kgo.Offset {
	m := make(map[int32]kgo.Offset)
	for p := range int32(testPartitions) {
		m[p] = kgo.NewOffset().At(from[p])
	}
	return map[string]map[int32]kgo.Offset{topic: m}
}

// Large batches and fetches, so that 100,000 records take few requests.
var (
	producerOpts = []kgo.Opt{
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(50 * time.Millisecond),
		kgo.MaxBufferedRecords(200_000),
	}
	consumerOpts = []kgo.Opt{
		kgo.FetchMaxBytes(64 << 20),
		kgo.FetchMaxPartitionBytes(8 << 20),
	}
)

// TestCodecsRestart produces 100,000 records over 8 partitions with each
// codec and kgo's default idempotent producer (acks=all), restarts the
// broker, and consumes everything back twice: by partition from explicit
// offsets, and through a consumer group. Every record is checked byte for
// byte, in order, exactly once.
func TestCodecsRestart(t *testing.T) {
	const records = 100_000
	codecs := []struct {
		name  string
		codec kgo.CompressionCodec
	}{
		{"none", kgo.NoCompression()},
		{"gzip", kgo.GzipCompression()},
		{"snappy", kgo.SnappyCompression()},
		{"lz4", kgo.Lz4Compression()},
		{"zstd", kgo.ZstdCompression()},
	}
	for _, c := range codecs {
		t.Run("codec="+c.name, func(t *testing.T) {
			b := startBroker(t, t.TempDir())
			topic := "records-" + c.name
			prod := newClient(t, b, append(producerOpts, kgo.ProducerBatchCompression(c.codec))...)
			produce(t, prod, topic, records)
			prod.Close()
			checkStoredCodec(t, b, topic, c.name)

			b = restart(t, b)

			byPartition := newClient(t, b, append(consumerOpts, kgo.ConsumePartitions(allFrom(topic, nil)))...)
			consume(t, byPartition, topic, records, nil)
			byPartition.Close()

			group := newClient(t, b, append(consumerOpts,
				kgo.ConsumerGroup("group-"+c.name), kgo.ConsumeTopics(topic))...)
			consume(t, group, topic, records, nil)
			group.Close()
		})
	}
}

// checkStoredCodec checks that the batches in partition 0 of topic are
// stored as the client compressed them.
func checkStoredCodec(t *testing.T, b *Broker, topic, codec string) {
	t.Helper()
	ids := map[string]int8{"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
	buf, err := b.partition(topic, 0).log.Read(nil, 0, replog.ReadOptions{MaxBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	batch, _, err := replog.SplitBatch(buf)
	if err != nil {
		t.Fatal(err)
	}
	if batch.CodecID() != ids[codec] || batch.ProducerID() < 0 || batch.LeaderEpoch() != leaderEpoch {
		t.Fatalf("stored batch: codec %d producer id %d leader epoch %d, want codec %d, a producer id, epoch %d",
			batch.CodecID(), batch.ProducerID(), batch.LeaderEpoch(), ids[codec], leaderEpoch)
	}
}

// TestGroupResumesAfterRestart commits offsets from a group member, restarts
// the broker, and checks that a new member of the group starts exactly at
// the committed offsets and reads everything after them.
func TestGroupResumesAfterRestart(t *testing.T) {
	const records = 8_000
	b := startBroker(t, t.TempDir())
	topic, groupID := "resume", "resume-group"
	prod := newClient(t, b, producerOpts...)
	produce(t, prod, topic, records)
	prod.Close()

	// A member joins, consumes a little and commits chosen offsets.
	first := newClient(t, b, kgo.ConsumerGroup(groupID), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit())
	ctx := testContext(t)
	for polled := 0; polled == 0; {
		fs := first.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatal(err)
		}
		polled = fs.NumRecords()
	}
	committed := make(map[int32]int64)
	toCommit := make(map[string]map[int32]kgo.EpochOffset)
	toCommit[topic] = make(map[int32]kgo.EpochOffset)
	for p := range int32(testPartitions) {
		committed[p] = int64(100*p + 7)
		toCommit[topic][p] = kgo.EpochOffset{Epoch: -1, Offset: committed[p]}
	}
	var commitErr error
	first.CommitOffsetsSync(ctx, toCommit, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		commitErr = err
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 && commitErr == nil {
					commitErr = fmt.Errorf("commit %s/%d: error code %d", t.Topic, p.Partition, p.ErrorCode)
				}
			}
		}
	})
	if commitErr != nil {
		t.Fatal(commitErr)
	}
	first.Close()

	b = restart(t, b)

	second := newClient(t, b, kgo.ConsumerGroup(groupID), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit())
	remaining := 0
	for p := range int32(testPartitions) {
		remaining += records/testPartitions - int(committed[p])
	}
	next := consume(t, second, topic, remaining, committed)
	for p := range int32(testPartitions) {
		if next[p] != records/testPartitions {
			t.Errorf("partition %d: consumed up to %d, want %d", p, next[p], records/testPartitions)
		}
	}
}

// TestAcks produces with acks=0 (no responses at all) and acks=1 and reads
// every record back.
func TestAcks(t *testing.T) {
	const records = 2_000
	b := startBroker(t, t.TempDir())
	for _, acks := range []struct {
		name string
		acks kgo.Acks
	}{{"0", kgo.NoAck()}, {"1", kgo.LeaderAck()}} {
		t.Run("acks="+acks.name, func(t *testing.T) {
			topic := "acks-" + acks.name
			prod := newClient(t, b, append(producerOpts, kgo.RequiredAcks(acks.acks), kgo.DisableIdempotentWrite())...)
			rs := make([]*kgo.Record, records)
			for i := range rs {
				rs[i] = testRecord(topic, i)
			}
			if err := prod.ProduceSync(testContext(t), rs...).FirstErr(); err != nil {
				t.Fatal(err)
			}
			prod.Close()
			// With acks=0 the client learns nothing: the records are
			// checked by reading them back.
			cl := newClient(t, b, kgo.ConsumePartitions(allFrom(topic, nil)))
			consume(t, cl, topic, records, nil)
		})
	}
}

// TestListOffsets checks earliest, latest and by-timestamp lookups, also
// inside compressed batches, where the log's index answers a batch and the
// broker finds the record.
func TestListOffsets(t *testing.T) {
	const records = 1_000
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	b := startBroker(t, t.TempDir())
	for name, codec := range map[string]kgo.CompressionCodec{"none": kgo.NoCompression(), "zstd": kgo.ZstdCompression()} {
		topic := "timestamps-" + name
		prod := newClient(t, b, append(producerOpts, kgo.ProducerBatchCompression(codec))...)
		rs := make([]*kgo.Record, records)
		for i := range rs {
			rs[i] = testRecord(topic, i)
			rs[i].Partition = 0
			rs[i].Timestamp = base.Add(time.Duration(i) * time.Millisecond)
		}
		if err := prod.ProduceSync(testContext(t), rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			ts, offset, timestamp int64
		}{
			{-2, 0, -1},
			{-1, records, -1},
			{base.UnixMilli(), 0, base.UnixMilli()},
			{base.UnixMilli() + 537, 537, base.UnixMilli() + 537},
			{base.UnixMilli() + records, -1, -1}, // newer than every record
		}
		for _, tt := range tests {
			req := kmsg.NewPtrListOffsetsRequest()
			rt := kmsg.NewListOffsetsRequestTopic()
			rt.Topic = topic
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Timestamp = tt.ts
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
			resp, err := req.RequestWith(testContext(t), prod)
			if err != nil {
				t.Fatal(err)
			}
			got := resp.Topics[0].Partitions[0]
			if got.ErrorCode != 0 || got.Offset != tt.offset || got.Timestamp != tt.timestamp {
				t.Errorf("%s: timestamp %d: error %d offset %d timestamp %d, want offset %d timestamp %d",
					topic, tt.ts, got.ErrorCode, got.Offset, got.Timestamp, tt.offset, tt.timestamp)
			}
		}
		prod.Close()
	}
}
