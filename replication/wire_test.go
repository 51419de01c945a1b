package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/replog/replog/log"
	"github.com/replog/replog/send"
)

func sampleRequest() *FetchRequest {
	return &FetchRequest{ClusterID: "cluster-ü", ReplicaID: 2, MaxBytes: 8 << 20, MaxWaitMs: 500,
		Partitions: []FetchPartition{
			{TopicPartition: TopicPartition{Topic: "orders", Partition: 0}, CurrentLeaderEpoch: 3, FetchOffset: 1 << 40, LastFetchedEpoch: 2},
			{TopicPartition: TopicPartition{Topic: "", Partition: -1}, CurrentLeaderEpoch: -1, FetchOffset: -1, LastFetchedEpoch: log.NoLeaderEpoch},
			{TopicPartition: TopicPartition{Topic: strings.Repeat("t", 1<<16-1), Partition: 1<<31 - 1}, FetchOffset: 0},
		}}
}

func sampleResponse() *FetchResponse {
	return &FetchResponse{Partitions: []FetchPartitionResponse{
		{TopicPartition: TopicPartition{Topic: "orders", Partition: 0}, HighWatermark: 10, LogStartOffset: 0, LogEndOffset: 12,
			Records: []byte("batch bytes, opaque to the codec")},
		{TopicPartition: TopicPartition{Topic: "orders", Partition: 1}, Error: CodeFencedLeaderEpoch, HighWatermark: -1, LogStartOffset: -1, LogEndOffset: -1},
		{TopicPartition: TopicPartition{Topic: "x", Partition: 7}, HighWatermark: 5, LogStartOffset: 1, LogEndOffset: 9,
			Diverging: &EpochEndOffset{Epoch: 4, EndOffset: 8}},
		{TopicPartition: TopicPartition{Topic: "x", Partition: 8}, Error: ErrorCode(-7)},
	}}
}

// decodeWhole decodes one whole frame of any type, as the fuzz target does.
func decodeWhole(b []byte, maxFrame int) (frameHeader, any, error) {
	h, body, err := decodeFrame(b, maxFrame)
	if err != nil {
		return h, nil, err
	}
	if err := h.checkVersion(); err != nil {
		return h, nil, err
	}
	switch h.typ {
	case msgFetchRequest:
		req, err := decodeFetchRequest(body)
		return h, req, err
	case msgFetchResponse:
		resp, err := decodeFetchResponse(body)
		return h, resp, err
	case msgError:
		return h, nil, decodeError(body)
	}
	return h, nil, ErrMalformedFrame
}

func TestFrameRoundTrip(t *testing.T) {
	t.Run("request", func(t *testing.T) {
		for _, req := range []*FetchRequest{sampleRequest(), {}, {ClusterID: "c", Partitions: []FetchPartition{}}} {
			frame, err := appendFetchRequestFrame([]byte("prefix"), 42, req)
			require.NoError(t, err)
			require.Equal(t, "prefix", string(frame[:6]))
			h, got, err := decodeWhole(frame[6:], DefaultMaxFrameBytes)
			require.NoError(t, err)
			assert.Equal(t, uint64(42), h.corr)
			assert.Equal(t, uint8(msgFetchRequest), h.typ)
			want := *req
			if len(want.Partitions) == 0 {
				want.Partitions = nil
			}
			assert.Equal(t, &want, got)
		}
	})
	t.Run("response", func(t *testing.T) {
		for _, resp := range []*FetchResponse{sampleResponse(), {}} {
			frame, err := appendFetchResponseFrame(nil, 1<<63, resp)
			require.NoError(t, err)
			h, got, err := decodeWhole(frame, DefaultMaxFrameBytes)
			require.NoError(t, err)
			assert.Equal(t, uint64(1<<63), h.corr)
			assert.Equal(t, resp, got)
		}
	})
	t.Run("error", func(t *testing.T) {
		for _, tc := range []struct {
			msg  string
			want error
		}{
			{ErrClusterMismatch.Error() + `: "b", this node is in "a"`, ErrClusterMismatch},
			{ErrClosed.Error(), ErrClosed},
			{"something else went wrong", nil},
			{strings.Repeat("é", maxErrorMessage), nil},
		} {
			frame := appendErrorFrame(nil, 9, tc.msg)
			_, _, err := decodeWhole(frame, minFrameBytes)
			require.ErrorIs(t, err, ErrRemote)
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
				assert.Contains(t, err.Error(), tc.msg)
			}
			assert.LessOrEqual(t, len(frame), minFrameBytes, "fits the smallest frame limit")
		}
	})
	t.Run("stream", func(t *testing.T) {
		var stream []byte
		stream, err := appendFetchRequestFrame(stream, 1, sampleRequest())
		require.NoError(t, err)
		stream, err = appendFetchResponseFrame(stream, 2, sampleResponse())
		require.NoError(t, err)
		r := bytes.NewReader(stream)
		var hdr [frameHeaderSize]byte
		var buf []byte
		for corr := uint64(1); corr <= 2; corr++ {
			h, err := readFrameHeader(r, &hdr, DefaultMaxFrameBytes)
			require.NoError(t, err)
			require.Equal(t, corr, h.corr)
			buf, err = readBody(r, h.bodyLen, buf, 0)
			require.NoError(t, err)
		}
		_, err = readFrameHeader(r, &hdr, DefaultMaxFrameBytes)
		require.ErrorIs(t, err, io.EOF)
	})
}

