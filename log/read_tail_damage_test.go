package log

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The header after a read's last batch gets the same verdict whether the
// read holds it whole (checked from the bytes read) or ends inside it
// (read from the file): for every damage to that header, with the last
// batch's own base offset damaged or not, the two reads return the same
// batches and the same error, or none.
func TestNextHeaderFromTheBytesReadAgreesWithTheFile(t *testing.T) {
	const last, next = 4, 5
	type dmg struct {
		name string
		f    func(h []byte, lastBase, nextBase int64)
	}
	put64 := func(h []byte, off int, v int64) {
		for i := range 8 {
			h[off+i] = byte(uint64(v) >> (56 - 8*i))
		}
	}
	put32 := func(h []byte, off int, v int32) {
		for i := range 4 {
			h[off+i] = byte(uint32(v) >> (24 - 8*i))
		}
	}
	damages := []dmg{
		{"none", func([]byte, int64, int64) {}},
		{"base overlaps", func(h []byte, lb, _ int64) { put64(h, offBaseOffset, lb) }},
		{"base -1", func(h []byte, _, _ int64) { put64(h, offBaseOffset, -1) }},
		{"base huge", func(h []byte, _, _ int64) { put64(h, offBaseOffset, 1<<40) }},
		{"length huge", func(h []byte, _, _ int64) { put32(h, offLength, 1<<30) }},
		{"length small", func(h []byte, _, _ int64) { put32(h, offLength, 3) }},
		{"length negative", func(h []byte, _, _ int64) { put32(h, offLength, -5) }},
		{"magic", func(h []byte, _, _ int64) { h[offMagic] = 1 }},
		{"delta huge", func(h []byte, _, _ int64) { put32(h, offLastOffsetDelta, 1<<30) }},
		{"delta negative", func(h []byte, _, _ int64) { put32(h, offLastOffsetDelta, -1) }},
		{"epoch", func(h []byte, _, _ int64) { put32(h, offLeaderEpoch, -7) }},
		{"crc", func(h []byte, _, _ int64) { h[offCRC] ^= 0xff }},
		{"overlap+magic", func(h []byte, lb, _ int64) { put64(h, offBaseOffset, lb); h[offMagic] = 0 }},
	}
	for _, shiftLast := range []bool{false, true} {
		for _, d := range damages {
			for _, crc := range []bool{false, true} {
				name := fmt.Sprintf("%s/shiftLast=%v/crc=%v", d.name, shiftLast, crc)
				fs, opts := memLog()
				opts.VerifyReadCRC = crc
				l := openLog(t, "/log", opts)
				want := appendN(t, l, 8, 0)
				if shiftLast {
					setBaseOffset(t, fs, int64(positionOf(want, last)), Batch(want[last]).BaseOffset()+1)
				}
				pos := positionOf(want, next)
				hdr := append([]byte(nil), want[next][:BatchHeaderSize]...)
				d.f(hdr, Batch(want[last]).BaseOffset(), Batch(want[next]).BaseOffset())
				writeSegmentAt(t, fs, int64(pos), hdr)
				type res struct {
					batches int
					err     bool
				}
				var got []res
				for _, tail := range []int{BatchHeaderSize + 40, BatchHeaderSize, BatchHeaderSize - 1, 1} {
					buf, err := l.Read(nil, 0, ReadOptions{MaxBytes: pos + tail})
					n := 0
					for rest := buf; len(rest) > 0; n++ {
						_, rest, _ = SplitBatch(rest)
					}
					got = append(got, res{n, err != nil})
				}
				for i := range got {
					require.Equal(t, got[0], got[i], "%s: read %d disagrees: %+v", name, i, got)
				}
				require.NoError(t, l.Close())
			}
		}
	}
}

// A Reader positioned at the log end (a consumer starting from the
// latest offset, or any Reader after SetOffset) locates the last batch
// from the header the appender remembers, then reads the file's: a base
// offset damaged on disk (outside the CRC) that overlaps the batch before
// must be refused, as Read refuses it (TestReadAtLogEndRefusesADamagedHeader)
// and as the Reader did when it located the batch from the file.
func TestReaderAtLogEndRefusesADamagedHeader(t *testing.T) {
	for _, reopen := range []bool{false, true} {
		fs, opts := memLog()
		l := openLog(t, "/log", opts)
		want := appendN(t, l, 10, 0)
		last := Batch(want[len(want)-1])
		if reopen { // nothing remembered: the header is read from the file
			require.NoError(t, l.Close())
			l = openLog(t, "/log", opts)
		}
		setBaseOffset(t, fs, int64(positionOf(want, len(want)-1)), last.BaseOffset()-1)
		r := l.NewReader(last.BaseOffset(), ReaderOptions{})
		b, err := r.TryNext()
		if err == nil {
			t.Fatalf("reopened %v: the Reader returned a batch at %d, appended at %d", reopen, b.BaseOffset(), last.BaseOffset())
		}
		require.ErrorIs(t, err, ErrCorrupt, "reopened %v", reopen)
		_, err = r.TryNext() // and again: a retry does not read on from there
		require.ErrorIs(t, err, ErrCorrupt, "reopened %v, retried", reopen)
		require.NoError(t, l.Close())
	}
}

// OffsetForTimestamp from a log start inside the last batch locates that
// batch from the header the appender remembers: a base offset damaged on
// disk (outside the CRC) that overlaps the batch before must fail with
// ErrCorrupt, as it does when the batch is located from the file
// (reopened), not give an offset computed from the damaged base.
func TestOffsetForTimestampAtLogEndRefusesADamagedHeader(t *testing.T) {
	for _, reopen := range []bool{true, false} {
		fs, opts := memLog()
		l := openLog(t, "/log", opts)
		want := appendN(t, l, 10, 0)
		last := Batch(want[len(want)-1])
		require.NoError(t, l.DeleteRecordsBefore(last.BaseOffset()+1))
		if reopen {
			require.NoError(t, l.Close())
			l = openLog(t, "/log", opts)
		}
		setBaseOffset(t, fs, int64(positionOf(want, len(want)-1)), last.BaseOffset()-1)
		off, ok, err := l.OffsetForTimestamp(last.MaxTimestamp())
		require.ErrorIs(t, err, ErrCorrupt, "reopened %v: answered %d, %v", reopen, off, ok)
		require.NoError(t, l.Close())
	}
}

// OffsetForTimestamp steps over batches from a time index entry: a base
// offset damaged on disk (outside the CRC) on the way, overlapping the
// batch before, fails with ErrCorrupt rather than giving an offset
// computed from it.
func TestOffsetForTimestampRefusesADamagedBaseOnTheWay(t *testing.T) {
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	want := appendN(t, l, 10, 1000)
	const damaged = 5
	b := Batch(want[damaged])
	setBaseOffset(t, fs, int64(positionOf(want, damaged)), b.BaseOffset()-1)
	off, ok, err := l.OffsetForTimestamp(b.MaxTimestamp())
	require.ErrorIs(t, err, ErrCorrupt, "answered %d, %v", off, ok)
}
