package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestRerunOnAKeptDirIsRefused: a second run on a -dir the first one
// kept is refused up front, naming the directory, instead of failing deep
// in the replication layer (the kept logs are at leader epoch 2, the
// example starts a cluster at epoch 1).
func TestRerunOnAKeptDirIsRefused(t *testing.T) {
	dir := t.TempDir()
	if err := checkDir(dir); err != nil {
		t.Fatalf("an empty -dir: %v", err)
	}
	if err := quickstart(context.Background(), dir, 2000, 2); err != nil {
		t.Fatalf("first run: %v", err)
	}
	err := checkDir(dir)
	if err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("a kept -dir: %v, want an error naming it", err)
	}
}

// TestInterruptRemovesTempDir interrupts the demo (Ctrl-C, SIGINT) while
// it produces: it stops, closes the cluster and removes its temporary
// directory (tens of MB of segments) instead of leaving it in $TMPDIR.
func TestInterruptRemovesTempDir(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("needs SIGINT")
	}
	bin := filepath.Join(t.TempDir(), "quickstart")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	tmp := t.TempDir()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait for the first line ("3 replicas on ..."): the cluster runs and
	// the producers are starting.
	if _, err := bufio.NewReader(stdout).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, stdout)
	cmd.Wait()
	left, err := filepath.Glob(filepath.Join(tmp, "replog-quickstart-*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("after Ctrl-C the demo left its temporary directory behind: %v", left)
	}
}
