"""The consumer group: a streaming query's membership and its partition assignors.

``member``     FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetFetch,
               OffsetCommit, as Kafka's own consumer speaks them (kafka.group.protocol=classic)
``consumer_protocol``  the same membership through ConsumerGroupHeartbeat (KIP-848,
               kafka.group.protocol=consumer, Kafka 4.0+)
``assignors``  Kafka's ConsumerProtocol format, ``range``, ``roundrobin`` and user assignors
``status``     a group as Kafka's tools see it: members, committed offsets, lag
"""
