package replication

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/log"
)

// collectSink rebuilds a response from what a fetchSink receives, and
// checks that every piece of records holds whole batches unless it is
// the partition's last.
type collectSink struct {
	resp   FetchResponse
	pieces int
	open   bool
	err    error
}

func (c *collectSink) beginPartition(i int, pr *FetchPartitionResponse) {
	if c.open || i != len(c.resp.Partitions) {
		c.err = fmt.Errorf("beginPartition(%d) out of order", i)
	}
	p := *pr
	p.Records = nil // they come through records
	c.resp.Partitions = append(c.resp.Partitions, p)
	c.open = true
}

func (c *collectSink) records(b []byte) {
	if !c.open {
		c.err = errors.New("records outside a partition")
		return
	}
	if len(b) == 0 {
		return
	}
	c.pieces++
	p := &c.resp.Partitions[len(c.resp.Partitions)-1]
	p.Records = append(p.Records, b...)
}

func (c *collectSink) endPartition() {
	if !c.open {
		c.err = errors.New("endPartition outside a partition")
	}
	c.open = false
}

// pieceReader returns at most n bytes per Read.
type pieceReader struct {
	r io.Reader
	n int
}

func (p pieceReader) Read(b []byte) (int, error) { return p.r.Read(b[:min(len(b), p.n)]) }

// streamDecode decodes body as fetchStream does, from a reader that
// delivers piece bytes at a time.
func streamDecode(t testing.TB, body []byte, piece int) (*collectSink, error) {
	s := startBodyStream(pieceReader{bytes.NewReader(body), piece}, make([]byte, len(body)))
	sink := &collectSink{}
	err := streamFetchResponse(s, sink)
	<-s.done
	require.NoError(t, sink.err)
	return sink, err
}

// batchesResponse is a response of two partitions holding n batches each.
func batchesResponse(t testing.TB, n int) *FetchResponse {
	var a, b []byte
	for i := range n {
		a = append(a, batchOfValues(t, []string{fmt.Sprintf("a%d-%0200d", i, i)})...)
		b = append(b, batchOfValues(t, []string{fmt.Sprintf("b%d", i)})...)
	}
	return &FetchResponse{Partitions: []FetchPartitionResponse{
		{TopicPartition: TopicPartition{Topic: "t", Partition: 0}, HighWatermark: 3, LogEndOffset: 9, Records: a},
		{TopicPartition: TopicPartition{Topic: "t", Partition: 1}, Error: CodeNotLeader, HighWatermark: -1},
		{TopicPartition: TopicPartition{Topic: "u", Partition: 2}, HighWatermark: 1, Records: b},
	}}
}

func TestStreamFetchResponseMatchesDecode(t *testing.T) {
	for _, resp := range []*FetchResponse{sampleResponse(), batchesResponse(t, 50), {}} {
		frame, err := appendFetchResponseFrame(nil, 1, resp)
		require.NoError(t, err)
		body := frame[frameHeaderSize:]
		want, err := decodeFetchResponse(body)
		require.NoError(t, err)
		for _, piece := range []int{1, 7, 100, 4096, len(body) + 1} {
			sink, err := streamDecode(t, body, piece)
			require.NoError(t, err, "piece %d", piece)
			if len(want.Partitions) == 0 {
				require.Empty(t, sink.resp.Partitions)
				continue
			}
			require.Equal(t, want, &sink.resp, "piece %d", piece)
		}
	}
	// Whole batches are handed on once they arrived, before the rest of
	// the response: here the reader holds back everything after the
	// first stream piece until the sink got records.
	var records []byte
	for i := range 100 {
		records = append(records, batchOfValues(t, []string{fmt.Sprintf("%d-%08000d", i, i)})...)
	}
	frame, err := appendFetchResponseFrame(nil, 1, &FetchResponse{Partitions: []FetchPartitionResponse{
		{TopicPartition: TopicPartition{Topic: "t"}, Records: records}}})
	require.NoError(t, err)
	body := frame[frameHeaderSize:]
	require.Greater(t, len(body), 2*streamPieceBytes)
	gate := make(chan struct{})
	sink := &gatedSink{gate: gate}
	s := startBodyStream(&gateReader{r: bytes.NewReader(body), at: streamPieceBytes, gate: gate}, make([]byte, len(body)))
	require.NoError(t, streamFetchResponse(s, sink))
	<-s.done
	require.NoError(t, sink.err)
	require.Greater(t, sink.pieces, 1)
	require.Equal(t, records, sink.resp.Partitions[0].Records)
}

