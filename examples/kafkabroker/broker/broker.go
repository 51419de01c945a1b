package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	replog "github.com/replog/replog/log"
)

// Defaults for the zero fields of Config.
const (
	DefaultAddr              = "127.0.0.1:9092"
	DefaultPartitions        = 1
	DefaultMaxRequestBytes   = 100 << 20 // Kafka's socket.request.max.bytes
	DefaultMaxPartitionCount = 10_000
	DefaultIdleTimeout       = 10 * time.Minute // Kafka's connections.max.idle.ms
	DefaultMaxFetchWait      = 30 * time.Second // Kafka's default request.timeout.ms
)

// Config configures a Broker.
type Config struct {
	// Addr is the TCP address to listen on (DefaultAddr when empty); port 0
	// picks a free port, see Broker.Addr.
	Addr string
	// DataDir holds the topics, committed offsets and producer ids. Required.
	DataDir string
	// Partitions is the partition count of topics created on demand
	// (DefaultPartitions when zero).
	Partitions int
	// NoAutoCreateTopics refuses to create topics that Metadata requests
	// name; by default they are created when the client allows it.
	NoAutoCreateTopics bool
	// MaxRequestBytes caps the size of a request; a larger one closes the
	// connection before anything is allocated for it
	// (DefaultMaxRequestBytes when zero). Parsing a request may take up to
	// about 32 times its size in memory (kmsg makes an element for every
	// array entry that the bytes left could hold, as Kafka's parser does),
	// so a hostile client can make each connection hold that much: set it
	// near what producers send (1 MiB by default in Kafka's clients).
	MaxRequestBytes int
	// IdleTimeout closes a connection that sends no request for that long,
	// or does not take a response within it (DefaultIdleTimeout when
	// zero).
	IdleTimeout time.Duration
	// MaxFetchWait bounds a fetch's long poll, whatever its MaxWaitMillis
	// asks (up to 24 days): a client gone meanwhile holds a goroutine
	// until then. Answering early with what there is is allowed, and
	// clients fetch again (DefaultMaxFetchWait when zero).
	MaxFetchWait time.Duration
	// Log is the template of every partition's log options (segment size,
	// fsync policy...). Its zero value gives replog's defaults.
	Log replog.Options
	// Logger receives connection and storage errors; nil discards them.
	Logger *slog.Logger
}

