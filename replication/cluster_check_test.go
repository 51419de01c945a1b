package replication

// The invariants a testCluster (cluster_harness_test.go) must hold once
// its chaos stopped and its replicas converged.

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/log"
)

// waitConverged waits until every partition has a live leader and every
// replica's log end and high watermark equal the leader's log end.
func (c *testCluster) waitConverged(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		why := c.notConverged()
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New(why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// notConverged describes a partition whose replicas have not converged,
// "" when all have.
func (c *testCluster) notConverged() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, tp := range c.tps {
		ld := c.ctrl[tp].leader
		if ld < 0 {
			return fmt.Sprintf("%s offline", tp)
		}
		ll, _ := c.nodes[ld].rep.Node().Log(tp)
		leo, hw := ll.LogEndOffset(), ll.HighWatermark()
		if hw != leo {
			return fmt.Sprintf("%s: leader %d log end %d, high watermark %d", tp, ld, leo, hw)
		}
		for _, n := range c.nodes {
			if l, _ := n.rep.Node().Log(tp); l.LogEndOffset() != leo || l.HighWatermark() != hw {
				return fmt.Sprintf("%s: node %d log end %d high watermark %d, leader %d's %d", tp, n.id, l.LogEndOffset(), l.HighWatermark(), ld, leo)
			}
		}
	}
	return ""
}

// checkInvariants checks every partition's logs and producer, that every
// log can still sync (none is stuck failed), that no leader's high
// watermark went down within its epoch, and that no node logged an
// unexpected warning or error.
func (c *testCluster) checkInvariants(prods []*clusterProducer) {
	t := c.t
	for i, tp := range c.tps {
		require.Empty(t, prods[i].bad, "%s: the producer had unexpected errors", tp)
		c.checkPartition(tp, prods[i])
	}
	for _, n := range c.nodes {
		for _, tp := range c.tps {
			l, _ := n.rep.Node().Log(tp)
			require.NoError(t, l.Sync(), "node %d %s", n.id, tp)
		}
	}
	c.hwMu.Lock()
	require.Empty(t, c.hwDrops, "a leader's high watermark went down within its epoch")
	require.NotEmpty(t, c.hwSeen, "no high watermark was sampled")
	c.hwMu.Unlock()
	var unexpected []string
	for _, l := range c.logged.all() {
		if !expectedLogLine(l) {
			unexpected = append(unexpected, l.text)
		}
	}
	require.Empty(t, unexpected, "unexpected warnings or errors were logged")
}

// checkPartition checks tp from the highest log start of its replicas:
// every acknowledged record is on the leader at its offset, no record
// value is stored twice, and every replica holds the leader's batches
// byte for byte.
func (c *testCluster) checkPartition(tp TopicPartition, pr *clusterProducer) {
	t := c.t
	ld := c.leaderOf(tp)
	start, data := c.readReplicas(tp)
	values := map[int64]string{}
	at := map[string]int64{}
	for rest := data[ld]; len(rest) > 0; {
		b, r, err := log.SplitBatch(rest)
		require.NoError(t, err)
		it := b.Records()
		for it.Next() {
			rec := it.Record()
			v := string(rec.Value)
			if prev, ok := at[v]; ok {
				require.Failf(t, "value stored twice", "%s: %q at offsets %d and %d", tp, v, prev, rec.Offset)
			}
			values[rec.Offset], at[v] = v, rec.Offset
		}
		require.NoError(t, it.Err())
		rest = r
	}
	for _, a := range pr.acks {
		for j, v := range a.values {
			if off := a.first + int64(j); off >= start {
				require.Equal(t, v, values[off], "%s: acknowledged record at offset %d on leader %d (log start %d)", tp, off, ld, start)
			}
		}
	}
	for id, d := range data {
		require.True(t, bytes.Equal(d, data[ld]), "%s: node %d's batches from offset %d differ from leader %d's (%d and %d bytes)", tp, id, start, ld, len(d), len(data[ld]))
	}
}

// readReplicas returns the highest log start of tp's replicas and each
// replica's batches that end at or after it. The logs' own retention may
// still move their starts meanwhile: a read failing on that is retried.
func (c *testCluster) readReplicas(tp TopicPartition) (start int64, data [][]byte) {
	t := c.t
	for attempt := 0; ; attempt++ {
		var logs []*log.Log
		start = 0
		for _, n := range c.nodes {
			l, _ := n.rep.Node().Log(tp)
			logs = append(logs, l)
			start = max(start, l.LogStartOffset())
		}
		data = make([][]byte, len(logs))
		var err error
		for i, l := range logs {
			var all []byte
			if all, err = readAll(l); err != nil {
				break
			}
			if data[i], err = batchesFrom(all, start); err != nil {
				break
			}
		}
		if err == nil {
			return start, data
		}
		require.ErrorIs(t, err, log.ErrOffsetOutOfRange, "reading %s", tp)
		require.Less(t, attempt, 10, "reading %s: log starts keep moving", tp)
	}
}

// expectedLogLine reports whether a WARN or ERROR record is one that
// leader changes and restarts cause by design; any other fails the test
// (a failing log, a refused response, a corrupt frame, ...).
func expectedLogLine(l loggedLine) bool {
	switch l.msg {
	case "replication: fetch failed":
		// A follower fetching from a node being restarted: dialing it is
		// refused (ErrUnreachable), or its server closed the connection
		// mid-fetch (EOF, reset). The fetcher backs off and retries, or
		// the controller moves it to the new leader.
		return errors.Is(l.err, ErrUnreachable) || peerGone(l.err)
	case "replication: ISR change refused":
		// A leader the controller has just replaced shrinks or expands
		// the ISR at its old epoch before its role change reaches it:
		// the controller refuses it (onISRChange), as it must.
		return errors.Is(l.err, errStaleISREpoch)
	case "replication: writing a fetch response failed":
		// A server answering a follower that is being restarted: the
		// follower's transport closed the connection.
		return peerGone(l.err) || errors.Is(l.err, net.ErrClosed)
	}
	return false
}
