package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/replog/replog/send"
)

// This file holds the frame codec of the TCP transport; the byte layout is
// drawn in the package documentation ("Wire format").

// DefaultMaxFrameBytes is the largest frame, header included, that the TCP
// transport and server accept unless TCPOptions.MaxFrameBytes says
// otherwise.
const DefaultMaxFrameBytes = 64 << 20

// Errors of the wire codec. They are wrapped with context; match them with
// errors.Is.
var (
	// ErrFrameTooLarge reports a frame whose announced length exceeds
	// MaxFrameBytes, or MaxRequestBytes for a request. It is detected from
	// the 16-byte header, before the body is read or any memory is
	// allocated for it.
	ErrFrameTooLarge = errors.New("replication: frame larger than the limit")
	// ErrMalformedFrame reports bytes that are not a valid frame: bad
	// magic, an unsupported version or type, a truncated frame, a length
	// or count that does not fit the frame, trailing bytes, or a value
	// that cannot be encoded (a topic name over 65,535 bytes).
	ErrMalformedFrame = errors.New("replication: malformed frame")
	// ErrRemote reports an error frame: the peer could not serve the
	// request. When the peer's message starts with one of the sentinel
	// errors a fetch can meet on the leader (ErrClusterMismatch,
	// ErrClosed, ErrFrameTooLarge, ErrMalformedFrame, ErrNotLeader,
	// ErrFencedLeaderEpoch, ErrUnknownLeaderEpoch, ErrOffsetOutOfRange,
	// ErrUnknownPartition, ErrNotReplica, ErrStorage), the returned error
	// wraps that sentinel too; the others (ErrUnreachable above all, which
	// means here that no connection could be made) do not cross.
	ErrRemote = errors.New("replication: error reported by the peer")
)

const (
	frameMagic      = 0x5250 // "RP"
	frameVersion    = 1
	frameHeaderSize = 16 // length, magic, version, type, correlation id
	// frameLengthMin is the smallest value of the length field: the
	// header after the length field.
	frameLengthMin = frameHeaderSize - 4

	msgFetchRequest  = 1
	msgFetchResponse = 2
	msgError         = 3

	// Smallest encodings of one partition (empty topic name), used to
	// reject counts the frame cannot hold before allocating for them.
	minRequestPartitionBytes  = 2 + 4 + 4 + 8 + 4 + 8
	minResponsePartitionBytes = 2 + 4 + 2 + 8 + 8 + 8 + 1 + 4 + 8 + 4
	// responsePartitionHeaderFixed is a partition header without its
	// topic name bytes.
	responsePartitionHeaderFixed = minResponsePartitionBytes

	// maxPrealloc bounds the slice capacity reserved from a decoded count
	// of response partitions; longer lists grow as their entries are
	// actually decoded.
	maxPrealloc = 256
	// minFrameBytes is the smallest frame limit (TCPOptions.MaxFrameBytes
	// and MaxRequestBytes) a peer may set.
	minFrameBytes = 4 << 10
	// maxErrorMessage bounds the message of an error frame so that the
	// frame fits in minFrameBytes: a peer at the smallest limit still
	// reads the error rather than dropping the connection.
	maxErrorMessage = minFrameBytes - frameHeaderSize - 2
)

// frameHeader is a decoded frame header.
type frameHeader struct {
	bodyLen int // bytes after the 16-byte header (announced, with ErrFrameTooLarge)
	version uint8
	typ     uint8
	corr    uint64
}

// parseFrameHeader checks a frame header against the limit (a whole frame
// of at most maxFrame bytes) and the magic. Version and type are returned
// for the caller to judge: the length is trustworthy even when they are
// unknown, so a server can skip the body and answer with an error frame.
func parseFrameHeader(b []byte, maxFrame int) (frameHeader, error) {
	if len(b) < frameHeaderSize {
		return frameHeader{}, fmt.Errorf("%w: truncated header: %d of %d bytes", ErrMalformedFrame, len(b), frameHeaderSize)
	}
	length := int64(binary.BigEndian.Uint32(b[0:4]))
	h := frameHeader{version: b[6], typ: b[7], corr: binary.BigEndian.Uint64(b[8:16])}
	if magic := binary.BigEndian.Uint16(b[4:6]); magic != frameMagic {
		return h, fmt.Errorf("%w: bad magic %#04x", ErrMalformedFrame, magic)
	}
	if length < frameLengthMin {
		return h, fmt.Errorf("%w: length %d is shorter than the header", ErrMalformedFrame, length)
	}
	if length+4 > int64(maxFrame) {
		h.bodyLen = int(min(length-frameLengthMin, math.MaxInt32))
		return h, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, length+4, maxFrame)
	}
	h.bodyLen = int(length - frameLengthMin)
	return h, nil
}

