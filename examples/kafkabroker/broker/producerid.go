package broker

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	replog "github.com/replog/replog/log"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// producerIDBlock is how many producer ids are reserved by one checkpoint
// write.
const producerIDBlock = 1000

// producerIDs hands out idempotent producer ids. An id must never be handed
// out twice, even across restarts: the logs remember each producer's last
// sequence numbers, and a new producer reusing an id would be rejected as out
// of order. Ids are reserved in blocks: the end of the current block is
// checkpointed (atomically, fsynced) before any id of it is used, and a
// restart begins at that end.
type producerIDs struct {
	path string

	mu          sync.Mutex
	next, limit int64 // ids in [next, limit) are reserved and unused
}

func openProducerIDs(path string) (*producerIDs, error) {
	p := &producerIDs{path: path}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return p, nil
	case err != nil:
		return nil, err
	}
	rows, err := replog.DecodeCheckpoint(data, 1)
	if err != nil || len(rows) != 1 || rows[0][0] < 0 {
		return nil, fmt.Errorf("broker: %s: bad producer id checkpoint: %w", path, err)
	}
	p.next, p.limit = rows[0][0], rows[0][0]
	return p, nil
}

// allocate returns a producer id never returned before.
func (p *producerIDs) allocate() (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.next == p.limit {
		limit := p.limit + producerIDBlock
		if err := writeFileAtomic(p.path, replog.EncodeCheckpoint([][]int64{{limit}})); err != nil {
			return 0, err
		}
		p.limit = limit
	}
	id := p.next
	p.next++
	return id, nil
}

// writeFileAtomic replaces path with data durably: a temporary file is
// written and fsynced, renamed over path, and the directory fsynced.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// handleInitProducerID gives an idempotent producer a new id at epoch 0.
// Transactional producers are refused: this broker has no transaction
// coordinator.
func (b *Broker) handleInitProducerID(req *kmsg.InitProducerIDRequest) *kmsg.InitProducerIDResponse {
	resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
	resp.ProducerID, resp.ProducerEpoch = -1, -1
	if req.TransactionalID != nil {
		resp.ErrorCode = errInvalidRequest
		return resp
	}
	id, err := b.pids.allocate()
	if err != nil {
		b.log.Error("allocate producer id", "err", err)
		resp.ErrorCode = errStorage
		return resp
	}
	resp.ProducerID, resp.ProducerEpoch = id, 0
	return resp
}
