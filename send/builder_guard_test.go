package send_test

import (
	"bytes"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/send"
)

// TestBackToBackRegionsOfTwoFiles checks that regions of two different
// files whose offsets happen to line up (one ends where the other starts)
// are each read from their own file: the single-ReadAt optimisation for
// back-to-back regions applies within one file only.
func TestBackToBackRegionsOfTwoFiles(t *testing.T) {
	fa, da := tempFile(t, 8<<10, 31)
	fb, db := tempFile(t, 8<<10, 32)
	hdr := []byte("header")
	want := concat(da[:1000], hdr, db[1000:3000])
	for _, name := range []string{"os.File", "bytes.Reader"} {
		t.Run(name, func(t *testing.T) {
			var b send.Builder
			if name == "os.File" {
				require.NoError(t, b.AddFile(fa, 0, 1000))
				b.AddBytes(hdr)
				require.NoError(t, b.AddFile(fb, 1000, 2000))
			} else {
				require.NoError(t, b.AddFile(bytes.NewReader(da), 0, 1000))
				b.AddBytes(hdr)
				require.NoError(t, b.AddFile(bytes.NewReader(db), 1000, 2000))
			}
			var out bytes.Buffer
			n, err := b.WriteTo(&out)
			require.NoError(t, err)
			require.Equal(t, int64(len(want)), n)
			require.True(t, bytes.Equal(want, out.Bytes()), "bytes differ")
		})
	}
}

// maxReadAt is an io.ReaderAt that records the largest ReadAt it served.
type maxReadAt struct {
	r   *bytes.Reader
	max int
}

func (m *maxReadAt) ReadAt(p []byte, off int64) (int, error) {
	m.max = max(m.max, len(p))
	return m.r.ReadAt(p, off)
}

// TestReadBufferBounded checks that file data read into memory is read
// in pieces of at most MaxReadBuffer bytes (the Builder's memory for file
// data is bounded by it), on the plain and the socket path, and that the
// bytes are still right.
func TestReadBufferBounded(t *testing.T) {
	data := randomBytes(64<<10, 33)
	const maxRead = 4 << 10
	for _, network := range append(networks, "buffer") {
		t.Run(network, func(t *testing.T) {
			src := &maxReadAt{r: bytes.NewReader(data)}
			b := send.NewBuilder(send.Options{MaxReadBuffer: maxRead})
			b.AddBytes([]byte("h1"))
			require.NoError(t, b.AddFile(src, 0, 40<<10))
			b.AddBytes([]byte("h2"))
			require.NoError(t, b.AddFile(src, 50<<10, 10<<10))
			want := concat([]byte("h1"), data[:40<<10], []byte("h2"), data[50<<10:60<<10])
			var got []byte
			if network == "buffer" {
				var out bytes.Buffer
				_, err := b.WriteTo(&out)
				require.NoError(t, err)
				got = out.Bytes()
			} else {
				client, server := connPair(t, network)
				col := collect(server, false)
				_, err := b.WriteTo(client)
				require.NoError(t, err)
				closeWrite(t, client)
				got = col.Wait(t)
			}
			require.True(t, bytes.Equal(want, got), "bytes differ")
			require.LessOrEqual(t, src.max, maxRead, "one ReadAt of %d bytes with MaxReadBuffer %d", src.max, maxRead)
		})
	}
}

// TestJoinAtCapacityEnd checks that a referenced slice whose capacity
// ends exactly where the next referenced slice ends is still joined with it
// (the adjacency check allows the second slice to fill a's capacity).
func TestJoinAtCapacityEnd(t *testing.T) {
	backing := randomBytes(8192, 34)
	var b send.Builder
	b.AddBytes(backing[6000:7000]) // cap runs to the end of backing
	b.AddBytes(backing[7000:])     // exactly fills that capacity
	var out bytes.Buffer
	n, err := b.WriteTo(&out)
	require.NoError(t, err)
	require.Equal(t, int64(8192-6000), n)
	require.Equal(t, backing[6000:], out.Bytes())
	require.Equal(t, int64(1), b.Stats().Write, "adjacent slices are one buffer")
}

// TestResetDropsReferences checks Reset's documented promise that the
// Builder drops its references to the slices and files added before, so
// that they can be collected while the Builder is kept for reuse.
func TestResetDropsReferences(t *testing.T) {
	type big struct{ p [4096]byte }
	var b send.Builder
	freed := make(chan string, 2)
	func() {
		mem := new(big)
		src := bytes.NewReader(make([]byte, 4096))
		runtime.AddCleanup(mem, func(s string) { freed <- s }, "slice")
		runtime.AddCleanup(src, func(s string) { freed <- s }, "file")
		b.AddBytes(mem.p[:]) // over the copy threshold: referenced
		require.NoError(t, b.AddFile(src, 0, 4096))
		_, err := b.WriteTo(io.Discard)
		require.NoError(t, err)
		b.Reset()
	}()
	got := map[string]bool{}
	deadline := time.Now().Add(500 * time.Millisecond)
	for len(got) < 2 && time.Now().Before(deadline) {
		runtime.GC()
		select {
		case s := <-freed:
			got[s] = true
		case <-time.After(10 * time.Millisecond):
		}
	}
	require.Equal(t, map[string]bool{"slice": true, "file": true}, got, "Reset must drop the Builder's references")
	runtime.KeepAlive(&b)
}