func (c *Config) validate() error {
	if c.DataDir == "" {
		return errors.New("broker: Config.DataDir is required")
	}
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.Partitions < 0 || c.Partitions > DefaultMaxPartitionCount {
		return fmt.Errorf("broker: Config.Partitions %d out of range [1, %d]", c.Partitions, DefaultMaxPartitionCount)
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.MaxRequestBytes < 1024 {
		return fmt.Errorf("broker: Config.MaxRequestBytes %d below 1024", c.MaxRequestBytes)
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.IdleTimeout < 0 {
		return fmt.Errorf("broker: Config.IdleTimeout %v is negative", c.IdleTimeout)
	}
	if c.MaxFetchWait == 0 {
		c.MaxFetchWait = DefaultMaxFetchWait
	}
	if c.MaxFetchWait < 0 {
		return fmt.Errorf("broker: Config.MaxFetchWait %v is negative", c.MaxFetchWait)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Broker is a running single-node Kafka broker. Its methods are safe for
// concurrent use.
type Broker struct {
	cfg      Config
	ln       net.Listener
	host     string // advertised host
	port     int32  // advertised port
	logs     *replog.Manager
	coord    *coordinator
	pids     *producerIDs
	ctx      context.Context // cancelled by Close: ends long polls and group waits
	cancel   context.CancelFunc
	log      *slog.Logger
	closeErr error
	dirLock  *os.File     // held until Close (lockDataDir)
	panics   atomic.Int64 // recovered panics of connection goroutines
	// fetchWaits counts the fetches waiting in a long poll (see
	// waitForFetch); tests wait for it before closing the broker.
	fetchWaits atomic.Int64
	hwMoved    notifier // wakes long polls

	mu     sync.RWMutex
	topics map[string][]*partition // guarded by mu; slices are never modified once stored
	// creating holds the topics whose logs createTopic is creating;
	// guarded by mu.
	creating map[string]bool
	conns    map[net.Conn]struct{} // guarded by mu
	closed   bool                  // guarded by mu

	wg        sync.WaitGroup // accept loop and connection goroutines
	closeOnce sync.Once
}

// partition is one topic-partition: its log, and the lock that keeps its
// high watermark moving forward when appends race.
type partition struct {
	log   *replog.Log
	hwMu  sync.Mutex
	moved *notifier // the broker's: told when the high watermark moves
}

// notifier wakes every long-polled fetch when any partition's high
// watermark moves: one channel, closed and replaced, rather than a
// goroutine per partition a waiting fetch names.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

// channel returns the channel the next wake closes.
func (n *notifier) channel() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

// wake releases everyone waiting on the current channel.
func (n *notifier) wake() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
}

// advanceHighWatermark sets the high watermark to the log end offset: on a
// single node every appended record is committed. The lock keeps a slower
// caller from setting an older end offset after a faster one.
func (p *partition) advanceHighWatermark() {
	p.hwMu.Lock()
	moved := false
	if leo := p.log.LogEndOffset(); leo > p.log.HighWatermark() {
		p.log.SetHighWatermark(leo)
		moved = true
	}
	p.hwMu.Unlock()
	if moved {
		p.moved.wake()
	}
}

// Start opens the data directory, listens on cfg.Addr and serves until Close.
func Start(cfg Config) (*Broker, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, err
	}
	dirLock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	b := &Broker{
		dirLock:  dirLock,
		cfg:      cfg,
		log:      cfg.Logger,
		topics:   make(map[string][]*partition),
		creating: make(map[string]bool),
		conns:    make(map[net.Conn]struct{}),
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	started := false
	defer func() {
		if !started && dirLock != nil {
			dirLock.Close()
		}
	}()
	if b.pids, err = openProducerIDs(filepath.Join(cfg.DataDir, "producer-id-block")); err != nil {
		return nil, err
	}
	if b.logs, err = replog.OpenManager(filepath.Join(cfg.DataDir, "topics"), replog.ManagerOptions{Log: cfg.Log}); err != nil {
		return nil, err
	}
	if err := b.loadTopics(); err != nil {
		b.logs.Close()
		return nil, err
	}
	offsets, err := openOffsetStore(filepath.Join(cfg.DataDir, "consumer-offsets"))
	if err != nil {
		b.logs.Close()
		return nil, err
	}
	b.coord = newCoordinator(b, offsets)
	if b.ln, err = net.Listen("tcp", cfg.Addr); err != nil {
		offsets.close()
		b.logs.Close()
		return nil, err
	}
	addr := b.ln.Addr().(*net.TCPAddr)
	b.host, b.port = addr.IP.String(), int32(addr.Port)
	if addr.IP.IsUnspecified() {
		b.host = "127.0.0.1"
	}
	started = true
	b.wg.Add(1)
	go b.acceptLoop()
	return b, nil
}

// Addr is the address the broker listens on.
func (b *Broker) Addr() net.Addr { return b.ln.Addr() }

// Close stops accepting connections, closes every connection, waits for their
// goroutines and closes the logs cleanly. It is idempotent.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		b.closed = true
		for c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
		b.cancel()
		b.ln.Close()
		b.wg.Wait()
		err := b.coord.close()
		b.closeErr = errors.Join(err, b.logs.Close())
		if b.dirLock != nil {
			b.dirLock.Close()
		}
	})
	return b.closeErr
}

// Accept errors other than a closed listener (EMFILE, ENFILE...) are
// retried after a delay that doubles from minAcceptDelay to maxAcceptDelay,
// as net/http does, instead of spinning.
const (
	minAcceptDelay = 5 * time.Millisecond
	maxAcceptDelay = time.Second
)

func (b *Broker) acceptLoop() {
	defer b.wg.Done()
	var delay time.Duration
	for {
		c, err := b.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || b.ctx.Err() != nil {
				return
			}
			delay = min(max(2*delay, minAcceptDelay), maxAcceptDelay)
			b.log.Warn("accept", "err", err, "retry_in", delay)
			t := time.NewTimer(delay)
			select {
			case <-b.ctx.Done(): // Close
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		delay = 0
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			c.Close()
			return
		}
		b.conns[c] = struct{}{}
		b.wg.Add(1)
		b.mu.Unlock()
		go func() {
			defer b.wg.Done()
			b.serveConn(c)
			b.mu.Lock()
			delete(b.conns, c)
			b.mu.Unlock()
		}()
	}
}

// topicName is what Kafka accepts as a topic name; it is also a safe
// directory name.
var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

func validTopic(name string) bool {
	return topicName.MatchString(name) && name != "." && name != ".."
}

