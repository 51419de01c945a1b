package replication

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// ErrUnreachable reports a node that cannot be reached: the TCP transport
// could not resolve or dial it, or the in-memory network dropped the
// request or it crosses a split.
var ErrUnreachable = errors.New("replication: node unreachable")

// Faults are the in-memory network's seeded misbehaviours.
type Faults struct {
	// DropRate is the probability that a request or its response is lost
	// (each half of the time): a lost response was handled by the leader,
	// which counted the fetch, but the follower gets ErrUnreachable.
	DropRate float64
	// DuplicateRate is the probability that a request is delivered twice
	// (the first answer is discarded, as a retransmission would be).
	DuplicateRate float64
	// MaxDelay delays each request by a random duration up to it, which
	// also reorders concurrent requests.
	MaxDelay time.Duration
}

// MemNetwork is an in-memory network between nodes for tests and
// simulations: requests are direct calls to the registered handlers,
// subject to seeded faults and to splits between pairs of nodes. It is
// safe for concurrent use; with concurrent callers the order in which
// they draw from the random source is not deterministic.
type MemNetwork struct {
	mu       sync.Mutex
	rng      *rand.Rand
	handlers map[int32]FetchHandler
	faults   Faults
	split    map[[2]int32]bool
}

// NewMemNetwork returns an empty network whose faults are drawn from seed.
func NewMemNetwork(seed uint64) *MemNetwork {
	return &MemNetwork{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		handlers: map[int32]FetchHandler{}, split: map[[2]int32]bool{}}
}

// Register makes node id reachable, served by h (nil unregisters it, as a
// crashed node).
func (m *MemNetwork) Register(id int32, h FetchHandler) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h == nil {
		delete(m.handlers, id)
		return
	}
	m.handlers[id] = h
}

// SetFaults changes the fault probabilities.
func (m *MemNetwork) SetFaults(f Faults) {
	m.mu.Lock()
	m.faults = f
	m.mu.Unlock()
}

// Split cuts (or, with cut false, heals) the link between a and b.
func (m *MemNetwork) Split(a, b int32, cut bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a > b {
		a, b = b, a
	}
	if cut {
		m.split[[2]int32{a, b}] = true
	} else {
		delete(m.split, [2]int32{a, b})
	}
}

// HealAll removes every split and fault.
func (m *MemNetwork) HealAll() {
	m.mu.Lock()
	m.split = map[[2]int32]bool{}
	m.faults = Faults{}
	m.mu.Unlock()
}

// fate is what the network does to one request.
type fate struct {
	h                      FetchHandler // nil: unreachable
	dropRequest, dropReply bool
	dup                    bool
	delay                  time.Duration
}

// plan decides a request's fate under the lock.
func (m *MemNetwork) plan(from, to int32) fate {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, b := min(from, to), max(from, to)
	h := m.handlers[to]
	if h == nil || m.split[[2]int32{a, b}] {
		return fate{}
	}
	f := m.faults
	ft := fate{h: h}
	if f.DropRate > 0 && m.rng.Float64() < f.DropRate {
		if m.rng.IntN(2) == 0 {
			ft.dropRequest = true
		} else {
			ft.dropReply = true
		}
	}
	ft.dup = f.DuplicateRate > 0 && m.rng.Float64() < f.DuplicateRate
	if f.MaxDelay > 0 {
		ft.delay = time.Duration(m.rng.Int64N(int64(f.MaxDelay)))
	}
	return ft
}

// Transport returns the Transport node from uses to reach the others.
func (m *MemNetwork) Transport(from int32) Transport { return memTransport{m: m, from: from} }

type memTransport struct {
	m    *MemNetwork
	from int32
}

func (t memTransport) Fetch(ctx context.Context, leader int32, req *FetchRequest) (*FetchResponse, error) {
	ft := t.m.plan(t.from, leader)
	if ft.delay > 0 {
		timer := time.NewTimer(ft.delay)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		}
	}
	unreachable := fmt.Errorf("%w: %d -> %d", ErrUnreachable, t.from, leader)
	if ft.h == nil || ft.dropRequest {
		return nil, unreachable
	}
	if ft.dup {
		if _, err := t.call(ctx, ft.h, req); err != nil {
			return nil, err
		}
	}
	resp, err := t.call(ctx, ft.h, req)
	if err == nil && ft.dropReply {
		return nil, unreachable
	}
	return resp, err
}

func (t memTransport) call(ctx context.Context, h FetchHandler, req *FetchRequest) (*FetchResponse, error) {
	resp, err := h.HandleFetch(ctx, req)
	if err != nil {
		return nil, err
	}
	if resp == nil {
		return nil, errNoResponse(h)
	}
	if err := resp.Materialize(); err != nil {
		return nil, err
	}
	return resp, nil
}
