"""The consumer group: a streaming query's membership and its partition assignors.

``member``     FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetFetch,
               OffsetCommit, as Kafka's own consumer speaks them
``assignors``  Kafka's ConsumerProtocol format, ``range``, ``roundrobin`` and user assignors
``status``     a group as Kafka's tools see it: members, committed offsets, lag
"""
