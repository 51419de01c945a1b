// Package replication replicates replog logs between nodes the way Kafka
// does: followers fetch from leaders, the leader keeps the high watermark
// and the in-sync replica set (ISR), and leader epochs keep logs from
// diverging.
//
// The application decides leadership, as Kafka's controller does with
// LeaderAndIsr; this package moves data, tracks the ISR and guarantees
// that logs never diverge. It does not elect leaders.
//
// # Contract with the application
//
//  1. Open one *log.Log per partition and AddPartition it to the node's
//     Replicator (New, with a Transport: NewTCPTransport, or
//     NewMemNetwork in tests). Serve followers' fetches with the
//     Replicator (it is a FetchHandler; NewTCPServer serves it on TCP).
//  2. Tell each node its role per partition with a leader epoch that only
//     grows: BecomeLeader(tp, epoch, replicas, isr) on the leader,
//     BecomeFollower(tp, epoch, leader) on the others. Older epochs are
//     refused (ErrStaleEpoch), older than the newest in the log too, and
//     requests carrying them are fenced. A node knows only the epochs in
//     its log and the roles it had since AddPartition: after
//     RemovePartition and AddPartition, an epoch it followed but holds no
//     batch of is forgotten, so keep the newest epoch in the application's
//     own records too. The replicas must include the
//     leader and number at least MinInsyncReplicas, the ISR must be a
//     subset of them that includes it, and a follower's leader must be
//     another node (else ErrInvalidAssignment).
//  3. Persist ISR changes in OnISRChange (return an error to refuse one)
//     and elect new leaders only from the last persisted ISR. Refuse a
//     change whose epoch is older than the partition's newest leader
//     epoch, recorded before the first BecomeLeader or BecomeFollower at
//     it, as Kafka's controller does: a deposed leader that has not
//     heard of its successor yet still shrinks its ISR, and accepting
//     that would let it count a follower of the new leader as in sync and
//     acknowledge records the new leader never had. The callback runs
//     under the partition's lock: it must not call into the Node or
//     Replicator.
//  4. Produce on the leader with acks 0, 1 or all (other values fail with
//     ErrInvalidAcks). An acks=all produce fails at once with
//     ErrNotEnoughReplicas when the ISR is smaller than
//     MinInsyncReplicas, and otherwise returns once the high watermark
//     passed the batch: it is then on every ISR member, fsynced there
//     unless RelaxedDurability is set. If the ISR shrinks below
//     MinInsyncReplicas meanwhile, the high watermark stops and the
//     produce waits until its context ends: pass a context with a
//     deadline, as Kafka's request timeout. A BecomeLeader at a newer
//     epoch on the node already leading fails the waiting acks=all
//     produces with ErrNotLeader, although their records stay in the log
//     and may still be committed: an idempotent producer's retry is then
//     stored once. With acks 0 or 1 and RelaxedDurability unset, the
//     high watermark passes a batch once the leader's log is fsynced: on
//     the next follower fetch, or by the Replicator's ticker within one
//     tick (a quarter of ReplicaLagTime, between 10 ms and 1 s) when no
//     follower fetches.
//  5. Consumers read a partition's log with log.ReadOptions{
//     UpToHighWatermark: true}: data above the high watermark may still be
//     truncated by a leader change.
//  6. Close the Replicator, then the logs.
//
// What the application may rely on: every record an acks=all produce
// acknowledged stays in the log at its offset across leader changes
// (made from the ISR) and crashes of all but one ISR member; after any
// sequence of leader changes the replicas' logs converge to identical
// batches; a leader's high watermark never decreases while it leads an
// epoch (a node that steps down takes its new leader's, which may be
// lower, as in Kafka) and never passes the smallest log end offset of
// its ISR; an idempotent producer's retried batch is stored once.
//
// # Protocol
//
// A follower's fetch carries, per partition, its current leader epoch,
// its log end offset (the fetch offset) and the epoch of its last batch.
// The leader fences stale epochs, and checks the last fetched epoch
// against its leader-epoch cache: if the follower's log diverges (the
// leader's end for that epoch is below the fetch offset, or it never had
// that epoch) the answer is the diverging epoch and its end offset, and
// the follower truncates to the end of the last epoch both logs share
// (KIP-101, KIP-279, KIP-320), never to its high watermark alone. When
// the leader has no epoch up to the follower's last one, the follower
// truncates to its high watermark, as Kafka does, and below any batch of
// an epoch above the leader's current one (damage: no leader wrote it,
// and a high watermark past it would never get rid of it). A base offset
// damaged in transit (it is outside the CRC) so that offsets still grow
// is stored as a gap, which a follower cannot tell from a compacted
// leader's. Else the
// leader records the follower's offset (which, unless RelaxedDurability,
// the follower fsynced), expands the ISR when the follower caught up to
// the high watermark and the current epoch, advances the high watermark to
// the smallest log end offset in the ISR (not while the ISR is smaller
// than MinInsyncReplicas) and answers with whole batches. As in Kafka,
// the high watermark also waits for a follower out of the ISR that is
// caught up (within ReplicaLagTime) and could join it (its log starts no
// lower than the leader's): else, while producers write, the high
// watermark would always be ahead of such a follower's fetch by the
// appends made since, and it would never join again. A follower that
// has not caught up within ReplicaLagTime leaves the ISR, unless its log
// end is the leader's (as in Kafka: on an idle partition the leader holds
// its fetches). FetchMaxWait must be shorter than ReplicaLagTime.
//
// A follower applies an answer only while its log is still the one the
// request described (role, epoch, log end, last batch's epoch), and only
// to the newest request it built for the partition: once a fetch timed
// out and was sent again, the leader may answer the second from a newer
// state (records deleted since, with the epochs that showed a divergence)
// and count its offset toward the ISR, which a late answer to the first
// must not undo.
//
// The log start follows the leader's, as in Kafka: records the leader
// deleted (retention, or the application's DeleteRecordsBefore) are
// deleted on a follower once its high watermark passes them, so that a
// new leader does not bring back what was deleted. Only committed records
// are deleted: AddPartition calls log.RetainAboveHighWatermark, so that
// retention keeps every segment that ends above the high watermark and
// DeleteRecordsBefore refuses an offset above it (deleting records no
// follower has fetched would let the high watermark, which follows the
// log start, pass them and acknowledge them). A fetch carries the
// follower's log start, and a follower joins the ISR only once its log
// starts no lower than the leader's: the leader deletes the epochs below
// its start with the records, so it cannot check a follower's records
// there, which may be ones it never had (a former leader's uncommitted
// batches); elected, such a follower would serve them and answer a
// producer's retry from them. A replica already in the ISR holds the
// leader's records up to the high watermark, so it still has the deleted
// ones if it becomes leader before it fetched the new start: unlike
// Kafka's DeleteRecords, which waits until every replica's log start has
// moved, DeleteRecordsBefore on the leader's log returns at once. A fetch
// below the leader's log start
// restarts the follower's log empty at it. The leader's start may lie
// inside a batch, which it sends whole: a follower's log that is empty,
// or ends exactly at the leader's start, then restarts at that batch
// (the leader, having deleted the epochs below its start, takes a fetch
// from its start on trust, so a follower's records below it need not be
// the leader's; they are deleted on the leader anyway).
//
// Node is this protocol as a synchronous state machine with the time
// passed in: it never blocks and starts no goroutine, so a test drives
// several nodes step by step from one seed. Replicator wraps it with one
// fetcher goroutine per leader (its partitions kept in a partitionstate
// map, walked in order and moved to the end when they received data, so
// partitions share the response size fairly), long-polled fetch handling
// (a fetch is held at most the leader's own FetchMaxWait, whatever it
// asks), and a ticker for ISR shrinking and, unless RelaxedDurability,
// fsyncing the logs it leads that hold unsynced data (the leader's part
// of the high watermark is its durable end, which acks 0 and 1 do not
// move). After Close, Produce and role changes return ErrClosed and
// change nothing.
//
// # Observing
//
// Stats (Node.Stats, Replicator.Stats) is a snapshot of every hosted
// partition: its role, epoch, leader, offsets and high watermark; on a
// leader the replicas, the ISR, and each follower's log end, lag in
// offsets, last fetch and last catch-up; on a follower its leader's log
// end as of the last response and its lag behind it. Its counters (fetches
// answered and applied, bytes sent and appended, per node and per
// partition, ISR changes, truncations) only grow: a rate is the difference
// between two snapshots over the difference of their At. Changes to the
// ISR are also reported as they happen, through Config.OnISRChange.
//
// # Catching up
//
// Over TCP, a follower's fetcher applies a response larger than 256 KiB
// while it is still arriving (smaller ones are read at once): a receiver
// goroutine reads the frame body into the fetcher's buffer (reused from
// fetch to fetch) in 256 KiB pieces, and the fetcher appends each
// partition's whole batches as soon as they are in, a few hundred KiB at
// a time, so that receiving the rest of the response overlaps appending
// what came. The next fetch is sent only once the whole response was
// applied (and, unless RelaxedDurability, fsynced): a fetch offset is
// always a log end offset the follower reached, as the leader's high
// watermark and ISR require, and the wire format is the same. Every
// append checks again that the response still applies to the log (role,
// epoch, log end), so a role change mid-response ends it. A frame found
// malformed after some of its partitions were applied leaves those
// applied: their batches were validated by the log as any others.
//
// In steady replication over TCP the fetch path allocates nothing: each
// server connection reuses its decoded request, the Replicator's answer
// and the held fetch's timer, and interns topic names; each fetcher reuses
// its request, response buffer and decoded response; a pooled connection
// keeps its context registration from one fetch to the next. Neither
// does an acks=all Produce: waits register a channel they reuse (a held
// fetch its connection's, a Produce one the Replicator lends) and a
// wake sends each a token. A Produce waits on the partition itself,
// taking no lock other partitions share, and a role change waits for its
// partition's lock (a follower holds it across the fsync of what it
// fetched) before it takes the locks all partitions share.
//
// An acks=all Produce returns after four hand-offs between goroutines in
// a row: its append wakes the leader's held fetches of the followers;
// their responses wake each follower's fetcher, whose next fetch, sent
// once the batch is appended, wakes the leader's connection; that fetch
// advances the high watermark, which wakes the producer. Each hand-off
// waits for the Go scheduler to run the woken goroutine, and for a core
// if none is idle. On a 2-core VM, with the leader and both followers in
// one process (BenchmarkProduce, 16 KiB batches), such a wait is 5 to
// 25 µs at the median; the work on the way (the appends, the responses)
// is about half of the median call of about 90 µs, and the 1% slowest
// calls, nearly three times the median, are mostly these waits grown
// long while the cores run other goroutines. The same round trip with
// nothing of replog in it (BenchmarkProduceVsRaw: the writes, reads and
// hand-offs alone) has a 1% slowest of about four fifths of replog's
// there.
//
// # Wire format (TCP transport)
//
// Every message is a frame; integers are big-endian. Frame and record
// sizes are checked against the configured limits (TCPOptions
// MaxFrameBytes, and MaxRequestBytes for requests) before anything is
// allocated. A server closes a connection idle for IdleTimeout between
// requests, or whose request body takes longer than RequestTimeout, and
// with MaxConnections set serves no more connections than that at once.
//
//	offset size  field
//	     0    4  length         bytes after this field
//	     4    2  magic          0x5250 ("RP")
//	     6    1  version        1
//	     7    1  type           1 fetch request, 2 fetch response, 3 error
//	     8    8  correlation id echoed by the response
//	    16    -  body
//
//	string:         u16 length | bytes
//	fetch request:  string clusterId | i32 replicaId | i32 maxBytes |
//	                i32 maxWaitMs | u32 count | count x (string topic |
//	                i32 partition | i32 currentLeaderEpoch |
//	                i64 fetchOffset | i32 lastFetchedEpoch |
//	                i64 logStartOffset)
//	fetch response: u32 count | count x (string topic | i32 partition |
//	                i16 error | i64 highWatermark | i64 logStartOffset |
//	                i64 logEndOffset | i8 diverging (0/1) |
//	                i32 divergingEpoch | i64 divergingEndOffset |
//	                (both -1 when diverging is 0)
//	                u32 recordsLength | records)
//	error:          string message
//
// A response's records are written from the segment files with
// send.Builder (sendfile for large regions, one writev for the headers).
//
// A request's cluster id and replica id are taken on trust: whoever can
// reach a TCPServer can fetch as any replica and move the high watermark
// with the log end it reports (see TCPOptions.TLSConfig for requiring
// client certificates).
//
// # Concurrency
//
// Node and Replicator are safe for concurrent use. MemNetwork is safe for
// concurrent use.
package replication
