package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/replog/replog/log"
)

// Replicator runs a Node for real: one fetcher goroutine per leader this
// node follows, a ticker that shrinks ISRs (and, unless
// RelaxedDurability, fsyncs the logs it leads that hold unsynced data,
// so that their high watermarks move when no follower fetches),
// long-polled fetch handling for followers, and produce with acks 0, 1
// or all. See the package documentation for the contract with the
// application.
//
// A Replicator is safe for concurrent use. Close stops and waits for every
// goroutine it started.
type Replicator struct {
	node      *Node
	cfg       Config
	transport Transport

	mu     sync.Mutex
	loops  map[int32]chan struct{} // leader id -> kick channel of its fetcher
	closed bool
	// ops counts the calls in progress that change state (Produce,
	// HandleFetch, BecomeLeader, BecomeFollower, AddPartition), begun under mu while not
	// closed: Close waits for them, so that none acts once it returned.
	ops       sync.WaitGroup
	closeDone chan struct{} // closed when the first Close is done

	newData waitBroadcast
	// waitChans lends acks=all Produce calls their hwAdvanced channels.
	waitChans wakeChans
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

// New returns a Replicator for node cfg.ReplicaID that fetches through t.
func New(cfg Config, t Transport) (*Replicator, error) {
	if t == nil {
		return nil, errors.New("replication: New needs a Transport")
	}
	node, err := NewNode(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	// Once Close began, ISR changes are refused before they reach the
	// application: a fetch or tick that passed its closing check may still
	// be waiting for the partition's lock.
	onISR := node.cfg.OnISRChange
	node.cfg.OnISRChange = func(tp TopicPartition, epoch int32, isr []int32) error {
		if ctx.Err() != nil {
			return ErrClosed
		}
		if onISR == nil {
			return nil
		}
		return onISR(tp, epoch, isr)
	}
	r := &Replicator{node: node, cfg: node.cfg, transport: t, loops: map[int32]chan struct{}{}, ctx: ctx, cancel: cancel,
		closeDone: make(chan struct{})}
	r.wg.Add(1)
	go r.tickLoop()
	return r, nil
}

// Node returns the protocol core, for inspection.
func (r *Replicator) Node() *Node { return r.node }

// AddPartition hosts tp, backed by l (see Node.AddPartition). After
// Close it returns ErrClosed and changes nothing.
func (r *Replicator) AddPartition(tp TopicPartition, l *log.Log) error {
	if !r.begin() {
		return ErrClosed
	}
	defer r.ops.Done()
	return r.node.AddPartition(tp, l)
}

// begin starts a call that Close must wait for; it reports false, and
// starts nothing, once Close began. The caller calls r.ops.Done.
func (r *Replicator) begin() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.ops.Add(1)
	return true
}

// RemovePartition stops replicating tp and forgets it. Fetches held for
// it are answered at once (its error: the partition is unknown).
func (r *Replicator) RemovePartition(tp TopicPartition) {
	r.node.RemovePartition(tp)
	r.newData.wake()
}

// BecomeLeader makes this node the leader of tp (see Node.BecomeLeader).
// After Close it returns ErrClosed and changes nothing.
func (r *Replicator) BecomeLeader(tp TopicPartition, epoch int32, replicas, isr []int32) error {
	if !r.begin() {
		return ErrClosed
	}
	defer r.ops.Done()
	if err := r.node.BecomeLeader(tp, epoch, replicas, isr, r.cfg.Now()); err != nil {
		return err
	}
	r.newData.wake()
	return nil
}

// BecomeFollower makes this node follow leader for tp (see
// Node.BecomeFollower) and starts a fetcher for that leader if there is
// none. After Close it returns ErrClosed and changes nothing.
func (r *Replicator) BecomeFollower(tp TopicPartition, epoch, leader int32) error {
	if !r.begin() {
		return ErrClosed
	}
	defer r.ops.Done()
	// Not under r.mu: the node waits for tp's lock, which a follower's
	// fsync may hold long, and every Produce and fetch takes r.mu.
	if err := r.node.BecomeFollower(tp, epoch, leader); err != nil {
		return err
	}
	r.newData.wake() // held fetches of tp are answered: this node no longer leads it
	// tp is in the node's fetcher of leader before r.mu is taken: a loop
	// that retires after this sees it, one that retired before is gone
	// from r.loops.
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil // Close began: it stops the fetchers, and starts none
	}
	if kick, ok := r.loops[leader]; ok {
		select {
		case kick <- struct{}{}:
		default:
		}
		return nil
	}
	kick := make(chan struct{}, 1)
	r.loops[leader] = kick
	r.wg.Add(1)
	go r.fetchLoop(leader, kick)
	return nil
}

