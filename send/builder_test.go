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
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/replog/replog/send"
)

// TestMain fails the run if goroutines started by the tests outlive them.
func TestMain(m *testing.M) {
	base := runtime.NumGoroutine()
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > base {
			buf := make([]byte, 1<<20)
			fmt.Fprintf(os.Stderr, "leaked goroutines: %d > %d\n%s\n", n, base, buf[:runtime.Stack(buf, true)])
			code = 1
		}
	}
	os.Exit(code)
}

// response is a randomly generated mix of parts and the bytes it stands for.
type response struct {
	want []byte
	add  func(b *send.Builder) // adds the parts to b
}

// sizeClass picks a part size of at most max bytes: mostly small,
// sometimes large.
func sizeClass(r *rand.Rand, max int) int {
	switch r.IntN(10) {
	case 0:
		return 0
	case 1, 2, 3, 4:
		return r.IntN(min(100, max) + 1)
	case 5, 6:
		return r.IntN(min(4<<10, max) + 1)
	case 7, 8:
		return r.IntN(min(80<<10, max) + 1)
	default:
		return r.IntN(max + 1)
	}
}

// randomResponse builds parts parts drawn from r: slices (owned by the
// response) and regions of src, whose content is data; large parts are at
// most max bytes. Adjacent file regions occur now and then.
func randomResponse(r *rand.Rand, parts int, src io.ReaderAt, data []byte, max int) response {
	type op struct {
		p      []byte
		file   bool
		off, n int64
	}
	var ops []op
	var want []byte
	var lastEnd int64 = -1
	for range parts {
		n := sizeClass(r, max)
		if r.IntN(2) == 0 {
			p := randomBytes(n, r.Uint64())
			ops = append(ops, op{p: p})
			want = append(want, p...)
			lastEnd = -1
			continue
		}
		n = min(n, len(data))
		off := int64(r.IntN(len(data) - n + 1))
		if lastEnd >= 0 && r.IntN(3) == 0 && lastEnd+int64(n) <= int64(len(data)) {
			off = lastEnd // adjacent to the previous region
		}
		ops = append(ops, op{file: true, off: off, n: int64(n)})
		want = append(want, data[off:off+int64(n)]...)
		lastEnd = off + int64(n)
	}
	return response{
		want: want,
		add: func(b *send.Builder) {
			for _, o := range ops {
				if o.file {
					if err := b.AddFile(src, o.off, o.n); err != nil {
						panic(err) // regions are valid by construction
					}
				} else {
					b.AddBytes(o.p)
				}
			}
		},
	}
}

func TestPlainWriterGetsSameBytes(t *testing.T) {
	f, data := tempFile(t, 4<<20, 1)
	tests := []struct {
		name string
		src  io.ReaderAt
		opts send.Options
	}{
		{"os.File/defaults", f, send.Options{}},
		{"bytes.Reader/defaults", bytes.NewReader(data), send.Options{}},
		{"os.File/tiny-read-buffer", f, send.Options{MaxReadBuffer: 1, CopyThreshold: -1}},
		{"bytes.Reader/copy-all", bytes.NewReader(data), send.Options{CopyThreshold: 1 << 30}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for seed := range uint64(3) {
				r := rand.New(rand.NewPCG(seed, 1))
				resp := randomResponse(r, 1+r.IntN(40), tt.src, data, 3<<20)
				b := send.NewBuilder(tt.opts)
				resp.add(b)
				require.Equal(t, int64(len(resp.want)), b.Len())

				var out bytes.Buffer
				before := b.Stats()
				n, err := b.WriteTo(&out)
				require.NoError(t, err)
				assert.Equal(t, int64(len(resp.want)), n)
				require.True(t, bytes.Equal(resp.want, out.Bytes()), "seed %d: bytes differ", seed)
				st := b.Stats().Sub(before)
				assert.Zero(t, st.Writev+st.Sendfile, "no socket calls on a plain writer")
				assert.Equal(t, n, st.Bytes)
			}
		})
	}
}