// loadTopics rebuilds the topic table from the Manager's log names
// ("topic-partition"), creating partitions missing below the highest one (a
// crash in the middle of creating a topic).
func (b *Broker) loadTopics() error {
	counts := make(map[string]int)
	for _, name := range b.logs.Names() {
		i := strings.LastIndexByte(name, '-')
		p, err := strconv.Atoi(name[i+1:])
		if i <= 0 || err != nil || p < 0 || p >= DefaultMaxPartitionCount || !validTopic(name[:i]) {
			b.log.Warn("ignoring log that is not a topic-partition", "name", name)
			continue
		}
		counts[name[:i]] = max(counts[name[:i]], p+1)
	}
	for topic, n := range counts {
		parts, err := b.openPartitions(topic, n)
		if err != nil {
			return err
		}
		b.topics[topic] = parts
	}
	return nil
}

// maxLogName is the longest log name the Manager creates.
const maxLogName = 247

// storableTopic reports whether the Manager can name every partition's
// log of topic with n partitions ("topic-partition", at most maxLogName
// bytes): Kafka's 249-byte names do not all fit.
func storableTopic(topic string, n int) bool {
	return len(topic)+1+len(strconv.Itoa(n-1)) <= maxLogName
}

// caseCollisionLocked reports whether topic differs in case only from a
// topic that exists or is being created: the Manager refuses such log
// names (case-insensitive filesystems). Callers hold b.mu.
func (b *Broker) caseCollisionLocked(topic string) bool {
	for t := range b.topics {
		if t != topic && strings.EqualFold(t, topic) {
			return true
		}
	}
	for t := range b.creating {
		if t != topic && strings.EqualFold(t, topic) {
			return true
		}
	}
	return false
}

// openPartitions opens (creating where missing) partitions 0..n-1 of topic.
// On an error the logs it created are deleted again, so that a refused
// creation does not come back as a topic at the next start.
func (b *Broker) openPartitions(topic string, n int) (_ []*partition, err error) {
	var created []string
	defer func() {
		if err != nil {
			for _, name := range created {
				if derr := b.logs.Delete(name); derr != nil {
					b.log.Error("delete partition of a failed topic creation", "name", name, "err", derr)
				}
			}
		}
	}()
	parts := make([]*partition, n)
	for i := range parts {
		name := topic + "-" + strconv.Itoa(i)
		l, ok := b.logs.Get(name)
		if !ok {
			var err error
			if l, err = b.logs.Create(name); err != nil {
				return nil, fmt.Errorf("broker: create partition %s: %w", name, err)
			}
			created = append(created, name)
		}
		// One node: everything in the log is committed, also what a crash
		// left above the last checkpointed high watermark.
		l.SetHighWatermark(l.LogEndOffset())
		parts[i] = &partition{log: l, moved: &b.hwMoved}
	}
	return parts, nil
}

// partitions returns the partitions of topic, or nil.
func (b *Broker) partitions(topic string) []*partition {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.topics[topic]
}

// partition returns one partition, or nil.
func (b *Broker) partition(topic string, p int32) *partition {
	parts := b.partitions(topic)
	if p < 0 || int(p) >= len(parts) {
		return nil
	}
	return parts[p]
}

// topicNames returns every topic, sorted.
func (b *Broker) topicNames() []string {
	b.mu.RLock()
	names := make([]string, 0, len(b.topics))
	for t := range b.topics {
		names = append(names, t)
	}
	b.mu.RUnlock()
	sort.Strings(names)
	return names
}

// createTopic creates topic with n partitions and returns a Kafka error code:
// 0, TOPIC_ALREADY_EXISTS, INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS or
// KAFKA_STORAGE_ERROR.
func (b *Broker) createTopic(topic string, n int) int16 {
	if !validTopic(topic) {
		return errInvalidTopic
	}
	if n < 1 || n > DefaultMaxPartitionCount {
		return errInvalidPartitions
	}
	if !storableTopic(topic, n) {
		return errInvalidTopic
	}
	// The name is reserved under the lock and the logs are created
	// without it, so that requests for other topics do not wait for
	// thousands of directories to be made.
	b.mu.Lock()
	_, exists := b.topics[topic]
	switch {
	case b.closed:
		b.mu.Unlock()
		return errNotLeader
	case exists || b.creating[topic]:
		b.mu.Unlock()
		return errTopicAlreadyExists
	case b.caseCollisionLocked(topic):
		b.mu.Unlock()
		return errInvalidTopic
	}
	b.creating[topic] = true
	b.mu.Unlock()
	parts, err := b.openPartitions(topic, n)
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.creating, topic)
	if err != nil {
		b.log.Error("create topic", "topic", topic, "err", err)
		return errStorage
	}
	b.topics[topic] = parts
	b.log.Info("created topic", "topic", topic, "partitions", n)
	return errNone
}
