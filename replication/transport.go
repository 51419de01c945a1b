package replication

import "context"

// Transport carries a follower's fetches to leaders. Implementations:
// TCP (NewTCPTransport, with NewTCPServer on the leader side) and an
// in-memory network with seeded fault injection for tests (NewMemNetwork).
type Transport interface {
	// Fetch sends req to node leader and returns its answer, or an error.
	// It honours ctx; the leader may hold the request up to
	// req.MaxWaitMs. The Replicator takes a nil answer without an error
	// for a malformed one (ErrMalformedFrame).
	Fetch(ctx context.Context, leader int32, req *FetchRequest) (*FetchResponse, error)
}

// FetchHandler serves fetches on the leader side; Replicator implements
// it. A TCP server or in-memory network calls it for each request.
type FetchHandler interface {
	// HandleFetch answers req, holding it (within ctx) while there is
	// nothing to send, up to its MaxWaitMs.
	HandleFetch(ctx context.Context, req *FetchRequest) (*FetchResponse, error)
}
