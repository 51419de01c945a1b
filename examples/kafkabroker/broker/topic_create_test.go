package broker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Topic names the log Manager cannot store (differing in case only from
// a topic's, or too long for "topic-partition" log names) get
// INVALID_TOPIC_EXCEPTION, not the retriable KAFKA_STORAGE_ERROR that
// clients retry until they time out.
func TestTopicNamesTheStoreRefusesAreInvalid(t *testing.T) {
	b := startBroker(t, t.TempDir())
	if code := b.createTopic("orders", 1); code != errNone {
		t.Fatal(code)
	}
	rc := dial(t, b)
	for _, name := range []string{"Orders", strings.Repeat("x", 246), strings.Repeat("y", 249)} {
		req := kmsg.NewPtrMetadataRequest()
		req.Version = 8
		req.AllowAutoTopicCreation = true
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(name)
		req.Topics = append(req.Topics, rt)
		resp := kmsg.NewPtrMetadataResponse()
		resp.Version = 8
		if err := resp.ReadFrom(rc.request(req)); err != nil {
			t.Fatal(err)
		}
		if got := resp.Topics[0].ErrorCode; got != errInvalidTopic {
			t.Errorf("Metadata auto-creating %.12q (%d bytes): error %d, want %d (INVALID_TOPIC_EXCEPTION)", name, len(name), got, errInvalidTopic)
		}
	}
	// Still fine: the longest names that fit.
	if code := b.createTopic(strings.Repeat("z", 245), 1); code != errNone {
		t.Errorf("245-byte name, 1 partition: error %d", code)
	}
	if code := b.createTopic(strings.Repeat("w", 244), 100); code != errNone {
		t.Errorf("244-byte name, 100 partitions: error %d", code)
	}
}

// A topic creation failing at partition 5 deletes partitions 0-4 again:
// they do not come back as the topic at the next start.
func TestFailedCreateLeavesNoPartitions(t *testing.T) {
	b := startBroker(t, t.TempDir())
	blocker := filepath.Join(b.cfg.DataDir, "topics", "t-5")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := b.createTopic("t", 8); code != errStorage {
		t.Fatalf("create: error %d, want %d", code, errStorage)
	}
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	b = restart(t, b)
	if n := len(b.partitions("t")); n != 0 {
		t.Fatalf("a refused CreateTopics left topic t with %d partitions after a restart", n)
	}
}
