package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	replog "github.com/replog/replog/log"
)

// Queue is a durable job queue: one Log, plus a checkpoint file per group.
type Queue struct {
	dir string
	log *replog.Log
	mu  sync.Mutex // keeps the high watermark moving forward
}

// Open opens (or creates) the queue in dir.
func Open(dir string) (*Queue, error) {
	l, err := replog.Open(filepath.Join(dir, "jobs"), replog.Options{})
	if err != nil {
		return nil, err
	}
	l.SetHighWatermark(l.LogEndOffset()) // everything recovered is durable
	return &Queue{dir: dir, log: l}, nil
}

// Close closes the queue's log.
func (q *Queue) Close() error { return q.log.Close() }

// Enqueue appends jobs as one batch and returns once they are durable;
// only then do consumers see them (the high watermark moves past them).
// Concurrent callers share fsyncs: the Log's Sync is a group commit.
func (q *Queue) Enqueue(jobs ...[]byte) error {
	b := replog.NewBatchBuilder()
	now := time.Now().UnixMilli()
	for _, j := range jobs {
		b.Add(now, nil, j)
	}
	batch, err := b.Build(nil)
	if err != nil {
		return err
	}
	info, err := q.log.Append(batch)
	if err != nil {
		return err
	}
	// Appends are ordered: this Sync covers every job before ours too.
	if err := q.log.Sync(); err != nil {
		return err
	}
	q.mu.Lock()
	if end := info.LastOffset + 1; end > q.log.HighWatermark() {
		q.log.SetHighWatermark(end)
	}
	q.mu.Unlock()
	return nil
}

// Job is one job and its offset in the queue.
type Job struct {
	// Offset is the job's offset in the queue's log.
	Offset int64
	// Payload is the job's content, a copy the caller keeps.
	Payload []byte
}

// Consumer reads the queue for one group, from the group's committed offset.
type Consumer struct {
	path   string // the group's checkpoint file
	reader *replog.Reader
	next   int64 // the next offset to hand out
}

// Consumer returns a reader for group, positioned at its committed offset.
func (q *Queue) Consumer(group string) (*Consumer, error) {
	c := &Consumer{path: filepath.Join(q.dir, group+".offset")}
	data, err := os.ReadFile(c.path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if err == nil {
		rows, err := replog.DecodeCheckpoint(data, 1)
		if err != nil {
			return nil, fmt.Errorf("%s: bad checkpoint: %w", c.path, err)
		}
		if len(rows) != 1 {
			return nil, fmt.Errorf("%s: bad checkpoint: %w: %d rows, want 1", c.path, replog.ErrCorrupt, len(rows))
		}
		c.next = rows[0][0]
	}
	c.reader = q.log.NewReader(c.next, replog.ReaderOptions{UpToHighWatermark: true})
	return c, nil
}

// Poll waits for the next jobs (one batch's worth) and returns them. The
// payloads are copies the caller keeps.
func (c *Consumer) Poll(ctx context.Context) ([]Job, error) {
	for {
		if _, err := c.reader.Next(ctx); err != nil {
			return nil, err
		}
		it, err := c.reader.Records(nil)
		if err != nil {
			return nil, err
		}
		var jobs []Job
		for it.Next() {
			if r := it.Record(); r.Offset >= c.next { // a batch may start before us
				jobs = append(jobs, Job{r.Offset, append([]byte(nil), r.Value...)})
			}
		}
		if err := it.Err(); err != nil {
			return nil, err
		}
		if len(jobs) > 0 {
			c.next = jobs[len(jobs)-1].Offset + 1
			return jobs, nil
		}
	}
}

// Commit records durably that every job below offset is done: a consumer
// of the group opened later starts there. The file is replaced atomically.
func (c *Consumer) Commit(offset int64) error {
	tmp := c.path + ".tmp"
	if err := writeSynced(tmp, replog.EncodeCheckpoint([][]int64{{offset}})); err != nil {
		return err
	}
	if err := os.Rename(tmp, c.path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(c.path))
}

func writeSynced(path string, data []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// syncDir makes a rename in dir durable. Windows cannot fsync a directory
// (its renames are durable once they return).
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
