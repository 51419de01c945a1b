package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"time"

	replog "github.com/replog/replog/log"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fetchPart is one partition of a fetch: what was asked and what was found.
type fetchPart struct {
	id       int32
	p        *partition // nil: unknown partition
	offset   int64
	maxBytes int32
	epoch    int32 // the client's current leader epoch

	errCode      int16
	hw, logStart int64
	region       replog.Region // Length 0: no records
	waitFrom     int64         // offset to wait for when long polling
}

type fetchTopic struct {
	name  string
	parts []fetchPart
}

// handleFetch answers a fetch: it reads the requested partitions and, while
// fewer than MinBytes were found, waits for appends until MaxWaitMillis has
// passed (a long poll), at most Config.MaxFetchWait. It writes the response itself,
// with the record batches sent from the segment files (see writeFetch).
func (cc *conn) handleFetch(h header, req *kmsg.FetchRequest) error {
	b := cc.b
	topics := make([]fetchTopic, len(req.Topics))
	for i, t := range req.Topics {
		ft := fetchTopic{name: t.Topic, parts: make([]fetchPart, len(t.Partitions))}
		for j, rp := range t.Partitions {
			ft.parts[j] = fetchPart{
				id:       rp.Partition,
				p:        b.partition(t.Topic, rp.Partition),
				offset:   rp.FetchOffset,
				maxBytes: rp.PartitionMaxBytes,
				epoch:    rp.CurrentLeaderEpoch,
			}
		}
		topics[i] = ft
	}
	maxWait := min(time.Duration(max(req.MaxWaitMillis, 0))*time.Millisecond, b.cfg.MaxFetchWait)
	deadline := time.Now().Add(maxWait)
	for {
		total, failed, more := b.readFetch(topics, int64(req.MaxBytes))
		if failed || more || total >= int64(req.MinBytes) || !time.Now().Before(deadline) {
			break
		}
		if !b.waitForFetch(topics, deadline) {
			return errors.New("broker: closing")
		}
	}
	return cc.writeFetch(h, req.Version, topics)
}

// readFetch finds the records of every partition, within the partition and
// response byte limits, except that the first partition with records gets at
// least one whole batch (KIP-74). It returns the bytes found, whether a
// partition has an error (which ends a long poll at once, as in Kafka), and
// whether a partition has committed records past what it read (a read
// stops at a segment's end, or at a limit): waiting for more appends would
// not help, so that also ends a long poll, as Kafka's DelayedFetch
// completes a fetch of an older segment at once.
func (b *Broker) readFetch(topics []fetchTopic, maxBytes int64) (total int64, failed, more bool) {
	remaining := maxBytes
	for i := range topics {
		for j := range topics[i].parts {
			fp := &topics[i].parts[j]
			fp.region = replog.Region{}
			fp.errCode = b.readFetchPart(fp, remaining, total == 0)
			if fp.errCode != errNone {
				failed = true
				continue
			}
			total += fp.region.Length
			remaining -= fp.region.Length
			more = more || fp.region.Length > 0 && fp.region.NextOffset < fp.hw
		}
	}
	return total, failed, more
}

func (b *Broker) readFetchPart(fp *fetchPart, remaining int64, first bool) int16 {
	if fp.p == nil {
		return errUnknownTopicOrPartition
	}
	if code := leaderEpochError(fp.epoch); code != errNone {
		fp.hw, fp.logStart = -1, -1 // as Kafka answers a fenced or unknown epoch
		return code
	}
	l := fp.p.log
	hw := l.HighWatermark()
	fp.hw, fp.logStart, fp.waitFrom = hw, l.LogStartOffset(), hw
	if fp.offset < fp.logStart || fp.offset > l.LogEndOffset() {
		return errOffsetOutOfRange
	}
	limit := min(int64(fp.maxBytes), remaining)
	if fp.offset >= hw || limit <= 0 && !first {
		return errNone // nothing committed there yet, or no room left
	}
	region, err := l.ReadRegion(fp.offset, replog.ReadOptions{MaxBytes: int(max(limit, 1)), UpToHighWatermark: true})
	switch {
	case errors.Is(err, replog.ErrOffsetOutOfRange): // retention moved the start
		return errOffsetOutOfRange
	case err != nil:
		b.log.Error("fetch read", "dir", l.Dir(), "offset", fp.offset, "err", err)
		return errStorage
	}
	fp.hw = max(fp.hw, l.HighWatermark())
	if region.Length > limit && !first {
		return errNone // its first batch alone is over the limits: none this time
	}
	fp.region = region
	return errNone
}