// checkVersion rejects frames of another protocol version.
func (h frameHeader) checkVersion() error {
	if h.version != frameVersion {
		return fmt.Errorf("%w: unsupported version %d", ErrMalformedFrame, h.version)
	}
	return nil
}

// appendFrameHeader appends a header whose length field is filled in by
// finishFrame.
func appendFrameHeader(dst []byte, typ uint8, corr uint64) []byte {
	dst = binary.BigEndian.AppendUint32(dst, 0)
	dst = binary.BigEndian.AppendUint16(dst, frameMagic)
	dst = append(dst, frameVersion, typ)
	return binary.BigEndian.AppendUint64(dst, corr)
}

// finishFrame sets the length field of the frame starting at start.
func finishFrame(frame []byte, start int) error {
	n := len(frame) - start - 4
	if uint64(n) > 1<<32-1 {
		return fmt.Errorf("%w: cannot encode a frame of %d bytes", ErrFrameTooLarge, n+4)
	}
	binary.BigEndian.PutUint32(frame[start:], uint32(n))
	return nil
}

func appendString(dst []byte, s string) ([]byte, error) {
	if len(s) > 1<<16-1 {
		return dst, fmt.Errorf("%w: cannot encode a string of %d bytes", ErrMalformedFrame, len(s))
	}
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...), nil
}

// appendFetchRequestFrame appends req as a whole frame.
func appendFetchRequestFrame(dst []byte, corr uint64, req *FetchRequest) ([]byte, error) {
	start := len(dst)
	dst = appendFrameHeader(dst, msgFetchRequest, corr)
	var err error
	if dst, err = appendString(dst, req.ClusterID); err != nil {
		return dst[:start], err
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(req.ReplicaID))
	dst = binary.BigEndian.AppendUint32(dst, uint32(req.MaxBytes))
	dst = binary.BigEndian.AppendUint32(dst, uint32(req.MaxWaitMs))
	if uint64(len(req.Partitions)) > 1<<32-1 {
		return dst[:start], fmt.Errorf("%w: cannot encode %d partitions", ErrMalformedFrame, len(req.Partitions))
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(req.Partitions)))
	for i := range req.Partitions {
		p := &req.Partitions[i]
		if dst, err = appendString(dst, p.Topic); err != nil {
			return dst[:start], err
		}
		dst = binary.BigEndian.AppendUint32(dst, uint32(p.Partition))
		dst = binary.BigEndian.AppendUint32(dst, uint32(p.CurrentLeaderEpoch))
		dst = binary.BigEndian.AppendUint64(dst, uint64(p.FetchOffset))
		dst = binary.BigEndian.AppendUint32(dst, uint32(p.LastFetchedEpoch))
		dst = binary.BigEndian.AppendUint64(dst, uint64(p.LogStartOffset))
	}
	if err := finishFrame(dst, start); err != nil {
		return dst[:start], err
	}
	return dst, nil
}

// appendPartitionHeader appends one partition of a fetch response up to
// and including its records length; the records follow it.
func appendPartitionHeader(dst []byte, p *FetchPartitionResponse, recordsLen int64) ([]byte, error) {
	var err error
	if dst, err = appendString(dst, p.Topic); err != nil {
		return dst, err
	}
	if uint64(recordsLen) > 1<<32-1 {
		return dst, fmt.Errorf("%w: cannot encode %d bytes of records", ErrFrameTooLarge, recordsLen)
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(p.Partition))
	dst = binary.BigEndian.AppendUint16(dst, uint16(p.Error))
	dst = binary.BigEndian.AppendUint64(dst, uint64(p.HighWatermark))
	dst = binary.BigEndian.AppendUint64(dst, uint64(p.LogStartOffset))
	dst = binary.BigEndian.AppendUint64(dst, uint64(p.LogEndOffset))
	div := EpochEndOffset{Epoch: -1, EndOffset: -1}
	flag := byte(0)
	if p.Diverging != nil {
		div, flag = *p.Diverging, 1
	}
	dst = append(dst, flag)
	dst = binary.BigEndian.AppendUint32(dst, uint32(div.Epoch))
	dst = binary.BigEndian.AppendUint64(dst, uint64(div.EndOffset))
	return binary.BigEndian.AppendUint32(dst, uint32(recordsLen)), nil
}

