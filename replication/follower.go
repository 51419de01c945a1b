package replication

import (
	"time"

	"github.com/replog/replog/log"
)

// BuildFetch returns the next fetch request to send to leader, with this
// node's partitions followed there in their fair order (partitions that
// received data last are at the end), or nil if there is none to fetch
// now (none, or all backing off).
func (n *Node) BuildFetch(leader int32, now time.Time) *FetchRequest {
	n.mu.RLock()
	defer n.mu.RUnlock()
	f := n.fetchers[leader]
	if f == nil {
		return nil
	}
	req := &FetchRequest{ClusterID: n.cfg.ClusterID, ReplicaID: n.id, MaxBytes: n.cfg.FetchMaxBytes,
		MaxWaitMs: int32(n.cfg.FetchMaxWait / time.Millisecond)}
	for tp, p := range f.All() {
		p.mu.Lock()
		if p.role == roleFollower && p.leader == leader && !now.Before(p.backoffUntil) {
			// The fetch offset counts toward the leader's high watermark,
			// so unless RelaxedDurability it must be durable: appends made
			// as leader whose Produce has not synced yet, or left by a
			// failed sync, are fsynced first.
			if !n.cfg.RelaxedDurability && p.log.DurableOffset() < p.log.LogEndOffset() {
				if err := p.log.Sync(); err != nil {
					n.logger.Warn("replication: follower sync failed", "partition", tp, "err", err)
					p.backoffUntil = now.Add(n.cfg.FetchBackoff)
					p.mu.Unlock()
					continue
				}
			}
			req.Partitions = append(req.Partitions, FetchPartition{TopicPartition: tp,
				CurrentLeaderEpoch: p.epoch, FetchOffset: p.log.LogEndOffset(), LastFetchedEpoch: lastBatchEpoch(p.log)})
		}
		p.mu.Unlock()
	}
	if len(req.Partitions) == 0 {
		return nil
	}
	return req
}

// lastBatchEpoch is the epoch of l's last batch, or log.NoLeaderEpoch:
// the latest cached epoch that starts below the log end. A node that led
// an epoch without appending to it keeps that epoch's entry at its log
// end; sent as LastFetchedEpoch, the leader (which never had that epoch)
// reports a divergence whose truncation point is the log end, where
// truncation changes nothing, and the follower never makes progress.
func lastBatchEpoch(l *log.Log) int32 {
	leo := l.LogEndOffset()
	epochs := l.LeaderEpochs()
	for i := len(epochs) - 1; i >= 0; i-- {
		if epochs[i].StartOffset < leo {
			return epochs[i].Epoch
		}
	}
	return log.NoLeaderEpoch
}

// HandleFetchResponse applies a leader's answer to req: it truncates
// diverging logs (KIP-101/KIP-279: to the end of the last common epoch,
// never to the high watermark alone), appends the records as follower,
// sets each high watermark to min(leader's, own log end), and moves the
// partitions that got data to the end of the fetch order. Unless
// RelaxedDurability is set, appended logs are fsynced before it returns,
// so the next fetch reports only durable offsets. Records are appended a
// few hundred KiB of whole batches at a time; when an append fails, the
// batches before it stay. It returns the bytes appended.
func (n *Node) HandleFetchResponse(leader int32, req *FetchRequest, resp *FetchResponse, now time.Time) (int64, error) {
	var total int64
	var got []TopicPartition
	var firstErr error
	for i := range resp.Partitions {
		pr := &resp.Partitions[i]
		if i >= len(req.Partitions) || req.Partitions[i].TopicPartition != pr.TopicPartition {
			continue
		}
		p := n.partition(pr.TopicPartition)
		if p == nil {
			continue
		}
		appended, err := n.applyPartition(p, leader, req.Partitions[i], pr, now)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if appended > 0 {
			total += appended
			got = append(got, pr.TopicPartition)
		}
	}
	if len(got) > 0 {
		n.mu.Lock()
		if f := n.fetchers[leader]; f != nil {
			for _, tp := range got {
				f.MoveToEnd(tp)
			}
		}
		n.mu.Unlock()
		n.stats.fetchedBytes.Add(total)
	}
	return total, firstErr
}

