package replication

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/replog/replog/log"
)

// handleFetchPartition answers one partition of a follower's fetch on the
// leader: fencing, divergence, follower tracking, ISR expansion, high
// watermark, and the records (as a file region). budget is what is left
// of the request's MaxBytes; it returns the bytes used. first says no
// partition before this one got records: then its first batch is sent
// whole even if larger than budget (KIP-74), else nothing past budget is.
// Any ISR change is reported through the node's ISR callback.
func (n *Node) handleFetchPartition(req *FetchRequest, fp FetchPartition, budget int64, first bool, now time.Time) (FetchPartitionResponse, int64) {
	resp := FetchPartitionResponse{TopicPartition: fp.TopicPartition, HighWatermark: -1, LogStartOffset: -1, LogEndOffset: -1}
	p := n.partition(fp.TopicPartition)
	if p == nil {
		resp.Error = CodeUnknownPartition
		return resp, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.log
	resp.HighWatermark, resp.LogStartOffset, resp.LogEndOffset = l.HighWatermark(), l.LogStartOffset(), l.LogEndOffset()
	switch {
	case p.role != RoleLeader:
		resp.Error = CodeNotLeader
		return resp, 0
	case fp.CurrentLeaderEpoch < p.epoch:
		resp.Error = CodeFencedLeaderEpoch
		return resp, 0
	case fp.CurrentLeaderEpoch > p.epoch:
		resp.Error = CodeUnknownLeaderEpoch
		return resp, 0
	case !slices.Contains(p.replicas, req.ReplicaID) || req.ReplicaID == n.id:
		resp.Error = CodeNotReplica
		return resp, 0
	}
	if fp.LastFetchedEpoch != log.NoLeaderEpoch {
		e, end := l.EndOffsetForEpoch(fp.LastFetchedEpoch)
		if e < fp.LastFetchedEpoch || end < fp.FetchOffset {
			resp.Diverging = &EpochEndOffset{Epoch: e, EndOffset: end}
			return resp, 0
		}
	}
	if fp.FetchOffset < resp.LogStartOffset || fp.FetchOffset > resp.LogEndOffset {
		resp.Error = CodeOffsetOutOfRange
		return resp, 0
	}
	n.trackFollower(p, req.ReplicaID, fp, now)
	resp.HighWatermark = l.HighWatermark()
	if budget <= 0 && !first || fp.FetchOffset == resp.LogEndOffset {
		return resp, 0
	}
	region, err := l.ReadRegion(fp.FetchOffset, log.ReadOptions{MaxBytes: int(max(budget, 1))})
	if err != nil {
		resp.Error = CodeStorage
		n.logger.Warn("replication: read for fetch failed", "partition", p.tp, "err", err)
		return resp, 0
	}
	if region.Length > budget && !first {
		return resp, 0 // its first batch alone is over what is left
	}
	resp.Region = region
	return resp, region.Length
}

// countServed counts a fetch answer in Stats: the request, and for each
// partition answered without error the fetch and its record bytes.
func (n *Node) countServed(resp *FetchResponse) {
	n.stats.fetches.Add(1)
	n.mu.RLock()
	defer n.mu.RUnlock()
	for i := range resp.Partitions {
		pr := &resp.Partitions[i]
		p := n.parts[pr.TopicPartition]
		if p == nil || pr.Error != CodeNone || pr.Diverging != nil {
			continue
		}
		n.stats.servedBytes.Add(pr.Region.Length) // before the partition's: see Stats
		p.fetches.Add(1)
		p.fetchBytes.Add(pr.Region.Length)
	}
}

// trackFollower records a follower's fetch offset, then expands the ISR
// and advances the high watermark as it allows. A follower joins the ISR
// once it caught up to the high watermark and to the current epoch's
// start, and its log starts no lower than the leader's (nor past its own
// end, which no log does): its records below the leader's start cannot be
// checked against the leader's epochs (they were deleted), so they may be
// ones the leader never had, which as leader it would serve and answer
// retries from. Callers hold p.mu.
func (n *Node) trackFollower(p *partition, id int32, fp FetchPartition, now time.Time) {
	fetchOffset := fp.FetchOffset
	rs := p.followers[id]
	leo := p.log.LogEndOffset()
	switch {
	case fetchOffset >= leo:
		rs.lastCaughtUp = now
	case fetchOffset >= rs.lastFetchLeaderLEO && !rs.lastFetchTime.IsZero():
		rs.lastCaughtUp = rs.lastFetchTime
	}
	rs.leo, rs.logStart = fetchOffset, fp.LogStartOffset
	rs.lastFetchLeaderLEO, rs.lastFetchTime = leo, now
	if !p.inISR(id) && fetchOffset >= p.log.HighWatermark() && fetchOffset >= p.epochStart &&
		fp.LogStartOffset >= p.log.LogStartOffset() && fp.LogStartOffset <= fetchOffset {
		isr := append(slices.Clone(p.isr), id)
		slices.Sort(isr)
		n.changeISR(p, isr)
		if p.inISR(id) && rs.lastCaughtUp.IsZero() {
			// It just caught up to the high watermark: the grace an ISR
			// member has from the role change, else the next Tick drops
			// a follower that joined on its first fetch (in Kafka, the
			// AlterPartition round trip masks this).
			rs.lastCaughtUp = now
		}
	}
	n.maybeAdvanceHW(p, now)
}

// maybeAdvanceHW moves the high watermark to min(log end) over the ISR
// and the followers about to join it (candidateHW), never backwards, not
// while the ISR is smaller than MinInsyncReplicas, and only while this
// node leads: a Produce whose fsync ends after the role changed must not
// move it over what the followers never had. Callers hold p.mu.
func (n *Node) maybeAdvanceHW(p *partition, now time.Time) {
	if p.role != RoleLeader || len(p.isr) < n.cfg.MinInsyncReplicas {
		return
	}
	hw := p.candidateHW(!n.cfg.RelaxedDurability, now, n.cfg.ReplicaLagTime)
	if hw > p.log.HighWatermark() {
		p.log.SetHighWatermark(hw)
		p.hwAdvanced.wake()
	}
}

// changeISR asks the application (OnISRChange) to persist a new ISR and
// applies it once accepted. Callers hold p.mu.
func (n *Node) changeISR(p *partition, isr []int32) {
	if cb := n.cfg.OnISRChange; cb != nil {
		if err := cb(p.tp, p.epoch, slices.Clone(isr)); err != nil {
			n.logger.Warn("replication: ISR change refused", "partition", p.tp, "isr", isr, "err", err)
			return
		}
	}
	p.isr = isr
	n.stats.isrChanges.Add(1)
}

// shrinkISR drops followers that have not caught up within LagTime. A
// follower whose log end is the leader's is caught up whenever it last
// fetched, as in Kafka (Replica.isCaughtUp): on an idle partition its
// fetch may be held, and its next one come, later than LagTime.
// Callers hold p.mu.
func (n *Node) shrinkISR(p *partition, now time.Time) {
	leo := p.log.LogEndOffset()
	isr := p.isr[:0:0]
	for _, id := range p.isr {
		rs := p.followers[id]
		if rs != nil && rs.leo != leo && now.Sub(rs.lastCaughtUp) > n.cfg.ReplicaLagTime {
			continue
		}
		isr = append(isr, id)
	}
	if len(isr) != len(p.isr) {
		n.changeISR(p, isr)
	}
	// Also when the ISR stays: a follower out of it that holds the high
	// watermark (candidateHW) stops holding it once it is no longer
	// caught up.
	n.maybeAdvanceHW(p, now)
}

// appendAsLeader appends a producer's batches; for acks=all it first
// checks the ISR size. It returns the append and whether the caller must
// wait for the high watermark. Acks other than AcksNone, AcksLeader and
// AcksAll append nothing (ErrInvalidAcks).
func (n *Node) appendAsLeader(tp TopicPartition, batches []byte, acks Acks, now time.Time) (log.AppendInfo, *partition, context.Context, error) {
	if acks != AcksNone && acks != AcksLeader && acks != AcksAll {
		return log.AppendInfo{}, nil, nil, fmt.Errorf("%w: %s: acks %d", ErrInvalidAcks, tp, acks)
	}
	p := n.partition(tp)
	if p == nil {
		return log.AppendInfo{}, nil, nil, fmt.Errorf("%w: %s", ErrUnknownPartition, tp)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.role != RoleLeader {
		return log.AppendInfo{}, nil, nil, fmt.Errorf("%w: %s", ErrNotLeader, tp)
	}
	if acks == AcksAll && len(p.isr) < n.cfg.MinInsyncReplicas {
		return log.AppendInfo{}, nil, nil, fmt.Errorf("%w: %s has %d in sync, needs %d", ErrNotEnoughReplicas, tp, len(p.isr), n.cfg.MinInsyncReplicas)
	}
	info, err := p.log.AppendAsLeader(batches, p.epoch)
	if err != nil {
		if errors.Is(err, log.ErrSyncFailed) {
			err = fmt.Errorf("%w: %w", ErrStorage, err)
		}
		return info, nil, nil, err
	}
	n.maybeAdvanceHW(p, now)
	return info, p, p.leadCtx, nil
}

// syncLedLogs fsyncs, before a follower's fetch is answered, the logs of
// the requested partitions this node leads that hold unsynced data, so
// that the leader's own durable end (its part of the high watermark) keeps
// up when producers use acks 0 or 1, which do not fsync. Concurrent
// fetches share fsyncs (the log's group commit). Unless RelaxedDurability.
func (n *Node) syncLedLogs(req *FetchRequest, now time.Time) {
	if n.cfg.RelaxedDurability {
		return
	}
	for _, fp := range req.Partitions {
		if p := n.partition(fp.TopicPartition); p != nil {
			n.syncLeader(p, false, now)
		}
	}
}

// syncAllLed is syncLedLogs for every partition this node leads: the
// Replicator's ticker runs it, so that the high watermark of a partition
// no follower fetches (its ISR is the leader alone) reaches the log end
// of acks 0 or 1 produces within a tick. Unless RelaxedDurability.
func (n *Node) syncAllLed(now time.Time) {
	if n.cfg.RelaxedDurability {
		return
	}
	n.mu.RLock()
	parts := slices.Collect(maps.Values(n.parts))
	n.mu.RUnlock()
	for _, p := range parts {
		n.syncLeader(p, true, now)
	}
}

// syncLeader fsyncs p's log if this node leads it and it holds unsynced
// data, outside p.mu (a fetch or produce of p need not wait for it), then
// advances the high watermark; with always, also when there was nothing
// to fsync (the ticker: the log's own fsyncs, SyncInterval or a roll
// flush, may have made the data durable since the high watermark last
// moved; a fetch advances it anyway when it tracks the follower).
func (n *Node) syncLeader(p *partition, always bool, now time.Time) {
	p.mu.Lock()
	lead := p.role == RoleLeader
	p.mu.Unlock()
	l := p.log
	if !lead || !always && l.DurableOffset() >= l.LogEndOffset() {
		return
	}
	if l.DurableOffset() < l.LogEndOffset() {
		if err := l.Sync(); err != nil {
			n.logger.Warn("replication: leader fsync failed", "partition", p.tp, "err", err)
			return
		}
	}
	p.mu.Lock()
	n.maybeAdvanceHW(p, now)
	p.mu.Unlock()
}
