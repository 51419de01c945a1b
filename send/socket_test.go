package send_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/replog/replog/send"
)

var networks = []string{"tcp", "unix"}

// fastPath reports whether this platform sends with writev and sendfile.
const fastPath = runtime.GOOS == "linux"

func TestSocketGetsSameBytes(t *testing.T) {
	f, data := tempFile(t, 8<<20, 10)
	tests := []struct {
		name  string
		opts  send.Options
		tiny  bool // tiny socket buffers and a slow reader
		parts int
		max   int
	}{
		{"defaults", send.Options{}, false, 20, 4 << 20},
		{"tiny-buffers-slow-reader", send.Options{}, true, 20, 1 << 20},
		{"all-sendfile-no-copy", send.Options{ReadThreshold: -1, CopyThreshold: -1}, false, 20, 4 << 20},
		{"all-read-small-read-buffer", send.Options{ReadThreshold: 1 << 40, MaxReadBuffer: 4 << 10}, true, 20, 1 << 20},
		{"many-small-parts", send.Options{}, false, 3000, 2 << 10},
	}
	for _, network := range networks {
		for _, tt := range tests {
			t.Run(network+"/"+tt.name, func(t *testing.T) {
				for seed := range uint64(2) {
					r := rand.New(rand.NewPCG(seed, 11))
					client, server := connPair(t, network)
					var col *collector
					if tt.tiny {
						setBuffers(t, client, server, 1, 0)
						col = collect(server, true)
					} else {
						col = collect(server, false)
					}
					b := send.NewBuilder(tt.opts)
					var want []byte
					for range 2 { // two responses on one connection
						b.Reset()
						resp := randomResponse(r, tt.parts, f, data, tt.max)
						resp.add(b)
						n, err := b.WriteTo(client)
						require.NoError(t, err)
						require.Equal(t, int64(len(resp.want)), n)
						want = append(want, resp.want...)
					}
					closeWrite(t, client)
					got := col.Wait(t)
					require.Equal(t, len(want), len(got))
					require.True(t, bytes.Equal(want, got), "seed %d: bytes differ", seed)

					st := b.Stats()
					assert.Equal(t, int64(len(want)), st.Bytes)
					if fastPath {
						assert.Zero(t, st.Write, "sockets never get plain writes")
						if tt.tiny {
							assert.Positive(t, st.EAGAIN, "a full socket buffer was waited for")
						}
					}
				}
			})
		}
	}
}

// setBuffers asks for a client send buffer of size bytes (the kernel
// rounds up to its minimum, about 4.5 KiB) and, if read is positive, a
// server receive buffer of read bytes. A tiny TCP receive buffer is
// avoided on purpose: the sender then waits for zero-window probes
// (persist timer, backing off to seconds) and the test crawls.
func setBuffers(tb testing.TB, client, server net.Conn, size, read int) {
	tb.Helper()
	type buffered interface {
		SetWriteBuffer(int) error
		SetReadBuffer(int) error
	}
	require.NoError(tb, client.(buffered).SetWriteBuffer(size))
	if read > 0 {
		require.NoError(tb, server.(buffered).SetReadBuffer(read))
	}
}

func TestConcurrentSendersShareFile(t *testing.T) {
	f, data := tempFile(t, 4<<20, 12)
	const senders = 4
	var wg sync.WaitGroup
	errs := make([]error, senders)
	for i := range senders {
		network := networks[i%len(networks)]
		client, server := connPair(t, network)
		col := collect(server, false)
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 13))
			var b send.Builder
			var want []byte
			for range 3 {
				b.Reset()
				resp := randomResponse(r, 30, f, data, 1<<20)
				resp.add(&b)
				if _, err := b.WriteTo(client); err != nil {
					errs[i] = err
					client.Close()
					return
				}
				want = append(want, resp.want...)
			}
			client.(interface{ CloseWrite() error }).CloseWrite()
			col.wg.Wait()
			switch {
			case col.err != nil:
				errs[i] = col.err
			case !bytes.Equal(want, col.buf.Bytes()):
				errs[i] = fmt.Errorf("sender %d: received %d bytes that differ from the %d sent", i, col.buf.Len(), len(want))
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	pos, err := f.Seek(0, io.SeekCurrent)
	require.NoError(t, err)
	assert.Zero(t, pos, "the file's shared offset is never used")
}

