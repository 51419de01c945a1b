package broker

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/replog/replog/compression"
	replog "github.com/replog/replog/log"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// initProducerID asks for a producer id on rc.
func initProducerID(t *testing.T, rc *rawConn) int64 {
	t.Helper()
	req := kmsg.NewPtrInitProducerIDRequest()
	req.Version = 1
	resp := kmsg.NewPtrInitProducerIDResponse()
	resp.Version = 1
	if err := resp.ReadFrom(rc.request(req)); err != nil {
		t.Fatal(err)
	}
	if resp.ErrorCode != 0 || resp.ProducerEpoch != 0 {
		t.Fatalf("InitProducerId: error %d epoch %d", resp.ErrorCode, resp.ProducerEpoch)
	}
	return resp.ProducerID
}

// produceBatch sends one idempotent batch of n records to topic/0 and
// returns the partition's answer.
func produceBatch(t *testing.T, rc *rawConn, topic string, pid int64, seq int32, n int) kmsg.ProduceResponseTopicPartition {
	t.Helper()
	bb := replog.NewBatchBuilder()
	bb.Reset(replog.BatchOptions{Idempotent: true, ProducerID: pid, ProducerEpoch: 0, BaseSequence: seq})
	for i := range n {
		bb.Add(1_700_000_000_000, nil, testValue(int(seq)+i))
	}
	batch, err := bb.Build(nil)
	if err != nil {
		t.Fatal(err)
	}
	return produceRecords(t, rc, topic, batch)
}

// produceRecords sends records to topic/0 with acks=-1 at Produce v8 and
// returns the partition's answer.
func produceRecords(t *testing.T, rc *rawConn, topic string, records []byte) kmsg.ProduceResponseTopicPartition {
	t.Helper()
	return produceRecordsAt(t, rc, 8, topic, records)
}

// produceRecordsAt is produceRecords at Produce version v.
func produceRecordsAt(t *testing.T, rc *rawConn, v int16, topic string, records []byte) kmsg.ProduceResponseTopicPartition {
	t.Helper()
	req := kmsg.NewPtrProduceRequest()
	req.Version = v
	req.Acks = -1
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = records
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = v
	if err := resp.ReadFrom(rc.request(req)); err != nil {
		t.Fatal(err)
	}
	return resp.Topics[0].Partitions[0]
}

