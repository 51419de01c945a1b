package broker

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	replog "github.com/replog/replog/log"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// rawConn is a bare Kafka protocol connection for tests.
type rawConn struct {
	t    testing.TB
	c    net.Conn
	r    *bufio.Reader
	corr int32
}

func dial(t testing.TB, b *Broker) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// Bounds a broken test; nothing asserts on time.
	c.SetDeadline(time.Now().Add(testTimeout))
	return &rawConn{t: t, c: c, r: bufio.NewReader(c)}
}

// frame returns a request frame: size, key, version, correlation id,
// client id "test", body.
func frame(key, version int16, corr int32, body []byte) []byte {
	f := binary.BigEndian.AppendUint32(nil, uint32(10+4+len(body)))
	f = binary.BigEndian.AppendUint16(f, uint16(key))
	f = binary.BigEndian.AppendUint16(f, uint16(version))
	f = binary.BigEndian.AppendUint32(f, uint32(corr))
	f = binary.BigEndian.AppendUint16(f, 4)
	f = append(f, "test"...)
	return append(f, body...)
}

func (rc *rawConn) write(p []byte) {
	rc.t.Helper()
	if _, err := rc.c.Write(p); err != nil {
		rc.t.Fatal(err)
	}
}

// request sends req at its version and returns the response body after
// checking the correlation id.
func (rc *rawConn) request(req kmsg.Request) []byte {
	rc.t.Helper()
	rc.corr++
	rc.write(frame(req.Key(), req.GetVersion(), rc.corr, req.AppendTo(nil)))
	body, err := rc.readResponse()
	if err != nil {
		rc.t.Fatalf("key %d v%d: %v", req.Key(), req.GetVersion(), err)
	}
	return body
}

func (rc *rawConn) readResponse() ([]byte, error) {
	var sz [4]byte
	if _, err := io.ReadFull(rc.r, sz[:]); err != nil {
		return nil, err
	}
	buf := make([]byte, binary.BigEndian.Uint32(sz[:]))
	if _, err := io.ReadFull(rc.r, buf); err != nil {
		return nil, err
	}
	if got := int32(binary.BigEndian.Uint32(buf)); got != rc.corr {
		rc.t.Fatalf("correlation id %d, want %d", got, rc.corr)
	}
	return buf[4:], nil
}

// expectClosed checks that the broker closes the connection without
// answering.
func (rc *rawConn) expectClosed() {
	rc.t.Helper()
	if n, err := rc.r.Read(make([]byte, 1)); n != 0 || err == nil {
		rc.t.Fatalf("read %d bytes, err %v: want the connection closed", n, err)
	}
}

// TestTooNewApiVersions checks Kafka's answer to an ApiVersions request of a
// version the broker does not know: version 0, UNSUPPORTED_VERSION, and the
// ApiVersions range.
func TestTooNewApiVersions(t *testing.T) {
	b := startBroker(t, t.TempDir())
	rc := dial(t, b)
	rc.corr = 7
	// A v5 request is flexible (tagged fields); its body is never parsed.
	rc.write(frame(apiVersionsKey, 5, rc.corr, []byte{0x05, 'k', 'g', 'o', 0x02, '1', 0}))
	body, err := rc.readResponse()
	if err != nil {
		t.Fatal(err)
	}
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 0
	if err := resp.ReadFrom(body); err != nil {
		t.Fatal(err)
	}
	if resp.ErrorCode != errUnsupportedVersion || len(resp.ApiKeys) != 1 ||
		resp.ApiKeys[0].ApiKey != apiVersionsKey || resp.ApiKeys[0].MinVersion != 0 || resp.ApiKeys[0].MaxVersion != apiVersionsMax {
		t.Fatalf("got %+v", resp)
	}
	// The connection stays usable: the client retries at v2.
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version = 2
	resp = kmsg.NewPtrApiVersionsResponse()
	resp.Version = 2
	if err := resp.ReadFrom(rc.request(req)); err != nil {
		t.Fatal(err)
	}
	if resp.ErrorCode != 0 || len(resp.ApiKeys) != len(apis) {
		t.Fatalf("got error %d and %d keys, want 0 and %d", resp.ErrorCode, len(resp.ApiKeys), len(apis))
	}
}

