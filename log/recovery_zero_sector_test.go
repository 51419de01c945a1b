package log

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestZeroSectorEndingABatch: a crash zeroed the one aligned sector
// that ends a batch written after the last sync, and a later (unsynced)
// batch reached the disk whole. A hole of zeros is what a torn write
// leaves: Open must truncate at the damaged batch, not refuse to open
// as if the damage were in the middle of the log.
func TestZeroSectorEndingABatch(t *testing.T) {
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	a := buildBatch(t, 1, 100, 1000)
	pos := int64(len(a))
	require.Less(t, pos, int64(zeroSector))
	// b spans [pos, 2*zeroSector): its only whole aligned sector is its last.
	want := int(2*zeroSector - pos)
	var b []byte
	for n := 1; n <= 4 && b == nil; n++ {
		for v := 1; v < 1024; v++ {
			if c := buildBatch(t, n, v, 2000); len(c) == want {
				b = c
				break
			}
		}
	}
	require.NotNil(t, b, "no batch of %d bytes", want)
	c := buildBatch(t, 1, 100, 3000)
	for _, x := range [][]byte{a, b, c} {
		_, err := l.Append(x)
		require.NoError(t, err)
	}
	img := crashCopy(t, fs)
	name := "/log/" + segmentName(0) + logSuffix
	data := readFileFS(t, img, name)
	require.Len(t, data, len(a)+len(b)+len(c))
	clear(data[zeroSector : 2*zeroSector])
	writeFileFS(t, img, name, data)

	opts.FS = img
	l2, err := Open("/log", opts)
	require.NoError(t, err, "a zeroed sector is a torn tail, not damage in the middle")
	defer l2.Close()
	require.Equal(t, Batch(a).NextOffset(), l2.LogEndOffset())
}
