package broker

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestCreateTopicsValidateOnlyChecksPartitions: a validate-only CreateTopics
// must run the same checks as a real one: 0 partitions is
// INVALID_PARTITIONS, not success.
func TestCreateTopicsValidateOnlyChecksPartitions(t *testing.T) {
	b := startBroker(t, t.TempDir())
	rc := dial(t, b)
	for _, n := range []int32{0, -5, DefaultMaxPartitionCount + 1} {
		req := kmsg.NewPtrCreateTopicsRequest()
		req.Version = 4
		req.ValidateOnly = true
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = "validate", n, -1
		req.Topics = append(req.Topics, rt)
		resp := kmsg.NewPtrCreateTopicsResponse()
		resp.Version = 4
		if err := resp.ReadFrom(rc.request(req)); err != nil {
			t.Fatal(err)
		}
		// The same request without ValidateOnly gets INVALID_PARTITIONS.
		if got := resp.Topics[0].ErrorCode; got != errInvalidPartitions {
			t.Errorf("validate-only create with %d partitions: error %d, want %d (INVALID_PARTITIONS)", n, got, errInvalidPartitions)
		}
	}
}

// TestMetadataAnswersEachNameOnce: a Metadata request naming a topic many
// times gets one entry for it, as from Kafka (which makes a set of the
// names): a small request naming "" a million times once cost one entry
// each, about 300 times the request's size in memory.
func TestMetadataAnswersEachNameOnce(t *testing.T) {
	b := startBroker(t, t.TempDir())
	rc := dial(t, b)
	const n = 10_000
	body := binary.BigEndian.AppendUint32(nil, n)
	for i := range n {
		name := []string{"", "orders"}[i%2]
		body = binary.BigEndian.AppendUint16(body, uint16(len(name)))
		body = append(body, name...)
	}
	body = append(body, 0) // v4+: no auto creation
	rc.corr = 1
	rc.write(frame(3, 4, 1, body))
	respBody, err := rc.readResponse()
	if err != nil {
		t.Fatal(err)
	}
	resp := kmsg.NewPtrMetadataResponse()
	resp.Version = 4
	if err := resp.ReadFrom(respBody); err != nil {
		t.Fatal(err)
	}
	if len(resp.Topics) != 2 {
		t.Fatalf("%d names, 2 distinct: %d topic entries in the answer", n, len(resp.Topics))
	}
	for _, rt := range resp.Topics {
		if rt.ErrorCode != errUnknownTopicOrPartition && rt.ErrorCode != errInvalidTopic {
			t.Errorf("topic %q: error %d", *rt.Topic, rt.ErrorCode)
		}
	}
}

// TestMetadataInvalidTopicName: a Metadata request for a name that cannot
// be a topic gets INVALID_TOPIC_EXCEPTION whether or not it may create
// topics, as from Kafka (which validates the name first). Without
// creation the broker said UNKNOWN_TOPIC_OR_PARTITION, which clients
// retry until they time out.
func TestMetadataInvalidTopicName(t *testing.T) {
	b := startBroker(t, t.TempDir())
	rc := dial(t, b)
	for _, allow := range []bool{false, true} {
		for _, name := range []string{"bad/name", "..", strings.Repeat("x", 250)} {
			req := kmsg.NewPtrMetadataRequest()
			req.Version = 8
			req.AllowAutoTopicCreation = allow
			rt := kmsg.NewMetadataRequestTopic()
			rt.Topic = kmsg.StringPtr(name)
			req.Topics = append(req.Topics, rt)
			resp := kmsg.NewPtrMetadataResponse()
			resp.Version = 8
			if err := resp.ReadFrom(rc.request(req)); err != nil {
				t.Fatal(err)
			}
			if got := resp.Topics[0].ErrorCode; got != errInvalidTopic {
				t.Errorf("Metadata for %.20q (auto-create %v): error %d, want %d (INVALID_TOPIC_EXCEPTION)", name, allow, got, errInvalidTopic)
			}
		}
	}
}