// appendFetchResponseFrame appends resp as a whole frame, its records
// taken from Records (Regions must have been materialized). The TCP server
// writes the same bytes with writeFetchResponse.
func appendFetchResponseFrame(dst []byte, corr uint64, resp *FetchResponse) ([]byte, error) {
	start := len(dst)
	dst = appendFrameHeader(dst, msgFetchResponse, corr)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(resp.Partitions)))
	var err error
	for i := range resp.Partitions {
		p := &resp.Partitions[i]
		if p.Region.Length > 0 {
			return dst[:start], fmt.Errorf("replication: appendFetchResponseFrame: partition %s has an unread region", p.TopicPartition)
		}
		if dst, err = appendPartitionHeader(dst, p, int64(len(p.Records))); err != nil {
			return dst[:start], err
		}
		dst = append(dst, p.Records...)
	}
	if err := finishFrame(dst, start); err != nil {
		return dst[:start], err
	}
	return dst, nil
}

// recordsLen is the size of a partition's records on the wire: its region
// when it has one, else its Records.
func recordsLen(p *FetchPartitionResponse) int64 {
	if p.Region.Length > 0 {
		return p.Region.Length
	}
	return int64(len(p.Records))
}

// recordsBudget is how many record bytes a response to req can carry in
// a frame of at most maxFrame bytes, after its frame and partition
// headers (negative when the headers alone exceed it).
func recordsBudget(req *FetchRequest, maxFrame int) int64 {
	budget := int64(maxFrame) - frameHeaderSize - 4
	for i := range req.Partitions {
		budget -= responsePartitionHeaderFixed + int64(len(req.Partitions[i].Topic))
	}
	return budget
}

// framedMaxBytes is req.MaxBytes lowered to what a response frame of at
// most maxFrame bytes can carry, so that a leader sends what the frame
// holds rather than records that would be dropped: a follower asking for
// more would be answered, again and again, with nothing.
func framedMaxBytes(req *FetchRequest, maxFrame int) int32 {
	if budget := recordsBudget(req, maxFrame); budget > 0 && int64(req.MaxBytes) > budget {
		return int32(budget)
	}
	return req.MaxBytes
}

// buildFetchResponse adds resp as one frame to b: the frame header and the
// partition headers as bytes encoded into scratch, the records as file
// regions (Region) or slices (Records). A response that would exceed
// maxFrame loses the records of its last partitions (their headers stay,
// so followers fetch them again) until it fits; dropped counts them.
// Records that would not fit even alone (a batch larger than the frame:
// the leader sends at least one whole batch) are answered with
// CodeRecordTooLarge instead, so that the follower backs off and reports
// it rather than fetching them again at once, forever. It returns
// scratch, possibly grown, which b references until b.Reset.
func buildFetchResponse(b *send.Builder, scratch []byte, corr uint64, resp *FetchResponse, maxFrame int) (_ []byte, dropped int, _ error) {
	total := int64(frameHeaderSize + 4)
	for i := range resp.Partitions {
		total += responsePartitionHeaderFixed + int64(len(resp.Partitions[i].Topic))
	}
	if total > int64(maxFrame) {
		return scratch, 0, fmt.Errorf("%w: %d partition headers take %d bytes, limit %d", ErrFrameTooLarge, len(resp.Partitions), total, maxFrame)
	}
	headers := total
	// lens[i]: partition i's records fit; decided in order so that the
	// partitions first in the follower's fair order are served first.
	lens := make([]int64, len(resp.Partitions))
	for i := range resp.Partitions {
		p := &resp.Partitions[i]
		n := recordsLen(p)
		if headers+n > int64(maxFrame) && p.Error == CodeNone {
			p.Error = CodeRecordTooLarge
		}
		if total+n > int64(maxFrame) {
			if n > 0 {
				dropped++
			}
			continue
		}
		lens[i] = n
		total += n
	}
	// Encode every header first: scratch must not move once b references
	// parts of it.
	scratch = appendFrameHeader(scratch[:0], msgFetchResponse, corr)
	binary.BigEndian.PutUint32(scratch[0:4], uint32(total-4))
	scratch = binary.BigEndian.AppendUint32(scratch, uint32(len(resp.Partitions)))
	ends := make([]int, len(resp.Partitions))
	var err error
	for i := range resp.Partitions {
		if scratch, err = appendPartitionHeader(scratch, &resp.Partitions[i], lens[i]); err != nil {
			return scratch, 0, err
		}
		ends[i] = len(scratch)
	}
	prev := 0
	for i := range resp.Partitions {
		b.AddBytes(scratch[prev:ends[i]])
		prev = ends[i]
		p := &resp.Partitions[i]
		switch {
		case lens[i] == 0:
		case p.Region.Length > 0:
			if err := b.AddFile(p.Region.File, p.Region.Position, p.Region.Length); err != nil {
				return scratch, 0, err
			}
		default:
			b.AddBytes(p.Records)
		}
	}
	if prev < len(scratch) {
		b.AddBytes(scratch[prev:]) // a response without partitions
	}
	if b.Len() != total {
		return scratch, 0, fmt.Errorf("replication: internal error: response frame of %d bytes, computed %d", b.Len(), total)
	}
	return scratch, dropped, nil
}

