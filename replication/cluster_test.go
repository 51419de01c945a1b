package replication

// Integration tests of a three-node cluster over TCP loopback with
// Manager-owned logs (cluster_harness_test.go, cluster_check_test.go).
// The controller's choices and the producers' batches follow a seed; the
// goroutines' timing does not, so a seed reproduces a run's actions but
// not its interleavings. REPLOG_CLUSTER_SEED overrides the fixed seed.

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// clusterSeed returns REPLOG_CLUSTER_SEED if set, def otherwise, and has
// a failing test log the seed to rerun it with.
func clusterSeed(t *testing.T, def int64) int64 {
	t.Helper()
	seed := def
	if v := os.Getenv("REPLOG_CLUSTER_SEED"); v != "" {
		var err error
		seed, err = strconv.ParseInt(v, 10, 64)
		require.NoError(t, err, "REPLOG_CLUSTER_SEED")
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d: rerun with REPLOG_CLUSTER_SEED=%d", seed, seed)
		}
	})
	return seed
}

// TestClusterWithManagerLogsSurvivesFailoversRestartsAndDeletes: 24
// partitions on three nodes whose Managers keep at most 3 files open,
// with idempotent acks=all producers, while the controller moves
// leaderships, restarts nodes (some as crashes, their leaderships moved
// only after they closed) and deletes records. Once the replicas
// converged, every acknowledged record is on the leader at its offset,
// none is stored twice, the replicas are identical batch for batch, no
// leader's high watermark went down within an epoch, no log is stuck
// failed, nothing unexpected was logged and no goroutine leaked.
func TestClusterWithManagerLogsSurvivesFailoversRestartsAndDeletes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster for several seconds")
	}
	runClusterScenario(t, clusterScenario{opts: defaultClusterOptions(24), duration: 8 * time.Second, seed: clusterSeed(t, 5),
		valueSize: 60, maxDown: 500 * time.Millisecond, convergeTimeout: 15 * time.Second,
		highWatermarkGap: 5 * time.Millisecond})
}

// TestClusterWithManagerLogsStreamsLargeResponses is the same with 8
// partitions of 3 KB records on 128 KiB segments (512 KiB retention),
// Managers keeping 2 files open, and nodes down for up to 1.5 s: a
// follower catching up gets fetch responses over 256 KiB, which it
// applies while they arrive (stream.go). A leader reads at most one
// segment per partition for a response, so the segments must be large
// enough for 8 partitions to pass 256 KiB.
func TestClusterWithManagerLogsStreamsLargeResponses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster for several seconds")
	}
	o := defaultClusterOptions(8)
	o.maxOpenFiles = 2
	o.logOpts.SegmentBytes = 128 << 10
	o.logOpts.RetentionBytes = 512 << 10
	o.cfg.ReplicaLagTime = 300 * time.Millisecond
	o.cfg.FetchMaxWait = 30 * time.Millisecond
	runClusterScenario(t, clusterScenario{opts: o, duration: 4 * time.Second, seed: clusterSeed(t, 6),
		valueSize: 3000, maxDown: 1500 * time.Millisecond, convergeTimeout: 15 * time.Second,
		highWatermarkGap: 5 * time.Millisecond})
}