// TestBuildFetchResponse checks that the frame the server writes with a
// send.Builder (records from a file region and from memory) is the frame
// appendFetchResponseFrame encodes, and that a response over the limit
// loses the records of its last partitions, not its headers.
func TestBuildFetchResponse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "segment")
	data := bytes.Repeat([]byte("0123456789abcdef"), 8<<10) // 128 KiB: sent with sendfile on sockets
	require.NoError(t, os.WriteFile(path, data, 0o600))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	resp := sampleResponse()
	resp.Partitions = append(resp.Partitions,
		FetchPartitionResponse{TopicPartition: TopicPartition{Topic: "file", Partition: 1}, HighWatermark: 3,
			Region: log.Region{File: f, Position: 100, Length: 100 << 10}},
		FetchPartitionResponse{TopicPartition: TopicPartition{Topic: "file", Partition: 2},
			Region: log.Region{File: f, Position: 7, Length: 33}})

	var b send.Builder
	scratch, dropped, err := buildFetchResponse(&b, nil, 77, resp, DefaultMaxFrameBytes)
	require.NoError(t, err)
	require.Zero(t, dropped)
	var out bytes.Buffer
	_, err = b.WriteTo(&out)
	require.NoError(t, err)

	want := *resp
	want.Partitions = append([]FetchPartitionResponse(nil), resp.Partitions...)
	require.NoError(t, want.Materialize())
	wantFrame, err := appendFetchResponseFrame(nil, 77, &want)
	require.NoError(t, err)
	require.Equal(t, wantFrame, out.Bytes())

	// Over the limit: the 100 KiB region does not fit in 64 KiB, even
	// alone (CodeRecordTooLarge); the small partitions after it still do.
	b.Reset()
	_, dropped, err = buildFetchResponse(&b, scratch, 78, resp, 64<<10)
	require.NoError(t, err)
	require.Equal(t, 1, dropped)
	out.Reset()
	_, err = b.WriteTo(&out)
	require.NoError(t, err)
	require.LessOrEqual(t, out.Len(), 64<<10)
	_, got, err := decodeWhole(out.Bytes(), 64<<10)
	require.NoError(t, err)
	gotResp := got.(*FetchResponse)
	require.Len(t, gotResp.Partitions, len(resp.Partitions))
	assert.Empty(t, gotResp.Partitions[4].Records)
	assert.Equal(t, CodeRecordTooLarge, gotResp.Partitions[4].Error)
	assert.Equal(t, int64(3), gotResp.Partitions[4].HighWatermark)
	assert.Equal(t, data[7:40], gotResp.Partitions[5].Records)
	assert.Equal(t, want.Partitions[0].Records, gotResp.Partitions[0].Records)

	// Even the headers do not fit: an error, and nothing to send.
	b.Reset()
	many := &FetchResponse{Partitions: make([]FetchPartitionResponse, 200)}
	_, _, err = buildFetchResponse(&b, scratch, 79, many, 4<<10)
	require.ErrorIs(t, err, ErrFrameTooLarge)
}

// header builds a frame header by hand.
func header(length uint32, magic uint16, version, typ uint8, corr uint64) []byte {
	b := binary.BigEndian.AppendUint32(nil, length)
	b = binary.BigEndian.AppendUint16(b, magic)
	b = append(b, version, typ)
	return binary.BigEndian.AppendUint64(b, corr)
}