// appendErrorFrame appends an error frame carrying msg (cut to
// maxErrorMessage bytes).
func appendErrorFrame(dst []byte, corr uint64, msg string) []byte {
	if len(msg) > maxErrorMessage {
		msg = strings.ToValidUTF8(msg[:maxErrorMessage], "")
	}
	start := len(dst)
	dst = appendFrameHeader(dst, msgError, corr)
	dst, _ = appendString(dst, msg) // short enough
	_ = finishFrame(dst, start)     // short enough
	return dst
}

// wireReader decodes big-endian fields from a frame body. The first
// failure sticks: later reads return zero values, and err says where the
// body fell short.
type wireReader struct {
	b     []byte
	off   int
	err   error
	names *nameTable // interns the strings read, when set
}

func (r *wireReader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b)-r.off {
		r.err = fmt.Errorf("%w: %s of %d bytes at byte %d exceeds the body of %d bytes", ErrMalformedFrame, what, n, r.off, len(r.b))
		return nil
	}
	p := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return p
}

func (r *wireReader) remaining() int { return len(r.b) - r.off }

func (r *wireReader) u8(what string) uint8 {
	if p := r.take(1, what); p != nil {
		return p[0]
	}
	return 0
}

func (r *wireReader) u16(what string) uint16 {
	if p := r.take(2, what); p != nil {
		return binary.BigEndian.Uint16(p)
	}
	return 0
}

func (r *wireReader) u32(what string) uint32 {
	if p := r.take(4, what); p != nil {
		return binary.BigEndian.Uint32(p)
	}
	return 0
}

func (r *wireReader) u64(what string) uint64 {
	if p := r.take(8, what); p != nil {
		return binary.BigEndian.Uint64(p)
	}
	return 0
}

func (r *wireReader) i32(what string) int32 { return int32(r.u32(what)) }
func (r *wireReader) i64(what string) int64 { return int64(r.u64(what)) }

func (r *wireReader) str(what string) string {
	n := int(r.u16(what))
	return r.names.get(r.take(n, what))
}

// strOr is str returning prev, without allocating, when the bytes equal
// it: a request lists the partitions of a topic one after the other.
func (r *wireReader) strOr(prev, what string) string {
	n := int(r.u16(what))
	if b := r.take(n, what); string(b) != prev {
		return r.names.get(b)
	}
	return prev
}

// nameTable interns the names (cluster id, topics) that the frames of one
// connection carry, so that a steady exchange about the same partitions
// allocates no strings. It keeps at most maxInternedNames names of at
// most maxInternedNameBytes each, so a peer sending ever new names costs
// it at most about 256 KiB; past that it starts over.
type nameTable struct {
	m map[string]string
}

const (
	maxInternedNames     = 1024
	maxInternedNameBytes = 255 // Kafka's topic names are at most 249 bytes
)

// get returns b as a string, interned when t is not nil.
func (t *nameTable) get(b []byte) string {
	if t == nil || len(b) > maxInternedNameBytes {
		return string(b)
	}
	if s, ok := t.m[string(b)]; ok {
		return s
	}
	if t.m == nil || len(t.m) >= maxInternedNames {
		t.m = make(map[string]string)
	}
	s := string(b)
	t.m[s] = s
	return s
}

