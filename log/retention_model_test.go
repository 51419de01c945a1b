package log

import (
	"encoding/binary"
	"math/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type retentionModelBatch struct {
	base, last int64
	maxTS      int64
	ts         []int64
	size       int64
}

// Random appends (timestamps out of order), rolls, reopens, TruncateTo,
// DeleteRecordsBefore, high watermark moves and ApplyRetention: each
// ApplyRetention deletes exactly the segments Kafka's three retention
// passes would, the log start never moves back nor past the high
// watermark, and OffsetForTimestamp agrees with a brute-force search.
func TestRetentionFollowsKafkasPasses(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		runRetentionModel(t, seed)
		if t.Failed() {
			return
		}
	}
}

func runRetentionModel(t *testing.T, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	clock := newTestClock()
	_, opts := memLog()
	opts.Now = clock.Now
	opts.SegmentBytes = 1 << 10
	opts.IndexIntervalBytes = 1 + rng.Intn(400)
	opts.RetentionAge = time.Hour
	if rng.Intn(2) == 0 {
		opts.RetentionBytes = int64(1000 + rng.Intn(4000))
	}
	keepHW := rng.Intn(2) == 0
	l, err := Open("/log", opts)
	require.NoError(t, err)
	defer func() { _ = l.Close() }()
	if keepHW {
		l.RetainAboveHighWatermark()
	}
	var model []retentionModelBatch
	now := func() int64 { return clock.Now().UnixMilli() }
	for step := 0; step < 600; step++ {
		switch op := rng.Intn(20); {
		case op < 12:
			n := 1 + rng.Intn(4)
			ts := make([]int64, n)
			for i := range ts {
				ts[i] = now() - int64(rng.Intn(80*60*1000)) + int64(rng.Intn(10*60*1000))
			}
			b := timestampedBatch(t, ts...)
			info, err := l.Append(b)
			require.NoError(t, err)
			mx := ts[0]
			for _, x := range ts {
				mx = max(mx, x)
			}
			model = append(model, retentionModelBatch{info.FirstOffset, info.LastOffset, mx, ts, int64(len(b))})
		case op < 13:
			clock.Advance(time.Duration(rng.Intn(60)) * time.Minute)
		case op < 14:
			require.NoError(t, l.Close())
			l, err = Open("/log", opts)
			require.NoError(t, err)
			if keepHW {
				l.RetainAboveHighWatermark()
			}
		case op < 15:
			if end := l.LogEndOffset(); end > l.LogStartOffset() {
				off := l.LogStartOffset() + rng.Int63n(end-l.LogStartOffset())
				require.NoError(t, l.TruncateTo(off))
				var keep []retentionModelBatch
				for _, b := range model {
					if b.last < l.LogEndOffset() {
						keep = append(keep, b)
					}
				}
				model = keep
			}
		case op < 16:
			l.SetHighWatermark(l.LogEndOffset() - rng.Int63n(3))
		case op < 17:
			lim := l.deletionLimit()
			if lim > l.LogStartOffset() {
				off := l.LogStartOffset() + rng.Int63n(lim-l.LogStartOffset()+1)
				require.NoError(t, l.DeleteRecordsBefore(off))
			}
		default:
			// Expected: Kafka's passes over the segments.
			segs := l.segments()
			hw := l.deletionLimit()
			type sg struct {
				base, next, size, maxTS int64
			}
			var ss []sg
			for i, s := range segs {
				next := l.LogEndOffset()
				if i+1 < len(segs) {
					next = segs[i+1].base
				}
				x := sg{base: s.base, next: next, size: s.size.Load(), maxTS: NoTimestamp}
				for _, b := range model {
					if b.base >= s.base && b.base < next {
						x.maxTS = max(x.maxTS, b.maxTS)
					}
				}
				ss = append(ss, x)
			}
			var total int64
			for _, s := range ss {
				total += s.size
			}
			cutoff := now() - opts.RetentionAge.Milliseconds()
			startBefore := l.LogStartOffset()
			want := 0
			for want+1 < len(ss) && ss[want].next <= hw {
				s := ss[want]
				bySize := opts.RetentionBytes > 0 && total-s.size >= opts.RetentionBytes
				byAge := s.maxTS < cutoff // NoTimestamp: mtime of 2000
				byStart := s.next <= startBefore
				if !bySize && !byAge && !byStart {
					break
				}
				total -= s.size
				want++
			}
			n, err := l.ApplyRetention()
			require.NoError(t, err)
			require.Equal(t, want, n, "seed %d step %d: segments %+v hw %d start %d cutoff %d", seed, step, ss, hw, startBefore, cutoff)
			require.GreaterOrEqual(t, l.LogStartOffset(), startBefore, "log start moved back")
			if keepHW {
				require.LessOrEqual(t, l.LogStartOffset(), max(hw, startBefore))
			}
		}
		// OffsetForTimestamp against brute force.
		start := l.LogStartOffset()
		for k := 0; k < 3; k++ {
			target := now() - int64(rng.Intn(4*3600*1000)) + int64(rng.Intn(700*1000))
			wantOff, wantOK := int64(0), false
		outer:
			for _, b := range model {
				for i, x := range b.ts {
					if off := b.base + int64(i); off >= start && x >= target {
						wantOff, wantOK = off, true
						break outer
					}
				}
			}
			got, ok, err := l.OffsetForTimestamp(target)
			require.NoError(t, err)
			require.Equal(t, wantOK, ok, "seed %d step %d target %d", seed, step, target)
			require.Equal(t, wantOff, got, "seed %d step %d target %d", seed, step, target)
		}
	}
}

// One bit flipped in the timestamp of segment 0's last time index entry
// (the file still validates): every record is years older than
// RetentionAge, so age retention deletes every sealed segment, going by
// segment 0's batch headers; keeping it would keep every later segment
// too, and the log would grow without bound.
func TestAgeRetentionSurvivesADamagedLastTimeIndexEntry(t *testing.T) {
	fs, opts := memLog()
	clock := newTestClock()
	opts.Now = clock.Now
	opts.RetentionAge = time.Hour
	l := openLog(t, "/log", opts)
	appendN(t, l, 100, 1000) // stamped 1970: all far past RetentionAge
	nsegs := len(l.segments())
	require.Greater(t, nsegs, 2)
	seg0 := l.segments()[0]
	require.NoError(t, l.Close())

	name := seg0.path(timeIndexSuffix)
	data := readFileFS(t, fs, name)
	require.GreaterOrEqual(t, len(data), 2*timeEntrySize)
	last := data[len(data)-timeEntrySize:]
	prevTS := int64(binary.BigEndian.Uint64(data[len(data)-2*timeEntrySize:]))
	lastTS := int64(binary.BigEndian.Uint64(last))
	flipped := lastTS & (lastTS - 1)
	require.GreaterOrEqual(t, flipped, prevTS, "the flipped file must still validate")
	binary.BigEndian.PutUint64(last, uint64(flipped))
	writeFileFS(t, fs, name, data)

	l = openLog(t, "/log", opts)
	n, err := l.ApplyRetention()
	require.NoError(t, err)
	require.Equal(t, nsegs-1, n, "segments left %v", segmentBases(l))
}