// frameOf wraps a body in a valid header.
func frameOf(typ uint8, body []byte) []byte {
	return append(header(uint32(frameLengthMin+len(body)), frameMagic, frameVersion, typ, 1), body...)
}

func TestFrameLimits(t *testing.T) {
	validReq, err := appendFetchRequestFrame(nil, 1, sampleRequest())
	require.NoError(t, err)
	validResp, err := appendFetchResponseFrame(nil, 1, sampleResponse())
	require.NoError(t, err)
	u32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

	respPartition := func(topicLen uint16, recLen uint32, rec []byte) []byte {
		b := binary.BigEndian.AppendUint16(nil, topicLen)
		b = append(b, make([]byte, 4+2+8+8+8+1+4+8)...)
		b = append(b, u32(recLen)...)
		return append(b, rec...)
	}
	cases := []struct {
		name  string
		frame []byte
		max   int
		want  error
	}{
		{"empty", nil, DefaultMaxFrameBytes, ErrMalformedFrame},
		{"short header", validReq[:15], DefaultMaxFrameBytes, ErrMalformedFrame},
		{"bad magic", header(12, 0x4b41, 1, 1, 1), DefaultMaxFrameBytes, ErrMalformedFrame},
		{"length below header", header(11, frameMagic, 1, 1, 1), DefaultMaxFrameBytes, ErrMalformedFrame},
		{"oversize", header(DefaultMaxFrameBytes, frameMagic, 1, 2, 1), DefaultMaxFrameBytes, ErrFrameTooLarge},
		{"max length", header(1<<32-1, frameMagic, 1, 2, 1), DefaultMaxFrameBytes, ErrFrameTooLarge},
		{"small limit", validResp, len(validResp) - 1, ErrFrameTooLarge},
		{"truncated request", validReq[:len(validReq)-1], DefaultMaxFrameBytes, ErrMalformedFrame},
		{"truncated response", validResp[:len(validResp)-3], DefaultMaxFrameBytes, ErrMalformedFrame},
		{"bytes after the frame", append(append([]byte(nil), validReq...), 0), DefaultMaxFrameBytes, ErrMalformedFrame},
		{"unknown version", header(12, frameMagic, 2, 1, 1), DefaultMaxFrameBytes, ErrMalformedFrame},
		{"unknown type", frameOf(9, nil), DefaultMaxFrameBytes, ErrMalformedFrame},
		{"request trailing bytes", frameOf(msgFetchRequest, append(validReq[frameHeaderSize:], 1)), DefaultMaxFrameBytes, ErrMalformedFrame},
		{"request string past body", frameOf(msgFetchRequest, []byte{0xff, 0xff, 'a'}), DefaultMaxFrameBytes, ErrMalformedFrame},
		{"request huge count", frameOf(msgFetchRequest, append(make([]byte, 2+12), u32(1<<32-1)...)), DefaultMaxFrameBytes, ErrMalformedFrame},
		{"request count one too many", frameOf(msgFetchRequest, append(append(make([]byte, 2+12), u32(2)...), make([]byte, 2*minRequestPartitionBytes-1)...)), DefaultMaxFrameBytes, ErrMalformedFrame},
		{"response huge count", frameOf(msgFetchResponse, u32(1<<32-1)), DefaultMaxFrameBytes, ErrMalformedFrame},
		{"response records past body", frameOf(msgFetchResponse, append(u32(1), respPartition(0, 100, make([]byte, 99))...)), DefaultMaxFrameBytes, ErrMalformedFrame},
		{"response records length max", frameOf(msgFetchResponse, append(u32(1), respPartition(0, 1<<32-1, nil)...)), DefaultMaxFrameBytes, ErrMalformedFrame},
		{"response topic past body", frameOf(msgFetchResponse, append(u32(1), respPartition(60, 0, nil)...)), DefaultMaxFrameBytes, ErrMalformedFrame},
		{"error frame message past body", frameOf(msgError, []byte{0, 5, 'a'}), DefaultMaxFrameBytes, ErrMalformedFrame},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.NotPanics(t, func() {
				_, _, err := decodeWhole(tc.frame, tc.max)
				require.ErrorIs(t, err, tc.want)
			})
		})
	}

	t.Run("diverging flag", func(t *testing.T) {
		frame := append([]byte(nil), validResp...)
		// First partition: count(4) | topic(2+6) | partition 4 | error 2 | 3 x 8 | flag.
		flagAt := frameHeaderSize + 4 + 2 + len("orders") + 4 + 2 + 24
		require.Equal(t, byte(0), frame[flagAt])
		frame[flagAt] = 2
		_, _, err := decodeWhole(frame, DefaultMaxFrameBytes)
		require.ErrorIs(t, err, ErrMalformedFrame)
	})

	t.Run("encode limits", func(t *testing.T) {
		_, err := appendFetchRequestFrame(nil, 1, &FetchRequest{ClusterID: strings.Repeat("c", 1<<16)})
		require.ErrorIs(t, err, ErrMalformedFrame)
		long := &FetchRequest{Partitions: []FetchPartition{{TopicPartition: TopicPartition{Topic: strings.Repeat("t", 1<<16)}}}}
		out, err := appendFetchRequestFrame([]byte("keep"), 1, long)
		require.ErrorIs(t, err, ErrMalformedFrame)
		require.Equal(t, "keep", string(out))
		resp := &FetchResponse{Partitions: []FetchPartitionResponse{{Region: log.Region{Length: 1}}}}
		_, err = appendFetchResponseFrame(nil, 1, resp)
		require.Error(t, err)
	})
}