func TestRegionPastEOF(t *testing.T) {
	const size = 100 << 10
	f, data := tempFile(t, size, 14)
	head := []byte("head")
	tests := []struct {
		name      string
		off, n    int64
		available int64 // bytes of the region inside the file
	}{
		{"small-region-straddles-eof", size - 100, 1000, 100},
		{"small-region-beyond-eof", size + 10, 10, 0},
		{"large-region-straddles-eof", size - 50<<10, 200 << 10, 50 << 10},
		{"large-region-at-eof", size, 100 << 10, 0},
	}
	for _, network := range append(networks, "buffer") {
		for _, tt := range tests {
			t.Run(network+"/"+tt.name, func(t *testing.T) {
				var b send.Builder
				b.AddBytes(head)
				require.NoError(t, b.AddFile(f, tt.off, tt.n))
				b.AddBytes([]byte("never sent"))
				want := append(append([]byte{}, head...), data[min(tt.off, size):min(tt.off+tt.n, size)]...)

				var got []byte
				var n int64
				var err error
				if network == "buffer" {
					var out bytes.Buffer
					n, err = b.WriteTo(&out)
					got = out.Bytes()
				} else {
					client, server := connPair(t, network)
					col := collect(server, false)
					n, err = b.WriteTo(client)
					closeWrite(t, client)
					got = col.Wait(t)
				}
				require.ErrorIs(t, err, send.ErrRegionPastEOF)
				assert.Equal(t, int64(len(head))+tt.available, n, "count of bytes written")
				assert.Equal(t, want, got, "the response up to the first missing byte")
			})
		}
	}
}

// bigResponse returns a Builder holding about size bytes of file regions
// and slices, and the bytes it stands for.
func bigResponse(tb testing.TB, size int) (*send.Builder, []byte) {
	tb.Helper()
	f, data := tempFile(tb, size/2, 15)
	mem := randomBytes(size-size/2, 16)
	var b send.Builder
	require.NoError(tb, b.AddFile(f, 0, int64(len(data))/2))
	b.AddBytes(mem)
	require.NoError(tb, b.AddFile(f, int64(len(data))/2, int64(len(data))-int64(len(data))/2))
	return &b, append(append([]byte{}, data...), mem...)
}

func TestWriteDeadline(t *testing.T) {
	for _, network := range networks {
		t.Run(network+"/expires-mid-response", func(t *testing.T) {
			b, want := bigResponse(t, 8<<20)
			client, server := connPair(t, network)
			setBuffers(t, client, server, 1, 0)
			require.NoError(t, client.SetWriteDeadline(time.Now().Add(100*time.Millisecond)))
			n, err := b.WriteTo(client) // nobody reads yet
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			assert.Less(t, n, int64(len(want)))
			require.NoError(t, client.Close())
			got := collect(server, false).Wait(t)
			assert.Equal(t, n, int64(len(got)), "the count is what the peer received")
			assert.True(t, bytes.Equal(want[:len(got)], got), "a prefix of the response")
		})
		t.Run(network+"/already-expired", func(t *testing.T) {
			b, _ := bigResponse(t, 64<<10)
			client, _ := connPair(t, network)
			require.NoError(t, client.SetWriteDeadline(time.Now().Add(-time.Second)))
			n, err := b.WriteTo(client)
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			assert.Zero(t, n)
		})
	}
}

func TestPeerGone(t *testing.T) {
	for _, network := range networks {
		t.Run(network+"/peer-closed", func(t *testing.T) {
			b, want := bigResponse(t, 8<<20)
			client, server := connPair(t, network)
			require.NoError(t, server.Close())
			// Guard against a hang: the error must come from the peer.
			require.NoError(t, client.SetWriteDeadline(time.Now().Add(20*time.Second)))
			n, err := b.WriteTo(client)
			require.Error(t, err)
			assert.False(t, errors.Is(err, os.ErrDeadlineExceeded), "error came from the deadline guard: %v", err)
			if runtime.GOOS != "windows" { // Windows reports WSAECONNRESET and friends
				assert.True(t, errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET), "peer gone: %v", err)
			}
			assert.Less(t, n, int64(len(want)))
		})
		t.Run(network+"/closed-locally", func(t *testing.T) {
			b, _ := bigResponse(t, 64<<10)
			client, _ := connPair(t, network)
			require.NoError(t, client.Close())
			n, err := b.WriteTo(client)
			require.ErrorIs(t, err, net.ErrClosed)
			assert.Zero(t, n)
		})
	}
}
