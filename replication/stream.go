package replication

import (
	"context"
	"encoding/binary"
	"io"
	"sync/atomic"

	"github.com/replog/replog/log"
)

// This file lets a fetcher append a response's records while the rest of
// the response is still being received: a receiver goroutine reads the
// frame body into the fetcher's buffer piece by piece, and the fetcher
// decodes what arrived and hands whole batches to a fetchSink (the
// follower's responseApplier). The next fetch is sent only once the whole
// response was applied, so its fetch offset is still the follower's log
// end (see "Catching up" in the package documentation).

// streamPieceBytes is how much the receiver reads before handing it on.
const streamPieceBytes = 256 << 10

// fetchSink takes a fetch response as it arrives: for each partition in
// order, its header (whose Records the sink ignores: nil when streamed,
// all of them when the response came whole), its records in pieces of
// whole batches (possibly none), its end.
type fetchSink interface {
	beginPartition(i int, pr *FetchPartitionResponse)
	records(batches []byte)
	endPartition()
}

// streamingFetcher is a Transport that hands responses to a fetchSink as
// they arrive (TCPTransport). buf is the caller's buffer, returned
// possibly replaced, for the next call.
type streamingFetcher interface {
	fetchStream(ctx context.Context, leader int32, req *FetchRequest, buf []byte, sink fetchSink) ([]byte, error)
}

// sinkResponse hands a whole response to sink. It does not change resp,
// which may be the caller's (Node.HandleFetchResponse).
func sinkResponse(resp *FetchResponse, sink fetchSink) {
	for i := range resp.Partitions {
		pr := &resp.Partitions[i]
		sink.beginPartition(i, pr)
		sink.records(pr.Records)
		sink.endPartition()
	}
}

// bodyStream is a frame body that a receiver goroutine reads while its
// consumer decodes the bytes that arrived.
type bodyStream struct {
	body   []byte
	filled atomic.Int64  // bytes of body received
	more   chan struct{} // a token when filled grew
	done   chan struct{} // closed when the receiver ended
	err    error         // the receiver's error, set before done is closed
}

// startBodyStream starts reading len(body) bytes from r into body. The
// caller must wait for done before it uses r again or returns body.
func startBodyStream(r io.Reader, body []byte) *bodyStream {
	s := &bodyStream{body: body, more: make(chan struct{}, 1), done: make(chan struct{})}
	go s.receive(r)
	return s
}

func (s *bodyStream) receive(r io.Reader) {
	defer close(s.done)
	for got := 0; got < len(s.body); {
		m, err := io.ReadFull(r, s.body[got:min(got+streamPieceBytes, len(s.body))])
		got += m
		s.filled.Store(int64(got))
		select {
		case s.more <- struct{}{}:
		default:
		}
		if err != nil {
			s.err = bodyErr(err, len(s.body))
			return
		}
	}
}

// wait blocks until at least n bytes of the body arrived (n at most its
// length) and returns how many did, or the receiver's error.
func (s *bodyStream) wait(n int) (int, error) {
	for {
		if f := int(s.filled.Load()); f >= n {
			return f, nil
		}
		select {
		case <-s.more:
		case <-s.done:
			if f := int(s.filled.Load()); f >= n {
				return f, nil
			}
			return 0, s.err
		}
	}
}

// streamFetchResponse decodes the fetch response body s receives, handing
// it to sink as it arrives, with the checks of decodeFetchResponse. An
// error may come after part of the response went to sink.
func streamFetchResponse(s *bodyStream, sink fetchSink) error {
	body := s.body
	r := &wireReader{b: body}
	// need waits for the next k bytes, or the rest of the body if
	// shorter (the wireReader then reports the shortfall).
	need := func(k int) error {
		_, err := s.wait(min(r.off+k, len(body)))
		return err
	}
	if err := need(4); err != nil {
		return err
	}
	n := r.count(minResponsePartitionBytes, "partitions")
	for i := 0; i < n && r.err == nil; i++ {
		if err := need(2); err != nil {
			return err
		}
		topicLen := 0
		if r.remaining() >= 2 {
			topicLen = int(binary.BigEndian.Uint16(body[r.off:]))
		}
		if err := need(topicLen + responsePartitionHeaderFixed); err != nil {
			return err
		}
		p, recLen := decodePartitionHeader(r)
		if r.err == nil && (recLen < 0 || recLen > r.remaining()) { // < 0: a u32 past MaxInt32 where int has 32 bits
			r.take(recLen, "records") // sets the error
		}
		if r.err != nil {
			break
		}
		sink.beginPartition(i, &p)
		pos, end := r.off, r.off+recLen
		for want := pos + 1; pos < end; {
			f, err := s.wait(want)
			if err != nil {
				return err
			}
			avail := min(f, end)
			k := wholeBatches(body[pos:avail])
			if k == 0 && avail < end {
				want = avail + 1 // a batch still arriving
				continue
			}
			if k == 0 {
				k = avail - pos // not a batch: the log refuses it
			}
			sink.records(body[pos : pos+k : pos+k])
			pos += k
			want = pos + 1
		}
		r.off = end
		sink.endPartition()
	}
	return r.end()
}

// wholeBatches is the length of the leading whole batches in b. A batch
// still arriving at the end ends them without a call to SplitBatch,
// whose error would be made for nothing at every piece of a stream.
func wholeBatches(b []byte) int {
	n := 0
	for n < len(b) {
		if rest := b[n:]; len(rest) < log.BatchHeaderSize || log.Batch(rest).Size() > len(rest) {
			break
		}
		batch, _, err := log.SplitBatch(b[n:])
		if err != nil {
			break
		}
		n += len(batch)
	}
	return n
}
