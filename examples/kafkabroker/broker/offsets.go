package broker

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	replog "github.com/replog/replog/log"
)

// offsetStore keeps consumer groups' committed offsets in a replog Log, one
// record per committed partition, replayed into memory at start: the last
// record for a key wins. A commit is fsynced before it is acknowledged.
//
//	key:   version i16 (0) | group str | topic str | partition i32
//	value: version i16 (0) | offset i64 | leader epoch i32 | metadata str | commit time ms i64
//	str:   length i16 | bytes
//
// The log is never compacted: it grows with every commit.
type offsetStore struct {
	mu      sync.Mutex
	log     *replog.Log
	offsets map[string]map[topicPartition]committedOffset // by group
	bb      *replog.BatchBuilder
	buf     []byte
}

type topicPartition struct {
	topic     string
	partition int32
}

type committedOffset struct {
	offset      int64
	leaderEpoch int32
	metadata    string
}

// offsetCommit is one partition of a commit.
type offsetCommit struct {
	tp topicPartition
	committedOffset
}

const (
	// maxOffsetsBatch bounds each batch of a commit: the offsets log
	// refuses larger ones (its MaxBatchBytes is the default).
	maxOffsetsBatch = replog.DefaultMaxBatchBytes
	// maxRecordOverhead bounds what a record adds to a batch besides its
	// key and value: its length, attributes, deltas, key and value
	// lengths and header count, as varints.
	maxRecordOverhead = 40
)

func openOffsetStore(dir string) (*offsetStore, error) {
	l, err := replog.Open(dir, replog.Options{SegmentBytes: 64 << 20})
	if err != nil {
		return nil, err
	}
	s := &offsetStore{
		log:     l,
		offsets: make(map[string]map[topicPartition]committedOffset),
		bb:      replog.NewBatchBuilder(),
	}
	if err := s.replay(); err != nil {
		l.Close()
		return nil, fmt.Errorf("broker: replay committed offsets in %s: %w", dir, err)
	}
	return s, nil
}

// replay reads the whole log into the offsets map.
func (s *offsetStore) replay() error {
	r := s.log.NewReader(s.log.LogStartOffset(), replog.ReaderOptions{})
	for {
		b, err := r.TryNext()
		if err != nil {
			return err
		}
		if b == nil {
			return nil
		}
		it, err := r.Records(nil)
		if err != nil {
			return err
		}
		for it.Next() {
			rec := it.Record()
			group, tp, ok := decodeOffsetKey(rec.Key)
			v, vok := decodeOffsetValue(rec.Value)
			if !ok || !vok {
				return fmt.Errorf("%w: bad committed offset record at offset %d", replog.ErrCorrupt, rec.Offset)
			}
			s.set(group, tp, v)
		}
		if err := it.Err(); err != nil {
			return err
		}
	}
}

func (s *offsetStore) set(group string, tp topicPartition, v committedOffset) {
	g := s.offsets[group]
	if g == nil {
		g = make(map[topicPartition]committedOffset)
		s.offsets[group] = g
	}
	g[tp] = v
}

// commit appends the commits as one batch, fsyncs it, and then makes them
// visible to get.
func (s *offsetStore) commit(group string, commits []offsetCommit) error {
	if len(commits) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UnixMilli()
	s.bb.Reset(replog.BatchOptions{})
	batches := s.buf[:0]
	var key, value []byte
	var err error
	for _, c := range commits {
		key = encodeOffsetKey(key[:0], group, c.tp)
		value = encodeOffsetValue(value[:0], c.committedOffset, now)
		// A commit of thousands of partitions with long metadata does not
		// fit one batch: it takes several, appended together.
		if s.bb.Len() > 0 && replog.BatchHeaderSize+s.bb.BodySize()+len(key)+len(value)+maxRecordOverhead > maxOffsetsBatch {
			if batches, err = s.bb.Build(batches); err != nil {
				return err
			}
			s.bb.Reset(replog.BatchOptions{})
		}
		s.bb.Add(now, key, value)
	}
	if batches, err = s.bb.Build(batches); err != nil {
		return err
	}
	s.buf = batches
	if _, err := s.log.Append(batches); err != nil {
		return err
	}
	if err := s.log.Sync(); err != nil {
		return err
	}
	for _, c := range commits {
		s.set(group, c.tp, c.committedOffset)
	}
	return nil
}

// get returns the committed offset of one partition.
func (s *offsetStore) get(group string, tp topicPartition) (committedOffset, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.offsets[group][tp]
	return v, ok
}

// all returns every committed partition of group.
func (s *offsetStore) all(group string) map[topicPartition]committedOffset {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[topicPartition]committedOffset, len(s.offsets[group]))
	for tp, v := range s.offsets[group] {
		out[tp] = v
	}
	return out
}

func (s *offsetStore) close() error { return s.log.Close() }

func appendStr(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// readStr reads a str at b[*pos:], advancing pos.
func readStr(b []byte, pos *int) (string, bool) {
	if len(b)-*pos < 2 {
		return "", false
	}
	n := int(binary.BigEndian.Uint16(b[*pos:]))
	*pos += 2
	if len(b)-*pos < n {
		return "", false
	}
	s := string(b[*pos : *pos+n])
	*pos += n
	return s, true
}

func encodeOffsetKey(b []byte, group string, tp topicPartition) []byte {
	b = binary.BigEndian.AppendUint16(b, 0)
	b = appendStr(b, group)
	b = appendStr(b, tp.topic)
	return binary.BigEndian.AppendUint32(b, uint32(tp.partition))
}

func decodeOffsetKey(b []byte) (string, topicPartition, bool) {
	if len(b) < 2 || binary.BigEndian.Uint16(b) != 0 {
		return "", topicPartition{}, false
	}
	pos := 2
	group, ok1 := readStr(b, &pos)
	topic, ok2 := readStr(b, &pos)
	if !ok1 || !ok2 || len(b)-pos != 4 {
		return "", topicPartition{}, false
	}
	return group, topicPartition{topic, int32(binary.BigEndian.Uint32(b[pos:]))}, true
}

func encodeOffsetValue(b []byte, v committedOffset, now int64) []byte {
	b = binary.BigEndian.AppendUint16(b, 0)
	b = binary.BigEndian.AppendUint64(b, uint64(v.offset))
	b = binary.BigEndian.AppendUint32(b, uint32(v.leaderEpoch))
	b = appendStr(b, v.metadata)
	return binary.BigEndian.AppendUint64(b, uint64(now))
}

func decodeOffsetValue(b []byte) (committedOffset, bool) {
	if len(b) < 14 || binary.BigEndian.Uint16(b) != 0 {
		return committedOffset{}, false
	}
	v := committedOffset{
		offset:      int64(binary.BigEndian.Uint64(b[2:])),
		leaderEpoch: int32(binary.BigEndian.Uint32(b[10:])),
	}
	pos := 14
	var ok bool
	if v.metadata, ok = readStr(b, &pos); !ok || len(b)-pos != 8 {
		return committedOffset{}, false
	}
	return v, true
}