// StopPartition drops tp's role while keeping it hosted. Fetches held for
// it are answered at once, with its error (this node does not lead it).
func (r *Replicator) StopPartition(tp TopicPartition) {
	r.node.StopPartition(tp)
	r.newData.wake()
}

// Produce appends batches to tp as its leader. With AcksNone or
// AcksLeader it returns once appended; unless RelaxedDurability, the
// high watermark passes them once the leader's log is fsynced: at the
// next follower fetch, or at the latest at the ticker's next tick (a
// quarter of ReplicaLagTime, between 10 ms and 1 s). With AcksAll it
// fails at once with ErrNotEnoughReplicas when the ISR is below
// MinInsyncReplicas, else returns once the high watermark passed the
// batches (they are then on every in-sync replica, fsynced unless
// RelaxedDurability), with ErrNotLeader if leadership is lost first
// (BecomeLeader at a newer epoch included: the batches may yet be
// committed), ErrClosed if the Replicator is closed first, log.ErrClosed
// if the partition's log is, or ctx's error: while the ISR is below MinInsyncReplicas it waits for ctx, so
// pass a ctx with a deadline. Retries of an idempotent producer's
// batches return the original offsets. Acks other than AcksNone,
// AcksLeader and AcksAll fail with ErrInvalidAcks, and a Produce after
// Close fails with ErrClosed, and one whose ctx already ended with ctx's
// error; none of these appends anything. An append the log
// refuses returns the log's error (log.ErrOutOfOrderSequence,
// log.ErrCorrupt...), wrapped in ErrStorage when the log has failed
// (log.ErrSyncFailed), as is a failed fsync of the leader's log with
// AcksAll, or one a Manager's file cache could not run for want of
// descriptors (the log stays usable then; see log.Log.Sync). A leader's
// log with log.Options.SyncEveryAppend may also return that reopen
// failure itself, after appending the batches (see
// log.Log.AppendAsLeader).
func (r *Replicator) Produce(ctx context.Context, tp TopicPartition, batches []byte, acks Acks) (log.AppendInfo, error) {
	if !r.begin() {
		return log.AppendInfo{}, ErrClosed
	}
	defer r.ops.Done()
	if err := ctx.Err(); err != nil {
		return log.AppendInfo{}, err // appends nothing
	}
	info, p, leadCtx, err := r.node.appendAsLeader(tp, batches, acks, r.cfg.Now())
	if err != nil {
		return info, err
	}
	r.newData.wake()
	if acks != AcksAll {
		return info, nil
	}
	if !r.cfg.RelaxedDurability {
		if err := p.log.Sync(); err != nil {
			return info, fmt.Errorf("%w: %w", ErrStorage, err)
		}
		p.mu.Lock()
		r.node.maybeAdvanceHW(p, r.cfg.Now())
		p.mu.Unlock()
	}
	return info, r.awaitHighWatermark(ctx, tp, p, leadCtx, info.LastOffset)
}

