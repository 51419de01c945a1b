package broker

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	replog "github.com/replog/replog/log"
)

// Answers that differed from Kafka's, found by a review against Kafka's
// ReplicaManager, KafkaApis and GroupCoordinator.

// tsBatch is a batch of n records stamped ts, ts+1, ...
func tsBatch(t *testing.T, ts int64, n int) []byte {
	t.Helper()
	bb := replog.NewBatchBuilder()
	bb.Reset(replog.BatchOptions{})
	for i := range n {
		bb.Add(ts+int64(i), nil, []byte("v"))
	}
	batch, err := bb.Build(nil)
	if err != nil {
		t.Fatal(err)
	}
	return batch
}

// listOffsetAt asks ListOffsets (version) for the first offset at or after
// ts in partition 0 of topic.
func listOffsetAt(t *testing.T, rc *rawConn, version int16, topic string, ts int64) kmsg.ListOffsetsResponseTopicPartition {
	t.Helper()
	req := kmsg.NewPtrListOffsetsRequest()
	req.Version = version
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Timestamp = ts
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp := kmsg.NewPtrListOffsetsResponse()
	resp.Version = version
	if err := resp.ReadFrom(rc.request(req)); err != nil {
		t.Fatal(err)
	}
	return resp.Topics[0].Partitions[0]
}

// commitOffset commits offset for partition 0 of topic in group, as member
// at generation gen, with OffsetCommit version.
func commitOffset(t *testing.T, rc *rawConn, version int16, group, member string, gen int32, topic string, offset int64) kmsg.OffsetCommitResponseTopicPartition {
	t.Helper()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Version = version
	req.Group, req.MemberID, req.Generation = group, member, gen
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset = 0, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp := kmsg.NewPtrOffsetCommitResponse()
	resp.Version = version
	if err := resp.ReadFrom(rc.request(req)); err != nil {
		t.Fatal(err)
	}
	return resp.Topics[0].Partitions[0]
}

// A fetch with MinBytes at the last batch of a segment waited out its
// whole max wait: a read returns one segment's batches, and the long poll
// waited for appends, though the next segments held plenty. Kafka's
// DelayedFetch completes a fetch of an older segment at once.
func TestFetchMinBytesEndsAtASegmentBoundary(t *testing.T) {
	b, err := Start(Config{Addr: "127.0.0.1:0", DataDir: t.TempDir(), Log: replog.Options{SegmentBytes: 64 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if code := b.createTopic("segs", 1); code != errNone {
		t.Fatal(code)
	}
	batch := bigBatch(t, 8<<10)
	for range 40 { // ~320 KiB over five or six 64 KiB segments
		appendCommitted(t, b, "segs", 0, batch)
	}
	// last is the last batch of the first segment: a read there gets one
	// batch (one segment per read), with ~30 more batches after it.
	l := b.partition("segs", 0).log
	last := int64(-1)
	for o := int64(0); o < 10; o++ {
		r, err := l.ReadRegion(o, replog.ReadOptions{MaxBytes: 1 << 20, UpToHighWatermark: true})
		if err != nil {
			t.Fatal(err)
		}
		if r.NextOffset == o+1 {
			last = o
			break
		}
	}
	if last < 0 {
		t.Fatal("setup: no segment boundary in the first 10 batches")
	}
	req := fetchRequest("segs", []int32{0}, 1<<20, 1<<20)
	req.Topics[0].Partitions[0].FetchOffset = last
	req.MinBytes = 64 << 10 // far less than the ~250 KiB ready after offset 7
	req.MaxWaitMillis = 8_000
	start := time.Now()
	p := fetch(t, dial(t, b), req).Topics[0].Partitions[0]
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("fetch at the last batch of a segment with MinBytes 64 KiB and %d KiB ready: answered after %v "+
			"(its whole max wait) with %d bytes; Kafka answers at once", (p.HighWatermark-last)*8, d.Round(time.Millisecond), len(p.RecordBatches))
	}
}

// Kafka answers a timestamp with no record at or after it with offset,
// timestamp and leader epoch -1 (KafkaApis, case None); the epoch was 0.
func TestListOffsetsNoneHasNoLeaderEpoch(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("none", 1); code != errNone {
		t.Fatal(code)
	}
	appendCommitted(t, b, "none", 0, tsBatch(t, 1_700_000_000_000, 5))
	p := listOffsetAt(t, dial(t, b), 5, "none", 1_800_000_000_000)
	if p.ErrorCode != 0 || p.Offset != -1 || p.Timestamp != -1 || p.LeaderEpoch != -1 {
		t.Errorf("timestamp newer than every record: error %d offset %d timestamp %d epoch %d; want 0 -1 -1 -1",
			p.ErrorCode, p.Offset, p.Timestamp, p.LeaderEpoch)
	}
}

// A group the broker does not know, with a generation >= 0, is
// ILLEGAL_GENERATION in Kafka (GroupCoordinator.handleCommitOffsets): a
// member committing right after a restart, since groups live in memory.
// It was UNKNOWN_MEMBER_ID.
func TestCommitToAnUnknownGroupIsAnIllegalGeneration(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("c", 1); code != errNone {
		t.Fatal(code)
	}
	p := commitOffset(t, dial(t, b), 7, "g-after-restart", "member-1", 3, "c", 5)
	if p.ErrorCode != errIllegalGeneration {
		t.Errorf("commit to an unknown group at generation 3: error %d, want ILLEGAL_GENERATION (%d)", p.ErrorCode, errIllegalGeneration)
	}
}

// Kafka takes a generation -1 commit on an empty group whatever the member
// id (GroupCoordinator.validateOffsetCommit); it was UNKNOWN_MEMBER_ID.
func TestSimpleCommitWithAMemberID(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("c", 1); code != errNone {
		t.Fatal(code)
	}
	p := commitOffset(t, dial(t, b), 7, "simple", "old-member", -1, "c", 5)
	if p.ErrorCode != errNone {
		t.Errorf("generation -1 commit with a member id to an empty group: error %d, want 0", p.ErrorCode)
	}
}
