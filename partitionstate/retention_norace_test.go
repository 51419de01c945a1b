//go:build !race

package partitionstate

// retentionMoves is the number of moves TestRetention makes: 10 million,
// as the issue asks.
const retentionMoves = 10_000_000