// TestMalformedFrames sends frames that must close the connection, then
// checks that the broker still serves a real client.
func TestMalformedFrames(t *testing.T) {
	b := startBroker(t, t.TempDir())
	header := func(key, version int16) []byte { return frame(key, version, 1, nil)[4:] }
	sized := func(size uint32, rest []byte) []byte {
		return append(binary.BigEndian.AppendUint32(nil, size), rest...)
	}
	tests := []struct {
		name  string
		frame []byte
	}{
		// A 2 GiB request: refused from its size alone, nothing allocated.
		{"huge size", sized(0x7fffffff, header(3, 8))},
		{"size above the cap", sized(uint32(DefaultMaxRequestBytes+1), header(3, 8))},
		{"negative size", sized(0xfffffff0, header(3, 8))},
		{"size below a header", sized(3, []byte{0, 3, 0})},
		{"client id past the end", sized(12, []byte{0, 3, 0, 8, 0, 0, 0, 1, 0x7f, 0xff, 'a', 'b'})},
		{"unknown api key", frame(999, 0, 1, nil)},
		{"unsupported version", frame(0, 2, 1, nil)},
		{"topic name past the end", frame(3, 8, 1, []byte{0, 0, 0, 5, 0, 9, 'a'})},
		{"topic count past the end", frame(3, 8, 1, []byte{0x7f, 0xff, 0xff, 0xff, 0, 1, 'a'})},
		{"truncated produce", frame(0, 8, 1, []byte{0xff, 0xff, 0, 1, 0, 0, 0x3a, 0x98, 0, 0, 0, 9})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := dial(t, b)
			rc.write(tt.frame)
			rc.expectClosed()
		})
	}
	// The broker is unharmed.
	cl := newClient(t, b, producerOpts...)
	produce(t, cl, "after-garbage", 100)
}

