package replication

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/replog/replog/log"
)

// waitMillis is d in whole milliseconds for FetchRequest.MaxWaitMs,
// rounded up (a wait under 1 ms must not become 0, which answers at once
// and turns an idle follower's long poll into a busy loop) and capped at
// MaxInt32.
func waitMillis(d time.Duration) int32 {
	return int32(min((d+time.Millisecond-1)/time.Millisecond, math.MaxInt32))
}

// BuildFetch returns the next fetch request to send to leader, with this
// node's partitions followed there in their fair order (partitions that
// received data last are at the end), or nil if there is none to fetch
// now (none, or all backing off).
func (n *Node) BuildFetch(leader int32, now time.Time) *FetchRequest {
	return n.buildFetch(leader, now, &fetchScratch{})
}

// fetchScratch is what a fetcher reuses from one fetch to the next, so
// that steady replication allocates nothing: the fair order's partitions,
// the request and the response's applier. A request built in it is valid
// until the next buildFetch with it, so it must not be handed to a
// transport that may keep it (as the in-memory one does, to duplicate).
type fetchScratch struct {
	parts   []*partition
	req     FetchRequest
	applier responseApplier
}

// buildFetch is BuildFetch building the request in s.
func (n *Node) buildFetch(leader int32, now time.Time, s *fetchScratch) *FetchRequest {
	s.parts = n.fetchOrder(leader, s.parts[:0])
	parts := s.parts
	defer clear(parts) // keep no partition alive past the fetch
	if len(parts) == 0 {
		return nil
	}
	req := &s.req
	*req = FetchRequest{ClusterID: n.cfg.ClusterID, ReplicaID: n.id, MaxBytes: n.cfg.FetchMaxBytes,
		MaxWaitMs: waitMillis(n.cfg.FetchMaxWait), seq: n.fetchSeq.Add(1), Partitions: req.Partitions[:0]}
	for _, p := range parts {
		tp := p.tp
		p.mu.Lock()
		if p.role == RoleFollower && p.leader == leader && !now.Before(p.backoffUntil) {
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
				CurrentLeaderEpoch: p.epoch, FetchOffset: p.log.LogEndOffset(), LastFetchedEpoch: lastBatchEpoch(p.log),
				LogStartOffset: p.log.LogStartOffset()})
			p.lastFetch = req.seq
		}
		p.mu.Unlock()
	}
	if len(req.Partitions) == 0 {
		return nil
	}
	return req
}

// fetchOrder appends to parts the partitions followed at leader in their
// fair order. It takes n.mu for writing, because a walk of the order moves its
// cursor, and returns before BuildFetch may fsync a log, so that a sync
// never holds up the callers of n.mu (Produce, HandleFetch, role changes).
// The roles are checked again under each partition's lock.
func (n *Node) fetchOrder(leader int32, parts []*partition) []*partition {
	n.mu.Lock()
	defer n.mu.Unlock()
	f := n.fetchers[leader]
	if f == nil {
		return parts
	}
	parts = slices.Grow(parts, f.Len())
	for _, p := range f.All() {
		parts = append(parts, p)
	}
	return parts
}

// lastBatchEpoch is the epoch of l's last batch, or log.NoLeaderEpoch:
// the latest cached epoch that starts below the log end. A node that led
// an epoch without appending to it keeps that epoch's entry at its log
// end; sent as LastFetchedEpoch, the leader (which never had that epoch)
// reports a divergence whose truncation point is the log end, where
// truncation changes nothing, and the follower never makes progress.
func lastBatchEpoch(l *log.Log) int32 { return l.EpochAt(l.LogEndOffset() - 1) }

