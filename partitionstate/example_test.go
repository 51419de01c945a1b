package partitionstate_test

import (
	"fmt"

	"github.com/replog/replog/partitionstate"
)

// TopicPartition identifies a partition, as Kafka does.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// A fetcher walks its partitions in order and moves each one that returned
// data to the end, so the others go first in the next fetch.
func Example() {
	fetchOffsets := partitionstate.New[TopicPartition, int64](3)
	fetchOffsets.UpdateAndMoveToEnd(TopicPartition{"orders", 0}, 100)
	fetchOffsets.UpdateAndMoveToEnd(TopicPartition{"orders", 1}, 200)
	fetchOffsets.UpdateAndMoveToEnd(TopicPartition{"payments", 0}, 300)

	// The fetch response had data for orders-0 only: advance its offset and
	// move it to the end. Moving inside the loop is allowed; each partition
	// is visited once.
	for tp, offset := range fetchOffsets.All() {
		if tp == (TopicPartition{"orders", 0}) {
			fetchOffsets.UpdateAndMoveToEnd(tp, offset+10)
		}
	}

	for tp, offset := range fetchOffsets.All() {
		fmt.Printf("%s-%d at %d\n", tp.Topic, tp.Partition, offset)
	}
	first, _, _ := fetchOffsets.First()
	fmt.Println("next fetch starts with", first.Topic, first.Partition)
	// Output:
	// orders-1 at 200
	// payments-0 at 300
	// orders-0 at 110
	// next fetch starts with orders 1
}
