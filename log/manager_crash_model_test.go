package log

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// mwWorkload: create, append, roll, sync, close/reopen, delete, recreate,
// delete, close. It stops at the first error.
func mwWorkload(t testing.TB, fsys vfs.FS) map[string]*mgrLogModel {
	md := map[string]*mgrLogModel{}
	seq := 0
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
		md[name] = &mgrLogModel{state: mgrCreating}
		l, err := m.Create(name)
		if err != nil {
			return nil
		}
		md[name].state = mgrLive
		return l
	}
	del := func(name string) bool {
		md[name].state = mgrDeleting
		if err := m.Delete(name); err != nil {
			return false
		}
		md[name].state = mgrDeleted
		return true
	}
	app := func(name string, l *Log, n int, sync bool) bool {
		lm := md[name]
		for i := 0; i < n; i++ {
			b := testBatch(t, seq%len(batchTemplates))
			seq++
			lm.attempted = append(lm.attempted, b)
			if _, err := l.Append(b); err != nil {
				return false
			}
			lm.appended++
		}
		if sync {
			n := lm.appended
			if err := l.Sync(); err != nil {
				return false
			}
			lm.acked = n
		}
		return true
	}
	a := create("a")
	if a == nil || !app("a", a, 4, true) {
		return md
	}
	b := create("b")
	if b == nil || !app("b", b, 12, false) || !app("b", b, 2, true) {
		return md
	}
	if err := m.Close(); err != nil {
		return md
	}
	for _, lm := range md {
		lm.acked = lm.appended
	}
	if m, err = OpenManager(mgrCrashDir, mgrCrashOptions(fsys)); err != nil {
		m = nil
		return md
	}
	a, _ = m.Get("a")
	if !app("a", a, 6, false) {
		return md
	}
	if !del("b") {
		return md
	}
	c := create("c")
	if c == nil || !app("c", c, 3, true) {
		return md
	}
	b = create("b")
	if b == nil || !app("b", b, 8, true) {
		return md
	}
	if !app("a", a, 2, true) {
		return md
	}
	if !del("a") {
		return md
	}
	if err := m.Close(); err != nil {
		return md
	}
	for _, lm := range md {
		lm.acked = lm.appended
	}
	return md
}

func mwCheck(t testing.TB, m *Manager, md map[string]*mgrLogModel, desc string) map[string]logState {
	t.Helper()
	states := map[string]logState{}
	for _, name := range m.Names() {
		l, _ := m.Get(name)
		st, err := tryReadState(l)
		require.NoError(t, err, "log %s %s", name, desc)
		states[name] = st
	}
	for name := range states {
		require.Contains(t, md, name, "unknown log %s %s", name, desc)
	}
	for name, lm := range md {
		st, ok := states[name]
		switch lm.state {
		case mgrLive:
			require.True(t, ok, "log %s whose Create returned nil is lost %s", name, desc)
		case mgrDeleted:
			require.False(t, ok, "log %s whose Delete returned nil is back %s", name, desc)
		}
		if !ok {
			continue
		}
		// Every batch found is one appended at that offset (to this
		// incarnation, unless a Delete was under way: then the old one).
		if lm.state != mgrDeleting && lm.state != mgrCreating {
			for i, b := range st.batches {
				require.Less(t, i, len(lm.attempted), "log %s has more batches than appended %s", name, desc)
				require.Equal(t, Batch(lm.attempted[i]).BaseOffset(), Batch(b).BaseOffset(), "log %s batch %d %s", name, i, desc)
				if i < lm.appended {
					require.Equal(t, lm.attempted[i], b, "log %s batch %d %s", name, i, desc)
				}
			}
			checkAcked(t, st, lm.attempted[:lm.acked])
		}
	}
	return states
}

func mwCrashRun(t *testing.T, mode string, opts func(n int64) vfs.CrashOptions, stride int64) {
	efs := vfs.NewErrorFS(vfs.NewMem(), nil)
	md := mwWorkload(t, efs)
	for name, lm := range md {
		require.NotEqual(t, mgrCreating, lm.state, name)
	}
	total := efs.Ops()
	crashes := 0
	for n := int64(0); n <= total+50; n += stride {
		mem := vfs.NewMem()
		o := opts(n)
		kill := o.Kill
		crash := &vfs.Crash{N: n, Mem: mem, Opts: o}
		md := mwWorkload(t, vfs.NewErrorFS(mem, crash))
		img := crash.Clone()
		if img == nil {
			break
		}
		crashes++
		desc := fmt.Sprintf("(%s: crash before op %d of %d)", mode, n, total)
		m, err := OpenManager(mgrCrashDir, mgrCrashOptions(img))
		require.NoError(t, err, "open after the crash %s", desc)
		states := mwCheck(t, m, md, desc)
		if kill {
			// What recovery trusts must be durable: a power loss now.
			img2 := img.CrashClone(vfs.CrashOptions{})
			m2, err := OpenManager(mgrCrashDir, mgrCrashOptions(img2))
			require.NoError(t, err, "open after a power loss right after recovery %s", desc)
			again := mwCheck(t, m2, md, desc+" (power loss after recovery)")
			require.Len(t, again, len(states), desc)
			for name, st := range states {
				requireSameState(t, st, again[name], "log "+name+" "+desc)
			}
			require.NoError(t, m2.Close())
		}
		require.NoError(t, m.Close(), desc)
		m, err = OpenManager(mgrCrashDir, mgrCrashOptions(img))
		require.NoError(t, err, "A4 %s", desc)
		again := mwCheck(t, m, md, desc+" (A4)")
		require.Len(t, again, len(states), desc)
		for name, st := range states {
			requireSameState(t, st, again[name], "log "+name+" "+desc)
		}
		require.NoError(t, m.Close())
	}
	t.Logf("%s: %d ops, %d crashes", mode, total, crashes)
}

// TestManagerCrashPrefixAndKill: a crash at every fifth filesystem
// operation of a workload that creates,
// rolls, syncs, closes and reopens, deletes and re-creates logs, with two
// crash models TestManagerCrash does not use: a journaling filesystem
// keeping a random prefix of each directory's unsynced entry changes, and
// a killed process followed by a power loss right after recovery. Checks:
// a log whose Create returned is there, one whose Delete returned is not,
// synced batches are kept, A2-A4.
func TestManagerCrashPrefixAndKill(t *testing.T) {
	modes := map[string]func(n int64) vfs.CrashOptions{
		"prefix": func(n int64) vfs.CrashOptions { return vfs.CrashOptions{Seed: n, DirOpsPrefix: 1} },
		"kill":   func(int64) vfs.CrashOptions { return vfs.CrashOptions{Kill: true} },
	}
	for name, o := range modes {
		t.Run(name, func(t *testing.T) { mwCrashRun(t, name, o, 5) })
	}
}
