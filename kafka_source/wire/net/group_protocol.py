"""The consumer group protocol's two APIs (KIP-848), which kafka-python 3 does not have.

kafka-python 3 builds its protocol classes from Kafka's JSON message specs at import time
(:mod:`kafka.protocol.api_message`); it ships no spec for ConsumerGroupHeartbeat (API key 68)
or ConsumerGroupDescribe (69). Ours are in :mod:`kafka_source.wire.net.schemas`, written in the
same format from Kafka's public message definitions, and loaded by kafka-python's own loader
(the ``load_json`` class keyword names the package to read them from). Everything else --
version negotiation against the broker's ApiVersions, flexible-version encoding, tagged fields
-- is kafka-python's, as for its own messages: a broker that does not list API 68 (Kafka 2.x,
3.x without the new protocol enabled) makes :meth:`BrokerClient.send` raise kafka-python's
``IncompatibleBrokerVersion`` before anything is written.

Versions (Kafka 4.0 lists 0-1 for both): ConsumerGroupHeartbeat v1 adds SubscribedTopicRegex
and has the client make its own member id (KIP-1082); ConsumerGroupDescribe v1 adds each
member's MemberType (KIP-1099).
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

_SCHEMAS = "kafka_source.wire.net.schemas"


class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=_SCHEMAS): pass
class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=_SCHEMAS): pass
class ConsumerGroupDescribeRequest(ApiMessage, load_json=_SCHEMAS): pass
class ConsumerGroupDescribeResponse(ApiMessage, load_json=_SCHEMAS): pass
