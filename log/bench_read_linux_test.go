package log

import (
	"syscall"
	"time"
)

// shortSleepSlack is how much longer than asked nanosleep may sleep: the
// kernel's default timer slack of 50 µs and the wake-up.
const shortSleepSlack = 70 * time.Microsecond

// sleepShort sleeps for about d with nanosleep, which, unlike time.Sleep,
// does not round a short sleep up to a millisecond.
func sleepShort(d time.Duration) {
	ts := syscall.NsecToTimespec(d.Nanoseconds())
	_ = syscall.Nanosleep(&ts, nil) // an early wake-up is made up by waitUntil's loop
}

// syncAll asks the kernel to write back every dirty page (sync(2)), so
// that a benchmark's timed region does not share the disk and the CPU
// with the writeback of what earlier benchmarks wrote.
func syncAll() { syscall.Sync() }