// awaitHighWatermark waits until the high watermark of p, which this node
// leads at leadCtx, passes offset. The high watermark only acknowledges
// the batch while this node still leads the epoch it was appended in:
// once it follows, its high watermark is the new leader's, over records
// that may have replaced the batch. (The leadership ends before the role
// changes, so a follower's high watermark is never seen with leadCtx
// alive.) It selects on the channels themselves, rather than joining them
// into one context for WaitForData: that allocates nothing, and takes no
// lock shared by all the Replicator's partitions (r.ctx's). Its wake
// channel is lent by r.waitChans.
func (r *Replicator) awaitHighWatermark(ctx context.Context, tp TopicPartition, p *partition, leadCtx context.Context, offset int64) error {
	advanced := r.waitChans.get()
	defer func() {
		p.hwAdvanced.remove(advanced)
		r.waitChans.put(advanced)
	}()
	for {
		p.hwAdvanced.add(advanced)
		if p.log.HighWatermark() > offset && leadCtx.Err() == nil {
			return nil
		}
		var closing bool
		select {
		case <-advanced: // the wake unregistered it
			continue
		case <-ctx.Done():
		case <-leadCtx.Done():
		case <-r.ctx.Done():
		case <-p.log.Closing():
			closing = true
		}
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case leadCtx.Err() != nil:
			return fmt.Errorf("%w: %s: leadership changed before the high watermark passed offset %d", ErrNotLeader, tp, offset)
		case r.ctx.Err() != nil:
			return fmt.Errorf("%w: %s: replicator closed before the high watermark passed offset %d", ErrClosed, tp, offset)
		case closing:
			return log.ErrClosed
		}
	}
}

// HandleFetch serves a follower's fetch (FetchHandler), holding it while
// there is nothing to send: up to MaxWaitMs, but never longer than this
// node's own FetchMaxWait, so that a peer cannot pin a connection and its
// goroutine for days. A fetch of no partitions is answered at once. After
// Close it returns ErrClosed and changes nothing.
func (r *Replicator) HandleFetch(ctx context.Context, req *FetchRequest) (*FetchResponse, error) {
	if req == nil {
		return nil, fmt.Errorf("%w: no fetch request", ErrMalformedFrame)
	}
	return r.handleFetchScratch(ctx, req, &serveScratch{})
}

// serveScratch is what a connection lends handleFetchScratch for each
// fetch it serves, so that serving allocates nothing in steady state: the
// response, valid until the connection's next fetch, and the timer and
// wake channel of a held fetch.
type serveScratch struct {
	resp  FetchResponse
	timer *time.Timer
	wake  chan struct{} // registered with newData while the fetch is held
}

// handleFetchScratch is HandleFetch answering in s.resp. It keeps nothing
// of req once it returns: TCPServer reuses both from one request of a
// connection to the next.
func (r *Replicator) handleFetchScratch(ctx context.Context, req *FetchRequest, s *serveScratch) (*FetchResponse, error) {
	if !r.begin() {
		return nil, ErrClosed
	}
	defer r.ops.Done()
	if err := r.holdFetch(ctx, req, s); err != nil {
		return nil, err
	}
	r.node.countServed(&s.resp)
	return &s.resp, nil
}

// holdFetch computes the answer to req in s.resp again each time new data
// arrives, until it has news or the wait is over.
func (r *Replicator) holdFetch(ctx context.Context, req *FetchRequest, s *serveScratch) error {
	wait := min(time.Duration(max(req.MaxWaitMs, 0))*time.Millisecond, r.cfg.FetchMaxWait)
	if len(req.Partitions) == 0 {
		wait = 0
	}
	deadline := time.Now().Add(wait)
	if s.wake == nil {
		s.wake = make(chan struct{}, 1)
	}
	defer r.newData.remove(s.wake)
	for {
		r.newData.add(s.wake)
		r.node.syncLedLogs(req, r.cfg.Now())
		if r.ctx.Err() != nil {
			// Closing: serve nothing, so that no follower is tracked and
			// no ISR change reported once Close began.
			return ErrClosed
		}
		if err := r.node.handleFetch(req, r.cfg.Now(), &s.resp); err != nil || hasNews(&s.resp) {
			return err
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return nil
		}
		if s.timer == nil {
			s.timer = time.NewTimer(wait)
		} else {
			s.timer.Reset(wait) // Go 1.23 timers: no stale tick survives Reset
		}
		select {
		case <-s.wake: // the wake unregistered it
			s.timer.Stop()
		case <-s.timer.C:
			return nil
		case <-ctx.Done():
			s.timer.Stop()
			return nil
		case <-r.ctx.Done():
			s.timer.Stop()
			return ErrClosed
		}
	}
}

// hasNews reports whether a response carries anything a follower acts on.
func hasNews(resp *FetchResponse) bool {
	for _, p := range resp.Partitions {
		if p.Error != CodeNone || p.Diverging != nil || p.Region.Length > 0 || len(p.Records) > 0 {
			return true
		}
	}
	return false
}

