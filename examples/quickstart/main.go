// Command quickstart shows replog end to end in a few seconds: three
// replicas of a partition over TCP on 127.0.0.1 in one process, several
// idempotent producers writing lz4-compressed batches with acks=all, a
// failover halfway (the leader is closed and another replica takes over),
// then every record is consumed back and checked: each acknowledged
// record must be there exactly once.
//
//	go run ./examples/quickstart [-dir DIR] [-records N] [-producers P]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/replog/replog/replication"
)

func main() { os.Exit(run()) }

// run is main with an exit code, so that deferred cleanup (the temporary
// directory) happens before the process exits, an interrupt included: it
// stops the producers, and the cluster is closed before the directory is
// removed.
func run() int {
	dir := flag.String("dir", "", "data directory to keep (default: a temporary directory, removed at exit)")
	records := flag.Int("records", 200_000, "records to produce (at least 200 per producer, so that the failover happens while they produce)")
	producers := flag.Int("producers", 4, "idempotent producers")
	flag.Parse()
	if err := checkFlags(*records, *producers); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		flag.Usage()
		return 2
	}
	if err := checkDir(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *dir == "" {
		tmp, err := os.MkdirTemp("", "replog-quickstart-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "quickstart: FAILED:", err)
			return 1
		}
		defer os.RemoveAll(tmp)
		*dir = tmp
	}
	if err := quickstart(ctx, *dir, *records, *producers); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "\nquickstart: interrupted")
			return 130
		}
		fmt.Fprintln(os.Stderr, "quickstart: FAILED:", err)
		return 1
	}
	return 0
}

// checkDir refuses a -dir that holds anything: the example starts a new
// cluster at epoch 1 with fresh producer ids, which a kept cluster's logs
// (at epoch 2 after the failover, with those producers' state) refuse.
func checkDir(dir string) error {
	if dir == "" {
		return nil
	}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return err
	case len(entries) > 0:
		return fmt.Errorf("-dir %s is not empty: the example starts a new cluster; give a new or empty directory", dir)
	}
	return nil
}

// checkFlags rejects values with which the example would show nothing: each
// producer needs two batches or more, so that the failover at half the
// records always has batches left to send to the new leader (see produce).
func checkFlags(records, producers int) error {
	switch {
	case producers < 1:
		return fmt.Errorf("-producers %d: want at least 1", producers)
	case producers > 1000:
		return fmt.Errorf("-producers %d: want at most 1000", producers)
	case records < 2*recordsPerBatch*producers:
		return fmt.Errorf("-records %d: want at least %d with %d producers (%d records, two batches, per producer), or the failover could come after the last batch",
			records, 2*recordsPerBatch*producers, producers, 2*recordsPerBatch)
	case records/producers > math.MaxInt32:
		return errors.New("-records: a producer's sequence numbers would overflow int32")
	}
	return nil
}

func quickstart(ctx context.Context, dir string, records, producers int) error {
	c, err := startCluster(dir)
	if err != nil {
		return err
	}
	defer c.close()
	fmt.Printf("3 replicas on %s, leader node 0 at epoch 1, data in %s\n", c.addrList(), dir)

	start := time.Now()
	res, err := produce(ctx, c, records, producers)
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	fmt.Printf("produced %d records (%.1f MB before compression) in %v: %.1f MB/s, %d retries after the failover (%d recognised as duplicates)\n",
		res.acked, float64(res.bytes)/1e6, elapsed.Round(time.Millisecond), float64(res.bytes)/1e6/elapsed.Seconds(), res.retries, res.duplicates)
	p := res.latencies
	fmt.Printf("acks=all produce latency: p50 %v, p99 %v, p99.9 %v (%d produce calls)\n", p.at(0.50), p.at(0.99), p.at(0.999), len(p))
	if !res.failedOver || res.afterFailover == 0 {
		// produce guarantees a failover while producing; say so if not.
		return fmt.Errorf("no failover while producing (failed over: %v, records acknowledged by the new leader: %d)", res.failedOver, res.afterFailover)
	}
	fmt.Printf("failover: node 0 closed after %d records were acknowledged; node 1 leads at epoch 2 with ISR %v and acknowledged %d records\n",
		res.failoverAt, c.isr(), res.afterFailover)

	if err := c.waitConverged(10 * time.Second); err != nil {
		return err
	}
	n, err := verify(c, res)
	if err != nil {
		return err
	}
	st := c.logs[1].Stats()
	fmt.Printf("consumed %d records from node 1: every acknowledged record exactly once; replicas 1 and 2 hold identical logs (%d segments, %d rolls on node 1)\n",
		n, st.Segments, st.Rolls)
	printReplication(c.reps[1].Stats(), c.reps[2].Stats())
	return nil
}

// printReplication says what the replicators' Stats report: the leader's
// view of the partition and of its follower, and what the follower fetched.
func printReplication(leader, follower replication.Stats) {
	lp := leader.Partitions[0]
	for _, f := range lp.Followers {
		if f.ReplicaID == 2 {
			fmt.Printf("stats: node 1 leads with ISR %v and high watermark %d, node 2 is at offset %d (lag %d); node 1 answered %d fetches (%.1f MB) since it took over, node 2 applied %d responses (%.1f MB) from nodes 0 and 1\n",
				lp.ISR, lp.HighWatermark, f.LogEndOffset, f.Lag,
				leader.FetchesServed, float64(leader.BytesServed)/1e6, follower.FetchesApplied, float64(follower.BytesFetched)/1e6)
		}
	}
}