// gateReader delivers at bytes, then waits for gate to be closed.
type gateReader struct {
	r    io.Reader
	at   int
	n    int
	gate chan struct{}
}

func (g *gateReader) Read(b []byte) (int, error) {
	if g.n >= g.at {
		select {
		case <-g.gate:
		case <-time.After(10 * time.Second):
			return 0, errors.New("gateReader: the sink got nothing from the first piece")
		}
	} else if len(b) > g.at-g.n {
		b = b[:g.at-g.n]
	}
	m, err := g.r.Read(b)
	g.n += m
	return m, err
}

// gatedSink is a collectSink that closes gate on its first records.
type gatedSink struct {
	collectSink
	gate chan struct{}
}

func (g *gatedSink) records(b []byte) {
	if g.pieces == 0 && len(b) > 0 {
		close(g.gate)
	}
	g.collectSink.records(b)
}

func TestStreamFetchResponseRejectsWhatDecodeRejects(t *testing.T) {
	frame, err := appendFetchResponseFrame(nil, 1, batchesResponse(t, 3))
	require.NoError(t, err)
	body := frame[frameHeaderSize:]
	cases := map[string][]byte{
		"empty":     {},
		"truncated": body[:len(body)-1],
		"trailing":  append(slices.Clone(body), 0),
		"count":     append([]byte{0, 0, 0, 9}, body[4:]...),
	}
	flag := slices.Clone(body)
	flag[4+2+1+4+2+8+8+8] = 2 // the first partition's diverging flag (topic "t")
	cases["flag"] = flag
	for name, b := range cases {
		_, derr := decodeFetchResponse(b)
		require.ErrorIs(t, derr, ErrMalformedFrame, name)
		_, serr := streamDecode(t, b, 5)
		require.ErrorIs(t, serr, ErrMalformedFrame, name)
	}
	// A receiver that fails ends the stream with its error.
	s := startBodyStream(io.LimitReader(bytes.NewReader(body), 10), make([]byte, len(body)))
	err = streamFetchResponse(s, &collectSink{})
	<-s.done
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

// A follower over TCP applies a response of many stream pieces as it
// arrives and ends equal to its leader, several times over.
func TestTCPFollowerStreamsLargeResponses(t *testing.T) {
	checkGoroutines(t)
	tp := TopicPartition{Topic: "big", Partition: 0}
	reps := startTCPReplicas(t, 2, tp, Config{ClusterID: "c", MinInsyncReplicas: 2, FetchMaxBytes: 3 << 20}, log.Options{})
	require.NoError(t, reps[0].rep.BecomeLeader(tp, 1, []int32{0, 1}, []int32{0}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	batch := batchOfSize(t, 16<<10)
	for range 500 { // about 8 MiB: three responses, of 12 pieces each
		_, err := reps[0].rep.Produce(ctx, tp, slices.Clone(batch), AcksLeader)
		require.NoError(t, err)
	}
	require.NoError(t, reps[1].rep.BecomeFollower(tp, 1, 0))
	end := reps[0].log.LogEndOffset()
	require.NoError(t, reps[1].log.WaitForData(ctx, end-1, false))
	// The ISR grows and acks=all completes: the follower's fetch offsets
	// reach the leader.
	_, err := reps[0].rep.Produce(ctx, tp, slices.Clone(batch), AcksAll)
	require.NoError(t, err)
	require.Equal(t, readAllBatches(t, reps[0].log), readAllBatches(t, reps[1].log))
	st := reps[1].rep.Stats()
	require.GreaterOrEqual(t, st.FetchesApplied, int64(3), "the streamed responses count as applied")
	require.Equal(t, logBytes(t, reps[1].log), st.BytesFetched)
}

// HandleFetchResponse applies a response the caller owns and may read
// meanwhile: handing it to the applier must not write to it (the race
// detector catches a write, such as clearing a partition's Records
// while its header is applied).
func TestHandleFetchResponseLeavesTheResponseAlone(t *testing.T) {
	leader, f := newCaughtUpPair(t)
	leader.produce(t, 1, AcksLeader)
	req, resp := fetchFrom(t, f, leader, ntime)
	records := resp.Partitions[0].Records
	require.NotEmpty(t, records)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if len(resp.Partitions[0].Records) != len(records) {
				panic("the response's records changed")
			}
		}
	}()
	for range 200 {
		_, _ = f.node.HandleFetchResponse(0, req, resp, ntime)
	}
	close(stop)
	<-done
	require.Equal(t, records, resp.Partitions[0].Records)
}

// TestWholeBatchesStopsAtABatchStillArriving checks the split of a
// streamed piece: the whole batches before one cut anywhere, or before
// bytes that are no batch, and no allocation for the cut one (a stream
// meets one at nearly every piece).
func TestWholeBatchesStopsAtABatchStillArriving(t *testing.T) {
	one := batchOfSize(t, 1000)
	two := append(slices.Clone(one), one...)
	for cut := 0; cut < len(one); cut += 7 {
		b := append(slices.Clone(two), one[:cut]...)
		require.Equal(t, len(two), wholeBatches(b), "third batch cut at %d", cut)
	}
	require.Equal(t, 3*len(one), wholeBatches(append(slices.Clone(two), one...)))
	bad := append(slices.Clone(two), one...)
	binary.BigEndian.PutUint32(bad[len(two)+8:], 1<<31) // a negative length
	require.Equal(t, len(two), wholeBatches(bad))
	partial := append(slices.Clone(two), one[:len(one)/2]...)
	require.Zero(t, testing.AllocsPerRun(100, func() { wholeBatches(partial) }))
}

// A response's records length is a u32. Where int has 32 bits (386,
// arm), one of 2^31 or more became a negative int that
// streamFetchResponse took for records that fit: it moved its read
// offset back before the body and sliced the body at a negative index, a
// panic from a leader's bytes (S17). Both decoders refuse it. On 64-bit
// machines the length is simply too large; the 32-bit case runs with
// qemu-user-static:
// GOARCH=arm GOARM=7 go test -exec qemu-arm-static -run TestStreamRefusesARecordsLengthPastMaxInt32 ./replication/
func TestStreamRefusesARecordsLengthPastMaxInt32(t *testing.T) {
	frame, err := appendFetchResponseFrame(nil, 1, &FetchResponse{Partitions: []FetchPartitionResponse{
		{TopicPartition: TopicPartition{Topic: "t"}}, {TopicPartition: TopicPartition{Topic: "t", Partition: 1}}}})
	require.NoError(t, err)
	body := frame[frameHeaderSize:]
	// The first partition's records length, its header's last 4 bytes.
	recLenAt := 4 + responsePartitionHeaderFixed + len("t") - 4
	for _, l := range []uint32{1 << 31, 1<<32 - 1, 1<<32 - 256} {
		binary.BigEndian.PutUint32(body[recLenAt:], l)
		_, derr := decodeFetchResponse(body)
		require.ErrorIs(t, derr, ErrMalformedFrame)
		_, serr := streamDecode(t, body, 7)
		require.ErrorIs(t, serr, ErrMalformedFrame, "records length %#x", l)
	}
}
