package replication_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	replog "github.com/replog/replog/log"
	"github.com/replog/replog/replication"
)

// Example replicates a partition from a leader to a follower over the
// in-memory network and produces with acks=all.
func Example() {
	dir, err := os.MkdirTemp("", "replog-replication-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	net := replication.NewMemNetwork(1)
	tp := replication.TopicPartition{Topic: "orders", Partition: 0}
	var nodes []*replication.Replicator
	var logs []*replog.Log
	for id := int32(0); id < 2; id++ {
		l, err := replog.Open(filepath.Join(dir, fmt.Sprint(id)), replog.Options{})
		if err != nil {
			panic(err)
		}
		r, err := replication.New(replication.Config{ReplicaID: id, ClusterID: "example", MinInsyncReplicas: 2}, net.Transport(id))
		if err != nil {
			panic(err)
		}
		net.Register(id, r)
		if err := r.AddPartition(tp, l); err != nil {
			panic(err)
		}
		nodes, logs = append(nodes, r), append(logs, l)
	}
	// The application decides who leads, at which epoch.
	if err := nodes[0].BecomeLeader(tp, 1, []int32{0, 1}, []int32{0, 1}); err != nil {
		panic(err)
	}
	if err := nodes[1].BecomeFollower(tp, 1, 0); err != nil {
		panic(err)
	}

	b := replog.NewBatchBuilder()
	b.Add(1700000000000, nil, []byte("order #1"))
	batch, _ := b.Build(nil)
	info, err := nodes[0].Produce(context.Background(), tp, batch, replication.AcksAll)
	if err != nil {
		panic(err)
	}
	fmt.Println("acknowledged offset", info.FirstOffset, "high watermark", logs[0].HighWatermark())
	fmt.Println("follower log end", logs[1].LogEndOffset())

	for i := range nodes {
		nodes[i].Close()
		logs[i].Close()
	}
	// Output:
	// acknowledged offset 0 high watermark 1
	// follower log end 1
}