// HandleFetchResponse applies a leader's answer to req: it truncates
// diverging logs (KIP-101/KIP-279: to the end of the last common epoch,
// never to the high watermark alone), appends the records as follower,
// sets each high watermark to min(leader's, own log end), moves each log
// start up to the leader's where that is below the new high watermark
// (as Kafka's followers do, so records the leader deleted do not come
// back with a new leader), and moves the
// partitions that got data to the end of the fetch order. Unless
// RelaxedDurability is set, appended logs are fsynced before it returns,
// so the next fetch reports only durable offsets. Records are appended a
// few hundred KiB of whole batches at a time; when an append fails, the
// batches before it stay. It returns the bytes appended.
func (n *Node) HandleFetchResponse(leader int32, req *FetchRequest, resp *FetchResponse, now time.Time) (int64, error) {
	if req == nil || resp == nil {
		return 0, fmt.Errorf("%w: no fetch request or response to apply", ErrMalformedFrame)
	}
	a := n.newResponseApplier(leader, req, func() time.Time { return now })
	sinkResponse(resp, a)
	return a.finish(true)
}

// responseApplier applies one fetch response partition by partition, the
// records of each in as many pieces as they arrive in (whole batches):
// HandleFetchResponse gives it a whole response, the TCP fetcher a
// response still being received (fetchStream). The partition lock is
// taken for each step, not across them, so every step checks again that
// the response still applies to the log: no role change, and the log
// still ends where the previous step left it.
type responseApplier struct {
	n      *Node
	leader int32
	req    *FetchRequest
	now    func() time.Time // for backoffs

	// The current partition, while its records are to be appended.
	p        *partition
	active   bool
	fp       FetchPartition // what the log must look like for the next step
	hw       int64          // the leader's high watermark
	start    int64          // the leader's log start offset
	appended int64

	total    int64
	got      []TopicPartition
	firstErr error
	respErr  error // the response's own: it does not answer the request
	answered int   // partitions begun, in the request's order
}

func (n *Node) newResponseApplier(leader int32, req *FetchRequest, now func() time.Time) *responseApplier {
	return &responseApplier{n: n, leader: leader, req: req, now: now}
}

// reset readies a for the answer to req, keeping the array of got.
func (a *responseApplier) reset(n *Node, leader int32, req *FetchRequest, now func() time.Time) {
	*a = responseApplier{n: n, leader: leader, req: req, now: now, got: a.got[:0]}
}

// fail records err, the failure of p's log, and backs p off: the fetcher
// goes on fetching the leader's other partitions at once (a partition
// whose log keeps failing, first in the fair order since it gets no data,
// would otherwise hold them all back). Callers hold p.mu.
func (a *responseApplier) fail(p *partition, err error) {
	if err == nil {
		return
	}
	p.backoffUntil = a.now().Add(a.n.cfg.FetchBackoff)
	if a.firstErr == nil {
		a.firstErr = err
	}
}

// malformed records err, a response that does not answer the request as
// a leader would, as the response's error: the fetcher backs off, as for
// a failed fetch (the partition it concerns may be none of the request's).
func (a *responseApplier) malformed(err error) {
	if a.respErr == nil {
		a.respErr = fmt.Errorf("%w: %w", ErrMalformedFrame, err)
	}
}

