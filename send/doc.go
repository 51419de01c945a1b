// Package send writes a response made of many byte slices and file regions
// with as few system calls as it can: the send side of a fetch response,
// which alternates small encoded headers with record data that already sits
// in segment files.
//
// Kafka once sent each buffer of a response with its own write; grouping
// consecutive buffers into one gathering write took p50 latency from 64 ms
// to 2 ms (PR 9619). A Builder does the same for Go, and sends file data
// with sendfile where that is cheaper than copying it.
//
// # Contract
//
//  1. Add the response in order with AddBytes, AddCopy and AddFile, then
//     call WriteTo. Len says how many bytes that will be.
//  2. A slice larger than the copy threshold is referenced, not copied: do
//     not modify it until Reset. Smaller slices (and AddCopy) are copied
//     into the Builder's coalescing buffer and may be reused at once.
//  3. A file region is read when WriteTo runs, at its explicit offset
//     (ReadAt, or sendfile with an offset argument); the file's shared
//     offset is never used or moved, so any number of Builders may send
//     regions of one file at the same time. Keep the file open until WriteTo
//     returns. A region that reaches past the end of the file fails WriteTo
//     with ErrRegionPastEOF; it is never silently shortened.
//  4. WriteTo returns how many bytes reached the writer. After an error the
//     stream is mid-response and should normally be closed.
//  5. Reset forgets the parts and keeps the memory for the next response.
//     Stats counts the system calls and bytes, cumulatively.
//
// A Builder is not safe for concurrent use; distinct Builders are
// independent.
//
// # How a response is written
//
// On Linux, when the writer is a *net.TCPConn, a stream *net.UnixConn or an
// *os.File, the whole response is written inside one RawConn.Write (the
// connection's write lock is held, so two responses written concurrently to
// one connection do not interleave):
//
//   - Each maximal run of memory buffers goes out with one writev of at
//     most IOV_MAX (1024) buffers. Consecutive copied slices are one buffer;
//     referenced slices are one buffer each (joined when adjacent in
//     memory).
//   - A file region larger than the read threshold, whose source is an
//     *os.File (any io.ReaderAt that also implements syscall.Conn), goes
//     out with sendfile at its offset. Regions that are adjacent in the same
//     file and added one after the other are merged into one sendfile. If
//     the kernel refuses sendfile for a source (EINVAL, ENOSYS,
//     EOPNOTSUPP), the region is read instead.
//   - Smaller regions, and regions of sources without a descriptor, are
//     read with ReadAt into a builder-owned buffer (at most MaxReadBuffer
//     bytes, reused) and sent inside the surrounding writev. Regions lying
//     back to back in one file are read with a single ReadAt even when
//     headers sit between them in the response.
//   - A partial write is resumed at once; EAGAIN waits in the runtime
//     poller, and the connection's write deadline is honoured.
//
// Any other writer, and every writer on other systems, gets the same bytes
// through plain calls: net.Buffers for the net package's own connections (a
// gathering write where the platform has one), one Write per buffer
// otherwise (a wrapper such as tls.Conn included), stopping at the first
// short Write, with file data read into memory.
//
// # Why small file regions are read, not sent with sendfile
//
// Each sendfile is a system call of its own and splits the writev runs
// around it, so a fetch response of 1,000 partitions with 1 KiB of records
// each would cost 2,000 calls. BenchmarkFileRegion sends 2 MiB responses of
// 60-byte headers alternating with file regions of one size over TCP
// loopback, every region by sendfile or every region read into memory.
// Medians of three runs on the 2-core development machine (shared, load
// about 10), as process CPU time per response (cpu-ns/op; wall-clock ns/op
// agrees, with more noise):
//
//	region   sendfile   read     read is
//	1 KiB    26.4 ms    1.66 ms  16x cheaper
//	4 KiB     6.67 ms   0.91 ms  7x cheaper
//	16 KiB    1.54 ms   1.03 ms  1.5x cheaper
//	32 KiB    1.31 ms   0.93 ms  1.4x cheaper
//	64 KiB    1.08 ms   1.07 ms  even
//	256 KiB   0.78 ms   1.05 ms  1.35x dearer
//
// Regions of at most 32 KiB (DefaultReadThreshold) are therefore read, and
// larger ones go by sendfile, which also spares the copy and the memory.
// Because the regions of a fetch response lie back to back in the segment,
// reading them costs one ReadAt per gathering write, not one per region: in
// BenchmarkFetchResponse the file-backed response takes two reads and two
// writev calls (plus about 0.3 retries after EAGAIN) and about 1.1 times
// the CPU time of the memory-backed one.
package send
