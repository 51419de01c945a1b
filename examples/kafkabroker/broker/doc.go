// Package broker is a single-node Kafka broker on top of replog: unmodified
// Kafka clients produce to it and consume from it.
//
// Every topic-partition is a replog Log kept by one log.Manager and named
// "topic-partition", as in Kafka. Produced record batches are validated by
// the log and stored byte for byte as the client sent them, with only their
// base offset and partition leader epoch stamped. Fetch responses are written
// with package send: the encoded headers go out from memory and the record
// batches straight from the segment files.
//
// # Data directory
//
//	<data>/topics/orders-0/...          one replog Log per partition (log.Manager)
//	<data>/topics/orders-1/...
//	<data>/consumer-offsets/...         committed offsets, a replog Log replayed at start
//	<data>/producer-id-block            checkpoint: producer ids below it were handed out
//
// # APIs
//
// Versions are those below each API's first "flexible" version, so no tagged
// fields are ever parsed or written. A request for a version outside the ranges
// below (or for another API) closes the connection, except ApiVersions, which
// answers a too-new request with a version 0 UNSUPPORTED_VERSION response so
// that the client retries with a version listed there.
//
//	key  API               versions
//	  0  Produce           3-8   acks 0 (no response), 1, -1 (also fsyncs)
//	  1  Fetch             4-11  long poll; at least one whole batch
//	  2  ListOffsets       1-5   -2 earliest, -1 latest, or by timestamp
//	  3  Metadata          0-8   topics created on demand if allowed
//	  8  OffsetCommit      2-7   stored in a replog Log, fsynced
//	  9  OffsetFetch       1-5
//	 10  FindCoordinator   0-2   this node, for groups
//	 11  JoinGroup         0-5
//	 12  Heartbeat         0-3
//	 13  LeaveGroup        0-3
//	 14  SyncGroup         0-3
//	 18  ApiVersions       0-2
//	 19  CreateTopics      0-4
//	 22  InitProducerId    0-1   idempotent producers only (no transactions)
//
// # Semantics
//
// This is one node: it is the leader of every partition at leader epoch 0,
// and a partition's high watermark is its log end offset once an append
// returns. Idempotent producers are de-duplicated by the log's producer state:
// a retried batch is acknowledged with its original offsets. A produce of a
// control batch (a transaction marker) is refused with INVALID_RECORD, as
// Kafka refuses it from clients. A fetch may exceed its MaxBytes only by the
// first batch of the first partition with records (KIP-74); a later
// partition whose next batch does not fit gets none. Producer ids
// are handed out in blocks whose end is checkpointed before use, so ids are
// never reused across restarts.
//
// The group coordinator runs one generation at a time: a member joining or
// leaving (or missing heartbeats for its session timeout) starts a rebalance,
// which completes when every member has rejoined or the rebalance timeout
// passes; the leader's assignment is handed out by SyncGroup.
//
// # Limits
//
// Requests larger than Config.MaxRequestBytes close the connection before any
// buffer of that size is allocated; a connection idle for Config.IdleTimeout
// is closed. A long-polled fetch waits at most Config.MaxFetchWait (30 s),
// whatever it asks, on one broker-wide notification of high-watermark
// moves, however many partitions it names, and an acks=-1
// produce fsyncs each log once, however many times it names it. No transactions, no ACLs or SASL, no
// replication, no compaction of the committed-offset log (it grows with every
// commit and is replayed whole at start), no static group membership (a
// group instance id is accepted and ignored).
package broker
