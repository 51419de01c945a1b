package replication

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// With MaxConnections 2, a third connection is not accepted, and its
// request not answered, until one of the first two closes; Close then
// ends the accept loop that waits for a slot again.
func TestTCPServerMaxConnections(t *testing.T) {
	checkGoroutines(t)
	data := testData(1 << 10)
	_, ln := startServer(t, echoHandler(segmentFile(t, data), data, nil), TCPOptions{MaxConnections: 2})
	addr := ln.Addr().String()
	frame, err := appendFetchRequestFrame(nil, 3, testRequest(1))
	require.NoError(t, err)
	answered := func(c net.Conn) {
		t.Helper()
		h, _, err := readRaw(t, c)
		require.NoError(t, err)
		require.Equal(t, uint8(msgFetchResponse), h.typ)
	}
	first, second := rawConn(t, addr), rawConn(t, addr)
	for _, c := range []net.Conn{first, second} {
		_, err := c.Write(frame)
		require.NoError(t, err)
		answered(c)
	}

	third := rawConn(t, addr)
	_, err = third.Write(frame)
	require.NoError(t, err)
	require.NoError(t, third.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, err = third.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "a connection over the limit is not served")
	require.Equal(t, int32(2), ln.accepted.Load())

	require.NoError(t, first.Close())
	require.NoError(t, third.SetReadDeadline(time.Now().Add(30*time.Second)))
	answered(third)
	require.Equal(t, int32(3), ln.accepted.Load())
	_, err = second.Write(frame)
	require.NoError(t, err)
	answered(second)
}
