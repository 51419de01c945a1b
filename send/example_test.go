package send_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/replog/replog/send"
)

// A response of encoded headers interleaved with record data that sits in
// a segment file. Written to a TCP or Unix connection on Linux it would go
// out with writev (and sendfile for large regions); here it goes to a
// bytes.Buffer through plain writes.
func Example() {
	dir, err := os.MkdirTemp("", "send-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "00000000000000000000.log")
	if err := os.WriteFile(path, []byte("batch-0|batch-1|batch-2|"), 0o600); err != nil {
		panic(err)
	}
	segment, err := os.Open(path)
	if err != nil {
		panic(err)
	}
	defer segment.Close()

	var b send.Builder
	b.AddBytes([]byte("[p0 "))
	if err := b.AddFile(segment, 0, 8); err != nil { // "batch-0|"
		panic(err)
	}
	b.AddBytes([]byte("] [p1 "))
	if err := b.AddFile(segment, 16, 7); err != nil { // "batch-2"
		panic(err)
	}
	b.AddBytes([]byte("]\n"))
	fmt.Println("length:", b.Len())

	var out bytes.Buffer
	n, err := b.WriteTo(&out)
	fmt.Println("written:", n, err)
	fmt.Print(out.String())

	// The Builder is reused for the next response.
	b.Reset()
	fmt.Println("after reset:", b.Len())
	// Output:
	// length: 27
	// written: 27 <nil>
	// [p0 batch-0|] [p1 batch-2]
	// after reset: 0
}
