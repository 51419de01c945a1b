package broker

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	replog "github.com/replog/replog/log"
)

// Session timeout bounds, Kafka's group.min/max.session.timeout.ms defaults.
const (
	minSessionTimeout = 6 * time.Second
	maxSessionTimeout = 30 * time.Minute
	// maxCommitMetadata is Kafka's offset.metadata.max.bytes default.
	maxCommitMetadata = 4096
)

// groupState is where a group is in its rebalance protocol:
//
//	Empty --join--> PreparingRebalance --all members joined, or rebalance
//	timeout--> CompletingRebalance --leader's SyncGroup--> Stable
//
// A join, a leave or an expired session in CompletingRebalance or Stable
// goes back to PreparingRebalance; the last member leaving goes to Empty.
type groupState int

const (
	groupEmpty groupState = iota
	groupPreparingRebalance
	groupCompletingRebalance
	groupStable
)

// coordinator is the group coordinator of this node: every group's
// coordinator. Group membership lives in memory (clients rejoin after a
// restart); committed offsets live in the offset store.
type coordinator struct {
	b       *Broker
	offsets *offsetStore

	mu     sync.Mutex
	groups map[string]*group // guarded by mu, as is everything in them
	closed bool
}

type group struct {
	id           string
	state        groupState
	generation   int32
	protocolType string
	protocol     string
	leader       string
	members      map[string]*member
	joinSeq      uint64 // for ordering members by first join
	// rebalance counts PreparingRebalance phases, so that a stale
	// rebalance timer does nothing.
	rebalance      uint64
	rebalanceTimer *time.Timer
}

type member struct {
	id, clientID, host string
	seq                uint64
	session, rebalance time.Duration
	protocols          []kmsg.JoinGroupRequestProtocol // metadata copied out of the request
	assignment         []byte
	// join and sync are the waiting JoinGroup and SyncGroup requests of
	// this member, answered when the rebalance gets there.
	join     chan joinResult
	sync     chan syncResult
	lastSeen time.Time
	timer    *time.Timer // checks the session
}

type joinResult struct {
	errCode    int16
	generation int32
	protocol   string
	leader     string
	members    []kmsg.JoinGroupResponseMember // the leader's answer only
}

type syncResult struct {
	errCode    int16
	assignment []byte
}

func newCoordinator(b *Broker, offsets *offsetStore) *coordinator {
	return &coordinator{b: b, offsets: offsets, groups: make(map[string]*group)}
}

// close stops every timer and closes the offset store. Requests waiting in
// join and sync return when the broker's context is cancelled.
func (c *coordinator) close() error {
	c.mu.Lock()
	c.closed = true
	for _, g := range c.groups {
		if g.rebalanceTimer != nil {
			g.rebalanceTimer.Stop()
		}
		for _, m := range g.members {
			if m.timer != nil {
				m.timer.Stop()
			}
		}
	}
	c.mu.Unlock()
	return c.offsets.close()
}

func newMemberID(clientID string) string {
	var b [8]byte
	rand.Read(b[:])
	return clientID + "-" + hex.EncodeToString(b[:])
}