// fetchLoop is the fetcher of one leader: it fetches the partitions this
// node follows there, in fair order, until none is left or Close.
func (r *Replicator) fetchLoop(leader int32, kick chan struct{}) {
	defer r.wg.Done()
	backoff := time.NewTimer(0)
	defer backoff.Stop()
	// With a streamingFetcher, responses are applied as they arrive,
	// read into buf, reused since the applier keeps nothing of a
	// response; one that outgrew what a fetch asks for is not kept.
	sf, _ := r.transport.(streamingFetcher)
	var buf []byte
	keepBytes := int(r.cfg.FetchMaxBytes) + 1<<20
	// A streamingFetcher keeps nothing of a request once it returns, so
	// the fetcher reuses one scratch; other transports get a new one.
	var scratch fetchScratch
	for {
		s := &scratch
		if sf == nil {
			s = &fetchScratch{}
		}
		req := r.node.buildFetch(leader, r.cfg.Now(), s)
		if req == nil {
			if r.retireLoop(leader) {
				return
			}
			if !r.sleep(kick, r.cfg.FetchBackoff) {
				return
			}
			continue
		}
		// err is the fetch's (the transport's, or a response that does
		// not answer the request): the fetcher backs off. applyErr is a
		// partition's log failing, or its records refused: that
		// partition backs off alone (responseApplier.fail).
		var err, applyErr error
		a := &s.applier
		a.reset(r.node, leader, req, r.cfg.Now)
		if sf != nil {
			buf, err = sf.fetchStream(r.ctx, leader, req, buf, a)
		} else {
			var resp *FetchResponse
			resp, err = r.transport.Fetch(r.ctx, leader, req)
			if err == nil && resp == nil {
				err = fmt.Errorf("%w: transport %T answered neither a response nor an error", ErrMalformedFrame, r.transport)
			}
			if err == nil && r.ctx.Err() == nil {
				sinkResponse(resp, a)
			}
		}
		_, applyErr = a.finish(err == nil && r.ctx.Err() == nil)
		if err == nil && a.respErr != nil {
			err, applyErr = a.respErr, a.firstErr
		}
		if r.ctx.Err() != nil {
			return
		}
		if cap(buf) > keepBytes {
			buf = nil
		}
		if applyErr != nil {
			r.cfg.Logger.Error("replication: applying a fetch response failed", "leader", leader, "err", applyErr)
		}
		if err != nil {
			r.cfg.Logger.Warn("replication: fetch failed", "leader", leader, "err", err)
			if !r.sleep(kick, r.cfg.FetchBackoff) {
				return
			}
		}
	}
}

// retireLoop ends a fetcher whose leader has no partitions left.
func (r *Replicator) retireLoop(leader int32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range r.node.Leaders() {
		if id == leader {
			return false
		}
	}
	delete(r.loops, leader)
	return true
}

// sleep waits for d, a kick or Close; it returns false on Close.
func (r *Replicator) sleep(kick chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-kick:
	case <-r.ctx.Done():
		return false
	}
	return true
}

func (r *Replicator) tickLoop() {
	defer r.wg.Done()
	interval := min(max(r.cfg.ReplicaLagTime/4, 10*time.Millisecond), time.Second)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			now := r.cfg.Now()
			r.node.Tick(now)
			r.node.syncAllLed(now)
		case <-r.ctx.Done():
			return
		}
	}
}

// Close stops every fetcher and the ticker and waits for them, and for
// the Produce, HandleFetch, BecomeLeader and AddPartition calls in
// progress, which it ends (acks=all waits and held fetches return
// ErrClosed); once it returned, these and BecomeFollower change nothing
// (StopPartition and RemovePartition still drop a partition's role and
// hosting, which stop nothing that runs). A concurrent or
// later Close waits for the first. It does not close the partitions'
// logs, which belong to the application.
func (r *Replicator) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		<-r.closeDone // a concurrent Close waits as the first one does
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.newData.wake()
	r.wg.Wait()
	r.ops.Wait()
	close(r.closeDone)
	return nil
}
