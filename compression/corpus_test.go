package compression

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
)

// Test data: Kafka v2 records whose values are JSON-like events, so that
// codecs see realistic, compressible input. Everything is deterministic.

var (
	corpusEvents = []string{"page_view", "click", "add_to_cart", "checkout", "login", "logout", "search", "purchase"}
	corpusPaths  = []string{"/", "/products", "/products/42", "/cart", "/checkout", "/account", "/search?q=shoes", "/help"}
	corpusAgents = []string{
		"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0 Safari/537.36",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Safari/605.1.15",
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:125.0) Gecko/20100101 Firefox/125.0",
	}
)

// jsonValue returns a JSON-like event of exactly size bytes.
func jsonValue(rng *rand.Rand, size int) []byte {
	var sb strings.Builder
	fmt.Fprintf(&sb, `{"id":%d,"ts":"2024-05-%02dT%02d:%02d:%02d.%03dZ","event":%q,"user":"user-%06d",`,
		rng.Int64N(1<<40), 1+rng.IntN(28), rng.IntN(24), rng.IntN(60), rng.IntN(60), rng.IntN(1000),
		corpusEvents[rng.IntN(len(corpusEvents))], rng.IntN(200000))
	fmt.Fprintf(&sb, `"session":"%016x","ip":"10.%d.%d.%d","path":%q,"agent":%q,"items":[`,
		rng.Uint64(), rng.IntN(256), rng.IntN(256), rng.IntN(256),
		corpusPaths[rng.IntN(len(corpusPaths))], corpusAgents[rng.IntN(len(corpusAgents))])
	for i := range 1 + rng.IntN(6) {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"sku":"SKU-%05d","qty":%d,"price":%d.%02d}`, rng.IntN(100000), 1+rng.IntN(5), rng.IntN(500), rng.IntN(100))
	}
	sb.WriteString(`],"note":"`)
	const filler = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
	for sb.Len() < size-2 {
		if rng.IntN(8) == 0 {
			fmt.Fprintf(&sb, "%x", rng.Uint32())
		} else {
			w := filler[rng.IntN(len(filler)-12):]
			sb.WriteString(w[:1+rng.IntN(11)])
		}
	}
	s := sb.String()[:size-2] + `"}`
	return []byte(s)
}

// recordsBody returns n Kafka v2 records (DefaultRecord) of valueSize-byte
// JSON values: the uncompressed body of a record batch.
func recordsBody(rng *rand.Rand, n, valueSize int) []byte {
	var body []byte
	for i := range n {
		key := fmt.Appendf(nil, "key-%d", rng.IntN(1000))
		value := jsonValue(rng, valueSize)
		var rec []byte
		rec = append(rec, 0)                       // attributes
		rec = binary.AppendVarint(rec, int64(i*3)) // timestampDelta
		rec = binary.AppendVarint(rec, int64(i))   // offsetDelta
		rec = binary.AppendVarint(rec, int64(len(key)))
		rec = append(rec, key...)
		rec = binary.AppendVarint(rec, int64(len(value)))
		rec = append(rec, value...)
		rec = binary.AppendVarint(rec, 0) // headers
		body = binary.AppendVarint(body, int64(len(rec)))
		body = append(body, rec...)
	}
	return body
}

// randomBytes returns n incompressible bytes.
func randomBytes(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// newRand returns a deterministic generator.
func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 42))
}