// count reads a u32 count of entries taking at least minBytes each, and
// fails if the rest of the body cannot hold that many.
func (r *wireReader) count(minBytes int, what string) int {
	n := r.u32(what)
	if r.err == nil && uint64(n)*uint64(minBytes) > uint64(r.remaining()) {
		r.err = fmt.Errorf("%w: %d %s cannot fit in the %d bytes left", ErrMalformedFrame, n, what, r.remaining())
		return 0
	}
	return int(n)
}

// end fails if bytes are left over.
func (r *wireReader) end() error {
	if r.err == nil && r.off != len(r.b) {
		r.err = fmt.Errorf("%w: %d trailing bytes", ErrMalformedFrame, len(r.b)-r.off)
	}
	return r.err
}

// decodeFetchRequest decodes a fetch request body. The request does not
// alias body. It allocates little more than twice the body's size: the
// partitions at once, once their count was checked against the body's
// size, and a topic name only where it differs from the one before.
func decodeFetchRequest(body []byte) (*FetchRequest, error) {
	req := &FetchRequest{}
	if err := decodeFetchRequestInto(body, req, nil); err != nil {
		return nil, err
	}
	return req, nil
}

// decodeFetchRequestInto is decodeFetchRequest into req, reusing its
// Partitions' array when it is large enough, with names interned in names
// (nil: allocated). On error req holds part of the request.
func decodeFetchRequestInto(body []byte, req *FetchRequest, names *nameTable) error {
	r := &wireReader{b: body, names: names}
	*req = FetchRequest{Partitions: req.Partitions[:0]}
	req.ClusterID = r.str("cluster id")
	req.ReplicaID = r.i32("replica id")
	req.MaxBytes = r.i32("max bytes")
	req.MaxWaitMs = r.i32("max wait")
	n := r.count(minRequestPartitionBytes, "partitions")
	if n > cap(req.Partitions) {
		req.Partitions = make([]FetchPartition, n)
	}
	req.Partitions = req.Partitions[:n]
	topic := ""
	for i := 0; i < n && r.err == nil; i++ {
		p := &req.Partitions[i]
		topic = r.strOr(topic, "topic")
		p.Topic = topic
		p.Partition = r.i32("partition")
		p.CurrentLeaderEpoch = r.i32("current leader epoch")
		p.FetchOffset = r.i64("fetch offset")
		p.LastFetchedEpoch = r.i32("last fetched epoch")
		p.LogStartOffset = r.i64("log start offset")
	}
	return r.end()
}

// decodeFetchResponse decodes a fetch response body. Each partition's
// Records alias body (capacity capped at their length); the caller owns
// body from then on.
func decodeFetchResponse(body []byte) (*FetchResponse, error) {
	resp := &FetchResponse{}
	if err := decodeFetchResponseInto(body, resp, nil); err != nil {
		return nil, err
	}
	return resp, nil
}

// decodeFetchResponseInto is decodeFetchResponse into resp, reusing its
// Partitions' array, with names interned in names (nil: allocated). On
// error resp holds part of the response.
func decodeFetchResponseInto(body []byte, resp *FetchResponse, names *nameTable) error {
	r := &wireReader{b: body, names: names}
	clear(resp.Partitions) // forget the last response's records
	*resp = FetchResponse{Partitions: resp.Partitions[:0]}
	n := r.count(minResponsePartitionBytes, "partitions")
	if n > 0 && resp.Partitions == nil {
		resp.Partitions = make([]FetchPartitionResponse, 0, min(n, maxPrealloc))
	}
	for i := 0; i < n && r.err == nil; i++ {
		p, recLen := decodePartitionHeader(r)
		if rec := r.take(recLen, "records"); len(rec) > 0 {
			p.Records = rec
		}
		resp.Partitions = append(resp.Partitions, p)
	}
	return r.end()
}

