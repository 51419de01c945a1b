//go:build linux

package send_test

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/replog/replog/send"
)

// Shape of the fetch response of BenchmarkFetchResponse.
const (
	benchPartitions = 1000
	benchHeader     = 60
	benchRecords    = 1 << 10
)

// fetchFixture holds the pieces of a fetch response: a header per
// partition and its records, in memory and back to back in a segment file.
type fetchFixture struct {
	headers [][]byte
	records [][]byte
	segment *os.File
}

func newFetchFixture(tb testing.TB, partitions, header, records int) *fetchFixture {
	tb.Helper()
	f, data := tempFile(tb, partitions*records, 6)
	fx := &fetchFixture{segment: f}
	for i := range partitions {
		h := make([]byte, header)
		binary.BigEndian.PutUint32(h, uint32(i))
		binary.BigEndian.PutUint32(h[len(h)-4:], uint32(records))
		fx.headers = append(fx.headers, h)
		fx.records = append(fx.records, data[i*records:(i+1)*records:(i+1)*records])
	}
	return fx
}

func (fx *fetchFixture) size() int64 {
	return int64(len(fx.headers)) * int64(len(fx.headers[0])+len(fx.records[0]))
}

// build fills bld with the response, records from memory or from the file.
func (fx *fetchFixture) build(tb testing.TB, bld *send.Builder, fromFile bool) {
	bld.Reset()
	for i, h := range fx.headers {
		bld.AddBytes(h)
		if fromFile {
			n := int64(len(fx.records[i]))
			if err := bld.AddFile(fx.segment, int64(i)*n, n); err != nil {
				tb.Fatal(err)
			}
		} else {
			bld.AddBytes(fx.records[i])
		}
	}
}

// drainedConn returns a TCP loopback connection whose peer is drained by a
// goroutine; the returned function closes the connection and returns the
// number of bytes the peer read.
func drainedConn(tb testing.TB) (*net.TCPConn, func() int64) {
	tb.Helper()
	client, server := connPair(tb, "tcp")
	done := make(chan int64, 1)
	go func() {
		// Read in large pieces: io.Copy to io.Discard would read 8 KiB at a
		// time, making the reader, not the writer, the bottleneck.
		var n int64
		p := make([]byte, 1<<20)
		for {
			k, err := server.Read(p)
			n += int64(k)
			if err != nil {
				break
			}
		}
		done <- n
	}()
	return client.(*net.TCPConn), func() int64 {
		client.Close()
		return <-done
	}
}

// naiveSender writes one buffer per write(2) call and one file region per
// sendfile(2) call, counting the calls (EAGAIN included), like a server
// that sends each piece of a response on its own.
type naiveSender struct {
	conn     syscall.RawConn
	file     syscall.RawConn
	p        []byte
	off, rem int64
	outFD    int
	n        int
	err      error
	calls    int64
	writeFn  func(uintptr) bool
	sendFn   func(uintptr) bool
	ctlFn    func(uintptr)
}

func newNaiveSender(tb testing.TB, c *net.TCPConn, f *os.File) *naiveSender {
	tb.Helper()
	s := &naiveSender{}
	var err error
	s.conn, err = c.SyscallConn()
	require.NoError(tb, err)
	s.file, err = f.SyscallConn()
	require.NoError(tb, err)
	s.writeFn, s.sendFn, s.ctlFn = s.writeStep, s.sendStep, s.sendfileCtl
	return s
}

func (s *naiveSender) write(p []byte) error {
	s.p, s.err = p, nil
	if err := s.conn.Write(s.writeFn); err != nil {
		return err
	}
	return s.err
}

func (s *naiveSender) writeStep(fd uintptr) bool {
	for len(s.p) > 0 {
		n, err := unix.Write(int(fd), s.p)
		s.calls++
		if n > 0 {
			s.p = s.p[n:]
		}
		switch err {
		case nil, unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			s.err = err
			return true
		}
	}
	return true
}

func (s *naiveSender) sendfile(off, n int64) error {
	s.off, s.rem, s.err = off, n, nil
	if err := s.conn.Write(s.sendFn); err != nil {
		return err
	}
	return s.err
}

func (s *naiveSender) sendStep(fd uintptr) bool {
	for s.rem > 0 {
		s.outFD = int(fd)
		if err := s.file.Control(s.ctlFn); err != nil {
			s.err = err
			return true
		}
		s.calls++
		switch s.err {
		case nil:
			if s.n == 0 {
				s.err = io.ErrUnexpectedEOF
				return true
			}
		case unix.EINTR:
			s.err = nil
		case unix.EAGAIN:
			s.err = nil
			return false
		default:
			return true
		}
	}
	return true
}

func (s *naiveSender) sendfileCtl(infd uintptr) {
	s.n, s.err = unix.Sendfile(s.outFD, int(infd), &s.off, int(s.rem))
	s.rem -= int64(max(s.n, 0))
}

