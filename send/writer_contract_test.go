package send_test

import (
	"bytes"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/replog/replog/send"
)

// shortOnceConn is a net.Conn wrapper whose first Write takes only half of
// its buffer without an error (breaking io.Writer's contract, which the
// package says it detects with ErrShortWrite); later Writes take
// everything.
type shortOnceConn struct {
	net.Conn
	buf   bytes.Buffer
	calls int
}

func (c *shortOnceConn) Write(p []byte) (int, error) {
	c.calls++
	if c.calls == 1 {
		n := len(p) / 2
		c.buf.Write(p[:n])
		return n, nil
	}
	c.buf.Write(p)
	return len(p), nil
}

// TestShortWriteOfAConnWrapperStopsTheResponse: on error WriteTo's count
// is a prefix of the response and nothing after it was written. A
// net.Conn wrapper (tls.Conn, a metrics or rate-limiting wrapper) went
// through net.Buffers, which for writers other than the net package's own
// calls Write per buffer and goes on after a short Write without error:
// later bytes reached the writer after a gap.
func TestShortWriteOfAConnWrapperStopsTheResponse(t *testing.T) {
	b := send.NewBuilder(send.Options{CopyThreshold: -1})
	// Three referenced buffers, not adjacent in memory.
	p1 := bytes.Repeat([]byte("A"), 1000)
	p2 := bytes.Repeat([]byte("B"), 1000)
	p3 := bytes.Repeat([]byte("C"), 1000)
	b.AddBytes(p1)
	b.AddBytes(p2)
	b.AddBytes(p3)
	want := append(append(append([]byte{}, p1...), p2...), p3...)

	c := &shortOnceConn{}
	n, err := b.WriteTo(c)
	require.ErrorIs(t, err, send.ErrShortWrite)
	got := c.buf.Bytes()
	assert.Equal(t, int64(len(got)), n)
	// Only a prefix of the response may have reached the writer.
	require.True(t, bytes.Equal(want[:len(got)], got),
		"writer got %d bytes that are not a prefix of the response (first short write at 500, then %d more bytes from later buffers)", len(got), len(got)-500)
}

// TestCopiedBuilderWritesItsOwnResponse: a Builder moved after use (an
// element of a []Builder that grew) cached method values bound to its old
// address, so its WriteTo ran the old Builder's state and sent nothing.
func TestCopiedBuilderWritesItsOwnResponse(t *testing.T) {
	client, server := connPair(t, "tcp")
	col := collect(server, false)

	bs := make([]send.Builder, 1, 1)
	bs[0].AddBytes([]byte("first;"))
	n, err := bs[0].WriteTo(client)
	require.NoError(t, err)
	require.Equal(t, int64(6), n)
	bs[0].Reset()

	bs = append(bs, send.Builder{}) // bs[0] moves to a new array
	b := &bs[0]
	b.AddBytes([]byte("second"))
	n, err = b.WriteTo(client)
	require.NoError(t, err)
	closeWrite(t, client)
	got := col.Wait(t)
	assert.Equal(t, b.Len(), n, "WriteTo's count")
	assert.Equal(t, "first;second", string(got))
}
