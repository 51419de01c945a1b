package log

import "sync"

// tailBatch remembers the header and position of the last batch the
// appender wrote to a segment, so that a read at the log's end (a
// follower's or a tailing consumer's next fetch, which asks for the batch
// just appended) finds that batch without reading its header back from
// the file: locating it from the index costs two header reads, one of the
// indexed batch before it and one of the batch itself.
//
// It only answers for the segment's last batch as written by this
// process: it is unknown after the segment is opened, and forgotten when
// the segment is cut (truncation, a failed append's cleanup, recovery).
// The appender sets it before it publishes the batch (segment.size), so
// a reader that found an offset below the log end never sees a tail
// older than that offset's batch; it may see a newer one, and then reads
// the headers as before.
//
// Read and ReadRegion use it (segment.findRemembered). Read checks that
// the file holds the header remembered; ReadRegion does not read the
// file, so its FirstOffset is the remembered header's while its bytes
// are the file's, which only differ if the file was damaged after the
// append (a follower refuses a base offset below its log end). Calls that go on from the header without such a check (a Reader's
// positioning, OffsetForTimestamp, the producer-state replay) read it
// from the file, where find checks it against the batch before.
type tailBatch struct {
	mu  sync.Mutex
	ok  bool
	pos int64
	hdr [BatchHeaderSize]byte
}

// set records b, written at pos, as the segment's last batch.
func (t *tailBatch) set(b Batch, pos int64) {
	t.mu.Lock()
	t.ok, t.pos = true, pos
	copy(t.hdr[:], b[:BatchHeaderSize])
	t.mu.Unlock()
}

// forget drops the record: the segment was cut.
func (t *tailBatch) forget() {
	t.mu.Lock()
	t.ok = false
	t.mu.Unlock()
}

// find returns the position of the segment's last batch, with its header
// in hdr, if that batch holds offset and ends at size, the segment's
// readable size: then it is the first batch whose last offset is >=
// offset, since every batch before it ends below its base offset.
func (t *tailBatch) find(offset, size int64, hdr *[BatchHeaderSize]byte) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := Batch(t.hdr[:])
	if !t.ok || offset < b.BaseOffset() || offset > b.LastOffset() || t.pos+int64(b.Size()) != size {
		return 0, false
	}
	*hdr = t.hdr
	return t.pos, true
}