// beginPartition handles the header of the response's i-th partition (its
// Records are ignored: records follows): errors, divergence, staleness.
// A leader answers every partition of a request, in its order; a response
// that does not is malformed.
func (a *responseApplier) beginPartition(i int, pr *FetchPartitionResponse) {
	a.p, a.active, a.appended = nil, false, 0
	a.answered = i + 1
	if i >= len(a.req.Partitions) || a.req.Partitions[i].TopicPartition != pr.TopicPartition {
		a.malformed(fmt.Errorf("leader %d answered %s in place %d of a fetch of %d partitions", a.leader, pr.TopicPartition, i, len(a.req.Partitions)))
		return
	}
	p := a.n.partition(pr.TopicPartition)
	if p == nil {
		return
	}
	fp := a.req.Partitions[i]
	p.mu.Lock()
	defer p.mu.Unlock()
	if a.stale(p, fp) {
		return
	}
	p.fetches.Add(1)
	if pr.Error == CodeNone || pr.Error == CodeOffsetOutOfRange {
		p.leaderLEO = pr.LogEndOffset // the leader's: others answer with an error
	}
	n, l := a.n, p.log
	switch {
	case pr.Error == CodeOffsetOutOfRange:
		before := [2]int64{l.LogStartOffset(), l.LogEndOffset()}
		a.fail(p, n.resetOutOfRange(p, fp, pr))
		if before == [2]int64{l.LogStartOffset(), l.LogEndOffset()} {
			// Nothing to reset (the leader's log is about to change, or
			// is not what this node expected): ask again later, not at
			// once, which would keep both nodes busy.
			p.backoffUntil = a.now().Add(n.cfg.FetchBackoff)
		}
		return
	case pr.Error == CodeRecordTooLarge:
		a.fail(p, fmt.Errorf("%w: partition %s at offset %d, from leader %d", ErrRecordTooLarge, p.tp, fp.FetchOffset, a.leader))
		return
	case pr.Error != CodeNone:
		p.backoffUntil = a.now().Add(n.cfg.FetchBackoff)
		return
	case pr.Diverging != nil:
		n.stats.truncations.Add(1)
		before := l.LogEndOffset()
		a.fail(p, l.TruncateTo(truncationTarget(l, *pr.Diverging, p.epoch)))
		if l.LogEndOffset() == before {
			// Nothing to cut (a divergence at or past this log's end,
			// which a leader does not report): as above.
			p.backoffUntil = a.now().Add(n.cfg.FetchBackoff)
		}
		return
	}
	a.p, a.active, a.fp, a.hw, a.start = p, true, fp, pr.HighWatermark, pr.LogStartOffset
}

// stale reports whether a response to fp no longer applies to p's log.
// A response applies to the log the request described: its end and the
// epoch of its last batch (the two identify the log's contents, as logs
// with the same epoch at the same end offset are equal). A delayed or
// repeated response to an earlier request, made before a truncation and
// refetch that led back to the same end, would otherwise truncate again
// below what the leader already counted. And only to the newest request
// for the partition: the leader may have answered a newer one, sent when
// the older timed out, from a newer state (records deleted since, the
// epochs that showed a divergence with them) and counted its offset
// toward the ISR; the older answer would then truncate the follower
// below that. Callers hold p.mu.
func (a *responseApplier) stale(p *partition, fp FetchPartition) bool {
	l := p.log
	superseded := a.req.seq != 0 && a.req.seq != p.lastFetch
	return p.role != RoleFollower || p.leader != a.leader || p.epoch != fp.CurrentLeaderEpoch || superseded ||
		l.LogEndOffset() != fp.FetchOffset || lastBatchEpoch(l) != fp.LastFetchedEpoch
}

// records appends the next records of the current partition: whole
// batches, continuing the previous ones.
func (a *responseApplier) records(records []byte) {
	if !a.active || len(records) == 0 {
		return
	}
	p := a.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if a.stale(p, a.fp) {
		a.active = false
		return
	}
	l := p.log
	rest := skipBelow(records, l.LogEndOffset())
	if len(rest) == 0 {
		// A leader answers from the batch holding the fetch offset.
		a.fail(p, fmt.Errorf("%w: leader %d sent %s records that end below the fetch offset %d", ErrMalformedFrame, a.leader, p.tp, l.LogEndOffset()))
		a.active = false
		return
	}
	rest, aboveErr := cutAboveEpoch(rest, a.fp.CurrentLeaderEpoch)
	if err := startAtFirstBatch(l, rest, a.start); err != nil {
		a.fail(p, err)
		a.active = false
		return
	}
	for len(rest) > 0 {
		var chunk []byte
		chunk, rest = nextAppendChunk(rest, followerAppendChunkBytes)
		if _, err := l.AppendAsFollower(chunk); err != nil {
			// The chunks before stay appended: whole batches of the
			// leader's log, which the next fetch continues after.
			a.fail(p, err)
			a.active = false
			break
		}
		a.appended += int64(len(chunk))
		p.fetchBytes.Add(int64(len(chunk)))
	}
	if aboveErr != nil && a.active {
		a.fail(p, fmt.Errorf("%w: leader %d sent %s: %w", ErrMalformedFrame, a.leader, p.tp, aboveErr))
		a.active = false
	}
	a.fp.FetchOffset, a.fp.LastFetchedEpoch = l.LogEndOffset(), lastBatchEpoch(l)
}