// TestFuzzRequests sends valid requests of every supported kind with random
// bytes changed, truncated or appended, and checks that the broker neither
// panics nor stops serving. Responses are not awaited: a mutated fetch may
// ask for a long poll; closing the broker at the end ends those.
func TestFuzzRequests(t *testing.T) {
	b := startBroker(t, t.TempDir())
	cl := newClient(t, b, producerOpts...)
	produce(t, cl, "fuzz", 64)

	batch, err := b.partition("fuzz", 0).log.Read(nil, 0, replog.ReadOptions{MaxBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	var seeds []kmsg.Request
	for _, a := range apis {
		for v := a.MinVersion; v <= a.MaxVersion; v++ {
			req := kmsg.RequestForKey(a.ApiKey)
			req.SetVersion(v)
			fillRequest(req, batch)
			seeds = append(seeds, req)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const iterations = 3000
	for i := range iterations {
		req := seeds[i%len(seeds)]
		body := req.AppendTo(nil)
		switch rng.IntN(4) {
		case 0: // flip bytes
			for range 1 + rng.IntN(4) {
				if len(body) > 0 {
					body[rng.IntN(len(body))] ^= byte(1 + rng.IntN(255))
				}
			}
		case 1: // truncate
			body = body[:rng.IntN(len(body)+1)]
		case 2: // append garbage
			for range 1 + rng.IntN(16) {
				body = append(body, byte(rng.Uint32()))
			}
		case 3: // overwrite a 4-byte length or count with a big or negative one
			if len(body) >= 4 {
				at := rng.IntN(len(body) - 3)
				binary.BigEndian.PutUint32(body[at:], []uint32{0x7fffffff, 0xffffffff, 0x80000000, 0x00ffffff}[rng.IntN(4)])
			}
		}
		c, err := net.Dial("tcp", b.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write(frame(req.Key(), req.GetVersion(), int32(i), body))
		c.Close()
	}
	// Still serving, and nothing panicked (checked at cleanup).
	produce(t, cl, "fuzz-after", 64)
}

// fillRequest gives a request plausible contents: topics, partitions, a
// record batch, a group.
func fillRequest(req kmsg.Request, batch []byte) {
	switch r := req.(type) {
	case *kmsg.ProduceRequest:
		r.Acks = -1
		t := kmsg.NewProduceRequestTopic()
		t.Topic = "fuzz"
		p := kmsg.NewProduceRequestTopicPartition()
		p.Records = bytes.Clone(batch)
		t.Partitions = append(t.Partitions, p)
		r.Topics = append(r.Topics, t)
	case *kmsg.FetchRequest:
		r.MaxWaitMillis = 1
		t := kmsg.NewFetchRequestTopic()
		t.Topic = "fuzz"
		p := kmsg.NewFetchRequestTopicPartition()
		p.PartitionMaxBytes = 1 << 20
		t.Partitions = append(t.Partitions, p)
		r.Topics = append(r.Topics, t)
	case *kmsg.ListOffsetsRequest:
		t := kmsg.NewListOffsetsRequestTopic()
		t.Topic = "fuzz"
		t.Partitions = append(t.Partitions, kmsg.NewListOffsetsRequestTopicPartition())
		r.Topics = append(r.Topics, t)
	case *kmsg.MetadataRequest:
		t := kmsg.NewMetadataRequestTopic()
		t.Topic = kmsg.StringPtr("fuzz")
		r.Topics = append(r.Topics, t)
	case *kmsg.CreateTopicsRequest:
		t := kmsg.NewCreateTopicsRequestTopic()
		t.Topic, t.NumPartitions, t.ReplicationFactor = "fuzz-created", 2, 1
		r.Topics = append(r.Topics, t)
	case *kmsg.OffsetCommitRequest:
		r.Group = "fuzz-group"
		t := kmsg.NewOffsetCommitRequestTopic()
		t.Topic = "fuzz"
		t.Partitions = append(t.Partitions, kmsg.NewOffsetCommitRequestTopicPartition())
		r.Topics = append(r.Topics, t)
	case *kmsg.OffsetFetchRequest:
		r.Group = "fuzz-group"
		t := kmsg.NewOffsetFetchRequestTopic()
		t.Topic, t.Partitions = "fuzz", []int32{0, 1}
		r.Topics = append(r.Topics, t)
	case *kmsg.FindCoordinatorRequest:
		r.CoordinatorKey = "fuzz-group"
	case *kmsg.JoinGroupRequest:
		r.Group, r.ProtocolType, r.SessionTimeoutMillis = "fuzz-group", "consumer", 10_000
		r.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: []byte{0, 1}}}
	case *kmsg.SyncGroupRequest:
		r.Group, r.MemberID = "fuzz-group", "m"
	case *kmsg.HeartbeatRequest:
		r.Group, r.MemberID = "fuzz-group", "m"
	case *kmsg.LeaveGroupRequest:
		r.Group, r.MemberID = "fuzz-group", "m"
		r.Members = []kmsg.LeaveGroupRequestMember{{MemberID: "m"}}
	}
}

// TestManyConnections serves hundreds of connections at once.
func TestManyConnections(t *testing.T) {
	const conns = 300
	b := startBroker(t, t.TempDir())
	rcs := make([]*rawConn, conns)
	for i := range rcs {
		rcs[i] = dial(t, b)
	}
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for _, rc := range rcs {
		wg.Go(func() {
			rc.corr = 1
			req := kmsg.NewPtrMetadataRequest()
			req.Version = 8
			if _, err := rc.c.Write(frame(req.Key(), req.Version, rc.corr, req.AppendTo(nil))); err != nil {
				errs <- err
				return
			}
			if _, err := rc.readResponse(); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestCloseEndsLongPoll closes the broker while a fetch waits for data that
// never comes and while connections are idle: Close returns, and the
// connections are closed.
func TestCloseEndsLongPoll(t *testing.T) {
	b := startBroker(t, t.TempDir())
	cl := newClient(t, b, producerOpts...)
	produce(t, cl, "idle", 8)

	rc := dial(t, b)
	req := kmsg.NewPtrFetchRequest()
	req.Version = 11
	req.MaxWaitMillis = 1 << 30 // twelve days
	req.MinBytes = 1
	req.MaxBytes = 1 << 20
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic = "idle"
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.FetchOffset = 1 // the end: nothing to read yet
	fp.PartitionMaxBytes = 1 << 20
	ft.Partitions = append(ft.Partitions, fp)
	req.Topics = append(req.Topics, ft)
	rc.corr = 1
	rc.write(frame(req.Key(), req.Version, rc.corr, req.AppendTo(nil)))
	idle := dial(t, b)

	// Close only once the fetch waits: closing earlier would not test the
	// long poll.
	for deadline := time.Now().Add(30 * time.Second); b.fetchWaits.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the fetch did not start waiting within 30s")
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	rc.expectClosed()
	idle.expectClosed()
}

// TestFetchVersions reads a partition with every fetch version and checks
// the response against kmsg's decoder and the log's own bytes.
func TestFetchVersions(t *testing.T) {
	b := startBroker(t, t.TempDir())
	cl := newClient(t, b, producerOpts...)
	produce(t, cl, "versions", 800)
	want, err := b.partition("versions", 3).log.Read(nil, 0, replog.ReadOptions{MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	rc := dial(t, b)
	for v := int16(4); v <= 11; v++ {
		req := kmsg.NewPtrFetchRequest()
		req.Version = v
		req.MaxBytes = 1 << 20
		ft := kmsg.NewFetchRequestTopic()
		ft.Topic = "versions"
		for _, p := range []int32{3, 99} { // 99 does not exist
			fp := kmsg.NewFetchRequestTopicPartition()
			fp.Partition = p
			fp.PartitionMaxBytes = 1 << 20
			ft.Partitions = append(ft.Partitions, fp)
		}
		req.Topics = append(req.Topics, ft)
		resp := kmsg.NewPtrFetchResponse()
		resp.Version = v
		if err := resp.ReadFrom(rc.request(req)); err != nil {
			t.Fatalf("v%d: %v", v, err)
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 2 {
			t.Fatalf("v%d: %+v", v, resp)
		}
		p, missing := resp.Topics[0].Partitions[0], resp.Topics[0].Partitions[1]
		if p.Partition != 3 || p.ErrorCode != 0 || p.HighWatermark != 100 || p.LastStableOffset != 100 ||
			v >= 5 && p.LogStartOffset != 0 || !bytes.Equal(p.RecordBatches, want) {
			t.Errorf("v%d: partition %d error %d hw %d lso %d start %d, %d record bytes (want %d)",
				v, p.Partition, p.ErrorCode, p.HighWatermark, p.LastStableOffset, p.LogStartOffset, len(p.RecordBatches), len(want))
		}
		if missing.Partition != 99 || missing.ErrorCode != errUnknownTopicOrPartition || len(missing.RecordBatches) != 0 {
			t.Errorf("v%d: missing partition: %+v", v, missing)
		}
	}
	// Offset out of range.
	req := kmsg.NewPtrFetchRequest()
	req.Version = 11
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic = "versions"
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.FetchOffset = 101
	ft.Partitions = append(ft.Partitions, fp)
	req.Topics = append(req.Topics, ft)
	resp := kmsg.NewPtrFetchResponse()
	resp.Version = 11
	if err := resp.ReadFrom(rc.request(req)); err != nil {
		t.Fatal(err)
	}
	if got := resp.Topics[0].Partitions[0].ErrorCode; got != errOffsetOutOfRange {
		t.Errorf("fetch past the end: error %d, want %d", got, errOffsetOutOfRange)
	}
}