// cpuTime returns the CPU time (user + system) the process has used so
// far. Reported per op next to ns/op, it shows the cost of a variant even
// when other load on the machine stretches wall-clock time.
func cpuTime(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkFetchResponse(b *testing.B) {
	fx := newFetchFixture(b, benchPartitions, benchHeader, benchRecords)
	for _, source := range []string{"memory", "file"} {
		fromFile := source == "file"
		for _, impl := range []string{"naive", "builder"} {
			b.Run(fmt.Sprintf("source=%s/impl=%s", source, impl), func(b *testing.B) {
				conn, closeConn := drainedConn(b)
				b.SetBytes(fx.size())
				b.ReportAllocs()
				var syscalls int64
				cpu := cpuTime(b)
				if impl == "naive" {
					s := newNaiveSender(b, conn, fx.segment)
					b.ResetTimer()
					for b.Loop() {
						for i, h := range fx.headers {
							if err := s.write(h); err != nil {
								b.Fatal(err)
							}
							var err error
							if fromFile {
								n := int64(len(fx.records[i]))
								err = s.sendfile(int64(i)*n, n)
							} else {
								err = s.write(fx.records[i])
							}
							if err != nil {
								b.Fatal(err)
							}
						}
					}
					syscalls = s.calls
				} else {
					var bld send.Builder
					before := bld.Stats()
					b.ResetTimer()
					for b.Loop() {
						fx.build(b, &bld, fromFile)
						if _, err := bld.WriteTo(conn); err != nil {
							b.Fatal(err)
						}
					}
					syscalls = bld.Stats().Sub(before).Syscalls()
				}
				b.StopTimer()
				b.ReportMetric(float64(syscalls)/float64(b.N), "syscalls/op")
				b.ReportMetric(float64((cpuTime(b)-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
				if got, want := closeConn(), int64(b.N)*fx.size(); got != want {
					b.Fatalf("peer read %d bytes, want %d", got, want)
				}
			})
		}
	}
}

// BenchmarkFileRegion measures the choice behind DefaultReadThreshold: a
// 2 MiB response of 60-byte headers alternating with file regions of one
// size, each region sent by its own sendfile (method=sendfile) or read
// into memory and sent in the writev (method=read).
func BenchmarkFileRegion(b *testing.B) {
	const total = 2 << 20
	for _, size := range []int{1 << 10, 4 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10} {
		fx := newFetchFixture(b, total/size, benchHeader, size)
		for _, method := range []string{"sendfile", "read"} {
			b.Run(fmt.Sprintf("size=%d/method=%s", size, method), func(b *testing.B) {
				conn, closeConn := drainedConn(b)
				b.SetBytes(fx.size())
				b.ReportAllocs()
				threshold := int64(-1) // every region by sendfile
				if method == "read" {
					threshold = int64(size)
				}
				bld := send.NewBuilder(send.Options{ReadThreshold: threshold})
				before := bld.Stats()
				cpu := cpuTime(b)
				for b.Loop() {
					fx.build(b, bld, true)
					if _, err := bld.WriteTo(conn); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(bld.Stats().Sub(before).Syscalls())/float64(b.N), "syscalls/op")
				b.ReportMetric(float64((cpuTime(b)-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
				if got, want := closeConn(), int64(b.N)*fx.size(); got != want {
					b.Fatalf("peer read %d bytes, want %d", got, want)
				}
			})
		}
	}
}

// BenchmarkFetchResponseRatio checks the goals of BenchmarkFetchResponse on
// a noisy machine: one iteration writes the response once in each of the
// four ways, back to back on their own connections, timing each, and the
// ratios of the summed times are reported, so load that comes and goes
// weighs on both sides of each ratio alike. Goals: memory-naive/builder
// >= 10, file/memory-builder <= 1.5.
func BenchmarkFetchResponseRatio(b *testing.B) {
	fx := newFetchFixture(b, benchPartitions, benchHeader, benchRecords)
	memNaiveConn, closeMemNaive := drainedConn(b)
	fileNaiveConn, closeFileNaive := drainedConn(b)
	memConn, closeMem := drainedConn(b)
	fileConn, closeFile := drainedConn(b)
	memNaive := newNaiveSender(b, memNaiveConn, fx.segment)
	fileNaive := newNaiveSender(b, fileNaiveConn, fx.segment)
	var memBuilder, fileBuilder send.Builder
	var tMemNaive, tFileNaive, tMem, tFile time.Duration
	naive := func(s *naiveSender, fromFile bool) time.Duration {
		start := time.Now()
		for i, h := range fx.headers {
			err := s.write(h)
			if err == nil && fromFile {
				n := int64(len(fx.records[i]))
				err = s.sendfile(int64(i)*n, n)
			} else if err == nil {
				err = s.write(fx.records[i])
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	builder := func(bld *send.Builder, conn net.Conn, fromFile bool) time.Duration {
		start := time.Now()
		fx.build(b, bld, fromFile)
		if _, err := bld.WriteTo(conn); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	b.SetBytes(4 * fx.size())
	b.ReportAllocs()
	for b.Loop() {
		tMem += builder(&memBuilder, memConn, false)
		tMemNaive += naive(memNaive, false)
		tFile += builder(&fileBuilder, fileConn, true)
		tFileNaive += naive(fileNaive, true)
	}
	b.StopTimer()
	b.ReportMetric(float64(tMemNaive)/float64(tMem), "memory-naive/builder")
	b.ReportMetric(float64(tFileNaive)/float64(tFile), "file-naive/builder")
	b.ReportMetric(float64(tFile)/float64(tMem), "file/memory-builder")
	b.ReportMetric(float64(tMem.Nanoseconds())/float64(b.N), "memory-builder-ns/op")
	b.ReportMetric(float64(tFile.Nanoseconds())/float64(b.N), "file-builder-ns/op")
	want := int64(b.N) * fx.size()
	for _, closeConn := range []func() int64{closeMemNaive, closeFileNaive, closeMem, closeFile} {
		if got := closeConn(); got != want {
			b.Fatalf("peer read %d bytes, want %d", got, want)
		}
	}
}
