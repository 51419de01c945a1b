// Package compression implements Kafka's record batch codecs (none, gzip,
// snappy, lz4, zstd) for replog, so that steady-state compression and
// decompression allocate nothing.
//
// # Contract
//
// A [Codec] is the id Kafka stores in bits 0-2 of a record batch's
// attributes. [Local.Decompress] and [Local.Compress] take and produce a
// whole compressed stream: a batch body after the 61-byte v2 header.
// Both append to a caller-supplied destination and return the extended
// slice, as append does; neither retains src or dst.
//
// A [Local] is a caller-owned scratch context, like Kafka's RequestLocal
// (Kafka PR 9229): it keeps every decoder, encoder and buffer a codec
// needs. It is not safe for concurrent use: give each goroutine or request
// handler its own and pass it down explicitly. Decompressing into
// out[:0] of a slice a previous call returned, with the same Local,
// allocates nothing once warmed up; so does compressing. A [Pool] is the
// convenience path, safe for concurrent use, that lends Locals from a
// sync.Pool it owns; there is no package-level state.
//
// Every error wraps one of the sentinels [ErrUnknownCodec], [ErrCorrupt],
// [ErrTooLarge], [ErrInvalidLevel] or [ErrUnsupported]; match them with
// errors.Is. No input makes this package panic.
//
// # Limits
//
// One Decompress call appends at most [Options].MaxDecompressedSize bytes
// ([DefaultMaxDecompressedSize], 64 MiB, unless set). The limit is enforced
// while decoding: the output buffer is never made larger than dst's length
// plus the limit (plus 64 bytes of slack for zstd), so a decompression bomb
// fails with [ErrTooLarge] having allocated at most about twice the limit
// (about 2.5 times for zstd, see below), never its full output. Per codec:
//   - snappy: every raw block states its decoded length, checked before the
//     block is decoded; a block declaring more than 22 bytes per input byte,
//     which snappy cannot encode, is corrupt (no allocation on a forged
//     length);
//   - lz4: a declared content size is checked up front; each block is
//     decoded into a window no longer than the limit leaves (nor than 255
//     bytes per input byte, LZ4's best ratio);
//   - gzip: output is read in windows that stop one byte past the limit;
//   - zstd: the frame and block headers bound the output (the content size,
//     or per block its raw size or 128 KiB; a compressed block of under 2
//     bytes is corrupt) before decoding; DecodeAll then writes into a
//     buffer capped at that bound and the limit, first at 32 times the
//     input (at least 256 KiB), grown fourfold and decoded again as often
//     as the output needs, straight to the cap once that is less than eight
//     times away (DecodeAll appends the block that crosses the buffer's
//     end before it checks, reallocating: zstd costs up to about 2.5 times
//     the limit). Frames with windows over
//     128 MiB (zstd's own default limit) fail with [ErrUnsupported]; smaller
//     windows cost no memory, since frames decode straight into the output.
//
// When an LZ4 block or zstd frame could make more than the limit leaves and
// fails to decode within it, for want of room, the error is ErrTooLarge:
// it may be corrupt as well, but finding out would take a decode past the
// limit. A zstd frame that fails where room was not short is ErrCorrupt.
//
// The limit is therefore what one call may cost in memory, whatever the
// input's size: a zstd frame of a few KiB can legitimately decompress to
// 64 MiB (a compressed block of about ten bytes may make 128 KiB), and its
// headers cannot tell it from one that makes less; its buffer grows to
// what it makes, up to the limit, a corrupt one's to about where it
// fails. A broker that decompresses untrusted batches concurrently
// should set MaxDecompressedSize to what it can hold that many times over.
//
// # Formats written
//
// Compress writes what Kafka's Java producer writes, which every Kafka
// client reads; Decompress also reads what other clients write.
//
// gzip: one RFC 1952 member (klauspost/compress/gzip). Decompress accepts
// concatenated members.
//
// zstd: one zstd frame with its content size, no checksum, a window of at
// most 1 MiB (klauspost/compress/zstd). Decompress accepts concatenated and
// skippable frames and checksums.
//
// snappy: xerial framing, as the Java producer writes it through
// snappy-java (librdkafka and franz-go write a raw snappy block instead;
// Decompress reads both and tells them apart by the magic):
//
//	+----+----+----+----+----+----+----+----+
//	| 82 | 53 | 4E | 41 | 50 | 50 | 59 | 00 |  magic "\x82SNAPPY\x00"
//	+----+----+----+----+----+----+----+----+
//	| 00   00   00   01 | 00   00   00   01 |  version 1, min compatible 1 (i32 BE)
//	+-------------------+-------------------+
//	| chunk length n (u32 BE) | raw snappy block of n bytes |  repeated
//	+-------------------------+-----------------------------+
//
// Each chunk holds up to 32 KiB of input (snappy-java's block size) as a
// raw snappy block: a uvarint decoded length, then literal and copy
// elements. Chunks follow one another to the end of the stream, with no
// end mark. Blocks are decoded with klauspost's snappy.Decode, which, like
// franz-go's decoder, also accepts s2's repeat-offset copies (an offset of
// 0, invalid in plain snappy); its strict decoder is 2.3x slower. A block
// declaring more than 22 bytes per input byte is refused before it is
// decoded (see above), repeat copies or not: snappy encoders never write
// one.
//
// lz4: one LZ4 frame (lz4_Frame_format.md, pierrec/lz4 for the blocks),
// exactly as Kafka's KafkaLZ4BlockOutputStream writes it:
//
//	+----+----+----+----+-----+-----+-----+
//	| 04 | 22 | 4D | 18 | FLG | BD  | HC  |  magic 0x184D2204 (LE), descriptor
//	+----+----+----+----+-----+-----+-----+
//	  FLG 0x60: version 01, independent blocks, no block checksum,
//	            no content size, no content checksum, no dictionary id
//	  BD  0x40: maximum block size 64 KiB
//	  HC  0x82: (xxh32(FLG BD [content size] [dict id], seed 0) >> 8) & 0xFF
//	+-------------------------+--------------------+
//	| block size (u32 LE)     | block data         |  repeated
//	+-------------------------+--------------------+
//	  high bit set: data stored uncompressed; clear: an LZ4 block
//	+----+----+----+----+
//	| 00 | 00 | 00 | 00 |  end mark
//	+----+----+----+----+
//
// Kafka computes HC correctly for magic 1 and 2 batches (the broken
// checksum of KAFKA-3160 only concerns magic 0), and so must every frame
// Decompress accepts. Decompress also reads what pierrec's frame writer
// (and so franz-go) writes: 256 KiB to 4 MiB blocks, the content size (an
// 8-byte LE field after BD, covered by HC), block checksums (u32 LE after
// each block's data), a content checksum (u32 LE after the end mark), all
// xxh32 with seed 0 and all verified; linked blocks; concatenated and
// skippable frames. Dictionary ids and legacy frames fail with
// [ErrUnsupported]. The frame is parsed here and every block decoded with
// lz4.UncompressBlock straight into the destination, so the frame layer
// costs a few comparisons per block; pierrec's frame reader costs about
// 1.8x the block decoder.
//
// # Levels
//
// See [Codec.CheckLevel]: gzip 1-9, lz4 1-17 (1 fast, 2+ high
// compression), zstd -131072 to 22, 0 always selecting the codec's default;
// snappy has none.
package compression
