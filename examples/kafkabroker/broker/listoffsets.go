package broker

import (
	"github.com/replog/replog/compression"
	replog "github.com/replog/replog/log"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ListOffsets timestamps with a special meaning.
const (
	latestTimestamp   = -1 // the high watermark (the next offset to be produced)
	earliestTimestamp = -2 // the log start offset
)

// decompressors decompress the batch a timestamp lookup lands in.
var decompressors = compression.NewPool(compression.Options{})

func (b *Broker) handleListOffsets(req *kmsg.ListOffsetsRequest) *kmsg.ListOffsetsResponse {
	resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
	for _, t := range req.Topics {
		rt := kmsg.NewListOffsetsResponseTopic()
		rt.Topic = t.Topic
		for _, tp := range t.Partitions {
			rp := kmsg.NewListOffsetsResponseTopicPartition()
			rp.Partition = tp.Partition
			p := b.partition(t.Topic, tp.Partition)
			switch {
			case p == nil:
				rp.ErrorCode = errUnknownTopicOrPartition
			case leaderEpochError(tp.CurrentLeaderEpoch) != errNone:
				rp.ErrorCode = leaderEpochError(tp.CurrentLeaderEpoch)
			default:
				rp.ErrorCode = b.listOffset(p.log, tp.Timestamp, &rp)
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

// listOffset fills rp's offset and timestamp for ts. With no transactions,
// the last stable offset read_committed consumers ask for is the high
// watermark, as for read_uncommitted ones.
func (b *Broker) listOffset(l *replog.Log, ts int64, rp *kmsg.ListOffsetsResponseTopicPartition) int16 {
	rp.LeaderEpoch = leaderEpoch
	switch {
	case ts == latestTimestamp:
		rp.Offset = l.HighWatermark()
		return errNone
	case ts == earliestTimestamp:
		rp.Offset = l.LogStartOffset()
		return errNone
	case ts < 0:
		return errInvalidRequest
	}
	off, ok, err := l.OffsetForTimestamp(ts)
	if err != nil {
		b.log.Error("offset for timestamp", "dir", l.Dir(), "err", err)
		return errStorage
	}
	if !ok || off >= l.HighWatermark() {
		rp.LeaderEpoch = -1
		return errNone // Kafka's "none": offset, timestamp and epoch -1
	}
	// OffsetForTimestamp answers a compressed batch's base offset; look
	// inside the batch for the exact record and its timestamp.
	rp.Offset, rp.Timestamp = off, ts
	batch, err := l.Read(nil, off, replog.ReadOptions{MaxBytes: 1, UpToHighWatermark: true})
	if err != nil || len(batch) == 0 {
		return errNone
	}
	local := decompressors.Get()
	defer decompressors.Put(local)
	var it replog.RecordIterator
	if it.ResetBatch(replog.Batch(batch), local) != nil {
		return errNone
	}
	for it.Next() {
		if r := it.Record(); r.Offset >= off && r.Timestamp >= ts {
			rp.Offset, rp.Timestamp = r.Offset, r.Timestamp
			break
		}
	}
	return errNone
}
