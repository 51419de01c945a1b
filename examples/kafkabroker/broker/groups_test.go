package broker

import (
	"context"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// owner tracks the partitions a group member owns, from kgo's callbacks.
type owner struct {
	mu      sync.Mutex
	owned   map[int32]bool
	changed chan struct{} // signalled after every change
}

func newOwner() *owner {
	return &owner{owned: make(map[int32]bool), changed: make(chan struct{}, 1)}
}

func (o *owner) update(ps map[string][]int32, own bool) {
	o.mu.Lock()
	for _, p := range ps["rebalance"] {
		if own {
			o.owned[p] = true
		} else {
			delete(o.owned, p)
		}
	}
	o.mu.Unlock()
	select {
	case o.changed <- struct{}{}:
	default:
	}
}

func (o *owner) partitions() []int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Sorted(maps.Keys(o.owned))
}

func (o *owner) opts() []kgo.Opt {
	return []kgo.Opt{
		kgo.ConsumerGroup("rebalance-group"),
		kgo.ConsumeTopics("rebalance"),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) { o.update(ps, true) }),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) { o.update(ps, false) }),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) { o.update(ps, false) }),
	}
}

// poll keeps a client polling (group callbacks need it) until the test ends.
func poll(t *testing.T, cl *kgo.Client) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil && !cl.PollFetches(ctx).IsClientClosed() {
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// waitFor waits until cond holds, re-checking it after each ownership change.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool, owners ...*owner) {
	t.Helper()
	cases := make([]chan struct{}, len(owners))
	for i, o := range owners {
		cases[i] = o.changed
	}
	for !cond() {
		select {
		case <-cases[0]:
		case <-cases[min(1, len(cases)-1)]:
		case <-ctx.Done():
			t.Fatalf("waiting until %s: %v", what, ctx.Err())
		}
	}
}

// TestGroupRebalance runs the coordinator through joins and a leave: one
// member gets every partition; a second member joining splits them between
// the two; after it leaves, the first owns them all again.
func TestGroupRebalance(t *testing.T) {
	b := startBroker(t, t.TempDir())
	ctx := testContext(t)
	prod := newClient(t, b, producerOpts...)
	produce(t, prod, "rebalance", 80)

	all := []int32{0, 1, 2, 3, 4, 5, 6, 7}
	a, bo := newOwner(), newOwner()
	clA := newClient(t, b, a.opts()...)
	poll(t, clA)
	waitFor(t, ctx, "the first member owns every partition", func() bool {
		return slices.Equal(a.partitions(), all)
	}, a)

	clB := newClient(t, b, bo.opts()...)
	poll(t, clB)
	waitFor(t, ctx, "two members split the partitions", func() bool {
		pa, pb := a.partitions(), bo.partitions()
		return len(pa) > 0 && len(pb) > 0 && slices.Equal(slices.Sorted(slices.Values(append(pa, pb...))), all)
	}, a, bo)

	clB.Close() // leaves the group
	waitFor(t, ctx, "the first member owns every partition again", func() bool {
		return slices.Equal(a.partitions(), all)
	}, a)
}

// joinFrame returns a JoinGroup v5 frame for group.
func joinFrame(corr int32, group, memberID string) []byte {
	req := kmsg.NewPtrJoinGroupRequest()
	req.Version = 5
	req.Group, req.MemberID, req.ProtocolType = group, memberID, "consumer"
	req.SessionTimeoutMillis, req.RebalanceTimeoutMillis = 10_000, 120_000
	req.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: []byte{0, 1}}}
	return frame(req.Key(), req.Version, corr, req.AppendTo(nil))
}

// TestCloseEndsAWaitingJoin (passing): Close returns while a JoinGroup
// waits in a rebalance, and leaves no goroutine behind.
func TestCloseEndsAWaitingJoin(t *testing.T) {
	g0 := runtime.NumGoroutine()
	dir := t.TempDir()
	b, err := Start(Config{Addr: "127.0.0.1:0", DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	a := dial(t, b)
	a.corr = 1
	a.write(joinFrame(1, "g", ""))
	body, err := a.readResponse()
	if err != nil {
		t.Fatal(err)
	}
	jr := kmsg.NewPtrJoinGroupResponse()
	jr.Version = 5
	if err := jr.ReadFrom(body); err != nil || jr.ErrorCode != 0 {
		t.Fatalf("join: %v, error %d", err, jr.ErrorCode)
	}
	// A second member: its join waits for the first to rejoin.
	second := dial(t, b)
	second.write(joinFrame(1, "g", ""))
	for {
		b.coord.mu.Lock()
		state := b.coord.groups["g"].state
		b.coord.mu.Unlock()
		if state == groupPreparingRebalance {
			break
		}
		time.Sleep(time.Millisecond)
	}
	done := make(chan error, 1)
	go func() { done <- b.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return while a join waited")
	}
	second.expectClosed()
	a.c.Close()
	second.c.Close()
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > g0+2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after Close, %d before Start", runtime.NumGoroutine(), g0)
		}
	}
}

