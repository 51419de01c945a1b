package log

import (
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/replog/replog/internal/vfs"
	"github.com/stretchr/testify/require"
)

func TestCheckpointRoundTrip(t *testing.T) {
	tests := []struct {
		name   string
		fields int
		rows   [][]int64
		text   string
	}{
		{"empty", 1, [][]int64{}, "0\n0\n"},
		{"one offset", 1, [][]int64{{42}}, "0\n1\n42\n"},
		{"pairs", 2, [][]int64{{0, 0}, {3, 100}, {7, 1 << 40}}, "0\n3\n0 0\n3 100\n7 1099511627776\n"},
		{"extremes", 2, [][]int64{{math.MinInt64, math.MaxInt64}, {-1, 0}}, "0\n2\n-9223372036854775808 9223372036854775807\n-1 0\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			enc := EncodeCheckpoint(tt.rows)
			require.Equal(t, tt.text, string(enc))
			got, err := DecodeCheckpoint(enc, tt.fields)
			require.NoError(t, err)
			require.Equal(t, tt.rows, got)
		})
	}
}

func TestDecodeCheckpointRejects(t *testing.T) {
	tests := []struct {
		name   string
		text   string
		fields int
	}{
		{"empty input", "", 1},
		{"missing final newline", "0\n1\n5", 1},
		{"only a version line", "0\n", 1},
		{"bad version", "1\n1\n5\n", 1},
		{"negative version", "-1\n0\n", 1},
		{"version not a number", "v0\n0\n", 1},
		{"count larger than entries", "0\n2\n5\n", 1},
		{"count smaller than entries", "0\n1\n5\n6\n", 1},
		{"negative count", "0\n-1\n", 1},
		{"count not a number", "0\nx\n5\n", 1},
		{"extra field", "0\n1\n5 6\n", 1},
		{"missing field", "0\n1\n5\n", 2},
		{"trailing space", "0\n1\n5 \n", 1},
		{"leading space", "0\n1\n 5\n", 1},
		{"double space", "0\n1\n5  6\n", 2},
		{"not a number", "0\n1\nfive\n", 1},
		{"hex", "0\n1\n0x10\n", 1},
		{"overflow", "0\n1\n9223372036854775808\n", 1},
		{"blank entry line", "0\n1\n\n", 1},
		{"crlf", "0\r\n1\r\n5\r\n", 1},
		{"extra blank line", "0\n1\n5\n\n", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := DecodeCheckpoint([]byte(tt.text), tt.fields)
			require.ErrorIs(t, err, ErrCorrupt)
			require.Nil(t, rows)
		})
	}
}

func TestDecodeCheckpointOversize(t *testing.T) {
	// A valid-looking file just past the limit is refused before parsing.
	var b strings.Builder
	b.WriteString("0\n")
	line := "1234567890123456789\n"
	n := maxCheckpointBytes/len(line) + 1
	b.WriteString(strconv.Itoa(n) + "\n")
	b.WriteString(strings.Repeat(line, n))
	data := []byte(b.String())
	require.Greater(t, len(data), maxCheckpointBytes)
	_, err := DecodeCheckpoint(data, 1)
	require.ErrorIs(t, err, ErrCorrupt)

	// Through the file reader too: the size is checked before reading.
	fs := vfs.NewMem()
	require.NoError(t, fs.MkdirAll("/c", 0o755))
	writeFileFS(t, fs, "/c/big", []byte("0\n1\n5\n"))
	f, err := fs.OpenFile("/c/big", os.O_RDWR, 0)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(maxCheckpointBytes+1))
	require.NoError(t, f.Close())
	_, _, err = readCheckpoint(fs, "/c/big", 1)
	require.ErrorIs(t, err, ErrCorrupt)
}

func TestCheckpointFileAtomicWrite(t *testing.T) {
	fs := vfs.NewMem()
	require.NoError(t, fs.MkdirAll("/c", 0o755))
	require.NoError(t, fs.SyncDir("/"))
	path := "/c/recovery-point"

	_, ok, err := readOffsetCheckpoint(fs, path)
	require.NoError(t, err)
	require.False(t, ok, "a missing checkpoint is not an error")

	require.NoError(t, writeOffsetCheckpoint(fs, path, 17))
	require.NoError(t, writeOffsetCheckpoint(fs, path, 99))
	off, ok, err := readOffsetCheckpoint(fs, path)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(99), off)
	_, err = fs.Stat(path + tmpSuffix)
	require.True(t, os.IsNotExist(err), "no temporary file is left behind")

	// The write is durable: it survives a crash right after it.
	crashed := fs.CrashClone(vfs.CrashOptions{})
	off, ok, err = readOffsetCheckpoint(crashed, path)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(99), off)

	// A corrupt file is an error wrapping ErrCorrupt, not "missing".
	writeFileFS(t, fs, path, []byte("0\n1\n"))
	_, _, err = readOffsetCheckpoint(fs, path)
	require.ErrorIs(t, err, ErrCorrupt)
	// A one-offset checkpoint with two entries is refused.
	writeFileFS(t, fs, path, []byte("0\n2\n1\n2\n"))
	_, _, err = readOffsetCheckpoint(fs, path)
	require.ErrorIs(t, err, ErrCorrupt)
}
