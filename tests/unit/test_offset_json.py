"""Offsets to and from the JSON Spark keeps in its offset log (`read/offset_json.py`)."""

from __future__ import annotations

import json

import pytest

import kafka_source.read.offset_json as offset_json
from kafka_source.read.offset_json import decode_offsets, encode_offsets

pytestmark = pytest.mark.pyspark_free


def test_offsets_json_orders_topics_and_partitions_as_numbers():
    offsets = {("b", 10): 5, ("a", 2): 1, ("b", 9): 4, ("a", 0): 0}
    encoded = encode_offsets(offsets)
    assert list(encoded) == ["a", "b"]
    assert list(encoded["b"]) == ["9", "10"]          # 9 before 10: by number, not by text
    assert json.dumps(encoded) == '{"a": {"0": 0, "2": 1}, "b": {"9": 4, "10": 5}}'
    assert decode_offsets(json.loads(json.dumps(encoded))) == offsets


def test_offsets_json_hands_back_what_it_wrote_without_decoding(monkeypatch):
    codec = offset_json.OffsetsJson()
    written = [{("t", p): 100 * n + p for p in range(50)} for n in range(6)]
    texts = [json.dumps(codec.encode(offsets)) for offsets in written]
    calls = []
    real = offset_json.decode_offsets
    monkeypatch.setattr(offset_json, "decode_offsets", lambda v: calls.append(v) or real(v))

    # The last KEEP written come back from memory, equal to a decode and each a copy of its own.
    for offsets, text in zip(written[-codec.KEEP:], texts[-codec.KEEP:]):
        got = codec.decode(json.loads(text))
        assert got == offsets and list(got) == sorted(offsets)
        got[("t", 0)] = -1
        assert codec.decode(json.loads(text)) == offsets
    assert calls == []
    # Older ones, and offsets never written here (a checkpoint of an earlier run), are decoded.
    assert codec.decode(json.loads(texts[0])) == written[0]
    other = {"t": {"0": 7, "3": 9}, "u": {"1": 2}}
    assert codec.decode(other) == {("t", 0): 7, ("t", 3): 9, ("u", 1): 2}
    assert len(calls) == 2
    assert codec.decode(None) == {} and codec.decode({}) == {}


def test_offsets_json_is_not_fooled_by_a_changed_return_value():
    codec = offset_json.OffsetsJson()
    returned = codec.encode({("t", 0): 5, ("t", 1): 6})
    returned["t"]["0"] = 99                    # whoever got it changed it
    assert codec.decode({"t": {"0": 99, "1": 6}}) == {("t", 0): 99, ("t", 1): 6}
    assert codec.decode({"t": {"0": 5, "1": 6}}) == {("t", 0): 5, ("t", 1): 6}


def test_offsets_json_writes_offsets_it_wrote_recently_without_sorting_them_again(monkeypatch):
    # A trigger's end, then its latest offsets (reportLatestOffset), most often the same.
    codec = offset_json.OffsetsJson()
    offsets = {("b", 10): 5, ("a", 2): 1, ("b", 9): 4}
    first = codec.encode(offsets)
    calls = []
    real = offset_json._encode
    monkeypatch.setattr(offset_json, "_encode", lambda o: calls.append(o) or real(o))
    again = codec.encode(dict(offsets))
    assert again == first and json.dumps(again) == json.dumps(first) and not calls
    again["a"]["2"] = 99                        # the caller's own copy
    assert codec.encode(offsets) == first and not calls
    moved = codec.encode({**offsets, ("a", 2): 2})     # the same partitions: not sorted again
    assert moved["a"] == {"2": 2} and not calls


def test_offsets_json_writes_new_offsets_of_the_same_partitions_as_a_fresh_encoding_would():
    codec = offset_json.OffsetsJson()
    tps = [("b", 10), ("a", 2), ("b", 9), ("c", 0), ("a", 11), ("a", 3)]
    codec.encode({tp: 0 for tp in tps})
    for step in range(1, 4):
        offsets = {tp: step * 100 + i for i, tp in enumerate(reversed(tps))}
        got = codec.encode(offsets)
        want = offset_json.encode_offsets(offsets)
        assert json.dumps(got) == json.dumps(want)             # the same text, in order
        assert codec.decode(json.loads(json.dumps(got))) == offsets
    # Another set of partitions (one added): sorted afresh
    grown = {**offsets, ("a", 1): 7}
    assert json.dumps(codec.encode(grown)) == json.dumps(offset_json.encode_offsets(grown))
    fewer = {tp: 1 for tp in tps[:3]}
    assert json.dumps(codec.encode(fewer)) == json.dumps(offset_json.encode_offsets(fewer))
    assert json.dumps(codec.encode(grown)) == json.dumps(offset_json.encode_offsets(grown))
