package broker

import "github.com/twmb/franz-go/pkg/kmsg"

const (
	apiVersionsKey = 18
	apiVersionsMax = 2
)

// apis lists the API keys and versions this broker answers: every version
// below each API's first flexible one (so no tagged fields), from the oldest
// that clients are known to send. See the package documentation.
var apis = []kmsg.ApiVersionsResponseApiKey{
	{ApiKey: 0, MinVersion: 3, MaxVersion: 8},  // Produce (v3+: record batch v2 only)
	{ApiKey: 1, MinVersion: 4, MaxVersion: 11}, // Fetch
	{ApiKey: 2, MinVersion: 1, MaxVersion: 5},  // ListOffsets
	{ApiKey: 3, MinVersion: 0, MaxVersion: 8},  // Metadata
	{ApiKey: 8, MinVersion: 2, MaxVersion: 7},  // OffsetCommit
	{ApiKey: 9, MinVersion: 1, MaxVersion: 5},  // OffsetFetch
	{ApiKey: 10, MinVersion: 0, MaxVersion: 2}, // FindCoordinator
	{ApiKey: 11, MinVersion: 0, MaxVersion: 5}, // JoinGroup
	{ApiKey: 12, MinVersion: 0, MaxVersion: 3}, // Heartbeat
	{ApiKey: 13, MinVersion: 0, MaxVersion: 3}, // LeaveGroup
	{ApiKey: 14, MinVersion: 0, MaxVersion: 3}, // SyncGroup
	{ApiKey: apiVersionsKey, MinVersion: 0, MaxVersion: apiVersionsMax},
	{ApiKey: 19, MinVersion: 0, MaxVersion: 4}, // CreateTopics
	{ApiKey: 22, MinVersion: 0, MaxVersion: 1}, // InitProducerId
}

// supported reports whether key and version are in apis.
func supported(key, version int16) bool {
	for _, a := range apis {
		if a.ApiKey == key {
			return version >= a.MinVersion && version <= a.MaxVersion
		}
	}
	return false
}

func apiVersionsResponse(req *kmsg.ApiVersionsRequest) *kmsg.ApiVersionsResponse {
	resp := req.ResponseKind().(*kmsg.ApiVersionsResponse)
	resp.ApiKeys = apis
	return resp
}

// unsupportedApiVersionsResponse is Kafka's answer to an ApiVersions request
// newer than it knows: version 0, UNSUPPORTED_VERSION, and the ApiVersions
// range, so that the client retries at a version listed there.
func unsupportedApiVersionsResponse() *kmsg.ApiVersionsResponse {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 0
	resp.ErrorCode = errUnsupportedVersion
	resp.ApiKeys = []kmsg.ApiVersionsResponseApiKey{{ApiKey: apiVersionsKey, MinVersion: 0, MaxVersion: apiVersionsMax}}
	return resp
}