func TestBuilderReuse(t *testing.T) {
	f, data := tempFile(t, 256<<10, 2)
	var b send.Builder
	header := []byte("header")
	build := func() {
		b.Reset()
		b.AddBytes(header)
		require.NoError(t, b.AddFile(f, 100, 1000))
		b.AddBytes(data[:2000])
		require.NoError(t, b.AddFile(f, 100_000, 100_000))
	}
	want := append(append(append([]byte("header"), data[100:1100]...), data[:2000]...), data[100_000:200_000]...)

	build()
	var out bytes.Buffer
	_, err := b.WriteTo(&out)
	require.NoError(t, err)
	_, err = b.WriteTo(&out)
	require.NoError(t, err)
	require.Equal(t, append(append([]byte{}, want...), want...), out.Bytes(), "a second WriteTo writes the response again")

	allocs := testing.AllocsPerRun(20, func() {
		build()
		if _, err := b.WriteTo(io.Discard); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs, "a reused Builder allocates nothing")

	b.Reset()
	assert.Zero(t, b.Len())
	out.Reset()
	n, err := b.WriteTo(&out)
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Zero(t, out.Len())
}

func TestAddBytesOwnership(t *testing.T) {
	var b send.Builder
	small := []byte("small")
	large := bytes.Repeat([]byte{'L'}, send.DefaultCopyThreshold+1)
	b.AddBytes(small)
	b.AddBytes(large)
	copied := []byte("copied anyway")
	b.AddCopy(copied)
	small[0], copied[0] = 'X', 'X' // copied: the change is not sent
	large[len(large)-1] = 'M'      // referenced: the change is sent

	var out bytes.Buffer
	_, err := b.WriteTo(&out)
	require.NoError(t, err)
	want := "small" + string(large) + "copied anyway"
	assert.Equal(t, want, out.String())
}

func TestAddFileInvalid(t *testing.T) {
	f, _ := tempFile(t, 10, 3)
	tests := []struct {
		name   string
		f      io.ReaderAt
		off, n int64
	}{
		{"nil file", nil, 0, 1},
		{"nil *os.File", (*os.File)(nil), 0, 1},           // was added, failing at WriteTo
		{"nil *bytes.Reader", (*bytes.Reader)(nil), 0, 1}, // was added, WriteTo panicked
		{"nil func", readerAtFunc(nil), 0, 1},             // the same
		{"negative offset", f, -1, 1},
		{"negative length", f, 0, -1},
		{"overflow", f, 1 << 62, 1<<62 + 1<<61 + 1<<60},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b send.Builder
			err := b.AddFile(tt.f, tt.off, tt.n)
			require.ErrorIs(t, err, send.ErrInvalidRegion)
			assert.Zero(t, b.Len(), "nothing added")
		})
	}
	var b send.Builder
	require.NoError(t, b.AddFile(f, 0, 1<<62))
	require.NoError(t, b.AddFile(f, 0, 1<<62-1))
	require.ErrorIs(t, b.AddFile(f, 0, 2), send.ErrInvalidRegion, "a response of more than MaxInt64 bytes")
	assert.Equal(t, int64(1<<63-1), b.Len(), "nothing added")
	b.Reset()
	require.NoError(t, b.AddFile(f, 5, 0), "an empty region is fine")
	assert.Zero(t, b.Len())
	b.AddBytes([]byte("x"))
	n, err := b.WriteTo(nil) // panicked
	require.Error(t, err)
	assert.Zero(t, n)
	b.Reset()
	_, err = b.WriteTo(nil)
	require.Error(t, err, "an empty Builder too")
	b.AddBytes([]byte("x"))
	var typedNil *bytes.Buffer
	_, err = b.WriteTo(typedNil) // panicked
	require.Error(t, err, "a nil pointer as the writer")
}

// readerAtFunc is a function type implementing io.ReaderAt.
type readerAtFunc func(p []byte, off int64) (int, error)

func (f readerAtFunc) ReadAt(p []byte, off int64) (int, error) { return f(p, off) }

// failingReaderAt returns err once a read reaches offset failAt.
type failingReaderAt struct {
	data   []byte
	failAt int64
	err    error
}

func (r failingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) <= r.failAt {
		return copy(p, r.data[off:]), nil
	}
	n := 0
	if off < r.failAt {
		n = copy(p, r.data[off:r.failAt])
	}
	return n, r.err
}

// failingWriter accepts limit bytes, then fails; with short set it reports
// a short write without an error instead.
type failingWriter struct {
	buf   bytes.Buffer
	limit int
	short bool
}

var errWriterBroken = errors.New("writer broken")

func (w *failingWriter) Write(p []byte) (int, error) {
	room := w.limit - w.buf.Len()
	if len(p) <= room {
		return w.buf.Write(p)
	}
	w.buf.Write(p[:room])
	if w.short {
		return room, nil
	}
	return room, errWriterBroken
}

func TestPlainWriterErrors(t *testing.T) {
	data := randomBytes(10_000, 4)
	head := []byte("0123456789")
	tests := []struct {
		name    string
		src     io.ReaderAt
		w       *failingWriter
		wantErr error
		wantN   int64
	}{
		{"read error", failingReaderAt{data, 500, errWriterBroken}, &failingWriter{limit: 1 << 30}, errWriterBroken, 10 + 400},
		{"short file", failingReaderAt{data, 500, io.EOF}, &failingWriter{limit: 1 << 30}, send.ErrRegionPastEOF, 10 + 400},
		{"write error", bytes.NewReader(data), &failingWriter{limit: 300}, errWriterBroken, 300},
		{"short write", bytes.NewReader(data), &failingWriter{limit: 300, short: true}, send.ErrShortWrite, 300},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b send.Builder
			b.AddBytes(head)
			require.NoError(t, b.AddFile(tt.src, 100, 1000))
			b.AddBytes([]byte("trailer"))
			n, err := b.WriteTo(tt.w)
			require.ErrorIs(t, err, tt.wantErr)
			assert.Equal(t, tt.wantN, n)
			want := append(append([]byte{}, head...), data[100:1100]...)
			assert.Equal(t, want[:n], tt.w.buf.Bytes(), "exactly the first n bytes arrived")
		})
	}
}

