//go:build linux

package send_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/replog/replog/send"
)

// bigBuffers gives the pair socket buffers large enough that every test
// response fits at once, so no write is ever partial.
func bigBuffers(tb testing.TB, network string) (*collector, func() []byte, *send.Builder, func(*send.Builder) (int64, error)) {
	tb.Helper()
	client, server := connPair(tb, network)
	setBuffers(tb, client, server, 4<<20, 4<<20)
	col := collect(server, false)
	finish := func() []byte {
		closeWrite(tb, client)
		return col.Wait(tb)
	}
	return col, finish, nil, func(b *send.Builder) (int64, error) { return b.WriteTo(client) }
}

func TestWritevCallCount(t *testing.T) {
	const iovMax = 1024
	for _, network := range networks {
		for _, slices := range []int{1, 2, iovMax - 1, iovMax, iovMax + 1, 3000} {
			t.Run(network+"/slices="+itoa(slices), func(t *testing.T) {
				_, finish, _, write := bigBuffers(t, network)
				// Slices of one array with gaps between them: never adjacent,
				// so each one is its own iovec.
				backing := randomBytes(slices*32, uint64(slices))
				b := send.NewBuilder(send.Options{CopyThreshold: -1})
				var want []byte
				for i := range slices {
					p := backing[i*32 : i*32+16]
					b.AddBytes(p)
					want = append(want, p...)
				}
				n, err := write(b)
				require.NoError(t, err)
				require.Equal(t, int64(len(want)), n)
				require.Equal(t, want, finish())

				st := b.Stats()
				assert.Equal(t, int64((slices+iovMax-1)/iovMax), st.Writev, "ceil(N/IOV_MAX) writev calls")
				assert.Zero(t, st.EAGAIN)
				assert.Zero(t, st.Sendfile+st.Write)
			})
		}
	}
}

func TestFileRegionStrategy(t *testing.T) {
	fx := newFetchFixture(t, 1000, 60, 1024)
	tests := []struct {
		name                     string
		opts                     send.Options
		fromFile                 bool
		writev, sendfile, preads int64
	}{
		// 2,000 buffers: two writev calls; the 1 KiB regions lie back to
		// back in the file, so each batch reads them with one pread.
		{"memory", send.Options{}, false, 2, 0, 0},
		{"file/small-regions-read", send.Options{}, true, 2, 0, 2},
		// One sendfile per region, and each header alone in a writev.
		{"file/all-sendfile", send.Options{ReadThreshold: -1}, true, 1000, 1000, 0},
		// A read buffer of 64 KiB: 16 batches of (header, region) pairs.
		{"file/small-read-buffer", send.Options{MaxReadBuffer: 64 << 10}, true, 16, 0, 16},
	}
	for _, network := range networks {
		for _, tt := range tests {
			t.Run(network+"/"+tt.name, func(t *testing.T) {
				_, finish, _, write := bigBuffers(t, network)
				b := send.NewBuilder(tt.opts)
				fx.build(t, b, tt.fromFile)
				n, err := write(b)
				require.NoError(t, err)
				require.Equal(t, fx.size(), n)
				got := finish()
				var want []byte
				for i := range fx.headers {
					want = append(append(want, fx.headers[i]...), fx.records[i]...)
				}
				require.True(t, bytes.Equal(want, got))

				st := b.Stats()
				assert.Zero(t, st.EAGAIN)
				assert.Equal(t, tt.writev, st.Writev, "writev calls")
				assert.Equal(t, tt.sendfile, st.Sendfile, "sendfile calls")
				assert.Equal(t, tt.preads, st.Pread, "preads")
			})
		}
	}
}

func TestAdjacentRegionsMerge(t *testing.T) {
	f, data := tempFile(t, 1<<20, 17)
	for _, network := range networks {
		t.Run(network, func(t *testing.T) {
			_, finish, _, write := bigBuffers(t, network)
			var b send.Builder
			// Four adjacent 128 KiB regions: one sendfile of 512 KiB.
			for i := range int64(4) {
				require.NoError(t, b.AddFile(f, 100+i*128<<10, 128<<10))
			}
			n, err := write(&b)
			require.NoError(t, err)
			require.Equal(t, int64(512<<10), n)
			require.True(t, bytes.Equal(data[100:100+512<<10], finish()))
			st := b.Stats()
			assert.Equal(t, int64(1), st.Sendfile)
			assert.Zero(t, st.Writev+st.Pread+st.EAGAIN)
		})
	}
}

func itoa(n int) string {
	return string(appendInt(nil, n))
}

func appendInt(p []byte, n int) []byte {
	if n >= 10 {
		p = appendInt(p, n/10)
	}
	return append(p, byte('0'+n%10))
}

func TestWriteToFile(t *testing.T) {
	f, data := tempFile(t, 1<<20, 18)
	tests := []struct {
		name     string
		flag     int
		sendfile int64 // sendfile calls
		preads   int64
	}{
		// sendfile to a regular file works.
		{"regular", os.O_WRONLY | os.O_CREATE | os.O_TRUNC, 1, 0},
		// The kernel refuses sendfile to an O_APPEND file (EINVAL): the
		// region is read and written with writev instead.
		{"append-refuses-sendfile", os.O_WRONLY | os.O_CREATE | os.O_APPEND, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out")
			out, err := os.OpenFile(path, tt.flag, 0o600)
			require.NoError(t, err)
			defer out.Close()
			var b send.Builder
			b.AddBytes([]byte("head"))
			require.NoError(t, b.AddFile(f, 1000, 512<<10))
			b.AddBytes([]byte("tail"))
			n, err := b.WriteTo(out)
			require.NoError(t, err)
			want := concat([]byte("head"), data[1000:1000+512<<10], []byte("tail"))
			assert.Equal(t, int64(len(want)), n)
			got, err := os.ReadFile(path)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got))
			assert.Equal(t, tt.sendfile, b.Stats().Sendfile)
			assert.Equal(t, tt.preads, b.Stats().Pread)
		})
	}
}