// TestEmptyGroupCommitsAndFetchesOffsets: Kafka accepts the empty group
// id in OffsetCommit and OffsetFetch, for backwards compatibility (its
// group coordinator refuses only a null one there; JoinGroup and the other
// membership requests refuse an empty one), so a client that commits
// offsets without a group gets them back.
func TestEmptyGroupCommitsAndFetchesOffsets(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("t", 1); code != errNone {
		t.Fatal(code)
	}
	c := dial(t, b)
	if p := commitOffset(t, c, 2, "", "", -1, "t", 10); p.ErrorCode != errNone {
		t.Fatalf("commit: error %d", p.ErrorCode)
	}
	for _, version := range []int16{1, 5} {
		req := kmsg.NewPtrOffsetFetchRequest()
		req.Version = version
		rt := kmsg.NewOffsetFetchRequestTopic()
		rt.Topic, rt.Partitions = "t", []int32{0}
		req.Topics = append(req.Topics, rt)
		resp := kmsg.NewPtrOffsetFetchResponse()
		resp.Version = req.Version
		if err := resp.ReadFrom(c.request(req)); err != nil {
			t.Fatal(err)
		}
		if resp.ErrorCode != errNone || len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			t.Fatalf("v%d: error %d, answer %+v", version, resp.ErrorCode, resp.Topics)
		}
		if p := resp.Topics[0].Partitions[0]; p.ErrorCode != errNone || p.Offset != 10 {
			t.Errorf("v%d: error %d, offset %d; want 0, 10", version, p.ErrorCode, p.Offset)
		}
	}
}

// bigOffsetCommit is an OffsetCommit of group g outside any generation
// that names partition c/0 n times (the bytes of n partitions, without
// creating them), with offsets 1..n and the largest metadata allowed.
func bigOffsetCommit(n int) *kmsg.OffsetCommitRequest {
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Version = 7
	req.Group = "g"
	req.Generation = -1
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = "c"
	md := strings.Repeat("m", maxCommitMetadata)
	for i := range n {
		p := kmsg.NewOffsetCommitRequestTopicPartition()
		p.Offset = int64(i + 1)
		p.Metadata = &md
		rt.Partitions = append(rt.Partitions, p)
	}
	req.Topics = append(req.Topics, rt)
	return req
}

// TestOffsetCommitLargerThanABatch: a commit whose records do not fit one
// batch of the offsets log (8 MiB: here 2,100 partitions with the largest
// metadata allowed) is stored in several. It used to fail with
// KAFKA_STORAGE_ERROR, which clients retry forever. (The test names one
// partition 2,100 times, which takes the same bytes, to stay fast.)
func TestOffsetCommitLargerThanABatch(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("c", 1); code != errNone {
		t.Fatal(code)
	}
	rc := dial(t, b)
	req := bigOffsetCommit(2100)
	resp := kmsg.NewPtrOffsetCommitResponse()
	resp.Version = req.Version
	if err := resp.ReadFrom(rc.request(req)); err != nil {
		t.Fatal(err)
	}
	if code := resp.Topics[0].Partitions[0].ErrorCode; code != errNone {
		t.Fatalf("OffsetCommit of %d partitions with %d-byte metadata: error %d", len(req.Topics[0].Partitions), maxCommitMetadata, code)
	}
	if v, ok := b.coord.offsets.get("g", topicPartition{"c", 0}); !ok || v.offset != 2100 {
		t.Errorf("committed offset %+v (found %v), want 2100, the last in the request", v, ok)
	}
}

// TestOffsetCommitLargerThanASegment: a commit whose records exceed what
// one append to the offsets log takes (its 64 MiB segment), within the
// 100 MiB request limit, is refused with INVALID_COMMIT_OFFSET_SIZE, as
// Kafka refuses an offsets batch over its limit; it got
// KAFKA_STORAGE_ERROR, which clients retry forever.
func TestOffsetCommitLargerThanASegment(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("c", 1); code != errNone {
		t.Fatal(code)
	}
	req := bigOffsetCommit(17000) // about 70 MB of records
	resp := b.coord.commit(req).(*kmsg.OffsetCommitResponse)
	if code := resp.Topics[0].Partitions[0].ErrorCode; code != errInvalidCommitOffsetSize {
		t.Fatalf("OffsetCommit of %d partitions with %d-byte metadata: error %d, want %d", len(req.Topics[0].Partitions), maxCommitMetadata, code, errInvalidCommitOffsetSize)
	}
	if _, ok := b.coord.offsets.get("g", topicPartition{"c", 0}); ok {
		t.Error("a refused commit stored an offset")
	}
}
