package replication

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// manyPartitionsLeader answers every fetch with a fetch response of n
// empty partitions (49 bytes each), whatever was asked.
func manyPartitionsLeader(t *testing.T, n int) *countingListener {
	t.Helper()
	resp := &FetchResponse{Partitions: make([]FetchPartitionResponse, n)}
	return serveRaw(t, func(c net.Conn) {
		var hdr [frameHeaderSize]byte
		for {
			h, err := readFrameHeader(c, &hdr, DefaultMaxFrameBytes)
			if err != nil {
				return
			}
			if _, err := readBody(c, h.bodyLen, nil, 0); err != nil {
				return
			}
			out, err := appendFetchResponseFrame(nil, h.corr, resp)
			if err != nil {
				return
			}
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	})
}

// A leader that answers a fetch of one partition with 200,000 (a 9.8 MB
// frame, within MaxFrameBytes) must not leave the follower's pooled
// connection holding the decoded partition array (about 32 MB) for its
// life, as the fetcher keeps using the connection: like the server past
// keepResponsePartitions, the transport drops it.
func TestTCPPooledConnectionDropsAHugeDecodedResponse(t *testing.T) {
	checkGoroutines(t)
	ln := manyPartitionsLeader(t, 200_000)
	tr := newTransport(t, ln.Addr().String(), TCPOptions{})
	req := testRequest(1)
	req.MaxBytes = 1 << 10
	_, err := tr.fetchStream(context.Background(), 0, req, nil, &collectSink{})
	require.NoError(t, err) // the transport decodes it; the applier would call it malformed
	tr.mu.Lock()
	defer tr.mu.Unlock()
	require.Len(t, tr.idle[0], 1, "the connection is pooled")
	c := tr.idle[0][0]
	require.LessOrEqual(t, cap(c.resp.Partitions), keepResponsePartitions,
		"a pooled connection keeps a decoded response of %d partitions", cap(c.resp.Partitions))
}