func (c *coordinator) join(ctx context.Context, req *kmsg.JoinGroupRequest, clientID, host string) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.JoinGroupResponse)
	resp.MemberID = req.MemberID
	session := time.Duration(req.SessionTimeoutMillis) * time.Millisecond
	rebalance := time.Duration(req.RebalanceTimeoutMillis) * time.Millisecond
	if req.Version == 0 {
		rebalance = session
	}
	switch {
	case req.Group == "":
		resp.ErrorCode = errInvalidGroupID
		return resp
	case session < minSessionTimeout || session > maxSessionTimeout:
		resp.ErrorCode = errInvalidSessionTimeout
		return resp
	case req.ProtocolType == "" || len(req.Protocols) == 0:
		resp.ErrorCode = errInconsistentGroupProtocol
		return resp
	}

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	g := c.groups[req.Group]
	var m *member
	if req.MemberID != "" {
		if g != nil {
			m = g.members[req.MemberID]
		}
		if m == nil {
			c.mu.Unlock()
			resp.ErrorCode = errUnknownMemberID
			return resp
		}
	}
	if g == nil { // created with its first member, not by a refused join
		g = &group{id: req.Group, members: make(map[string]*member)}
		c.groups[req.Group] = g
	}
	if !g.accepts(m, req.ProtocolType, req.Protocols) {
		c.mu.Unlock()
		resp.ErrorCode = errInconsistentGroupProtocol
		return resp
	}
	if len(g.members) == 0 {
		g.protocolType = req.ProtocolType
	}
	if m == nil {
		g.joinSeq++
		m = &member{id: newMemberID(clientID), seq: g.joinSeq}
		g.members[m.id] = m
	}
	m.clientID, m.host = clientID, host
	m.session, m.rebalance = session, rebalance
	m.protocols = m.protocols[:0]
	for _, p := range req.Protocols {
		m.protocols = append(m.protocols, kmsg.JoinGroupRequestProtocol{Name: p.Name, Metadata: bytes.Clone(p.Metadata)})
	}
	if m.join != nil { // a second join while the first waits: the first is superseded
		m.join <- joinResult{errCode: errRebalanceInProgress}
	}
	ch := make(chan joinResult, 1)
	m.join = ch
	if g.state != groupPreparingRebalance {
		c.prepareRebalance(g)
	}
	c.maybeCompleteJoin(g)
	memberID := m.id
	c.mu.Unlock()

	var r joinResult
	select {
	case r = <-ch:
	case <-ctx.Done():
		return nil
	}
	resp.ErrorCode = r.errCode
	if r.errCode == errNone {
		resp.MemberID = memberID
		resp.Generation = r.generation
		resp.Protocol = kmsg.StringPtr(r.protocol)
		resp.LeaderID = r.leader
		resp.Members = r.members
	}
	return resp
}

// accepts reports whether a member (m, nil for a new one) with these
// protocols can join g: same protocol type, and at least one protocol that
// every other member also supports.
func (g *group) accepts(m *member, protocolType string, protocols []kmsg.JoinGroupRequestProtocol) bool {
	others := 0
	for _, o := range g.members {
		if o != m {
			others++
		}
	}
	if others == 0 {
		return true
	}
	if protocolType != g.protocolType {
		return false
	}
	for _, p := range protocols {
		if g.supportedByAll(p.Name, m) {
			return true
		}
	}
	return false
}

// supportedByAll reports whether every member but skip supports protocol.
func (g *group) supportedByAll(protocol string, skip *member) bool {
	for _, o := range g.members {
		if o == skip {
			continue
		}
		if !slices.ContainsFunc(o.protocols, func(p kmsg.JoinGroupRequestProtocol) bool { return p.Name == protocol }) {
			return false
		}
	}
	return true
}

// sortedMembers returns the members in the order they first joined.
func (g *group) sortedMembers() []*member {
	ms := make([]*member, 0, len(g.members))
	for _, m := range g.members {
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b *member) int { return cmp.Compare(a.seq, b.seq) })
	return ms
}

// prepareRebalance starts a rebalance: members must rejoin (they learn it
// from their heartbeats) within the largest rebalance timeout, or are
// removed.
func (c *coordinator) prepareRebalance(g *group) {
	g.state = groupPreparingRebalance
	g.rebalance++
	for _, m := range g.members {
		if m.sync != nil {
			m.sync <- syncResult{errCode: errRebalanceInProgress}
			m.sync = nil
		}
	}
	var timeout time.Duration
	for _, m := range g.members {
		timeout = max(timeout, m.rebalance)
	}
	if g.rebalanceTimer != nil {
		g.rebalanceTimer.Stop()
	}
	phase := g.rebalance
	g.rebalanceTimer = time.AfterFunc(timeout, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !c.closed && g.state == groupPreparingRebalance && g.rebalance == phase {
			c.completeJoin(g)
		}
	})
}

// maybeCompleteJoin completes the rebalance once every member has rejoined.
func (c *coordinator) maybeCompleteJoin(g *group) {
	if g.state != groupPreparingRebalance {
		return
	}
	for _, m := range g.members {
		if m.join == nil {
			return
		}
	}
	c.completeJoin(g)
}

