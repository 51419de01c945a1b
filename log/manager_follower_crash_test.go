package log

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// followerCrashModel holds, per base offset, the batches a log may hold
// there (allowed) and those it must hold (acked: synced).
type followerCrashModel struct {
	allowed map[int64][][]byte
	acked   map[int64][]byte
	pending map[int64][]byte // appended, not yet acked
	state   mgrLogState
}

func newFollowerCrashModel() *followerCrashModel {
	return &followerCrashModel{allowed: map[int64][][]byte{}, acked: map[int64][]byte{}, pending: map[int64][]byte{}, state: mgrCreating}
}

// followerCrashWorkload runs a Manager's follower logs through appends
// with offset gaps, syncs, truncations, a clean close and reopen, and a
// Delete and re-Create, on fsys, stopping at the first error (a crash),
// and returns what each log may and must hold.
func followerCrashWorkload(t *testing.T, fsys vfs.FS) map[string]*followerCrashModel {
	md := map[string]*followerCrashModel{}
	m, err := OpenManager(mgrCrashDir, mgrCrashOptions(fsys))
	if err != nil {
		return md
	}
	defer func() {
		if m != nil {
			_ = m.Close()
		}
	}()
	create := func(name string) *Log {
		md[name] = newFollowerCrashModel()
		l, err := m.Create(name)
		if err != nil {
			return nil
		}
		md[name].state = mgrLive
		return l
	}
	app := func(name string, l *Log, base int64, n int, epoch int32) bool {
		b := followerBatch(t, base, n, epoch)
		lm := md[name]
		lm.allowed[base] = append(lm.allowed[base], b)
		if _, err := l.AppendAsFollower(b); err != nil {
			return false
		}
		lm.pending[base] = b
		return true
	}
	sync := func(name string, l *Log) bool {
		if err := l.Sync(); err != nil {
			return false
		}
		lm := md[name]
		for k, v := range lm.pending {
			lm.acked[k] = v
		}
		clear(lm.pending)
		return true
	}
	trunc := func(name string, l *Log, off int64, full bool) bool {
		lm := md[name]
		// Not required from now on.
		for k, b := range lm.acked {
			if Batch(b).LastOffset() >= off || full {
				delete(lm.acked, k)
			}
		}
		for k, b := range lm.pending {
			if Batch(b).LastOffset() >= off || full {
				delete(lm.pending, k)
			}
		}
		var err error
		if full {
			err = l.TruncateFullyAndStartAt(off)
		} else {
			err = l.TruncateTo(off)
		}
		if err != nil {
			return false
		}
		for k, bs := range lm.allowed {
			if Batch(bs[0]).LastOffset() >= off || full {
				delete(lm.allowed, k)
			}
		}
		return true
	}
	closeAll := func() bool {
		if err := m.Close(); err != nil {
			return false
		}
		for _, lm := range md {
			for k, v := range lm.pending {
				lm.acked[k] = v
			}
			clear(lm.pending)
		}
		return true
	}
	f := create("f")
	if f == nil {
		return md
	}
	for base := int64(0); base < 24; base += 3 {
		if !app("f", f, base, 3, 1) {
			return md
		}
	}
	if !sync("f", f) || !app("f", f, 1000, 3, 1) || !app("f", f, 1003, 3, 1) || !sync("f", f) {
		return md
	}
	if !app("f", f, 1006, 3, 1) || !trunc("f", f, 1000, false) {
		return md
	}
	for base := int64(24); base < 40; base += 4 {
		if !app("f", f, base, 4, 2) {
			return md
		}
	}
	if !sync("f", f) || !app("f", f, 2000, 2, 3) || !sync("f", f) {
		return md
	}
	if !closeAll() {
		return md
	}
	if m, err = OpenManager(mgrCrashDir, mgrCrashOptions(fsys)); err != nil {
		m = nil
		return md
	}
	f, _ = m.Get("f")
	if !trunc("f", f, 30, false) {
		return md
	}
	for base := int64(30); base < 50; base += 5 {
		if !app("f", f, base, 5, 4) {
			return md
		}
	}
	if !sync("f", f) || !trunc("f", f, 5000, true) || !app("f", f, 5000, 3, 5) || !app("f", f, 5003, 3, 5) || !sync("f", f) {
		return md
	}
	md["f"].state = mgrDeleting
	if err := m.Delete("f"); err != nil {
		return md
	}
	md["f"].state = mgrDeleted
	f = create("f")
	if f == nil || !app("f", f, 7000, 3, 6) || !app("f", f, 7003, 3, 6) || !sync("f", f) || !app("f", f, 9000, 3, 6) || !sync("f", f) {
		return md
	}
	closeAll()
	return md
}