// allocated returns how many bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestFrameLimitsAllocate checks that sizes are checked before memory is
// allocated: an oversize frame is refused from its header, a truncated
// frame announcing 60 MiB costs about what arrived, and a huge count
// reserves nothing.
func TestFrameLimitsAllocate(t *testing.T) {
	var hdr [frameHeaderSize]byte
	t.Run("oversize", func(t *testing.T) {
		r := bytes.NewReader(append(header(1<<32-1, frameMagic, 1, 2, 1), make([]byte, 100)...))
		var err error
		n := allocated(func() { _, err = readFrameHeader(r, &hdr, DefaultMaxFrameBytes) })
		require.ErrorIs(t, err, ErrFrameTooLarge)
		require.Equal(t, 100, r.Len(), "the body must not be read")
		require.Less(t, n, uint64(64<<10))
	})
	t.Run("truncated", func(t *testing.T) {
		const announced = 60 << 20
		r := bytes.NewReader(append(header(frameLengthMin+announced, frameMagic, 1, 2, 1), make([]byte, 1000)...))
		var err error
		n := allocated(func() {
			var h frameHeader
			h, err = readFrameHeader(r, &hdr, DefaultMaxFrameBytes)
			if err == nil {
				_, err = readBody(r, h.bodyLen, nil, 0)
			}
		})
		require.ErrorIs(t, err, ErrMalformedFrame)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		require.Less(t, n, uint64(2*bodyFirstRead), "a truncated frame must cost about what it sent, not its announced size")
	})
	t.Run("huge count", func(t *testing.T) {
		body := binary.BigEndian.AppendUint32(nil, 1<<32-1)
		body = append(body, make([]byte, 1<<20)...)
		var err error
		n := allocated(func() { _, err = decodeFetchResponse(body) })
		require.ErrorIs(t, err, ErrMalformedFrame)
		require.Less(t, n, uint64(64<<10))
		req := append(make([]byte, 2+12), body...)
		n = allocated(func() { _, err = decodeFetchRequest(req) })
		require.ErrorIs(t, err, ErrMalformedFrame)
		require.Less(t, n, uint64(64<<10))
	})
	t.Run("stream ends in body", func(t *testing.T) {
		frame, err := appendFetchResponseFrame(nil, 1, sampleResponse())
		require.NoError(t, err)
		for cut := frameHeaderSize; cut < len(frame); cut += 7 {
			r := bytes.NewReader(frame[:cut])
			h, err := readFrameHeader(r, &hdr, DefaultMaxFrameBytes)
			require.NoError(t, err)
			_, err = readBody(r, h.bodyLen, nil, 0)
			require.ErrorIs(t, err, ErrMalformedFrame)
		}
		_, err = readFrameHeader(bytes.NewReader(frame[:5]), &hdr, DefaultMaxFrameBytes)
		require.ErrorIs(t, err, ErrMalformedFrame)
	})
	t.Run("growth", func(t *testing.T) {
		// A body larger than expected still arrives whole, grown in steps.
		data := bytes.Repeat([]byte{1, 2, 3}, 1<<20)
		got, err := readBody(io.MultiReader(bytes.NewReader(data[:5]), bytes.NewReader(data[5:])), len(data), make([]byte, 10), 100)
		require.NoError(t, err)
		require.Equal(t, data, got)
	})
}