// completeJoin ends PreparingRebalance: members that did not rejoin are
// removed, the generation advances, a protocol every member supports is
// chosen, and every waiting JoinGroup is answered (the leader's with the
// members and their metadata, for it to compute the assignment).
func (c *coordinator) completeJoin(g *group) {
	if g.rebalanceTimer != nil {
		g.rebalanceTimer.Stop()
		g.rebalanceTimer = nil
	}
	for _, m := range g.members {
		if m.join == nil {
			c.removeMember(g, m, errUnknownMemberID)
		}
	}
	g.generation++
	if len(g.members) == 0 {
		g.state, g.leader, g.protocol = groupEmpty, "", ""
		c.forget(g)
		return
	}
	members := g.sortedMembers()
	if g.members[g.leader] == nil {
		g.leader = members[0].id
	}
	g.protocol = ""
	for _, p := range g.members[g.leader].protocols {
		if g.supportedByAll(p.Name, nil) {
			g.protocol = p.Name
			break
		}
	}
	if g.protocol == "" { // accepts() prevents this; fail everyone rather than guess
		for _, m := range members {
			c.removeMember(g, m, errInconsistentGroupProtocol)
		}
		g.state, g.leader = groupEmpty, ""
		c.forget(g)
		return
	}
	g.state = groupCompletingRebalance
	var metadata []kmsg.JoinGroupResponseMember
	for _, m := range members {
		jm := kmsg.NewJoinGroupResponseMember()
		jm.MemberID = m.id
		for _, p := range m.protocols {
			if p.Name == g.protocol {
				jm.ProtocolMetadata = p.Metadata
			}
		}
		metadata = append(metadata, jm)
	}
	now := time.Now()
	for _, m := range members {
		r := joinResult{generation: g.generation, protocol: g.protocol, leader: g.leader}
		if m.id == g.leader {
			r.members = metadata
		}
		m.join <- r
		m.join = nil
		m.assignment = nil
		m.lastSeen = now
		c.watchSession(g, m)
	}
}

// watchSession arms m's session timer. When it fires, a member not heard
// from for its session timeout (and not waiting in a join or sync) is
// removed and the group rebalances.
func (c *coordinator) watchSession(g *group, m *member) {
	if m.timer != nil {
		m.timer.Reset(m.session)
		return
	}
	m.timer = time.AfterFunc(m.session, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.closed || g.members[m.id] != m {
			return
		}
		idle := time.Since(m.lastSeen)
		if m.join != nil || m.sync != nil || idle < m.session {
			m.timer.Reset(max(m.session-idle, time.Millisecond))
			return
		}
		c.b.log.Info("group member session expired", "group", g.id, "member", m.id)
		c.removeMember(g, m, errUnknownMemberID)
		c.membersLeft(g)
	})
}

// removeMember drops m from g, answering its waiting requests with errCode.
func (c *coordinator) removeMember(g *group, m *member, errCode int16) {
	delete(g.members, m.id)
	if m.timer != nil {
		m.timer.Stop()
	}
	if m.join != nil {
		m.join <- joinResult{errCode: errCode}
		m.join = nil
	}
	if m.sync != nil {
		m.sync <- syncResult{errCode: errCode}
		m.sync = nil
	}
	if g.leader == m.id {
		g.leader = ""
	}
}

// membersLeft moves g on after members were removed: to Empty if none is
// left, else into (or on with) a rebalance.
func (c *coordinator) membersLeft(g *group) {
	if len(g.members) == 0 {
		if g.rebalanceTimer != nil {
			g.rebalanceTimer.Stop()
			g.rebalanceTimer = nil
		}
		if g.state != groupEmpty {
			g.generation++
		}
		g.state, g.leader, g.protocol = groupEmpty, "", ""
		c.forget(g)
		return
	}
	if g.state != groupPreparingRebalance {
		c.prepareRebalance(g)
	}
	c.maybeCompleteJoin(g)
}

// forget drops an empty group: membership is all it holds (committed
// offsets are in the offset store), and a JoinGroup makes it anew.
func (c *coordinator) forget(g *group) {
	if c.groups[g.id] == g {
		delete(c.groups, g.id)
	}
}

