"""The record values the read workloads are filled with, by kind (``run.py --values``).

* ``random``: JSON-like text with random numbers, ids and words (``payload_pool``); lz4 shrinks a
  batch of them about 2x, zstd about 3.5x: poorly compressible, as the benchmark always used.
* ``json``: JSON events with the same field names in every record and little variety in the
  values (a few event types, 64 users, a timestamp that moves slowly; a 1000-byte event carries
  a list of items from a catalogue of six) (``json_pool``); lz4 shrinks a batch of 100-byte
  events about 6.5x and of 1000-byte ones about 9x, zstd about 13x.
* ``repeat``: the same few JSON events over and over (``repeat_pool``: ``json_pool``'s first
  ``REPEAT_DISTINCT`` events, cycled), as a topic of status or heartbeat messages carries them;
  lz4 shrinks a 1 MB producer batch of 100-byte values tens of times (issue 38's "highly
  compressible" stream), so a fetch of 1 MiB expands to tens of MiB of records.

Every value of a pool is exactly ``size`` bytes, so a workload's value bytes are
``records x size`` whatever the kind.
"""

from __future__ import annotations

import random

VALUE_KINDS = ("random", "json", "repeat")
REPEAT_DISTINCT = 4

_WORDS = ("view click cart buy search home product checkout login logout mobile web "
          "desktop promo email banner organic paid referral direct sale return refund "
          "gift card shipped pending delivered cancelled premium basic trial").split()


def payload_pool(size: int, count: int, seed: int = 20260101) -> list[bytes]:
    """``count`` distinct JSON-like values of exactly ``size`` bytes: random numbers and words,
    so that codecs compress them about as well as real event data (not all zeros)."""
    rnd = random.Random(seed)
    pool = []
    for i in range(count):
        head = ('{"id":%d,"user":"u%06d","amount":%d.%02d,"kind":"%s","sid":"%012x","note":"'
                % (i, rnd.randrange(1_000_000), rnd.randrange(10_000), rnd.randrange(100),
                   rnd.choice(_WORDS), rnd.getrandbits(48)))
        body = [head]
        length = len(head)
        while length < size:
            w = rnd.choice(_WORDS) if rnd.random() < 0.7 else str(rnd.randrange(100_000))
            body.append(w + " ")
            length += len(w) + 1
        value = "".join(body).encode()[: max(0, size - 2)] + b'"}'
        pool.append(value[-size:] if len(value) > size else value.ljust(size, b" "))
    return pool


_EVENTS = ("page_view", "page_view", "page_view", "click", "click", "add_to_cart", "purchase")
_FIELDS = (("country", ('"DE"', '"FR"', '"US"', '"GB"')),
           ("device", ('"mobile"', '"desktop"')),
           ("browser", ('"chrome"', '"firefox"', '"safari"')),
           ("consent", ("true", "false")),
           ("level", ('"info"', '"info"', '"warn"')),
           ("app_version", ('"4.2.0"', '"4.2.1"')))

_ITEMS = tuple('{"sku":"sku-%02d","qty":%d,"price":%s},' % (sku, qty, price)
               for sku, qty, price in ((1, 1, "9.99"), (2, 1, "19.99"), (3, 2, "4.50"),
                                       (4, 1, "12.00"), (5, 3, "2.25"), (6, 1, "99.00")))


def json_pool(size: int, count: int, seed: int = 20260102) -> list[bytes]:
    """``count`` distinct JSON events of exactly ``size`` bytes that compress well: the same
    field names in every record, a handful of values per field, then (for large sizes) a list of
    items of the same shape, cut to ``size`` and closed with ``}``."""
    rnd = random.Random(seed)
    pool = []
    for i in range(count):
        parts = ['{"event":"%s","user_id":"user-%03d","ts":%d'
                 % (rnd.choice(_EVENTS), rnd.randrange(64), 1_767_225_600 + i // 50)]
        parts += [',"%s":%s' % (name, rnd.choice(choices)) for name, choices in _FIELDS]
        parts.append(',"items":[')
        length = sum(map(len, parts))
        while length < size:
            item = rnd.choice(_ITEMS)
            parts.append(item)
            length += len(item)
        value = "".join(parts).encode()[: max(0, size - 1)] + b"}"
        pool.append(value.ljust(size, b" "))
    return pool


def repeat_pool(size: int, count: int) -> list[bytes]:
    """``count`` values of exactly ``size`` bytes that are ``REPEAT_DISTINCT`` events cycled."""
    distinct = json_pool(size, min(count, REPEAT_DISTINCT))
    return [distinct[i % len(distinct)] for i in range(count)]


def value_pool(kind: str, size: int, count: int) -> list[bytes]:
    """The values of a workload of this kind (``VALUE_KINDS``)."""
    if kind == "random":
        return payload_pool(size, count)
    if kind == "json":
        return json_pool(size, count)
    if kind == "repeat":
        return repeat_pool(size, count)
    raise ValueError(f"unknown value kind {kind!r}; valid: {', '.join(VALUE_KINDS)}")
