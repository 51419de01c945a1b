package broker

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Groups whose last member left are forgotten: a client cycling group ids
// must not grow the broker's memory without bound.
func TestEmptyGroupsAreForgotten(t *testing.T) {
	b := startBroker(t, t.TempDir())
	rc := dial(t, b)
	for i := range 50 {
		group := strings.Repeat("g", 1000) + string(rune('a'+i%26)) + string(rune('a'+i/26))
		rc.corr++
		rc.write(joinFrame(rc.corr, group, ""))
		body, err := rc.readResponse()
		if err != nil {
			t.Fatal(err)
		}
		jr := kmsg.NewPtrJoinGroupResponse()
		jr.Version = 5
		if err := jr.ReadFrom(body); err != nil || jr.ErrorCode != 0 {
			t.Fatalf("join: %v, error %d", err, jr.ErrorCode)
		}
		leave := kmsg.NewPtrLeaveGroupRequest()
		leave.Version = 3
		leave.Group = group
		m := kmsg.NewLeaveGroupRequestMember()
		m.MemberID = jr.MemberID
		leave.Members = append(leave.Members, m)
		rc.request(leave)
	}
	b.coord.mu.Lock()
	n := len(b.coord.groups)
	b.coord.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d empty groups kept in memory after every member left", n)
	}
}
