package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	replog "github.com/replog/replog/log"
	"github.com/replog/replog/replication"
)

var topic = replication.TopicPartition{Topic: "orders", Partition: 0}

// cluster is three replicas of one partition in this process, and the
// application's "controller" role: it decides who leads and keeps the ISR.
type cluster struct {
	logs    [3]*replog.Log
	reps    [3]*replication.Replicator
	servers [3]*replication.TCPServer
	trans   [3]*replication.TCPTransport
	addrs   [3]string
	closed  [3]bool // node i was closed (by failover or close)

	mu      sync.Mutex
	leader  int32 // -1 while failing over
	epoch   int32
	isrList []int32
	changed chan struct{} // closed when leadership changes, or the failover fails
	err     error         // why the failover failed; no node leads then
}

func startCluster(dir string) (_ *cluster, err error) {
	c := &cluster{leader: -1, changed: make(chan struct{})}
	lns := make([]net.Listener, 3)
	defer func() {
		if err != nil { // close what was started
			for _, ln := range lns {
				if ln != nil {
					ln.Close()
				}
			}
			c.close()
		}
	}()
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns[i], c.addrs[i] = ln, ln.Addr().String()
	}
	resolve := func(node int32) (string, error) { return c.addrs[node], nil }
	for i := int32(0); i < 3; i++ {
		l, err := replog.Open(filepath.Join(dir, fmt.Sprintf("node-%d", i), "orders-0"), replog.Options{SegmentBytes: 512 << 10})
		if err != nil {
			return nil, err
		}
		c.logs[i] = l
		t, err := replication.NewTCPTransport(replication.TCPOptions{Resolve: resolve})
		if err != nil {
			return nil, err
		}
		c.trans[i] = t
		r, err := replication.New(replication.Config{ReplicaID: i, ClusterID: "quickstart", MinInsyncReplicas: 2,
			ReplicaLagTime: 5 * time.Second, OnISRChange: c.onISRChange}, t)
		if err != nil {
			return nil, err
		}
		c.reps[i] = r
		if err := r.AddPartition(topic, l); err != nil {
			return nil, err
		}
		s, err := replication.NewTCPServer(r, lns[i], replication.TCPOptions{})
		if err != nil {
			return nil, err
		}
		c.servers[i] = s
	}
	if err := c.reps[0].BecomeLeader(topic, 1, []int32{0, 1, 2}, []int32{0, 1, 2}); err != nil {
		return nil, err
	}
	for _, f := range []int32{1, 2} {
		if err := c.reps[f].BecomeFollower(topic, 1, 0); err != nil {
			return nil, err
		}
	}
	c.leader, c.epoch, c.isrList = 0, 1, []int32{0, 1, 2}
	return c, nil
}

// onISRChange is where an application persists the ISR; here it is kept
// in memory.
func (c *cluster) onISRChange(_ replication.TopicPartition, epoch int32, isr []int32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if epoch < c.epoch {
		// A deposed leader's: accepting it could count a follower of the
		// new leader as in sync with the old one.
		return errStaleISRChange
	}
	c.isrList = slices.Clone(isr)
	return nil
}

// errStaleISRChange refuses an ISR change from an older leader epoch.
var errStaleISRChange = errors.New("quickstart: ISR change from an older leader epoch")

func (c *cluster) isr() []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.isrList)
}

func (c *cluster) addrList() string { return strings.Join(c.addrs[:], ", ") }

// current returns the leader and a channel closed at the next change, or
// the error that left the cluster without a leader.
func (c *cluster) current() (int32, chan struct{}, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader, c.changed, c.err
}

// depose takes leadership away from node 0: producers wait for the next
// leader from now on. It is the first step of a failover.
func (c *cluster) depose() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader == 0 {
		c.leader = -1
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

// failover closes node 0 and makes node 1 the leader at epoch 2, with node
// 2 following it: what a controller does when a leader dies. If that fails,
// no node leads, and the error is what current returns from then on.
func (c *cluster) failover() (err error) {
	c.depose()
	defer func() {
		if err != nil {
			c.mu.Lock()
			c.err = fmt.Errorf("failover: %w", err)
			close(c.changed) // wakes the producers waiting for a leader
			c.mu.Unlock()
		}
	}()
	if err := c.closeNode(0); err != nil {
		return err
	}
	isr := slices.DeleteFunc(c.isr(), func(id int32) bool { return id == 0 })
	// The new epoch and ISR first, as a controller persists them: from
	// here on, node 0's ISR changes (at epoch 1) are refused, even if it
	// were still running, and node 1's own come after.
	c.mu.Lock()
	c.epoch, c.isrList = 2, isr
	c.mu.Unlock()
	if err := c.reps[1].BecomeLeader(topic, 2, []int32{0, 1, 2}, isr); err != nil {
		return err
	}
	if err := c.reps[2].BecomeFollower(topic, 2, 1); err != nil {
		return err
	}
	c.mu.Lock()
	c.leader = 1
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	return nil
}

// closeNode closes node i, once, and returns the error of closing its log.
// It is called by failover and close, never concurrently.
func (c *cluster) closeNode(i int) error {
	if c.closed[i] {
		return nil
	}
	c.closed[i] = true
	if c.servers[i] != nil {
		c.servers[i].Close()
	}
	if c.reps[i] != nil {
		c.reps[i].Close()
	}
	if c.trans[i] != nil {
		c.trans[i].Close()
	}
	if c.logs[i] != nil {
		return c.logs[i].Close()
	}
	return nil
}

// waitConverged waits until replica 2 holds exactly replica 1's log.
func (c *cluster) waitConverged(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		a, errA := readAll(c.logs[1])
		b, errB := readAll(c.logs[2])
		if errA == nil && errB == nil && bytes.Equal(a, b) && c.logs[1].HighWatermark() == c.logs[1].LogEndOffset() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replicas 1 and 2 did not converge within %v (log ends %d and %d)", timeout, c.logs[1].LogEndOffset(), c.logs[2].LogEndOffset())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readAll returns a log's batches, all segments, as bytes.
func readAll(l *replog.Log) ([]byte, error) {
	var out []byte
	for off := l.LogStartOffset(); off < l.LogEndOffset(); {
		n := len(out)
		var err error
		if out, err = l.Read(out, off, replog.ReadOptions{MaxBytes: 4 << 20}); err != nil {
			return nil, err
		}
		if len(out) == n {
			break
		}
		last := out[n:]
		for len(last) > 0 {
			b, rest, err := replog.SplitBatch(last)
			if err != nil {
				return nil, err
			}
			off, last = b.NextOffset(), rest
		}
	}
	return out, nil
}

// close closes every node still open. It must not run concurrently with
// failover: produce returns only once its controller goroutine is done.
func (c *cluster) close() {
	for i := range c.logs {
		c.closeNode(i)
	}
}