// member returns the member a request names and checks its generation.
func (c *coordinator) member(groupID, memberID string, generation int32) (*group, *member, int16) {
	g := c.groups[groupID]
	if g == nil || g.members[memberID] == nil {
		return g, nil, errUnknownMemberID
	}
	if generation != g.generation {
		return g, nil, errIllegalGeneration
	}
	return g, g.members[memberID], errNone
}

func (c *coordinator) sync(ctx context.Context, req *kmsg.SyncGroupRequest) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.SyncGroupResponse)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	g, m, code := c.member(req.Group, req.MemberID, req.Generation)
	if code != errNone {
		c.mu.Unlock()
		resp.ErrorCode = code
		return resp
	}
	m.lastSeen = time.Now()
	switch g.state {
	case groupStable:
		resp.MemberAssignment = m.assignment
		c.mu.Unlock()
		return resp
	case groupCompletingRebalance:
	default:
		c.mu.Unlock()
		resp.ErrorCode = errRebalanceInProgress
		return resp
	}
	if m.id == g.leader {
		assigned := make(map[string][]byte, len(req.GroupAssignment))
		for _, a := range req.GroupAssignment {
			assigned[a.MemberID] = bytes.Clone(a.MemberAssignment)
		}
		for _, o := range g.members {
			o.assignment = assigned[o.id]
			if o.assignment == nil {
				o.assignment = []byte{}
			}
			if o.sync != nil {
				o.sync <- syncResult{assignment: o.assignment}
				o.sync = nil
			}
		}
		g.state = groupStable
		resp.MemberAssignment = m.assignment
		c.mu.Unlock()
		return resp
	}
	// A follower waits for the leader's assignment.
	if m.sync != nil {
		m.sync <- syncResult{errCode: errRebalanceInProgress}
	}
	ch := make(chan syncResult, 1)
	m.sync = ch
	c.mu.Unlock()
	select {
	case r := <-ch:
		resp.ErrorCode, resp.MemberAssignment = r.errCode, r.assignment
		return resp
	case <-ctx.Done():
		return nil
	}
}

func (c *coordinator) heartbeat(req *kmsg.HeartbeatRequest) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
	c.mu.Lock()
	defer c.mu.Unlock()
	g, m, code := c.member(req.Group, req.MemberID, req.Generation)
	if code != errNone {
		resp.ErrorCode = code
		return resp
	}
	m.lastSeen = time.Now()
	if g.state == groupPreparingRebalance {
		resp.ErrorCode = errRebalanceInProgress
	}
	return resp
}

