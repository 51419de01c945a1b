package log_test

import (
	"fmt"
	"os"

	replog "github.com/replog/replog/log"
)

// Example appends a batch, makes it durable, reads it back and iterates
// its records.
func Example() {
	dir, err := os.MkdirTemp("", "replog-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	l, err := replog.Open(dir, replog.Options{})
	if err != nil {
		panic(err)
	}
	defer l.Close()

	b := replog.NewBatchBuilder()
	b.Add(1700000000000, []byte("user-1"), []byte("signed up"))
	b.Add(1700000000001, []byte("user-1"), []byte("logged in"))
	batch, err := b.Build(nil)
	if err != nil {
		panic(err)
	}
	info, err := l.Append(batch)
	if err != nil {
		panic(err)
	}
	if err := l.Sync(); err != nil {
		panic(err)
	}
	fmt.Println("appended offsets", info.FirstOffset, "to", info.LastOffset)

	buf, err := l.Read(nil, 0, replog.ReadOptions{})
	if err != nil {
		panic(err)
	}
	for rest := buf; len(rest) > 0; {
		batch, r, err := replog.SplitBatch(rest)
		if err != nil {
			panic(err)
		}
		it := batch.Records()
		for it.Next() {
			rec := it.Record()
			fmt.Printf("%d %s %s\n", rec.Offset, rec.Key, rec.Value)
		}
		rest = r
	}
	// Output:
	// appended offsets 0 to 1
	// 0 user-1 signed up
	// 1 user-1 logged in
}
