"""Test-side Fetch responses, encoded by kafka-python (not by the package under test)."""

from __future__ import annotations

from kafka.protocol.consumer import FetchResponse

T = FetchResponse.FetchableTopicResponse
P = T.PartitionData


def encode_response(version, *, topics, error_code=0, session_id=0, leader_tags=False,
                    correlation_id=7):
    """A framed FetchResponse (size, header, body) as kafka-python encodes it."""
    responses = []
    for topic, parts in topics.items():
        entries = []
        for partition, p in parts.items():
            kw = {}
            if leader_tags:   # tagged fields (v12+) the parser must skip
                kw = dict(current_leader=P.LeaderIdAndEpoch(leader_id=3, leader_epoch=9),
                          diverging_epoch=P.EpochEndOffset(epoch=2, end_offset=77))
            entries.append(P(
                partition_index=partition, error_code=p["error"], high_watermark=p["hw"],
                last_stable_offset=p["lso"], log_start_offset=p["start"],
                aborted_transactions=None if p["aborted"] is None else
                [P.AbortedTransaction(producer_id=a, first_offset=b) for a, b in p["aborted"]],
                preferred_read_replica=-1, records=p["records"], **kw))
        responses.append(T(topic=topic, partitions=entries))
    response = FetchResponse(throttle_time_ms=5, error_code=error_code, session_id=session_id,
                             responses=responses, version=version)
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(framed=True, header=True))
