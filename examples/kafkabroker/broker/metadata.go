package broker

import "github.com/twmb/franz-go/pkg/kmsg"

// clusterID is reported in Metadata responses.
const clusterID = "replog"

func (b *Broker) handleMetadata(req *kmsg.MetadataRequest) *kmsg.MetadataResponse {
	resp := req.ResponseKind().(*kmsg.MetadataResponse)
	broker := kmsg.NewMetadataResponseBroker()
	broker.NodeID, broker.Host, broker.Port = nodeID, b.host, b.port
	resp.Brokers = []kmsg.MetadataResponseBroker{broker}
	cluster := clusterID
	resp.ClusterID = &cluster
	resp.ControllerID = nodeID

	// v0: an empty list means every topic; v1+: a null list does.
	var names []string
	if req.Topics == nil || req.Version == 0 && len(req.Topics) == 0 {
		names = b.topicNames()
	} else {
		// Each name once, as Kafka answers (it makes a set of them): a
		// request naming one topic a million times costs one entry.
		seen := make(map[string]bool, min(len(req.Topics), 1024))
		for _, t := range req.Topics {
			if t.Topic != nil && !seen[*t.Topic] {
				seen[*t.Topic] = true
				names = append(names, *t.Topic)
			}
		}
	}
	resp.Topics = make([]kmsg.MetadataResponseTopic, 0, len(names))
	// Versions before 4 have no flag: Kafka then creates topics if its
	// configuration allows, and so does this broker.
	autoCreate := !b.cfg.NoAutoCreateTopics && (req.Version < 4 || req.AllowAutoTopicCreation)
	for _, name := range names {
		rt := kmsg.NewMetadataResponseTopic()
		rt.Topic = kmsg.StringPtr(name)
		parts := b.partitions(name)
		if parts == nil && !validTopic(name) {
			// Kafka checks the name first, creating or not: a client
			// retries UNKNOWN_TOPIC_OR_PARTITION, never INVALID_TOPIC.
			rt.ErrorCode = errInvalidTopic
		}
		if parts == nil && autoCreate && rt.ErrorCode == errNone {
			if code := b.createTopic(name, b.cfg.Partitions); code != errNone && code != errTopicAlreadyExists {
				rt.ErrorCode = code
			}
			parts = b.partitions(name)
		}
		if parts == nil && rt.ErrorCode == errNone {
			rt.ErrorCode = errUnknownTopicOrPartition
		}
		for i := range parts {
			p := kmsg.NewMetadataResponseTopicPartition()
			p.Partition = int32(i)
			p.Leader = nodeID
			p.LeaderEpoch = leaderEpoch
			p.Replicas = []int32{nodeID}
			p.ISR = []int32{nodeID}
			p.OfflineReplicas = []int32{}
			rt.Partitions = append(rt.Partitions, p)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

func (b *Broker) handleCreateTopics(req *kmsg.CreateTopicsRequest) *kmsg.CreateTopicsResponse {
	resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
	for _, t := range req.Topics {
		rt := kmsg.NewCreateTopicsResponseTopic()
		rt.Topic = t.Topic
		n := int(t.NumPartitions)
		if n == -1 { // v4+: the broker's default
			n = b.cfg.Partitions
		}
		switch {
		case len(t.ReplicaAssignment) > 0:
			rt.ErrorCode = errInvalidRequest
			rt.ErrorMessage = kmsg.StringPtr("replica assignments are not supported")
		case t.ReplicationFactor != -1 && t.ReplicationFactor != 1:
			rt.ErrorCode = errInvalidReplicationFactor // there is one node
		case req.ValidateOnly:
			switch {
			case !validTopic(t.Topic):
				rt.ErrorCode = errInvalidTopic
			case n < 1 || n > DefaultMaxPartitionCount:
				rt.ErrorCode = errInvalidPartitions
			case !storableTopic(t.Topic, n):
				rt.ErrorCode = errInvalidTopic
			case b.partitions(t.Topic) != nil:
				rt.ErrorCode = errTopicAlreadyExists
			}
		default:
			rt.ErrorCode = b.createTopic(t.Topic, n)
		}
		if rt.ErrorCode == errNone {
			rt.NumPartitions = int32(n)
			rt.ReplicationFactor = 1
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

func (b *Broker) handleFindCoordinator(req *kmsg.FindCoordinatorRequest) *kmsg.FindCoordinatorResponse {
	resp := req.ResponseKind().(*kmsg.FindCoordinatorResponse)
	if req.CoordinatorType != 0 { // 1: transactions, which this broker has not
		resp.ErrorCode = errInvalidRequest
		resp.ErrorMessage = kmsg.StringPtr("transactions are not supported")
		resp.NodeID = -1
		return resp
	}
	resp.NodeID, resp.Host, resp.Port = nodeID, b.host, b.port
	return resp
}
