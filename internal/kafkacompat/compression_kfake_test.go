package kafkacompat

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/replog/replog/compression"
)

// Wire compatibility through kfake, franz-go's in-process fake cluster
// (listening on 127.0.0.1 only): batches franz-go produces with each codec
// are fetched raw and decompressed with ours; batches whose records ours
// compressed are produced raw and consumed with kgo.

// newCompatCluster starts a one-broker fake cluster with the topics, each
// of one partition, and returns its addresses and a client for it.
func newCompatCluster(t *testing.T, topics []string) ([]string, *kgo.Client) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topics...))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return c.ListenAddrs(), cl
}

// topicID returns the id of topic, which fetch and produce v13+ use.
func topicID(t *testing.T, ctx context.Context, cl *kgo.Client, topic string) [16]byte {
	t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Len(t, resp.Topics, 1)
	require.NoError(t, kerr.ErrorForCode(resp.Topics[0].ErrorCode))
	return resp.Topics[0].TopicID
}

// fetchRaw returns the record batches of partition 0 of topic, as the
// broker sends them.
func fetchRaw(t *testing.T, ctx context.Context, cl *kgo.Client, topic string) []byte {
	t.Helper()
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = 100
	req.MaxBytes = 64 << 20
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = topic
	rt.TopicID = topicID(t, ctx, cl, topic)
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition = 0
	rp.FetchOffset = 0
	rp.PartitionMaxBytes = 64 << 20
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.NoError(t, kerr.ErrorForCode(resp.ErrorCode))
	require.Len(t, resp.Topics, 1)
	require.Len(t, resp.Topics[0].Partitions, 1)
	p := resp.Topics[0].Partitions[0]
	require.NoError(t, kerr.ErrorForCode(p.ErrorCode))
	return p.RecordBatches
}

func TestCompressionFranzProducesOursDecompresses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var topics []string
	for _, c := range compatCodecs {
		topics = append(topics, "franz-"+c.String())
	}
	addrs, admin := newCompatCluster(t, topics)
	l := compression.NewLocal(compression.Options{})
	for _, c := range compatCodecs {
		t.Run(c.String(), func(t *testing.T) {
			topic := "franz-" + c.String()
			producer, err := kgo.NewClient(
				kgo.SeedBrokers(addrs...),
				kgo.DefaultProduceTopic(topic),
				kgo.ProducerBatchCompression(franzCodec(c)),
				kgo.ProducerBatchMaxBytes(4<<20),
				kgo.ProducerLinger(50*time.Millisecond),
			)
			require.NoError(t, err)
			defer producer.Close()

			// One small batch, then one large enough for several LZ4 blocks
			// and xerial chunks.
			var want []compatRecord
			for _, recs := range [][]compatRecord{compatRecords(10, 4, 1024), compatRecords(11, 120, 1024)} {
				krs := make([]*kgo.Record, len(recs))
				for i, r := range recs {
					krs[i] = &kgo.Record{Key: r.Key, Value: r.Value}
					for _, h := range r.Headers {
						krs[i].Headers = append(krs[i].Headers, kgo.RecordHeader{Key: h.Key, Value: []byte(h.Value)})
					}
				}
				require.NoError(t, producer.ProduceSync(ctx, krs...).FirstErr())
				want = append(want, recs...)
			}

			var got []compatRecord
			var out []byte
			for _, b := range splitCompatBatches(t, fetchRaw(t, ctx, admin, topic)) {
				require.Equal(t, c, b.Codec, "franz-go compressed the batch with the codec asked for")
				out, err = l.Decompress(out[:0], b.Records, c)
				require.NoError(t, err)
				recs, err := parseCompatRecords(out, b.Count)
				require.NoError(t, err)
				for _, r := range recs {
					r.TsDelta = 0 // franz-go's timestamps are its own
					got = append(got, compatRecord{Key: append([]byte(nil), r.Key...), Value: append([]byte(nil), r.Value...), Headers: r.Headers})
				}
			}
			require.Len(t, got, len(want))
			for i := range want {
				want[i].TsDelta = 0
				require.Equal(t, want[i], got[i], "record %d", i)
			}
		})
	}
}

func TestCompressionOursProducesFranzConsumes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type batchCase struct {
		c     compression.Codec
		level int
		recs  []compatRecord
	}
	var cases []batchCase
	for _, c := range compatCodecs {
		levels := map[compression.Codec][]int{compression.Gzip: {0, 9}, compression.LZ4: {0, 9}, compression.Zstd: {0, 22}}[c]
		if levels == nil {
			levels = []int{0}
		}
		for _, level := range levels {
			cases = append(cases,
				batchCase{c, level, compatRecords(uint64(20+level), 4, 1024)},
				batchCase{c, level, compatRecords(uint64(40+level), 150, 1024)}, // several LZ4 blocks
			)
		}
	}
	var topics []string
	for i := range cases {
		topics = append(topics, fmt.Sprintf("ours-%d", i))
	}
	addrs, admin := newCompatCluster(t, topics)
	l := compression.NewLocal(compression.Options{})
	baseTs := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC).UnixMilli()
	for i, tc := range cases {
		topic := topics[i]
		t.Run(fmt.Sprintf("%s/level=%d/records=%d", tc.c, tc.level, len(tc.recs)), func(t *testing.T) {
			batch := buildCompatBatch(t, l, tc.recs, tc.c, tc.level, baseTs)

			req := kmsg.NewPtrProduceRequest()
			req.Acks = -1
			req.TimeoutMillis = 5000
			rt := kmsg.NewProduceRequestTopic()
			rt.Topic = topic
			rt.TopicID = topicID(t, ctx, admin, topic)
			rp := kmsg.NewProduceRequestTopicPartition()
			rp.Partition = 0
			rp.Records = batch
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
			resp, err := req.RequestWith(ctx, admin)
			require.NoError(t, err)
			require.Len(t, resp.Topics, 1)
			require.Len(t, resp.Topics[0].Partitions, 1)
			require.NoError(t, kerr.ErrorForCode(resp.Topics[0].Partitions[0].ErrorCode))

			consumer, err := kgo.NewClient(
				kgo.SeedBrokers(addrs...),
				kgo.ConsumeTopics(topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			)
			require.NoError(t, err)
			defer consumer.Close()
			var got []*kgo.Record
			for len(got) < len(tc.recs) {
				fs := consumer.PollFetches(ctx)
				require.NoError(t, ctx.Err())
				for _, fe := range fs.Errors() {
					require.NoError(t, fe.Err, "fetch %s/%d", fe.Topic, fe.Partition)
				}
				got = append(got, fs.Records()...)
			}
			require.Len(t, got, len(tc.recs))
			for j, r := range got {
				w := tc.recs[j]
				assert.Equal(t, int64(j), r.Offset)
				assert.Equal(t, w.Key, r.Key, "record %d", j)
				require.Equal(t, w.Value, r.Value, "record %d", j)
				require.Len(t, r.Headers, len(w.Headers))
				for k, h := range w.Headers {
					assert.Equal(t, h.Key, r.Headers[k].Key)
					assert.Equal(t, h.Value, string(r.Headers[k].Value))
				}
				assert.Equal(t, baseTs+w.TsDelta, r.Timestamp.UnixMilli(), "record %d", j)
			}
		})
	}
}
