//go:build !linux

package log

import "time"

// shortSleepSlack is how much longer than asked time.Sleep may sleep
// when the process is otherwise idle.
const shortSleepSlack = 1500 * time.Microsecond

// sleepShort sleeps for about d.
func sleepShort(d time.Duration) { time.Sleep(d) }

// syncAll does nothing here (sync(2) on Linux: see its doc there).
func syncAll() {}
