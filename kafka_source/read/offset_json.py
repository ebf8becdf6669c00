"""Driver side: a stream's offsets in the JSON Spark keeps in its offset log, both ways.

Spark's Kafka source writes ``{"topic": {"partition": offset, ...}, ...}``; pykafka writes the
same, so a query's offsets read the same in either. Topics and each topic's partitions go in
order (partition 9 before 10), so that equal offsets make equal text: Spark compares a trigger's
end with its start to decide whether there is a batch to run.

The stream reader (:mod:`.stream`) gets back what it returned, each time parsed anew from Spark's
JSON: a trigger's end is the next ``latestOffset``'s start, comes twice to ``partitions`` and once
to ``commit``. :class:`OffsetsJson` remembers the last few it wrote, so that over thousands of
partitions those are not decoded again.
"""
from typing import Mapping

from ..wire.net.client import TopicPartition

Offsets = dict[TopicPartition, int]


def encode_offsets(offsets: Mapping[TopicPartition, int]) -> dict:
    """Spark's Kafka offset JSON (as a dict): topics and partitions in a stable order."""
    return _encode(offsets)[0]


def _encode(offsets: Mapping[TopicPartition, int]) -> tuple[dict, Offsets]:
    """:func:`encode_offsets`, and what :func:`decode_offsets` makes of it, in one pass that
    makes no tuple (at 10,000 partitions each made one is work for Python's collector)."""
    encoded: dict[str, dict[str, int]] = {}
    decoded: Offsets = {}
    topic_now, parts = None, {}
    for tp in sorted(offsets):            # the keys in order: topics, then partition numbers
        topic, partition = tp
        offset = int(offsets[tp])
        if topic != topic_now:
            topic_now, parts = topic, encoded.setdefault(topic, {})
        parts[str(partition)] = offset
        decoded[tp] = offset
    return encoded, decoded


def _encode_as(offsets: Mapping[TopicPartition, int], order: list[TopicPartition],
               topics: list[tuple[str, list[str]]]) -> tuple[dict, Offsets]:
    """:func:`_encode` of ``offsets`` whose partitions are those of an earlier call: in that
    call's ``order``, with its ``topics`` (each with its partitions' names in order), in passes
    that run in C. A stream's partitions stay the same from trigger to trigger while their
    offsets move; sorting 10,000 of them and naming each again took 5-10 ms a trigger."""
    values = list(map(int, map(offsets.__getitem__, order)))
    encoded, at = {}, 0
    for topic, names in topics:
        encoded[topic] = dict(zip(names, values[at:at + len(names)]))
        at += len(names)
    return encoded, dict(zip(order, values))


def decode_offsets(value: Mapping | None) -> Offsets:
    result: Offsets = {}
    for topic, parts in (value or {}).items():
        for partition, offset in parts.items():
            result[(topic, int(partition))] = int(offset)
    return result


class OffsetsJson:
    """One stream reader's offsets to and from Spark's JSON, remembering the last few it wrote.

    Spark hands the reader back what it returned: a trigger's end comes back as the next
    ``latestOffset``'s start, twice in ``partitions`` and once in ``commit``, each time parsed
    anew from the offset log's JSON. Over 10,000 partitions decoding one takes about 5 ms of
    Python, comparing it with one written here well under 1 ms (a dict comparison, in C), so a
    value equal to one of the last few written is taken from here; anything else (a checkpoint
    written by an earlier run) is decoded."""

    KEEP = 4

    def __init__(self) -> None:
        self._recent: list[tuple[dict, Offsets]] = []     # (encoded, decoded), newest last
        # The partitions last sorted: (their set, them in order, each topic's partition names)
        self._layout: tuple[frozenset, list, list[tuple[str, list[str]]]] | None = None

    def encode(self, offsets: Mapping[TopicPartition, int]) -> dict:
        for encoded, decoded in reversed(self._recent):
            # The same offsets again (a trigger's latest offsets, reported after its end,
            # are usually the end): a copy of that JSON, not a sort of every partition.
            if decoded == offsets:
                return {topic: dict(parts) for topic, parts in encoded.items()}
        layout = self._layout
        if layout is not None and offsets.keys() == layout[0]:
            encoded, decoded = _encode_as(offsets, layout[1], layout[2])
        else:
            encoded, decoded = _encode(offsets)
            self._layout = (frozenset(decoded), list(decoded),
                            [(topic, list(parts)) for topic, parts in encoded.items()])
        # A copy of its own: the caller may change what it got back.
        self._recent.append(({topic: dict(parts) for topic, parts in encoded.items()}, decoded))
        del self._recent[:-self.KEEP]
        return encoded

    def decode(self, value: Mapping | None) -> Offsets:
        if value:
            for encoded, decoded in reversed(self._recent):
                if encoded == value:
                    return dict(decoded)
        return decode_offsets(value)


__all__ = ["Offsets", "OffsetsJson", "encode_offsets", "decode_offsets"]
