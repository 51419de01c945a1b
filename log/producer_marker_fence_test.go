package log

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMarkerOfOlderEpochFenced: a leader refuses a transaction
// marker of a producer epoch older than the producer's current one
// (ErrProducerFenced), and writes nothing.
func TestMarkerOfOlderEpochFenced(t *testing.T) {
	l := idemOpen(t, idemMem(), Options{})
	idemAppend(t, l, idemBatch(t, 9, 2, 0, 1, 1000))
	leo := l.LogEndOffset()
	_, err := l.Append(markerBatch(t, 9, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced)
	require.Equal(t, leo, l.LogEndOffset(), "a fenced marker changes nothing")
	// The producer's epoch is unchanged: its next batch still follows.
	idemAppend(t, l, idemBatch(t, 9, 2, 1, 1, 1000))
}
