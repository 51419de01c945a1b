package log

import "slices"

// The model FuzzLogOps checks the log against (fuzz_ops_test.go).

// opsModel is what the log should hold. batches are the batches appended
// and not truncated, in order, as stored; those below start may or may
// not still be on disk.
type opsModel struct {
	batches    [][]byte
	start, end int64
	epoch      int32 // the epoch the next appends carry
	epochs     []EpochEntry
	// durable is how many of batches a power loss must keep (Sync,
	// Close), durableStart the least log start offset it may leave.
	durable      int
	durableStart int64
}

// producerBatches returns producer pid's batches in the model, only those
// at or after the log start if live.
func (m *opsModel) producerBatches(pid int64, live bool) [][]byte {
	var out [][]byte
	for _, b := range m.batches {
		if Batch(b).ProducerID() == pid && (!live || Batch(b).LastOffset() >= m.start) {
			out = append(out, b)
		}
	}
	return out
}

// live returns the batches at or after the log start.
func (m *opsModel) live() [][]byte {
	out := [][]byte{}
	for _, b := range m.batches {
		if Batch(b).LastOffset() >= m.start {
			out = append(out, b)
		}
	}
	return out
}

func (m *opsModel) add(b Batch) {
	m.batches = append(m.batches, slices.Clone(b))
	m.assignEpoch(b.LeaderEpoch(), b.BaseOffset())
	m.end = b.NextOffset()
}

// assignEpoch is Kafka's LeaderEpochFileCache.assign: entries starting at
// or after offset hold no batch and go; a newer epoch is added.
func (m *opsModel) assignEpoch(epoch int32, offset int64) {
	if n := len(m.epochs); n > 0 && (epoch < m.epochs[n-1].Epoch && m.epochs[n-1].StartOffset < offset ||
		epoch == m.epochs[n-1].Epoch && m.epochs[n-1].StartOffset <= offset) {
		return
	}
	m.truncateEpochsFromEnd(offset)
	if n := len(m.epochs); n == 0 || m.epochs[n-1].Epoch < epoch {
		m.epochs = append(m.epochs, EpochEntry{Epoch: epoch, StartOffset: offset})
	}
}

func (m *opsModel) truncateEpochsFromEnd(end int64) {
	for len(m.epochs) > 0 && m.epochs[len(m.epochs)-1].StartOffset >= end {
		m.epochs = m.epochs[:len(m.epochs)-1]
	}
}

// deleteBefore moves the start to off; the epochs that started below it
// collapse into the latest of them, starting at off.
func (m *opsModel) deleteBefore(off int64) {
	m.start = off
	m.truncateEpochsFromStart(off)
}

func (m *opsModel) truncateEpochsFromStart(off int64) {
	i := 0
	for i < len(m.epochs) && m.epochs[i].StartOffset <= off {
		i++
	}
	if i > 0 {
		m.epochs = append([]EpochEntry{{Epoch: m.epochs[i-1].Epoch, StartOffset: off}}, m.epochs[i:]...)
	}
}