// FuzzFrameDecode: arbitrary bytes never panic, every error is typed, and
// whatever decodes re-encodes to a frame that decodes to the same value.
func FuzzFrameDecode(f *testing.F) {
	req, err := appendFetchRequestFrame(nil, 1, sampleRequest())
	require.NoError(f, err)
	resp, err := appendFetchResponseFrame(nil, 2, sampleResponse())
	require.NoError(f, err)
	small, err := appendFetchRequestFrame(nil, 3, &FetchRequest{ClusterID: "c", Partitions: []FetchPartition{{FetchOffset: 5}}})
	require.NoError(f, err)
	f.Add(req)
	f.Add(resp)
	f.Add(small)
	f.Add(appendErrorFrame(nil, 4, ErrClusterMismatch.Error()))
	f.Add(resp[:len(resp)/2])
	f.Add(header(1<<31, frameMagic, 1, 2, 1))
	f.Add(frameOf(msgFetchResponse, binary.BigEndian.AppendUint32(nil, 1<<32-1)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxFrame = 1 << 20
		// The streaming decoder of a follower agrees with the in-memory
		// one (what it handed on before an error aside).
		if h, body, err := decodeFrame(data, maxFrame); err == nil && h.checkVersion() == nil && h.typ == msgFetchResponse {
			want, derr := decodeFetchResponse(body)
			sink, serr := streamDecode(t, body, 3)
			if derr != nil {
				require.ErrorIs(t, serr, ErrMalformedFrame)
			} else {
				require.NoError(t, serr)
				require.Equal(t, want, &sink.resp)
			}
		}
		checkDecodeIntoReused(t, data, maxFrame)
		h, v, err := decodeWhole(data, maxFrame)
		if err != nil {
			if !errors.Is(err, ErrMalformedFrame) && !errors.Is(err, ErrFrameTooLarge) && !errors.Is(err, ErrRemote) {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		var again []byte
		switch v := v.(type) {
		case *FetchRequest:
			again, err = appendFetchRequestFrame(nil, h.corr, v)
		case *FetchResponse:
			again, err = appendFetchResponseFrame(nil, h.corr, v)
		default:
			t.Fatalf("decoded %T without error", v)
		}
		require.NoError(t, err)
		h2, v2, err := decodeWhole(again, maxFrame)
		require.NoError(t, err)
		require.Equal(t, h, h2)
		require.Equal(t, v, v2)

		// The stream reader agrees with the in-memory decoder.
		r := bytes.NewReader(data)
		var hdr [frameHeaderSize]byte
		sh, err := readFrameHeader(r, &hdr, maxFrame)
		require.NoError(t, err)
		body, err := readBody(r, sh.bodyLen, nil, 0)
		require.NoError(t, err)
		require.Equal(t, data[frameHeaderSize:], body)
	})
}

// checkDecodeIntoReused decodes a frame's body into a request and a
// response that first held the sample ones, with a name table, as a
// connection does: the result and error are those of a fresh decode.
func checkDecodeIntoReused(t *testing.T, data []byte, maxFrame int) {
	_, body, err := decodeFrame(data, maxFrame)
	if err != nil {
		return
	}
	names := &nameTable{}
	req := sampleRequest()
	wantReq, werr := decodeFetchRequest(body)
	err = decodeFetchRequestInto(body, req, names)
	require.Equal(t, werr, err)
	if err == nil {
		require.Equal(t, wantReq.ClusterID, req.ClusterID)
		require.Equal(t, len(wantReq.Partitions), len(req.Partitions))
		for i := range req.Partitions {
			require.Equal(t, wantReq.Partitions[i], req.Partitions[i])
		}
	}
	resp := sampleResponse()
	wantResp, werr := decodeFetchResponse(body)
	err = decodeFetchResponseInto(body, resp, names)
	require.Equal(t, werr, err)
	if err == nil {
		require.Equal(t, len(wantResp.Partitions), len(resp.Partitions))
		for i := range resp.Partitions {
			require.Equal(t, wantResp.Partitions[i], resp.Partitions[i])
		}
	}
}
