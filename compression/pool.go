package compression

import "sync"

// Pool is the convenience path for callers that do not own a Local: a
// sync.Pool of Locals, each configured by the Pool's Options. Create one
// Pool per configuration and share it; there is no package-level pool.
//
// A Pool is safe for concurrent use by multiple goroutines. The zero value
// is ready to use with default Options. A Pool must not be copied after
// first use.
type Pool struct {
	opts Options
	p    sync.Pool
}

// NewPool returns a Pool whose Locals are configured by opts.
func NewPool(opts Options) *Pool {
	return &Pool{opts: opts}
}

// Get returns a Local from the pool, or a new one. The caller owns it until
// it hands it back with Put.
func (p *Pool) Get() *Local {
	if l, ok := p.p.Get().(*Local); ok {
		return l
	}
	return NewLocal(p.opts)
}

// Put returns l, obtained from p.Get, to the pool. The caller must not use
// l afterwards. A Local configured differently from the Pool is dropped.
func (p *Pool) Put(l *Local) {
	if l == nil || l.MaxDecompressedSize() != p.opts.maxDecompressed() {
		return
	}
	p.p.Put(l)
}

// Decompress is Local.Decompress with a Local taken from the pool for the
// duration of the call.
func (p *Pool) Decompress(dst, src []byte, c Codec) ([]byte, error) {
	l := p.Get()
	defer p.Put(l)
	return l.Decompress(dst, src, c)
}

// Compress is Local.Compress with a Local taken from the pool for the
// duration of the call.
func (p *Pool) Compress(dst, src []byte, c Codec, level int) ([]byte, error) {
	l := p.Get()
	defer p.Put(l)
	return l.Compress(dst, src, c, level)
}
