package broker

import (
	"encoding/binary"
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/replog/replog/compression"
	replog "github.com/replog/replog/log"
)

// handleProduce appends each partition's record batches with
// Log.AppendAsLeader, which validates them (framing, CRC, records, producer
// sequence) and stamps their base offset and leader epoch in place: the bytes
// stored are those the client sent. With acks=-1 the touched logs are also
// fsynced before the answer.
func (b *Broker) handleProduce(req *kmsg.ProduceRequest) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	// acks=-1: the partitions to fsync, each once however many times
	// the request names it, with the answers that wait for it.
	toSync := map[*partition][]*kmsg.ProduceResponseTopicPartition{}
	for _, t := range req.Topics {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = t.Topic
		rt.Partitions = make([]kmsg.ProduceResponseTopicPartition, len(t.Partitions))
		for i, tp := range t.Partitions {
			rp := &rt.Partitions[i]
			rp.Default()
			rp.Partition = tp.Partition
			rp.BaseOffset = -1
			p := b.partition(t.Topic, tp.Partition)
			switch {
			case p == nil:
				rp.ErrorCode = errUnknownTopicOrPartition
				continue
			case req.Acks != 0 && req.Acks != 1 && req.Acks != -1:
				rp.ErrorCode = errInvalidRequiredAcks
				continue
			case req.TransactionID != nil:
				rp.ErrorCode = errInvalidRequest // no transactions here
				continue
			}
			batch, code := partitionBatch(req.Version, tp.Records)
			switch {
			case code != errNone:
				rp.ErrorCode = code
				continue
			case hasTransactionBatch(batch):
				// Transaction markers are the coordinator's to write (Kafka:
				// "Clients are not allowed to write control records"); a
				// forged one would fence any producer id. A transactional
				// batch would open a transaction nothing ends.
				rp.ErrorCode = errInvalidRecord
				continue
			}
			info, err := p.log.AppendAsLeader(batch, leaderEpoch)
			if err != nil {
				rp.ErrorCode = appendErrorCode(err)
				b.log.Debug("produce rejected", "topic", t.Topic, "partition", tp.Partition, "err", err)
				continue
			}
			p.advanceHighWatermark()
			rp.BaseOffset = info.FirstOffset
			rp.LogStartOffset = p.log.LogStartOffset()
			if req.Acks == -1 {
				toSync[p] = append(toSync[p], rp)
			}
		}
		resp.Topics = append(resp.Topics, rt)
	}
	// acks=-1: every in-sync replica (this node) has the data, durably.
	// The logs are fsynced in parallel; each Log shares one fsync among
	// concurrent callers.
	var wg sync.WaitGroup
	for p, answers := range toSync {
		wg.Go(func() {
			if err := p.log.Sync(); err != nil {
				b.log.Error("sync", "dir", p.log.Dir(), "err", err)
				for _, rp := range answers {
					rp.ErrorCode = errStorage
					rp.BaseOffset = -1
				}
			}
		})
	}
	wg.Wait()
	return resp
}

// produceFailed reports whether any partition of resp has an error.
func produceFailed(resp *kmsg.ProduceResponse) bool {
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != errNone {
				return true
			}
		}
	}
	return false
}

// hasTransactionBatch reports whether records holds a control batch (a
// transaction marker) or a transactional one. Bytes that do not split
// into batches are left to AppendAsLeader, which refuses them with a
// precise error.
func hasTransactionBatch(records []byte) bool {
	for rest := records; len(rest) > 0; {
		b, r, err := replog.SplitBatch(rest)
		if err != nil {
			return false
		}
		if b.IsControl() || b.IsTransactional() {
			return true
		}
		rest = r
	}
	return false
}

// partitionBatch is Kafka's ProduceRequest.validateRecords, for Produce v3
// and later, with the batch framing of its ByteBufferLogInputStream: it
// returns the one batch a partition's records must hold, or the code
// refusing them. No whole batch, a batch of magic 0 or 1, or a second
// whole batch is INVALID_RECORD (which a client does not retry); zstd
// before Produce v7 is UNSUPPORTED_COMPRESSION_TYPE; a length or magic no
// batch can have, in the first batch or the next, is CORRUPT_MESSAGE.
// Bytes after the batch that are not a whole batch are dropped, as
// Kafka's append trims them. The CRC and the records are AppendAsLeader's
// to check.
func partitionBatch(version int16, records []byte) ([]byte, int16) {
	size, code := nextBatchSize(records)
	switch {
	case code != errNone:
		return nil, code
	case size == 0:
		return nil, errInvalidRecord
	}
	batch := replog.Batch(records[:size])
	if batch.Magic() != replog.MagicV2 {
		return nil, errInvalidRecord
	}
	if compression.Codec(batch.CodecID()) == compression.Zstd && version < 7 {
		return nil, errUnsupportedCompressionType
	}
	switch next, code := nextBatchSize(records[size:]); {
	case code != errNone:
		return nil, code
	case next > 0:
		return nil, errInvalidRecord
	}
	return batch, errNone
}

// nextBatchSize is the size of the batch b starts with, 0 if b does not
// hold all of it (or too little to tell), or CORRUPT_MESSAGE if its
// length or magic cannot be a batch's (Kafka's nextBatchSize and
// nextBatch: a length under a v0 message's overhead, a magic outside
// 0..2).
func nextBatchSize(b []byte) (int, int16) {
	const (
		lengthEnd   = 12 // base offset and length
		magicOffset = 16
		minLength   = 14 // Kafka's LegacyRecord.RECORD_OVERHEAD_V0
	)
	if len(b) < lengthEnd {
		return 0, errNone
	}
	length := int32(binary.BigEndian.Uint32(b[8:lengthEnd]))
	if length < minLength {
		return 0, errCorruptMessage
	}
	if len(b) <= magicOffset {
		return 0, errNone
	}
	if m := int8(b[magicOffset]); m < 0 || m > replog.MagicV2 {
		return 0, errCorruptMessage
	}
	if size := int64(length) + lengthEnd; size <= int64(len(b)) {
		return int(size), errNone
	}
	return 0, errNone
}
