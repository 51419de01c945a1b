package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	replog "github.com/replog/replog/log"
)

// TestRerunReportsTheResumeOffset runs the example twice on the same -dir
// ("queue directory to keep"). The second run's mailer resumes at its
// committed offset 800 (600 jobs from the first run + 200 handled now),
// which the report prints (it printed the jobs handled, 200).
func TestRerunReportsTheResumeOffset(t *testing.T) {
	dir := t.TempDir()
	var first strings.Builder
	if err := run(context.Background(), &first, dir, 300); err != nil {
		t.Fatal(err)
	}
	var second strings.Builder
	if err := run(context.Background(), &second, dir, 300); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "mailer.offset"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := replog.DecodeCheckpoint(data, 1)
	if err != nil {
		t.Fatal(err)
	}
	if rows[0][0] != 1200 {
		t.Fatalf("mailer committed %d, want 1200", rows[0][0])
	}
	if want := "resumed at offset 800,"; !strings.Contains(second.String(), want) {
		t.Errorf("second run's report lacks %q (the mailer's real resume offset):\n%s", want, second.String())
	}
	if want := "audit: read all 600 jobs on its own, from offset 600"; !strings.Contains(second.String(), want) {
		t.Errorf("second run's report lacks %q (the audit group reads this run's jobs):\n%s", want, second.String())
	}
}

// TestBadCheckpointIsErrCorrupt: a checkpoint file that decodes to no rows
// (or more than one) is reported as corrupt (the error once wrapped a nil
// error: "bad checkpoint: %!w(<nil>)", matching nothing with errors.Is).
func TestBadCheckpointIsErrCorrupt(t *testing.T) {
	dir := t.TempDir()
	q, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for name, rows := range map[string][][]int64{
		"no rows":  {},
		"two rows": {{1}, {2}},
	} {
		if err := os.WriteFile(filepath.Join(dir, "g.offset"), replog.EncodeCheckpoint(rows), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := q.Consumer("g")
		if err == nil {
			t.Fatalf("%s: Consumer accepted a bad checkpoint", name)
		}
		if !errors.Is(err, replog.ErrCorrupt) || strings.Contains(err.Error(), "%!w") {
			t.Errorf("%s: Consumer error %q: want an error wrapping log.ErrCorrupt", name, err)
		}
	}
}

// TestInterruptRemovesTempDir interrupts the example (Ctrl-C, SIGINT)
// after it enqueued its jobs: it stops, closes the queue and removes its
// temporary directory instead of leaving replog-queue-* in $TMPDIR.
func TestInterruptRemovesTempDir(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("needs SIGINT")
	}
	bin := filepath.Join(t.TempDir(), "queue")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	tmp := t.TempDir()
	cmd := exec.Command(bin, "-jobs", "5000")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The first line ("enqueued ...") comes once the jobs are durable; the
	// mailer is consuming now.
	if _, err := bufio.NewReader(stdout).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, stdout)
	cmd.Wait()
	left, err := filepath.Glob(filepath.Join(tmp, "replog-queue-*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("after Ctrl-C the example left its temporary directory behind: %v", left)
	}
}

// TestRerunAfterAnInterruptedRun: a run on a kept directory after one
// interrupted with the mailer behind (here committed at offset 100 of
// 600) must still have each group handle every job of its own run. The
// run consumed a count of jobs from the group's commit, so the mailer
// never reached the last jobs of its run, and the check, which counted
// distinct payloads that repeated from run to run, still said ok.
func TestRerunAfterAnInterruptedRun(t *testing.T) {
	dir := t.TempDir()
	if err := run(context.Background(), io.Discard, dir, 300); err != nil {
		t.Fatal(err)
	}
	q, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := q.Consumer("mailer")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(100); err != nil { // as if interrupted there
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	var out strings.Builder
	if err := run(context.Background(), &out, dir, 300); err != nil {
		t.Fatalf("second run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "mailer: also handled 500 jobs of earlier runs") {
		t.Errorf("the second run did not report the first run's 500 jobs the mailer had left:\n%s", out.String())
	}
	q, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for _, group := range []string{"mailer", "audit"} {
		c, err := q.Consumer(group)
		if err != nil {
			t.Fatal(err)
		}
		if c.next != 1200 {
			t.Errorf("%s committed offset %d of the queue's 1200 jobs", group, c.next)
		}
	}
}
