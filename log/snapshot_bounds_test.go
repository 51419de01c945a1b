package log

import (
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/require"
)

// snapshotWithBatches is a snapshot (valid CRC) of one producer that
// claims n cached batches, with the bytes for them present.
func snapshotWithBatches(n int) []byte {
	be := binary.BigEndian
	b := be.AppendUint16(nil, snapshotVersion)
	b = be.AppendUint32(b, 0)
	b = be.AppendUint32(b, 1)
	b = be.AppendUint64(b, 7)    // pid
	b = be.AppendUint16(b, 0)    // epoch
	b = be.AppendUint64(b, 1000) // last timestamp
	b = append(b, byte(n))
	for i := 0; i < n; i++ {
		b = be.AppendUint32(b, uint32(i))
		b = be.AppendUint32(b, uint32(i))
		b = be.AppendUint64(b, uint64(i))
		b = be.AppendUint32(b, 0)
		b = be.AppendUint64(b, 1000)
	}
	be.PutUint32(b[2:], crc32.Checksum(b[6:], castagnoli))
	return b
}

// TestSnapshotTooManyBatches: a snapshot entry claiming more cached
// batches than a producer keeps is corrupt (a typed error), never a
// panic, whether decoded directly or found by Open.
func TestSnapshotTooManyBatches(t *testing.T) {
	ok := snapshotWithBatches(producerBatchesKept)
	n, err := DecodeSnapshot(ok)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	bad := snapshotWithBatches(producerBatchesKept + 1)
	require.NotPanics(t, func() { _, err = DecodeSnapshot(bad) })
	require.ErrorIs(t, err, ErrCorrupt)

	fs := idemMem()
	l := idemOpen(t, fs, Options{})
	idemAppend(t, l, idemBatch(t, 9, 0, 0, 2, 1000))
	leo := l.LogEndOffset()
	require.NoError(t, l.Close())
	writeFileFS(t, fs, l.snapshotPath(leo), bad)
	var l2 *Log
	require.NotPanics(t, func() { l2, err = Open(idemDir, Options{FS: fs, ProducerIDExpiration: neverExpire}) })
	require.NoError(t, err)
	defer l2.Close()
	require.Equal(t, leo, l2.LogEndOffset())
	// The state was rebuilt from the segments: producer 9 continues.
	idemAppend(t, l2, idemBatch(t, 9, 0, 2, 1, 1000))
}
