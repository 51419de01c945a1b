//go:build !race

package compression

// raceEnabled reports whether the race detector is on.
const raceEnabled = false
