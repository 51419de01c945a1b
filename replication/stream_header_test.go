package replication

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// delayedReader delivers the first at bytes at once and the rest only
// after delay.
type delayedReader struct {
	r     *bytes.Reader
	at    int
	n     int
	delay time.Duration
}

func (d *delayedReader) Read(b []byte) (int, error) {
	if d.n >= d.at {
		if d.delay > 0 {
			time.Sleep(d.delay)
			d.delay = 0
		}
	} else if len(b) > d.at-d.n {
		b = b[:d.at-d.n]
	}
	m, err := d.r.Read(b)
	d.n += m
	return m, err
}

// TestStreamWaitsForTheWholePartitionHeader: a partition header is decoded
// only once all of it arrived, topic name included. Here the second
// partition's header (with a long topic name) straddles the end of the
// first stream piece, and the rest of the body comes later: a decoder that
// waited only for the fixed part of the header would read the topic's tail
// and the fields after it from bytes not yet received.
func TestStreamWaitsForTheWholePartitionHeader(t *testing.T) {
	topic := strings.Repeat("x", 1000)
	const headerAt = streamPieceBytes - 500 // where partition 1's header starts
	first := FetchPartitionResponse{TopicPartition: TopicPartition{Topic: "t"}, HighWatermark: 1, LogEndOffset: 1}
	recLen := headerAt - 4 - responsePartitionHeaderFixed - len(first.Topic)
	first.Records = bytes.Repeat([]byte{7}, recLen) // not batches: the codec does not care
	resp := &FetchResponse{Partitions: []FetchPartitionResponse{first,
		{TopicPartition: TopicPartition{Topic: topic, Partition: 3}, HighWatermark: 42, LogStartOffset: 2, LogEndOffset: 50,
			Diverging: &EpochEndOffset{Epoch: 4, EndOffset: 40}},
	}}
	frame, err := appendFetchResponseFrame(nil, 1, resp)
	require.NoError(t, err)
	body := frame[frameHeaderSize:]
	want, err := decodeFetchResponse(body)
	require.NoError(t, err)

	s := startBodyStream(&delayedReader{r: bytes.NewReader(body), at: streamPieceBytes, delay: 300 * time.Millisecond}, make([]byte, len(body)))
	sink := &collectSink{}
	err = streamFetchResponse(s, sink)
	<-s.done
	require.NoError(t, err)
	require.NoError(t, sink.err)
	require.Len(t, sink.resp.Partitions, len(want.Partitions))
	for i := range want.Partitions {
		w, g := want.Partitions[i], sink.resp.Partitions[i]
		require.True(t, bytes.Equal(w.Records, g.Records), "partition %d: records differ", i)
		w.Records, g.Records = nil, nil
		require.Equal(t, w, g, "partition %d: header", i)
	}
}
