package broker

import (
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
			case recordsErrorCode(req.Version, tp.Records) != errNone:
				rp.ErrorCode = recordsErrorCode(req.Version, tp.Records)
				continue
			case hasTransactionBatch(tp.Records):
				// Transaction markers are the coordinator's to write (Kafka:
				// "Clients are not allowed to write control records"); a
				// forged one would fence any producer id. A transactional
				// batch would open a transaction nothing ends.
				rp.ErrorCode = errInvalidRecord
				continue
			}
			info, err := p.log.AppendAsLeader(tp.Records, leaderEpoch)
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

// recordsErrorCode checks what Kafka's ProduceRequest.validateRecords does
// before any append: from Produce v3 on, a partition's records are exactly
// one batch of magic 2 (INVALID_RECORD otherwise, which a client does not
// retry), and zstd needs Produce v7 (UNSUPPORTED_COMPRESSION_TYPE).
// Framing that does not hold together is CORRUPT_MESSAGE, as the log
// reports it; the CRC and the records are AppendAsLeader's to check.
func recordsErrorCode(version int16, records []byte) int16 {
	if len(records) == 0 {
		return errInvalidRecord
	}
	if len(records) > magicOffset && int8(records[magicOffset]) != replog.MagicV2 {
		return errInvalidRecord
	}
	batch, rest, err := replog.SplitBatch(records)
	switch {
	case err != nil:
		return errCorruptMessage
	case len(rest) > 0:
		return errInvalidRecord
	case compression.Codec(batch.CodecID()) == compression.Zstd && version < 7:
		return errUnsupportedCompressionType
	}
	return errNone
}

// magicOffset is where a record batch holds its magic byte.
const magicOffset = 16
