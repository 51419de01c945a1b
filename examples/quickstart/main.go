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
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	dir := flag.String("dir", "", "data directory to keep (default: a temporary directory, removed at exit)")
	records := flag.Int("records", 200_000, "records to produce")
	producers := flag.Int("producers", 4, "idempotent producers")
	flag.Parse()
	if *dir == "" {
		tmp, err := os.MkdirTemp("", "replog-quickstart-")
		if err != nil {
			fail(err)
		}
		defer os.RemoveAll(tmp)
		*dir = tmp
	}
	if err := run(*dir, *records, *producers); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "quickstart: FAILED:", err)
	os.Exit(1)
}

func run(dir string, records, producers int) error {
	c, err := startCluster(dir)
	if err != nil {
		return err
	}
	defer c.close()
	fmt.Printf("3 replicas on %s, leader node 0 at epoch 1, data in %s\n", c.addrList(), dir)

	start := time.Now()
	res, err := produce(c, records, producers)
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	fmt.Printf("produced %d records (%.1f MB before compression) in %v: %.1f MB/s, %d retries after the failover (%d recognised as duplicates)\n",
		res.acked, float64(res.bytes)/1e6, elapsed.Round(time.Millisecond), float64(res.bytes)/1e6/elapsed.Seconds(), res.retries, res.duplicates)
	p := res.latencies
	fmt.Printf("acks=all produce latency: p50 %v, p99 %v, p99.9 %v (%d produce calls)\n", p.at(0.50), p.at(0.99), p.at(0.999), len(p))
	fmt.Printf("failover: node 0 closed after %d records, node 1 leads at epoch 2 with ISR %v\n", res.failoverAt, c.isr())

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
	return nil
}