// TestProduceRecordsChecks: Kafka's ProduceRequest.validateRecords
// refuses, from Produce v3 on, a partition with no whole record batch, a
// batch of magic 0 or 1, or more than one batch, with INVALID_RECORD,
// which a client does not retry; zstd before Produce v7 with
// UNSUPPORTED_COMPRESSION_TYPE; and a batch length or magic no batch can
// have with CORRUPT_MESSAGE (its batch iterator's checks). The broker
// answered the first two with CORRUPT_MESSAGE, which clients retry until
// they time out, and stored the other two. None of them may append
// anything; a batch followed by bytes that are not a whole batch is
// stored, without them, as Kafka trims them.
func TestProduceRecordsChecks(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("checks", 1); code != errNone {
		t.Fatal(code)
	}
	rc := dial(t, b)
	good := bigBatch(t, 20)
	withMagic := func(m byte) []byte {
		c := bytes.Clone(good)
		c[16] = m
		return c
	}
	shortLength := bytes.Clone(good)
	binary.BigEndian.PutUint32(shortLength[8:], 13)
	zc, err := replog.CompressWith(nil, compression.Zstd, 0)
	if err != nil {
		t.Fatal(err)
	}
	bb := replog.NewBatchBuilder()
	bb.Reset(replog.BatchOptions{Compressor: zc})
	bb.Add(time.Now().UnixMilli(), nil, []byte("zstd"))
	zstdBatch, err := bb.Build(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		version int16
		records []byte
		want    int16
	}{
		{"no batch", 8, []byte{}, errInvalidRecord},
		{"5 bytes", 8, good[:5], errInvalidRecord},
		{"20 bytes of a batch", 8, good[:20], errInvalidRecord},
		{"all but a batch's last byte", 8, good[:len(good)-1], errInvalidRecord},
		{"magic 1", 8, withMagic(1), errInvalidRecord},
		{"magic 3", 8, withMagic(3), errCorruptMessage},
		{"length 13", 8, shortLength, errCorruptMessage},
		{"two batches", 8, append(bytes.Clone(good), good...), errInvalidRecord},
		{"a batch, then one of magic 3", 8, append(bytes.Clone(good), withMagic(3)...), errCorruptMessage},
		{"zstd at Produce v6", 6, zstdBatch, errUnsupportedCompressionType},
		{"zstd then a second batch at Produce v6", 6, append(bytes.Clone(zstdBatch), good...), errUnsupportedCompressionType},
	} {
		got := produceRecordsAt(t, rc, tc.version, "checks", tc.records).ErrorCode
		if got != tc.want {
			t.Errorf("%s: error %d, want %d", tc.name, got, tc.want)
		}
		if end := b.partition("checks", 0).log.LogEndOffset(); end != 0 {
			t.Fatalf("%s: the log end moved to %d", tc.name, end)
		}
	}
	if got := produceRecordsAt(t, rc, 7, "checks", zstdBatch).ErrorCode; got != errNone {
		t.Errorf("zstd at Produce v7: error %d", got)
	}
	l := b.partition("checks", 0).log
	end := l.LogEndOffset()
	if got := produceRecordsAt(t, rc, 8, "checks", append(bytes.Clone(good), good[:30]...)).ErrorCode; got != errNone {
		t.Fatalf("a batch and 30 bytes of another: error %d, want 0 (Kafka stores the batch)", got)
	}
	stored, err := l.Read(nil, end, replog.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != len(good) {
		t.Errorf("a batch and 30 bytes of another stored %d bytes, want the batch's %d", len(stored), len(good))
	}
}

// TestIdempotentProducer checks that a retried batch is acknowledged with
// its original offset and not stored twice, that a sequence gap is refused,
// and that producer ids are never handed out twice, across restarts too.
func TestIdempotentProducer(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("idem", 1); code != errNone {
		t.Fatalf("create topic: error %d", code)
	}
	rc := dial(t, b)
	pid := initProducerID(t, rc)

	steps := []struct {
		name       string
		seq        int32
		n          int
		errCode    int16
		baseOffset int64
	}{
		{"first batch", 0, 5, errNone, 0},
		{"second batch", 5, 3, errNone, 5},
		{"retry of the first", 0, 5, errNone, 0},
		{"retry of the second", 5, 3, errNone, 5},
		{"sequence gap", 10, 1, errOutOfOrderSequence, -1},
		{"next batch", 8, 2, errNone, 8},
	}
	for _, s := range steps {
		got := produceBatch(t, rc, "idem", pid, s.seq, s.n)
		if got.ErrorCode != s.errCode || got.BaseOffset != s.baseOffset {
			t.Errorf("%s: error %d base offset %d, want error %d base offset %d",
				s.name, got.ErrorCode, got.BaseOffset, s.errCode, s.baseOffset)
		}
	}
	if end := b.partition("idem", 0).log.LogEndOffset(); end != 10 {
		t.Errorf("log end offset %d, want 10: retries were stored again", end)
	}

	seen := map[int64]bool{pid: true}
	for range 3 {
		b = restart(t, b)
		rc = dial(t, b)
		id := initProducerID(t, rc)
		if seen[id] {
			t.Fatalf("producer id %d handed out twice", id)
		}
		seen[id] = true
		// A new producer starts at sequence 0 on the same partition.
		if got := produceBatch(t, rc, "idem", id, 0, 1); got.ErrorCode != errNone {
			t.Fatalf("new producer %d: error %d", id, got.ErrorCode)
		}
	}
}

// TestCreateTopics checks CreateTopics and its errors.
func TestCreateTopics(t *testing.T) {
	b := startBroker(t, t.TempDir())
	rc := dial(t, b)
	create := func(name string, partitions int32, validateOnly bool) int16 {
		req := kmsg.NewPtrCreateTopicsRequest()
		req.Version = 4
		req.ValidateOnly = validateOnly
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, partitions, -1
		req.Topics = append(req.Topics, rt)
		resp := kmsg.NewPtrCreateTopicsResponse()
		resp.Version = 4
		if err := resp.ReadFrom(rc.request(req)); err != nil {
			t.Fatal(err)
		}
		return resp.Topics[0].ErrorCode
	}
	tests := []struct {
		name         string
		partitions   int32
		validateOnly bool
		want         int16
	}{
		{"checked", 3, true, errNone},
		{"made", 3, false, errNone},
		{"made", 3, false, errTopicAlreadyExists},
		{"default-count", -1, false, errNone},
		{"../escape", 1, false, errInvalidTopic},
		{"zero", 0, false, errInvalidPartitions},
	}
	for _, tt := range tests {
		if got := create(tt.name, tt.partitions, tt.validateOnly); got != tt.want {
			t.Errorf("create %q (%d partitions, validate only %v): error %d, want %d",
				tt.name, tt.partitions, tt.validateOnly, got, tt.want)
		}
	}
	for topic, want := range map[string]int{"checked": 0, "made": 3, "default-count": testPartitions} {
		if got := len(b.partitions(topic)); got != want {
			t.Errorf("topic %q has %d partitions, want %d", topic, got, want)
		}
	}
}

// TestProduceRefusesControlBatches: Kafka's LogValidator refuses control
// batches (transaction markers) from clients with INVALID_RECORD ("Clients
// are not allowed to write control records"). The broker stores them: any
// client can then write a commit/abort marker into a partition, and a
// marker with a higher producer epoch fences an idempotent producer that
// never used transactions.
func TestProduceRefusesControlBatches(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("ctl", 1); code != errNone {
		t.Fatal(code)
	}
	rc := dial(t, b)
	pid := initProducerID(t, rc)
	if got := produceBatch(t, rc, "ctl", pid, 0, 1); got.ErrorCode != errNone {
		t.Fatalf("first batch: error %d", got.ErrorCode)
	}

	// An ABORT marker for pid at epoch 7, from another client.
	const attrTransactional, attrControl = 0x10, 0x20
	bb := replog.NewBatchBuilder()
	bb.Reset(replog.BatchOptions{Idempotent: true, ProducerID: pid, ProducerEpoch: 7, BaseSequence: replog.NoSequence, Attributes: attrTransactional | attrControl})
	bb.Add(1_700_000_000_000, []byte{0, 0, 0, 0}, []byte{0, 0, 0, 0, 0, 0})
	marker, err := bb.Build(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := produceRecords(t, dial(t, b), "ctl", marker).ErrorCode; got != errInvalidRecord {
		t.Errorf("control batch from a client: error %d, want %d (INVALID_RECORD); log end offset now %d",
			got, errInvalidRecord, b.partition("ctl", 0).log.LogEndOffset())
	}
	// The idempotent producer goes on at epoch 0.
	if got := produceBatch(t, rc, "ctl", pid, 1, 1); got.ErrorCode != errNone {
		t.Errorf("idempotent producer's next batch after the forged marker: error %d, want 0", got.ErrorCode)
	}
}

// TestProduceRefusesTransactionalBatches: a batch marked transactional in
// a request without a transactional id was stored, opening a transaction
// that no marker would ever end, though the broker refuses transactional
// producers (Kafka refuses such a request too).
func TestProduceRefusesTransactionalBatches(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("txn", 1); code != errNone {
		t.Fatal(code)
	}
	rc := dial(t, b)
	pid := initProducerID(t, rc)
	const attrTransactional = 0x10
	bb := replog.NewBatchBuilder()
	bb.Reset(replog.BatchOptions{Idempotent: true, ProducerID: pid, ProducerEpoch: 0, BaseSequence: 0, Attributes: attrTransactional})
	bb.Add(1_700_000_000_000, nil, []byte("v"))
	batch, err := bb.Build(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := produceRecords(t, rc, "txn", batch); got.ErrorCode != errInvalidRecord {
		t.Errorf("transactional batch: error %d, want %d (INVALID_RECORD); log end offset now %d",
			got.ErrorCode, errInvalidRecord, b.partition("txn", 0).log.LogEndOffset())
	}
}

// The edges of Kafka's nextBatchSize that TestProduceRecordsChecks does
// not reach: a negative magic is CORRUPT_MESSAGE (Kafka: magic < 0 ||
// magic > 2 throws); after a whole batch, 12 bytes claiming the minimum
// length 14 (RECORD_OVERHEAD_V0, not corrupt) and exactly 16 bytes (one
// short of the magic: too little to tell) are not a batch, and the first
// batch is stored.
func TestProduceFramingBoundaries(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("edges", 1); code != errNone {
		t.Fatal(code)
	}
	rc := dial(t, b)
	good := bigBatch(t, 20)
	l := b.partition("edges", 0).log

	negMagic := bytes.Clone(good)
	negMagic[16] = 0xff // -1
	if got := produceRecordsAt(t, rc, 8, "edges", negMagic).ErrorCode; got != errCorruptMessage {
		t.Errorf("magic -1: error %d, want %d (CORRUPT_MESSAGE)", got, errCorruptMessage)
	}
	if end := l.LogEndOffset(); end != 0 {
		t.Fatalf("magic -1: the log end moved to %d", end)
	}

	minLength := make([]byte, 12)
	binary.BigEndian.PutUint32(minLength[8:], 14)
	for _, tc := range []struct {
		name string
		tail []byte
	}{
		{"12 bytes claiming length 14", minLength},
		{"16 bytes of a batch", good[:16]},
	} {
		end := l.LogEndOffset()
		if got := produceRecordsAt(t, rc, 8, "edges", append(bytes.Clone(good), tc.tail...)).ErrorCode; got != errNone {
			t.Errorf("a batch, then %s: error %d, want 0 (Kafka stores the batch)", tc.name, got)
			continue
		}
		stored, err := l.Read(nil, end, replog.ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(stored) != len(good) {
			t.Errorf("a batch, then %s: stored %d bytes, want the batch's %d", tc.name, len(stored), len(good))
		}
	}
}
