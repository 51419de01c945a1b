package vfs_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/replog/replog/internal/vfs"
)

func ExampleMemFS_CrashClone() {
	m := vfs.NewMemWithOptions(vfs.MemOptions{MkdirAllDurable: true})
	dir := filepath.Join(string(filepath.Separator), "log")
	_ = m.MkdirAll(dir, 0o755)

	f, _ := m.OpenFile(filepath.Join(dir, "00000.log"), os.O_RDWR|os.O_CREATE, 0o644)
	_, _ = f.WriteAt([]byte("acked"), 0)
	_ = f.Sync()
	_ = m.SyncDir(dir) // without this the file would vanish in the crash
	_, _ = f.WriteAt([]byte("+lost"), 5)

	c := m.CrashClone(vfs.CrashOptions{})
	g, _ := c.OpenFile(filepath.Join(dir, "00000.log"), os.O_RDONLY, 0)
	buf := make([]byte, 10)
	n, _ := g.ReadAt(buf, 0)
	fmt.Printf("%s\n", buf[:n])
	// Output: acked
}

func ExampleFailAt() {
	m := vfs.NewMem()
	// Fail every write from operation 2 on, writing 2 bytes of it: a full
	// disk.
	efs := vfs.NewErrorFS(m, &vfs.FailAt{N: 2, Kinds: vfs.OpWrite, Err: syscall.ENOSPC, Sticky: true, ShortWrite: 2})
	f, _ := efs.OpenFile("seg", os.O_RDWR|os.O_CREATE, 0o644) // op 0
	_, err := f.WriteAt([]byte("abc"), 0)                     // op 1
	fmt.Println(err)
	n, err := f.WriteAt([]byte("def"), 3) // op 2
	fmt.Println(n, errors.Is(err, syscall.ENOSPC), errors.Is(err, vfs.ErrInjected))
	efs.SetEnabled(false) // space returns
	_, err = f.WriteAt([]byte("f"), 5)
	fmt.Println(err, efs.Ops())
	// Output:
	// <nil>
	// 2 true true
	// <nil> 4
}