// applyPartition handles one partition of a fetch response.
func (n *Node) applyPartition(p *partition, leader int32, fp FetchPartition, pr *FetchPartitionResponse, now time.Time) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.log
	// A response applies to the log the request described: its end and
	// the epoch of its last batch (the two identify the log's contents,
	// as logs with the same epoch at the same end offset are equal). A
	// delayed or repeated response to an earlier request, made before a
	// truncation and refetch that led back to the same end, would
	// otherwise truncate again below what the leader already counted.
	if p.role != roleFollower || p.leader != leader || p.epoch != fp.CurrentLeaderEpoch ||
		l.LogEndOffset() != fp.FetchOffset || lastBatchEpoch(l) != fp.LastFetchedEpoch {
		return 0, nil // stale response
	}
	switch {
	case pr.Error == CodeOffsetOutOfRange:
		return 0, n.resetOutOfRange(p, fp, pr)
	case pr.Error != CodeNone:
		p.backoffUntil = now.Add(n.cfg.FetchBackoff)
		return 0, nil
	case pr.Diverging != nil:
		n.stats.truncations.Add(1)
		return 0, l.TruncateTo(truncationTarget(l, *pr.Diverging))
	}
	records := skipBelow(pr.Records, l.LogEndOffset())
	var appended int64
	if len(records) > 0 {
		for rest := records; len(rest) > 0; {
			var chunk []byte
			chunk, rest = nextAppendChunk(rest, followerAppendChunkBytes)
			if _, err := l.AppendAsFollower(chunk); err != nil {
				// The chunks before stay appended: whole batches of the
				// leader's log, which the next fetch continues after.
				p.backoffUntil = now.Add(n.cfg.FetchBackoff)
				return appended, err
			}
			appended += int64(len(chunk))
		}
		if !n.cfg.RelaxedDurability {
			if err := l.Sync(); err != nil {
				return appended, err
			}
		}
	}
	if pr.HighWatermark >= 0 {
		l.SetHighWatermark(min(pr.HighWatermark, l.LogEndOffset()))
	}
	return appended, nil
}

// resetOutOfRange handles a fetch offset outside the leader's log.
func (n *Node) resetOutOfRange(p *partition, fp FetchPartition, pr *FetchPartitionResponse) error {
	switch {
	case fp.FetchOffset < pr.LogStartOffset:
		return p.log.TruncateFullyAndStartAt(pr.LogStartOffset)
	case pr.LogEndOffset >= 0 && fp.FetchOffset > pr.LogEndOffset:
		n.stats.truncations.Add(1)
		return p.log.TruncateTo(max(pr.LogEndOffset, p.log.LogStartOffset()))
	}
	return nil
}

// truncationTarget is where a follower truncates when the leader reports
// a diverging epoch d: the end of the last epoch both logs share.
func truncationTarget(l *log.Log, d EpochEndOffset) int64 {
	leo := l.LogEndOffset()
	if d.Epoch == log.NoLeaderEpoch || d.EndOffset < 0 {
		return max(min(l.HighWatermark(), leo), l.LogStartOffset())
	}
	fe, fend := l.EndOffsetForEpoch(d.Epoch)
	target := d.EndOffset
	switch {
	case fend < 0:
	case fe == d.Epoch:
		target = min(target, fend)
	default:
		// The follower never had the leader's epoch: cut to the end of its
		// own largest earlier epoch and ask again.
		target = fend
	}
	return max(min(target, leo), l.LogStartOffset())
}

// followerAppendChunkBytes bounds the batches a follower appends at a
// time. The log validates an append (CRC, every record) and then copies it
// to the segment file: in pieces that fit the CPU's cache the copy reads
// what validation just brought in, where one append of a whole response
// (megabytes) reads it from memory twice. Smaller pieces cost a log lock
// round and an index check each.
const followerAppendChunkBytes = 256 << 10

// nextAppendChunk splits records (batches) after the leading batches that
// fit in limit bytes, and at least one. Bytes that do not frame as a batch
// end a chunk, or make one of their own, for the log to refuse.
func nextAppendChunk(records []byte, limit int) (chunk, rest []byte) {
	n := 0
	for n < len(records) {
		b, _, err := log.SplitBatch(records[n:])
		if err != nil {
			if n == 0 {
				return records, nil
			}
			break
		}
		if n > 0 && n+len(b) > limit {
			break
		}
		n += len(b)
	}
	return records[:n], records[n:]
}

// skipBelow drops leading batches that end below offset (a response to a
// fetch that started mid-batch).
func skipBelow(records []byte, offset int64) []byte {
	for len(records) > 0 {
		b, rest, err := log.SplitBatch(records)
		if err != nil || b.NextOffset() > offset {
			return records
		}
		records = rest
	}
	return records
}
