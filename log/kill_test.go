//go:build unix

package log

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// S9: the test binary runs itself as a child process (TestKillHelper) that
// appends and syncs on the real filesystem and reports every offset it
// got acknowledged; the parent SIGKILLs it at random moments (while it
// opens and recovers the log, appends, rolls or syncs), then opens the
// log itself and checks A1-A5, many times over the same directory.

// killDirEnv names the log directory of the child process; the child test
// skips without it.
const killDirEnv = "REPLOG_KILL_HELPER_DIR"

// killKills is how many times TestKill kills the child.
const killKills = 60

// killOptions roll often: each child run crosses a few segments.
func killOptions() Options {
	return Options{SegmentBytes: 16 << 10, IndexIntervalBytes: 1024}
}

// expectedKillBatch is the only batch the child (or checkA4A5) ever
// appends at offset off: testBatch(off) stamped with its offset.
func expectedKillBatch(t testing.TB, off int64) []byte {
	t.Helper()
	b := testBatch(t, int(off))
	Batch(b).setBaseOffset(off)
	return b
}

// TestKillHelper is the child process of TestKill. It appends
// testBatch(LogEndOffset) batches, syncs after every one to three of
// them, and prints "acked <offset>" once everything below offset is
// durable, until it is killed or its stdin closes (the parent died).
func TestKillHelper(t *testing.T) {
	dir := os.Getenv(killDirEnv)
	if dir == "" {
		t.Skip("child process of TestKill")
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3) // the parent is gone
	}()
	fmt.Println("start")
	start := time.Now()
	l, err := Open(dir, killOptions())
	if err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(2)
	}
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 0))
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(out, "opened %d %d\n", l.LogEndOffset(), time.Since(start))
	out.Flush()
	for {
		for n := 1 + rng.IntN(3); n > 0; n-- {
			if _, err := l.Append(testBatch(t, int(l.LogEndOffset()))); err != nil {
				fmt.Fprintf(out, "error %v\n", err)
				out.Flush()
				os.Exit(2)
			}
		}
		leo := l.LogEndOffset()
		if err := l.Sync(); err != nil {
			fmt.Fprintf(out, "error %v\n", err)
			out.Flush()
			os.Exit(2)
		}
		fmt.Fprintf(out, "acked %d\n", leo)
		out.Flush()
	}
}

// TestKill is S9: at least 50 SIGKILLs of a child appending and syncing,
// each at a random moment, with A1-A5 checked on the real filesystem
// after each.
func TestKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	requireNoGoroutineLeak(t)
	// A fresh directory every killsPerDir kills keeps the log small: the
	// checks read all of it, and Close fsyncs the index files read.
	const killsPerDir = 10
	var dir string
	seed := *crashSeed
	rng := rand.New(rand.NewPCG(uint64(seed), 9))
	var acked int64 // everything below it was acknowledged
	var duringOpen int
	// How long the child's last Open took, by its own clock: a kill
	// meant for the Open comes at a uniformly random moment of it.
	openTook := time.Millisecond
	for kill := 0; kill < killKills; kill++ {
		if kill%killsPerDir == 0 {
			dir, acked = t.TempDir(), 0
		}
		// A quarter of the kills come while the child opens (and
		// recovers) the log; the others after a random number of
		// acknowledgements, plus a little.
		acks := 0
		delay := time.Duration(rng.Int64N(int64(max(openTook, time.Microsecond))))
		if kill%4 != 0 {
			acks = 1 + rng.IntN(25)
			delay = time.Duration(rng.IntN(2000)) * time.Microsecond
		}
		desc := fmt.Sprintf("(kill %d, seed %d, after %d acks + %v)", kill, seed, acks, delay)
		got, started, opened, took := runAndKill(t, dir, acks, delay, desc)
		if started && !opened {
			duringOpen++
		}
		if took > 0 {
			openTook = took
		}
		for _, a := range got {
			acked = max(acked, a)
		}
		acked = checkKilled(t, dir, acked, desc)
	}
	t.Logf("S9: %d kills (%d while the child opened the log), seed %d", killKills, duringOpen, seed)
}

// runAndKill starts the child, waits for it to start and then for acks
// acknowledgements and delay, kills it and returns the offsets it
// reported as acknowledged, whether it had started to open and had
// opened the log, and how long its Open took (0 if it did not report).
func runAndKill(t *testing.T, dir string, acks int, delay time.Duration, desc string) (acked []int64, started, opened bool, openTook time.Duration) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), killDirEnv+"="+dir)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer stdin.Close()
	exited := false
	defer func() {
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()

	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	handle := func(line string) {
		switch {
		case line == "start":
			started = true
		case strings.HasPrefix(line, "opened "):
			opened = true
			var leo int64
			_, err := fmt.Sscanf(line, "opened %d %d", &leo, &openTook)
			require.NoError(t, err, "child output %q", line)
		case strings.HasPrefix(line, "acked "):
			off, err := strconv.ParseInt(strings.TrimPrefix(line, "acked "), 10, 64)
			require.NoError(t, err, "child output %q", line)
			acked = append(acked, off)
		case strings.HasPrefix(line, "error "):
			require.Fail(t, "child failed", "%s %s", line, desc)
		}
	}
	for !started || len(acked) < acks {
		line, ok := <-lines
		require.True(t, ok, "child exited early %s", desc)
		handle(line)
	}
	time.Sleep(delay)
	require.NoError(t, syscall.Kill(cmd.Process.Pid, syscall.SIGKILL))
	// Whatever the child printed before it died counts: each line was
	// written after its Sync returned.
	for line := range lines {
		handle(line)
	}
	err = cmd.Wait()
	exited = true
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, "child was not killed %s", desc)
	ws, ok := exitErr.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "child ended with %v, not SIGKILL %s", err, desc)
	return acked, started, opened, openTook
}

// checkKilled opens the log the child left and checks A1-A5: it holds only
// the batches the child appended, densely from 0, and everything below
// acked. A5 appends one more (synced) batch, so it returns the new
// acknowledged offset.
func checkKilled(t *testing.T, dir string, acked int64, desc string) int64 {
	t.Helper()
	l, err := Open(dir, killOptions())
	require.NoError(t, err, "open after the kill %s", desc)
	defer l.Close()
	st, err := tryReadState(l)
	require.NoError(t, err, desc)
	require.Zero(t, st.start, "log start offset %s", desc)
	require.GreaterOrEqual(t, st.end, acked, "A1: acknowledged offsets lost %s", desc)
	for _, b := range st.batches {
		off := Batch(b).BaseOffset()
		if want := expectedKillBatch(t, off); string(b) != string(want) {
			require.Failf(t, "A1: batch differs from the one appended", "offset %d %s", off, desc)
		}
	}
	checkA4A5(t, l, st)
	return Batch(expectedKillBatch(t, st.end)).NextOffset()
}
