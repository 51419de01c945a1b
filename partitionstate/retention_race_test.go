//go:build race

package partitionstate

// retentionMoves is the number of moves TestRetention makes under the race
// detector: 2 million instead of 10. The race detector makes each map access
// about 1 µs, so 10 million moves took 14 s on a 2-core machine, most of the
// package's -race budget. 2 million moves still expose any retention of a
// byte per move or more (the limit is 1 MiB); the full 10 million run
// without -race (retention_norace_test.go).
const retentionMoves = 2_000_000
