package main

import (
	"bytes"
	"fmt"

	"github.com/replog/replog/compression"
	replog "github.com/replog/replog/log"
)

// verify consumes node 1's log up to the high watermark and checks that
// every acknowledged record is there exactly once, with its content.
func verify(c *cluster, res *result) (int, error) {
	l := c.logs[1]
	r := l.NewReader(0, replog.ReaderOptions{UpToHighWatermark: true})
	local := compression.NewLocal(compression.Options{})
	seen := make([]map[int]bool, len(res.ackedSeqs))
	for i := range seen {
		seen[i] = map[int]bool{}
	}
	n := 0
	for {
		b, err := r.TryNext()
		if err != nil {
			return n, err
		}
		if b == nil {
			break
		}
		p := int(b.ProducerID() - 1000)
		if p < 0 || p >= len(seen) {
			return n, fmt.Errorf("batch at offset %d from unknown producer %d", b.BaseOffset(), b.ProducerID())
		}
		it, err := r.Records(local)
		if err != nil {
			return n, err
		}
		for i := 0; it.Next(); i++ {
			seq := int(b.BaseSequence()) + i
			if seen[p][seq] {
				return n, fmt.Errorf("producer %d record %d stored twice (second at offset %d)", p, seq, it.Record().Offset)
			}
			if !bytes.Equal(it.Record().Value, recordValue(p, seq)) {
				return n, fmt.Errorf("producer %d record %d has the wrong value", p, seq)
			}
			seen[p][seq] = true
			n++
		}
		if err := it.Err(); err != nil {
			return n, err
		}
	}
	for p, upTo := range res.ackedSeqs {
		for seq := 0; seq < int(upTo); seq++ {
			if !seen[p][seq] {
				return n, fmt.Errorf("acknowledged record %d of producer %d is missing", seq, p)
			}
		}
	}
	return n, nil
}