// halfConn is a net.Conn wrapper whose Write takes half of what it is given
// and reports no error, breaking io.Writer's contract.
type halfConn struct {
	net.Conn
	buf bytes.Buffer
}

func (c *halfConn) Write(p []byte) (int, error) {
	n := (len(p) + 1) / 2
	c.buf.Write(p[:n])
	return n, nil
}

func TestNetConnWrapperShortWrite(t *testing.T) {
	var b send.Builder
	b.AddBytes([]byte("hello, "))
	b.AddBytes(bytes.Repeat([]byte("world"), 1000))
	c := &halfConn{}
	n, err := b.WriteTo(c)
	require.ErrorIs(t, err, send.ErrShortWrite)
	assert.Less(t, n, b.Len())
	assert.Equal(t, int64(c.buf.Len()), n, "the count is what the writer took")
}

// sliceReaderAt is an io.ReaderAt whose values are not comparable.
type sliceReaderAt []byte

func (r sliceReaderAt) ReadAt(p []byte, off int64) (int, error) {
	return bytes.NewReader(r).ReadAt(p, off)
}

// wrappedReaderAt is a comparable type that can hold an incomparable value.
type wrappedReaderAt struct{ r io.ReaderAt }

func (w wrappedReaderAt) ReadAt(p []byte, off int64) (int, error) { return w.r.ReadAt(p, off) }

func TestAddFileIncomparableSources(t *testing.T) {
	data := randomBytes(1000, 9)
	for name, src := range map[string]io.ReaderAt{
		"slice":            sliceReaderAt(data),
		"struct of slice":  wrappedReaderAt{sliceReaderAt(data)},
		"struct of reader": wrappedReaderAt{bytes.NewReader(data)},
	} {
		t.Run(name, func(t *testing.T) {
			var b send.Builder
			require.NoError(t, b.AddFile(src, 0, 100))
			require.NoError(t, b.AddFile(src, 100, 100), "adjacent regions of one source")
			var out bytes.Buffer
			n, err := b.WriteTo(&out)
			require.NoError(t, err)
			assert.Equal(t, int64(200), n)
			assert.Equal(t, data[:200], out.Bytes())
		})
	}
}

func TestNetPipeFallback(t *testing.T) {
	f, data := tempFile(t, 1<<20, 5)
	c1, c2 := net.Pipe()
	defer c2.Close()
	col := collect(c2, false)
	r := rand.New(rand.NewPCG(7, 7))
	resp := randomResponse(r, 200, f, data, 512<<10)
	var b send.Builder
	resp.add(&b)
	n, err := b.WriteTo(c1)
	require.NoError(t, err)
	require.NoError(t, c1.Close())
	assert.Equal(t, int64(len(resp.want)), n)
	require.True(t, bytes.Equal(resp.want, col.Wait(t)))
	assert.Zero(t, b.Stats().Sendfile)
}

func TestBuffersJoin(t *testing.T) {
	backing := randomBytes(8192, 8)
	f, data := tempFile(t, 8192, 9)
	tests := []struct {
		name   string
		add    func(b *send.Builder)
		want   []byte
		writes int64 // buffers handed to the plain writer
	}{
		{"copied slices", func(b *send.Builder) {
			b.AddBytes(backing[0:10])
			b.AddBytes(backing[100:110])
			b.AddCopy(backing[200:1200])
		}, concat(backing[0:10], backing[100:110], backing[200:1200]), 1},
		{"adjacent referenced slices", func(b *send.Builder) {
			b.AddBytes(backing[0:1000])
			b.AddBytes(backing[1000:3000])
		}, backing[0:3000], 1},
		{"adjacent but capacity capped", func(b *send.Builder) {
			b.AddBytes(backing[0:1000:1500])
			b.AddBytes(backing[1000:3000])
		}, backing[0:3000], 2},
		{"gap between slices", func(b *send.Builder) {
			b.AddBytes(backing[0:1000])
			b.AddBytes(backing[1001:3000])
		}, concat(backing[0:1000], backing[1001:3000]), 2},
		{"adjacent file regions", func(b *send.Builder) {
			require.NoError(t, b.AddFile(f, 0, 100))
			require.NoError(t, b.AddFile(f, 100, 100))
		}, data[0:200], 1},
		{"file regions apart in the response, back to back in the file", func(b *send.Builder) {
			require.NoError(t, b.AddFile(f, 0, 100))
			b.AddBytes(backing[:5])
			require.NoError(t, b.AddFile(f, 100, 100))
		}, concat(data[0:100], backing[:5], data[100:200]), 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b send.Builder
			tt.add(&b)
			var out bytes.Buffer
			n, err := b.WriteTo(&out)
			require.NoError(t, err)
			assert.Equal(t, int64(len(tt.want)), n)
			assert.Equal(t, tt.want, out.Bytes())
			assert.Equal(t, tt.writes, b.Stats().Write)
		})
	}
}

func concat(parts ...[]byte) []byte {
	var p []byte
	for _, q := range parts {
		p = append(p, q...)
	}
	return p
}