// waitForFetch waits until one of the partitions has records past what the
// last read saw, or deadline passes. It returns false when the broker is
// closing. It starts nothing: it looks again each time any partition's
// high watermark moves.
func (b *Broker) waitForFetch(topics []fetchTopic, deadline time.Time) bool {
	ctx, cancel := context.WithDeadline(b.ctx, deadline)
	defer cancel()
	b.fetchWaits.Add(1)
	defer b.fetchWaits.Add(-1)
	for {
		moved := b.hwMoved.channel()
		if fetchHasNews(topics) {
			return true
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return b.ctx.Err() == nil
		}
	}
}

// fetchHasNews reports whether a partition's high watermark passed where
// the last read of it stopped.
func fetchHasNews(topics []fetchTopic) bool {
	for i := range topics {
		for _, fp := range topics[i].parts {
			if fp.p != nil && fp.p.log.HighWatermark() > fp.waitFrom {
				return true
			}
		}
	}
	return false
}

// writeFetch encodes a fetch response (v4-v11) and sends it with the
// connection's send.Builder: the encoded header runs from memory, each
// partition's record batches from its segment file region, read at write
// time (the Manager's cached files have no descriptor for sendfile).
//
//	size i32 | correlation i32 | throttle i32 | [v7+ error i16 | session i32]
//	topics i32 | per topic: name str | partitions i32 | per partition:
//	  partition i32 | error i16 | high watermark i64 | last stable i64 |
//	  [v5+ log start i64] | aborted txns i32 (-1) | [v11+ preferred replica i32] |
//	  records length i32 | record batches (from the segment file)
func (cc *conn) writeFetch(h header, version int16, topics []fetchTopic) error {
	be := binary.BigEndian
	hdr := append(cc.resp[:0], 0, 0, 0, 0) // size, set below
	hdr = be.AppendUint32(hdr, uint32(h.correlation))
	hdr = be.AppendUint32(hdr, 0) // throttle
	if version >= 7 {
		hdr = be.AppendUint16(hdr, 0) // error
		hdr = be.AppendUint32(hdr, 0) // session id: no fetch sessions
	}
	hdr = be.AppendUint32(hdr, uint32(len(topics)))
	// cuts[i] is where region i goes in the header bytes.
	var cuts []int
	var regions []replog.Region
	var recordBytes int64
	for _, t := range topics {
		hdr = be.AppendUint16(hdr, uint16(len(t.name)))
		hdr = append(hdr, t.name...)
		hdr = be.AppendUint32(hdr, uint32(len(t.parts)))
		for _, fp := range t.parts {
			hw, lso, start := fp.hw, fp.hw, fp.logStart
			if fp.p == nil {
				hw, lso, start = -1, -1, -1
			}
			hdr = be.AppendUint32(hdr, uint32(fp.id))
			hdr = be.AppendUint16(hdr, uint16(fp.errCode))
			hdr = be.AppendUint64(hdr, uint64(hw))
			hdr = be.AppendUint64(hdr, uint64(lso)) // no transactions: last stable = high watermark
			if version >= 5 {
				hdr = be.AppendUint64(hdr, uint64(start))
			}
			hdr = be.AppendUint32(hdr, 0xffffffff) // aborted transactions: null
			if version >= 11 {
				hdr = be.AppendUint32(hdr, 0xffffffff) // preferred read replica: -1
			}
			hdr = be.AppendUint32(hdr, uint32(fp.region.Length))
			if fp.region.Length > 0 {
				cuts = append(cuts, len(hdr))
				regions = append(regions, fp.region)
				recordBytes += fp.region.Length
			}
		}
	}
	be.PutUint32(hdr, uint32(int64(len(hdr))-4+recordBytes))
	cc.resp = hdr

	bl := cc.builder
	bl.Reset()
	prev := 0
	for i, r := range regions {
		bl.AddCopy(hdr[prev:cuts[i]])
		if err := bl.AddFile(r.File, r.Position, r.Length); err != nil {
			return err
		}
		prev = cuts[i]
	}
	bl.AddCopy(hdr[prev:])
	_ = cc.c.SetWriteDeadline(time.Now().Add(cc.b.cfg.IdleTimeout))
	_, err := bl.WriteTo(cc.c)
	bl.Reset() // drop the file references
	return err
}
