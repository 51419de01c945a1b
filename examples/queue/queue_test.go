package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestRun runs the example as `go run` does and checks its report.
func TestRun(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), &out, t.TempDir(), 300); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"enqueued 600 jobs from 2 producers",
		"mailer: handled 200 jobs, committed, stopped",
		"resumed at offset 200, handled the other 400 jobs",
		"audit: read all 600 jobs",
		"ok: every job handled exactly once by each group",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestRunOneJobEach: with -jobs 1 the mailer still handles a job before
// it stops (a third of two jobs rounded down to none, and the report said
// "handled 0 jobs, committed").
func TestRunOneJobEach(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), &out, t.TempDir(), 1); err != nil {
		t.Fatal(err)
	}
	if want := "mailer: handled 1 jobs, committed, stopped"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
}

// poll returns the payloads of the next jobs of c.
func poll(t *testing.T, c *Consumer) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	jobs, err := c.Poll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, j := range jobs {
		out = append(out, fmt.Sprintf("%d:%s", j.Offset, j.Payload))
	}
	return out
}

// TestCommitSurvivesReopen checks that a group resumes at its commit, inside
// a batch, after the queue is reopened, and that another group starts at
// the beginning.
func TestCommitSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	q, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Enqueue([]byte("a"), []byte("b"), []byte("c"), []byte("d")); err != nil {
		t.Fatal(err)
	}
	c, err := q.Consumer("g")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(poll(t, c), " "); got != "0:a 1:b 2:c 3:d" {
		t.Fatalf("first poll: %s", got)
	}
	if err := c.Commit(2); err != nil { // a and b are done
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	if q, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Enqueue([]byte("e")); err != nil {
		t.Fatal(err)
	}
	for group, want := range map[string][]string{
		"g": {"2:c 3:d", "4:e"},
		"h": {"0:a 1:b 2:c 3:d", "4:e"},
	} {
		c, err := q.Consumer(group)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			if got := strings.Join(poll(t, c), " "); got != w {
				t.Errorf("group %s: polled %q, want %q", group, got, w)
			}
		}
	}
}

// Example shows the queue in a few lines: enqueue, consume, commit.
func Example() {
	dir, _ := os.MkdirTemp("", "queue-example-")
	defer os.RemoveAll(dir)
	q, err := Open(dir)
	if err != nil {
		panic(err)
	}
	defer q.Close()
	q.Enqueue([]byte("resize photo 1"), []byte("resize photo 2"))

	c, _ := q.Consumer("resizers")
	jobs, _ := c.Poll(context.Background())
	for _, j := range jobs {
		fmt.Printf("job %d: %s\n", j.Offset, j.Payload)
	}
	c.Commit(jobs[len(jobs)-1].Offset + 1) // done up to here, durably
	// Output:
	// job 0: resize photo 1
	// job 1: resize photo 2
}
