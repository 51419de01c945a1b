package log

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestManagerCloseReportsCheckpointFailure: when Manager.Close
// cannot write the recovery-point checkpoint it returns the error, and
// writes no clean-shutdown markers (the next OpenManager recovers).
func TestManagerCloseReportsCheckpointFailure(t *testing.T) {
	mem := vfs.NewMem()
	efs, armed := failCheckpointWrites(mem)
	m, err := OpenManager(mgrCrashDir, mgrCrashOptions(efs))
	require.NoError(t, err)
	a, err := m.Create("a")
	require.NoError(t, err)
	for k := 0; k < 5; k++ {
		_, err := a.Append(testBatch(t, k))
		require.NoError(t, err)
	}
	armed.Store(true)
	require.Error(t, m.Close(), "a failed checkpoint write must be reported")
	_, exists, err := readNamed(mem, managerCleanShutdownFile)
	require.NoError(t, err)
	require.False(t, exists, "no clean-shutdown markers after a failed checkpoint write")
}
