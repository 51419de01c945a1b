// Command queue is an in-process work queue on one replog Log: producers
// append jobs, and each consumer group reads them from its committed offset,
// which it keeps in a small checkpoint file written atomically. No network.
// The queue itself is in queue.go; this file shows it at work.
//
//	go run ./examples/queue [-dir DIR] [-jobs N]
//
// It enqueues jobs from two producers, lets a "mailer" group handle part of
// them and stop, reopens everything (as after a restart), lets the group
// resume where it committed, has an "audit" group read every job on its own,
// and checks that each job was handled exactly once per group. Run again
// with the same -dir, each group starts at its committed offset: both handle
// the jobs of the new run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	dir := flag.String("dir", "", "queue directory to keep (default: a temporary directory, removed at exit)")
	jobs := flag.Int("jobs", 1000, "jobs per producer")
	flag.Parse()
	// An interrupt ends run's waits, so that its deferred cleanup (the
	// queue closed, the temporary directory removed) happens.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout, *dir, *jobs)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "queue:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, w io.Writer, dir string, jobs int) (err error) {
	if jobs < 1 {
		return fmt.Errorf("-jobs %d: want at least 1", jobs)
	}
	if dir == "" {
		tmp, err := os.MkdirTemp("", "replog-queue-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	q, err := Open(dir)
	if err != nil {
		return err
	}
	// Close whichever queue is open when run returns, on error paths too.
	defer func() {
		if q != nil {
			err = errors.Join(err, q.Close())
		}
	}()
	// Two producers enqueue jobs concurrently, ten per batch. A queue kept
	// with -dir may hold an earlier run's jobs: this run's name the offset
	// it started at, so that they are told apart.
	runStart := q.log.LogEndOffset()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for p := range errs {
		wg.Go(func() {
			for i := 0; i < jobs && errs[p] == nil; i += 10 {
				var batch [][]byte
				for j := i; j < min(i+10, jobs); j++ {
					batch = append(batch, fmt.Appendf(nil, "run %d, producer %d: send email #%d", runStart, p, j))
				}
				errs[p] = q.Enqueue(batch...)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	total := 2 * jobs
	fmt.Fprintf(w, "enqueued %d jobs from 2 producers in %s\n", total, dir)

	end := q.log.LogEndOffset()

	// The mailer handles about a third (at least one), commits, and stops.
	done := make(map[string]int) // payload -> times handled by the mailer
	handled, _, err := consume(ctx, q, "mailer", max(total/3, 1), end, done)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "mailer: handled %d jobs, committed, stopped\n", handled)

	// A restart: reopen the queue; the mailer resumes at its commit.
	err = q.Close()
	q = nil // closed, even if Close failed: the deferred close must not repeat it
	if err != nil {
		return err
	}
	if q, err = Open(dir); err != nil {
		return err
	}
	rest, resumed, err := consume(ctx, q, "mailer", -1, end, done)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "mailer: reopened the queue, resumed at offset %d, handled the other %d jobs\n", resumed, rest)
	audit := make(map[string]int)
	audited, from, err := consume(ctx, q, "audit", -1, end, audit)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "audit: read all %d jobs on its own, from offset %d\n", audited, from)
	if err := checkHandled(w, runStart, total, map[string]map[string]int{"mailer": done, "audit": audit}); err != nil {
		return err
	}
	fmt.Fprintln(w, "ok: every job handled exactly once by each group")
	return nil
}

// checkHandled checks that each group handled each of this run's total
// jobs (named after runStart) exactly once, and says how many jobs of
// earlier runs (left by an interrupted run, or never read by a group) it
// handled besides.
func checkHandled(w io.Writer, runStart int64, total int, groups map[string]map[string]int) error {
	prefix := fmt.Sprintf("run %d,", runStart)
	for group, seen := range groups {
		ours := 0
		for job, n := range seen {
			if !strings.HasPrefix(job, prefix) {
				continue
			}
			ours++
			if n != 1 {
				return fmt.Errorf("%s handled %q %d times", group, job, n)
			}
		}
		if ours != total {
			return fmt.Errorf("%s handled %d of this run's %d jobs", group, ours, total)
		}
		if earlier := len(seen) - ours; earlier > 0 {
			fmt.Fprintf(w, "%s: also handled %d jobs of earlier runs\n", group, earlier)
		}
	}
	return nil
}

// consume has group handle jobs (counting them in done) until it handled n
// of them (n < 0: no limit) or reached offset end, committing after each
// batch, and returns how many it handled and the offset it started at (the
// group's committed offset).
func consume(ctx context.Context, q *Queue, group string, n int, end int64, done map[string]int) (handled int, start int64, err error) {
	c, err := q.Consumer(group)
	if err != nil {
		return 0, 0, err
	}
	start = c.next
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for (n < 0 || handled < n) && c.next < end {
		jobs, err := c.Poll(ctx)
		if err != nil {
			return handled, start, err
		}
		if n >= 0 {
			jobs = jobs[:min(len(jobs), n-handled)]
		}
		for _, j := range jobs {
			done[string(j.Payload)]++ // "send the email"
		}
		handled += len(jobs)
		if err := c.Commit(jobs[len(jobs)-1].Offset + 1); err != nil {
			return handled, start, err
		}
	}
	return handled, start, nil
}