// cutAboveEpoch returns the leading batches of records whose leader epoch
// is at most epoch, and an error if it cut any. The leader of epoch
// answers only at that epoch (it fences fetches at others), and no batch
// it holds is of a later one: a later epoch is damage (the epoch lies
// outside the CRC), which, appended, would make this log refuse to lead
// any epoch up to it. Bytes that do not frame as a batch are kept, for
// the log to refuse.
func cutAboveEpoch(records []byte, epoch int32) ([]byte, error) {
	for rest := records; len(rest) > 0; {
		b, r, err := log.SplitBatch(rest)
		if err != nil {
			return records, nil
		}
		if e := b.LeaderEpoch(); e > epoch {
			return records[:len(records)-len(rest)], fmt.Errorf("a batch at offset %d of leader epoch %d, above the leader's %d", b.BaseOffset(), e, epoch)
		}
		rest = r
	}
	return records, nil
}

// endPartition finishes the current partition: fsync (unless
// RelaxedDurability), high watermark and log start.
func (a *responseApplier) endPartition() {
	appended := a.appended
	a.countAppended()
	if !a.active {
		return
	}
	p := a.p
	a.active = false
	p.mu.Lock()
	defer p.mu.Unlock()
	if a.stale(p, a.fp) {
		return
	}
	l := p.log
	if appended > 0 && !a.n.cfg.RelaxedDurability {
		if err := l.Sync(); err != nil {
			a.fail(p, err)
			return
		}
	}
	if a.hw >= 0 {
		l.SetHighWatermark(min(a.hw, l.LogEndOffset()))
	}
	if a.start > l.LogStartOffset() && a.start <= l.HighWatermark() {
		// Records the leader deleted (retention, DeleteRecordsBefore)
		// go here too, durably; only committed ones, which this log
		// holds as the leader does.
		a.fail(p, l.DeleteRecordsBefore(a.start))
	}
}

// countAppended adds the current partition's appended bytes to the
// response's, once.
func (a *responseApplier) countAppended() {
	if a.appended > 0 {
		a.total += a.appended
		a.got = append(a.got, a.p.tp)
		a.appended = 0
	}
}

// finish moves the partitions that got data to the end of the fetch
// order and returns the bytes appended and the first error: the
// response's own (respErr) or else the first partition's. complete says
// the whole response arrived: only then does it count as a response
// applied in Stats (a streamed one may fail after part of it was
// applied, whose bytes count).
func (a *responseApplier) finish(complete bool) (int64, error) {
	a.countAppended() // a partition whose records were cut short
	if complete && a.answered < len(a.req.Partitions) {
		a.malformed(fmt.Errorf("leader %d answered %d of the %d partitions fetched", a.leader, a.answered, len(a.req.Partitions)))
	}
	n := a.n
	if complete {
		n.stats.responses.Add(1)
	}
	if len(a.got) > 0 {
		n.mu.Lock()
		if f := n.fetchers[a.leader]; f != nil {
			for _, tp := range a.got {
				f.MoveToEnd(tp)
			}
		}
		n.mu.Unlock()
		n.stats.fetchedBytes.Add(a.total)
	}
	if a.respErr != nil {
		return a.total, a.respErr
	}
	return a.total, a.firstErr
}

// resetOutOfRange handles a fetch offset outside the leader's log: below
// its start, the log restarts empty there; past its end, the log is cut
// back to the leader's end, or, when that is below this log's start (so
// none of this log's records are the leader's), restarts empty at it, as
// Kafka's truncateFullyAndStartAt does. Keeping a start above the leader's
// end would take the leader's later records there on trust, without the
// ones below.
func (n *Node) resetOutOfRange(p *partition, fp FetchPartition, pr *FetchPartitionResponse) error {
	switch {
	case fp.FetchOffset < pr.LogStartOffset:
		n.stats.truncations.Add(1)
		return p.log.TruncateFullyAndStartAt(pr.LogStartOffset)
	case pr.LogEndOffset >= 0 && fp.FetchOffset > pr.LogEndOffset:
		n.stats.truncations.Add(1)
		if pr.LogEndOffset < p.log.LogStartOffset() {
			return p.log.TruncateFullyAndStartAt(max(pr.LogEndOffset, pr.LogStartOffset))
		}
		return p.log.TruncateTo(pr.LogEndOffset)
	}
	return nil
}

