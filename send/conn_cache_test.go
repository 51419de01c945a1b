package send_test

import (
	"bytes"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/send"
)

// TestBuilderAlternatingConnections writes with one Builder to two
// sockets in turn: the raw connection it keeps from the last write is
// used only for the same socket, so each peer gets exactly its responses.
func TestBuilderAlternatingConnections(t *testing.T) {
	var b send.Builder
	var clients [2]net.Conn
	var cols [2]*collector
	var want [2]bytes.Buffer
	for i := range clients {
		var server net.Conn
		clients[i], server = connPair(t, "tcp")
		cols[i] = collect(server, false)
	}
	for round := range 6 {
		i := round % 2
		if round == 3 {
			i = 1 // twice in a row to the same socket
		}
		payload := randomBytes(1000+round*4096, uint64(round))
		b.Reset()
		b.AddBytes(payload)
		n, err := b.WriteTo(clients[i])
		require.NoError(t, err)
		require.Equal(t, int64(len(payload)), n)
		want[i].Write(payload)
	}
	for i := range clients {
		closeWrite(t, clients[i])
		require.Equal(t, want[i].Bytes(), cols[i].Wait(t), "socket %d", i)
	}
	// The socket written to last, whose raw connection is kept, fails
	// the write once closed.
	require.NoError(t, clients[1].Close())
	b.Reset()
	b.AddBytes([]byte("late"))
	_, err := b.WriteTo(clients[1])
	require.ErrorIs(t, err, net.ErrClosed)
}