// checkFollowerCrash checks the logs of m against md: every batch was
// appended there, every acknowledged one is there, no live log is lost.
func checkFollowerCrash(t *testing.T, m *Manager, md map[string]*followerCrashModel, desc string) map[string]logState {
	states := map[string]logState{}
	for _, name := range m.Names() {
		l, _ := m.Get(name)
		st, err := readLeaping(l)
		require.NoError(t, err, "log %s %s", name, desc)
		states[name] = st
	}
	for name, lm := range md {
		st, ok := states[name]
		if lm.state == mgrLive {
			require.True(t, ok, "log %s lost %s", name, desc)
		}
		if !ok || lm.state == mgrDeleting || lm.state == mgrCreating {
			continue
		}
		got := map[int64][]byte{}
		for _, b := range st.batches {
			base := Batch(b).BaseOffset()
			got[base] = b
			found := false
			for _, a := range lm.allowed[base] {
				found = found || bytes.Equal(a, b)
			}
			require.True(t, found, "log %s: batch at %d never appended there (or truncated away) %s", name, base, desc)
		}
		for base, a := range lm.acked {
			require.Equal(t, a, got[base], "A1: log %s lost acked batch at %d (log [%d,%d)) %s", name, base, st.start, st.end, desc)
		}
	}
	return states
}

// A crash at every filesystem operation of followerCrashWorkload, in four
// modes (strict, partial power loss, journal prefix, kill then power
// loss), keeps what was synced, never brings a deleted log back nor an
// old log's checkpoint entries into a recreated one, and reopens to the
// same state.
func TestManagerFollowerCrashSweep(t *testing.T) {
	efs := vfs.NewErrorFS(vfs.NewMem(), nil)
	md := followerCrashWorkload(t, efs)
	require.Equal(t, mgrLive, md["f"].state)
	total := efs.Ops()
	modes := []func(n int64) vfs.CrashOptions{
		func(n int64) vfs.CrashOptions { return vfs.CrashOptions{} },
		func(n int64) vfs.CrashOptions {
			return vfs.CrashOptions{Seed: n, KeepUnsynced: 0.6, ZeroSectors: 0.05, KeepDirOps: 0.5}
		},
		func(n int64) vfs.CrashOptions { return vfs.CrashOptions{Seed: n, DirOpsPrefix: 1} },
		func(n int64) vfs.CrashOptions { return vfs.CrashOptions{Kill: true} },
	}
	for mi, mode := range modes {
		for n := int64(0); n <= total+20; n++ {
			mem := vfs.NewMem()
			o := mode(n)
			crash := &vfs.Crash{N: n, Mem: mem, Opts: o}
			md := followerCrashWorkload(t, vfs.NewErrorFS(mem, crash))
			img := crash.Clone()
			if img == nil {
				break
			}
			desc := fmt.Sprintf("(mode %d crash before op %d of %d)", mi, n, total)
			m, err := OpenManager(mgrCrashDir, mgrCrashOptions(img))
			require.NoError(t, err, "open %s", desc)
			states := checkFollowerCrash(t, m, md, desc)
			require.NoError(t, m.Close(), desc)
			img2 := img
			if o.Kill {
				img2 = img.CrashClone(vfs.CrashOptions{})
			}
			m, err = OpenManager(mgrCrashDir, mgrCrashOptions(img2))
			require.NoError(t, err, "A4 %s", desc)
			again := checkFollowerCrash(t, m, md, desc+" A4")
			require.Len(t, again, len(states), desc)
			for name, st := range states {
				requireSameState(t, st, again[name], "log "+name+" "+desc)
			}
			require.NoError(t, m.Close())
		}
	}
	t.Logf("%d ops", total)
}