func (c *coordinator) leave(req *kmsg.LeaveGroupRequest) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.LeaveGroupResponse)
	ids := []string{req.MemberID}
	if req.Version >= 3 {
		ids = ids[:0]
		for _, m := range req.Members {
			ids = append(ids, m.MemberID)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[req.Group]
	removed := false
	for i, id := range ids {
		code := errUnknownMemberID
		if g != nil && g.members[id] != nil {
			c.removeMember(g, g.members[id], errUnknownMemberID)
			code, removed = errNone, true
		}
		if req.Version >= 3 {
			rm := kmsg.NewLeaveGroupResponseMember()
			rm.MemberID, rm.InstanceID, rm.ErrorCode = id, req.Members[i].InstanceID, code
			resp.Members = append(resp.Members, rm)
		} else {
			resp.ErrorCode = code
		}
	}
	if removed {
		c.b.log.Debug("group members left", "group", req.Group, "members", ids)
		c.membersLeft(g)
	}
	return resp
}

// commit stores committed offsets. Members of the current generation may
// commit while the group is Stable or PreparingRebalance (clients commit
// before they rejoin); a commit with no member id and generation -1 is
// accepted only by a group without members (an admin or a consumer that
// assigns partitions itself). The empty group id is a group like another
// here and in OffsetFetch, as Kafka keeps it for backwards compatibility;
// only the membership requests (JoinGroup...) refuse it.
func (c *coordinator) commit(req *kmsg.OffsetCommitRequest) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
	code := errNone
	c.mu.Lock()
	g := c.groups[req.Group]
	switch {
	case req.Generation < 0 && (req.MemberID == "" || g == nil || len(g.members) == 0):
		// A simple commit (Kafka accepts it on an empty group whatever
		// the member id).
		if g != nil && len(g.members) > 0 {
			code = errUnknownMemberID
		}
	case g == nil:
		// A generation of a group this broker does not know (it keeps
		// groups in memory: a consumer committing after a restart).
		code = errIllegalGeneration
	default:
		var m *member
		if g, m, code = c.member(req.Group, req.MemberID, req.Generation); code == errNone {
			m.lastSeen = time.Now()
			if g.state == groupCompletingRebalance {
				code = errRebalanceInProgress
			}
		}
	}
	c.mu.Unlock()

	var commits []offsetCommit
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			switch {
			case code != errNone:
			case p.Metadata != nil && len(*p.Metadata) > maxCommitMetadata:
			case c.b.partition(t.Topic, p.Partition) == nil:
			default:
				v := committedOffset{offset: p.Offset, leaderEpoch: p.LeaderEpoch}
				if p.Metadata != nil {
					v.metadata = *p.Metadata
				}
				commits = append(commits, offsetCommit{topicPartition{t.Topic, p.Partition}, v})
			}
		}
	}
	stored := errNone
	switch err := c.offsets.commit(req.Group, commits); {
	case errors.Is(err, replog.ErrBatchTooLarge):
		// Larger than one append to the offsets log takes (its segment
		// size): refused, as Kafka refuses an offsets batch over its
		// limit, not retried forever as a storage error would be.
		stored = errInvalidCommitOffsetSize
	case err != nil:
		c.b.log.Error("commit offsets", "group", req.Group, "err", err)
		stored = errStorage
	}
	for _, t := range req.Topics {
		rt := kmsg.NewOffsetCommitResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewOffsetCommitResponseTopicPartition()
			rp.Partition = p.Partition
			switch {
			case code != errNone:
				rp.ErrorCode = code
			case p.Metadata != nil && len(*p.Metadata) > maxCommitMetadata:
				rp.ErrorCode = errOffsetMetadataTooLarge
			case c.b.partition(t.Topic, p.Partition) == nil:
				rp.ErrorCode = errUnknownTopicOrPartition
			default:
				rp.ErrorCode = stored
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

// fetchOffsets answers OffsetFetch: the committed offset of each partition
// asked for (-1 if none), or of every committed partition when the topic list
// is null (v2+).
func (c *coordinator) fetchOffsets(req *kmsg.OffsetFetchRequest) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.OffsetFetchResponse)
	if req.Topics == nil && req.Version >= 2 {
		byTopic := make(map[string]*kmsg.OffsetFetchResponseTopic)
		var names []string
		for tp, v := range c.offsets.all(req.Group) {
			rt := byTopic[tp.topic]
			if rt == nil {
				t := kmsg.NewOffsetFetchResponseTopic()
				t.Topic = tp.topic
				rt = &t
				byTopic[tp.topic] = rt
				names = append(names, tp.topic)
			}
			rt.Partitions = append(rt.Partitions, offsetFetchPartition(tp.partition, v, true))
		}
		slices.Sort(names)
		for _, n := range names {
			rt := byTopic[n]
			slices.SortFunc(rt.Partitions, func(a, b kmsg.OffsetFetchResponseTopicPartition) int { return cmp.Compare(a.Partition, b.Partition) })
			resp.Topics = append(resp.Topics, *rt)
		}
		return resp
	}
	for _, t := range req.Topics {
		rt := kmsg.NewOffsetFetchResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			v, ok := c.offsets.get(req.Group, topicPartition{t.Topic, p})
			rt.Partitions = append(rt.Partitions, offsetFetchPartition(p, v, ok))
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

func offsetFetchPartition(p int32, v committedOffset, ok bool) kmsg.OffsetFetchResponseTopicPartition {
	rp := kmsg.NewOffsetFetchResponseTopicPartition()
	rp.Partition = p
	rp.Offset, rp.LeaderEpoch = -1, -1
	rp.Metadata = kmsg.StringPtr("")
	if ok {
		rp.Offset, rp.LeaderEpoch = v.offset, v.leaderEpoch
		rp.Metadata = kmsg.StringPtr(v.metadata)
	}
	return rp
}