// decodePartitionHeader decodes one partition of a fetch response up to
// its records, and returns their length.
func decodePartitionHeader(r *wireReader) (FetchPartitionResponse, int) {
	var p FetchPartitionResponse
	p.Topic = r.str("topic")
	p.Partition = r.i32("partition")
	p.Error = ErrorCode(r.u16("error code"))
	p.HighWatermark = r.i64("high watermark")
	p.LogStartOffset = r.i64("log start offset")
	p.LogEndOffset = r.i64("log end offset")
	flag := r.u8("diverging flag")
	epoch, end := r.i32("diverging epoch"), r.i64("diverging end offset")
	switch {
	case r.err != nil:
	case flag == 1:
		p.Diverging = &EpochEndOffset{Epoch: epoch, EndOffset: end}
	case flag != 0:
		r.err = fmt.Errorf("%w: diverging flag %d", ErrMalformedFrame, flag)
	}
	return p, int(r.u32("records length"))
}

// decodeError decodes an error frame body into the error it reports.
func decodeError(body []byte) error {
	r := &wireReader{b: body}
	msg := r.str("message")
	if err := r.end(); err != nil {
		return err
	}
	return remoteError(msg)
}

// remoteSentinels are the errors a peer's message is matched against.
var remoteSentinels = [...]error{ErrClusterMismatch, ErrClosed, ErrFrameTooLarge, ErrMalformedFrame,
	ErrNotLeader, ErrFencedLeaderEpoch, ErrUnknownLeaderEpoch, ErrOffsetOutOfRange,
	ErrUnknownPartition, ErrNotReplica, ErrStorage}

// remoteError turns an error frame's message into an error wrapping
// ErrRemote and, when the message starts with one, a sentinel error.
func remoteError(msg string) error {
	for _, s := range remoteSentinels {
		if rest, ok := strings.CutPrefix(msg, s.Error()); ok {
			return fmt.Errorf("%w: %w%s", ErrRemote, s, rest)
		}
	}
	return fmt.Errorf("%w: %s", ErrRemote, msg)
}

// decodeFrame splits one whole frame held in b (nothing more) into its
// checked header and body.
func decodeFrame(b []byte, maxFrame int) (frameHeader, []byte, error) {
	h, err := parseFrameHeader(b, maxFrame)
	if err != nil {
		return h, nil, err
	}
	if rest := len(b) - frameHeaderSize; rest != h.bodyLen {
		if rest < h.bodyLen {
			return h, nil, fmt.Errorf("%w: truncated: %d of %d body bytes", ErrMalformedFrame, rest, h.bodyLen)
		}
		return h, nil, fmt.Errorf("%w: %d bytes after the frame", ErrMalformedFrame, rest-h.bodyLen)
	}
	return h, b[frameHeaderSize:], nil
}

// readFrameHeader reads and checks one frame header from r into hdr.
// io.EOF means the stream ended cleanly before a frame.
func readFrameHeader(r io.Reader, hdr *[frameHeaderSize]byte, maxFrame int) (frameHeader, error) {
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return frameHeader{}, fmt.Errorf("%w: truncated header: %w", ErrMalformedFrame, err)
		}
		return frameHeader{}, err
	}
	return parseFrameHeader(hdr[:], maxFrame)
}

// bodyFirstRead is the most readBody allocates before any byte of a body
// has arrived, unless its caller expects more.
const bodyFirstRead = 64 << 10

// readBody reads a body of n bytes (already checked against the frame
// limit) from r. It reuses buf when n fits its capacity. Otherwise it
// allocates up to expect bytes at once (a size the reader asked for, such
// as its fetch's MaxBytes; at least bodyFirstRead) and grows beyond that,
// doubling, only as the bytes arrive: a peer that announces a large frame
// and sends less costs about what it sent. A stream that ends early gives
// ErrMalformedFrame wrapping io.ErrUnexpectedEOF.
func readBody(r io.Reader, n int, buf []byte, expect int) ([]byte, error) {
	if n <= cap(buf) {
		buf = buf[:n]
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, bodyErr(err, n)
		}
		return buf, nil
	}
	buf = make([]byte, min(n, max(expect, bodyFirstRead)))
	got := 0
	for {
		m, err := io.ReadFull(r, buf[got:])
		got += m
		if err != nil {
			return nil, bodyErr(err, n)
		}
		if got == n {
			return buf, nil
		}
		next := make([]byte, min(n, 2*len(buf)))
		copy(next, buf)
		buf = next
	}
}

func bodyErr(err error, n int) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: stream ended inside a body of %d bytes: %w", ErrMalformedFrame, n, io.ErrUnexpectedEOF)
	}
	return err
}