// truncationTarget is where a follower following at epoch current
// truncates when the leader reports a diverging epoch d: the end of the
// last epoch both logs share.
func truncationTarget(l *log.Log, d EpochEndOffset, current int32) int64 {
	leo := l.LogEndOffset()
	if d.Epoch == log.NoLeaderEpoch || d.EndOffset < 0 {
		// The leader has no epoch up to the follower's last one: back to
		// the high watermark, as in Kafka, and below any batch of an epoch
		// above current, which no leader wrote (roles at older epochs
		// than the log's are refused), so it is damage, and truncating
		// only to a high watermark past it would ask again forever.
		target := min(l.HighWatermark(), leo)
		if l.LatestEpoch() > current {
			if _, end := l.EndOffsetForEpoch(current); end >= 0 {
				target = min(target, end)
			}
		}
		return max(target, l.LogStartOffset())
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
// end a chunk, or make one of their own, for the log to refuse. A batch
// whose offsets lie more than 2^31 past the chunk's first starts a chunk
// of its own: the log appends a call's batches to one segment, whose
// relative offsets are int32.
func nextAppendChunk(records []byte, limit int) (chunk, rest []byte) {
	n := 0
	var base int64
	for n < len(records) {
		b, _, err := log.SplitBatch(records[n:])
		if err != nil {
			if n == 0 {
				return records, nil
			}
			break
		}
		if n == 0 {
			base = b.BaseOffset()
		} else if n+len(b) > limit || b.LastOffset()-base > math.MaxInt32 {
			break
		}
		n += len(b)
	}
	return records[:n], records[n:]
}

// startAtFirstBatch restarts the log at the base offset of the first of
// records when that batch holds the log end offset, and the log is empty
// or ends at leaderStart, the leader's log start. The leader's start may
// lie inside a batch (DeleteRecordsBefore), which it sends whole from the
// batch's base. A follower's log ends there when an out-of-range fetch
// restarted it empty at the leader's start (Kafka's follower then
// restarts too), or when its records below the leader's start are not the
// leader's: the leader cannot check epochs it deleted, and takes a fetch
// from its start on trust. Those records are deleted on the leader. The
// log start then moves up to the leader's once the high watermark passes
// it. A leader answers a fetch below its start with OffsetOutOfRange, not
// records: a non-empty log that ends below leaderStart is left as it is
// (the log refuses the batch), since restarting it would delete records
// the leader may never have deleted, committed ones among them.
func startAtFirstBatch(l *log.Log, records []byte, leaderStart int64) error {
	b, _, err := log.SplitBatch(records)
	end := l.LogEndOffset()
	if err != nil || b.BaseOffset() >= end || b.NextOffset() <= end || end != l.LogStartOffset() && end != leaderStart {
		return nil
	}
	return l.TruncateFullyAndStartAt(b.BaseOffset())
}

// skipBelow drops leading batches that end below offset (a response to a
// fetch that started mid-batch), if the batch after them holds offset or
// they are all there is: when it starts past offset, the leading ones are
// no batches of the leader's below offset but damaged ones (a leader
// answers from the batch holding the fetch offset), and skipping them
// would leave a gap where the leader has records. They are kept, for the
// log to refuse.
func skipBelow(records []byte, offset int64) []byte {
	rest := records
	for len(rest) > 0 {
		b, r, err := log.SplitBatch(rest)
		if err != nil {
			return records
		}
		if b.NextOffset() > offset {
			if b.BaseOffset() > offset && len(rest) < len(records) {
				return records
			}
			return rest
		}
		rest = r
	}
	return rest
}
