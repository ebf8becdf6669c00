"""Which topic and partition each row goes to.

Topic: the ``topic`` option if set (it overrides the column, as in Spark), else the row's
``topic`` column; a null there is an error naming the row, since there is nowhere to put it.

Partition, row by row, as the Java producer's default partitioner decides:

1. the ``partition`` column, when the row has one (it must exist: 0 <= partition < count);
2. else, for a row with a key, ``murmur2(key) % partitions`` (:mod:`.partitioner`), so that
   every producer -- Java, kafka-python, this one -- puts a key on the same partition;
3. else (no key) spread evenly: round robin over the topic's partitions, starting at a random
   one in each task so that many small tasks do not all begin with partition 0. (The Java
   producer sticks to one partition per record batch for the same evenness; here the producer
   batches per partition anyway, so a row-by-row round robin costs no batching and keeps the
   spread even however small the task.)

All of it is vectorised over a whole Arrow batch.
"""

from __future__ import annotations

import random

import numpy as np

from ..errors import TopicError
from ..wire.format.arrays import to_numpy, valid_mask
from .columns import ColumnError

__all__ = ["Spreader", "choose_partitions", "split_by_topic"]


class Spreader:
    """Round robin of unkeyed rows, per topic, for one task."""

    def __init__(self, rng: random.Random | None = None):
        self._rng = rng or random.Random()
        self._next: dict[str, int] = {}

    def spread(self, topic: str, count: int, partitions: int) -> np.ndarray:
        start = self._next.get(topic)
        if start is None:
            start = self._rng.randrange(partitions)
        result = ((start + np.arange(count, dtype=np.int64)) % partitions).astype(np.int32)
        self._next[topic] = int((start + count) % partitions)
        return result


def choose_partitions(topic: str, num_partitions: int, keys, explicit, spreader: Spreader,
                      partitions_for_keys, row_numbers=None) -> np.ndarray:
    """The partition (int32) of each row of one topic's rows.

    ``keys``: binary Arrow array or None; ``explicit``: int32 Arrow array (the ``partition``
    column) or None; ``partitions_for_keys(keys, n)`` is the key hash rule (-1 for null keys).
    ``row_numbers``: the task's row number of each row, for error messages (default 0, 1, ...).
    """
    n_rows = len(keys) if keys is not None else (len(explicit) if explicit is not None else None)
    if n_rows is None:
        raise ValueError("choose_partitions needs keys or explicit partitions to size the rows")
    result = np.full(n_rows, -1, dtype=np.int32)
    if explicit is not None:
        given = _int32_with_nulls(explicit)
        has = given >= 0
        bad = np.flatnonzero(has & (given >= num_partitions)) if num_partitions else []
        negative = np.flatnonzero(_is_negative(explicit))
        if len(negative):
            row = int(negative[0])
            raise TopicError(f"Column 'partition' is {explicit[row].as_py()} in row "
                             f"{_row(row_numbers, row)} for "
                             f"topic '{topic}': a partition is >= 0 (the topic has "
                             f"{num_partitions} partitions, 0 to {num_partitions - 1}).")
        if len(bad):
            row = int(bad[0])
            raise TopicError(f"Column 'partition' is {int(given[row])} in row "
                             f"{_row(row_numbers, row)}, but topic "
                             f"'{topic}' has {num_partitions} partitions (0 to "
                             f"{num_partitions - 1}).")
        result[has] = given[has]
    todo = result < 0
    if not todo.any():
        return result
    if keys is not None and keys.null_count < len(keys):
        hashed = np.asarray(partitions_for_keys(keys, num_partitions), dtype=np.int32)
        use = todo & (hashed >= 0)
        result[use] = hashed[use]
        todo &= ~use
    count = int(todo.sum())
    if count:
        result[todo] = spreader.spread(topic, count, num_partitions)
    return result


def _row(row_numbers, index: int) -> int:
    return index if row_numbers is None else int(row_numbers[index])


def _int32_with_nulls(array) -> np.ndarray:
    """The int32 values of ``array`` with nulls (and negatives) as -1."""
    values = to_numpy(array, null=-1).astype(np.int64)
    return np.where(values < 0, -1, values).astype(np.int32)


def _is_negative(array) -> np.ndarray:
    values = to_numpy(array).astype(np.int64)
    return values < 0


def split_by_topic(batch_topics, row_offset: int = 0):
    """[(topic, row indices or None for all rows)] of a ``topic`` column (Arrow strings).

    ColumnError naming the first row whose topic is null (``row_offset`` is added to the row
    number, so that it counts the rows of the whole task)."""
    import pyarrow.compute as pc

    if batch_topics.null_count:
        row = int(np.flatnonzero(~valid_mask(batch_topics))[0])
        raise ColumnError(f"Column 'topic' is null in row {row + row_offset} of this task's "
                          "rows: set the option 'topic' for a topic to use for every row, or "
                          "filter out rows without a topic.")
    if len(batch_topics) == 0:
        return []
    encoded = pc.dictionary_encode(batch_topics)
    names = encoded.dictionary.to_pylist()
    if len(names) == 1:
        return [(names[0], None)]
    indices = to_numpy(encoded.indices)
    order = np.argsort(indices, kind="stable")
    bounds = np.searchsorted(indices[order], np.arange(len(names) + 1))
    return [(names[i], order[bounds[i]:bounds[i + 1]]) for i in range(len(names))
            if bounds[i + 1] > bounds[i]]
