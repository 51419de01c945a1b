package log

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// mwFaultWorkload goes on after errors, retrying Create and Delete once.
func mwFaultWorkload(t testing.TB, fsys vfs.FS) (map[string]*mgrLogModel, []string) {
	md := map[string]*mgrLogModel{}
	var notes []string
	seq := 0
	m, err := OpenManager(mgrCrashDir, mgrCrashOptions(fsys))
	if err != nil {
		notes = append(notes, fmt.Sprintf("open1: %v", err))
		if m, err = OpenManager(mgrCrashDir, mgrCrashOptions(fsys)); err != nil {
			t.Fatalf("OpenManager retry: %v", err)
		}
	}
	create := func(name string) *Log {
		md[name] = &mgrLogModel{state: mgrCreating}
		l, err := m.Create(name)
		if err != nil {
			notes = append(notes, fmt.Sprintf("create %s: %v", name, err))
			l, err = m.Create(name)
			if err != nil {
				notes = append(notes, fmt.Sprintf("create retry %s: %v", name, err))
				return nil
			}
		}
		md[name].state = mgrLive
		return l
	}
	del := func(name string) {
		md[name].state = mgrDeleting
		if err := m.Delete(name); err != nil {
			notes = append(notes, fmt.Sprintf("delete %s: %v", name, err))
			if err := m.Delete(name); err != nil {
				notes = append(notes, fmt.Sprintf("delete retry %s: %v", name, err))
				if !errors.Is(err, ErrNoSuchLog) {
					return
				}
			}
		}
		md[name].state = mgrDeleted
	}
	app := func(name string, l *Log, n int) {
		if l == nil {
			return
		}
		lm := md[name]
		ok := true
		for i := 0; i < n; i++ {
			b := testBatch(t, seq%len(batchTemplates))
			seq++
			if _, err := l.Append(b); err != nil {
				ok = false
				continue
			}
			lm.attempted = append(lm.attempted, b)
			lm.appended++
		}
		if ok {
			if err := l.Sync(); err == nil {
				lm.acked = lm.appended
			}
		}
	}
	a := create("a")
	app("a", a, 4)
	b := create("b")
	app("b", b, 14)
	del("b")
	c := create("c")
	app("c", c, 3)
	b = create("b")
	app("b", b, 5)
	app("a", a, 5)
	if err := m.Close(); err != nil {
		notes = append(notes, fmt.Sprintf("close: %v", err))
	} else {
		for _, lm := range md {
			if lm.state == mgrLive {
				lm.acked = lm.appended
			}
		}
	}
	return md, notes
}

// TestManagerFaultEveryOtherOp: S7 for a Manager: one EIO at every second
// filesystem operation of a workload of Creates, appends, rolls, Syncs, a Delete and a re-Create (each retried once after
// an error) and Close; then OpenManager on what a killed process and a
// power loss leave must succeed, keep every created log and synced batch,
// and not bring back a deleted log.
func TestManagerFaultEveryOtherOp(t *testing.T) {
	for n := int64(0); ; n += 2 {
		mem := vfs.NewMem()
		fa := &vfs.FailAt{N: n, Err: syscall.EIO}
		efs := vfs.NewErrorFS(mem, fa)
		md, notes := mwFaultWorkload(t, efs)
		if fa.Injected() == 0 {
			t.Logf("%d fault points", n)
			break
		}
		desc := fmt.Sprintf("(fault at op %d; %v)", n, notes)
		for _, img := range []*vfs.MemFS{mem.CrashClone(vfs.CrashOptions{Kill: true}), mem.CrashClone(vfs.CrashOptions{})} {
			m, err := OpenManager(mgrCrashDir, mgrCrashOptions(img))
			require.NoError(t, err, "reopen %s", desc)
			mwCheck(t, m, md, desc)
			require.NoError(t, m.Close(), desc)
		}
	}
}
