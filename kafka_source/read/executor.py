"""Executor side entry point: read one input partition into Arrow batches.

Spark reuses Python workers between tasks, so the Kafka client of a worker -- with its
dedicated Fetch connections and their fetch sessions -- is kept in a small per-process cache
keyed by the connection settings; a task that fails drops its client.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import pyarrow as pa

from ..wire.net.client import BrokerClient
from ..config.client_config import connection_settings
from .fetcher import FetchSettings, RangeFetcher
from .planning import KafkaInputPartition

_clients: dict[tuple, BrokerClient] = {}
_lock = threading.Lock()


def _client_key(config) -> tuple:
    # Secrets hash and compare by value (kafka_source.config.secrets), so two reads with
    # different passwords never share a connection, and the key shows no password.
    return tuple(sorted(connection_settings(config).items()))


def _checkout(key: tuple, config) -> BrokerClient:
    with _lock:
        client = _clients.pop(key, None)
    return client if client is not None else BrokerClient(config)


def _checkin(key: tuple, client: BrokerClient) -> None:
    with _lock:
        old = _clients.pop(key, None)
        _clients[key] = client
    if old is not None:
        old.close()


@contextmanager
def worker_client(config) -> Iterator[BrokerClient]:
    """This worker's client for ``config``, from the cache: back into the cache when the block
    ends normally, closed when it raises or is abandoned (a generator closed early), since a
    connection may then hold a response that will never be read."""
    key = _client_key(config)
    client = _checkout(key, config)
    ok = False
    try:
        yield client
        ok = True
    finally:
        if ok:
            _checkin(key, client)
        else:
            client.close()


def read_input_partition(partition: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
    settings = partition.settings
    config = settings.client_config
    fetch_settings = FetchSettings.from_config(config, poll_timeout_ms=settings.poll_timeout_ms,
                                               fail_on_data_loss=settings.fail_on_data_loss)
    with worker_client(config) as client:
        fetcher = RangeFetcher(client, fetch_settings)
        batches = fetcher.read_arrow(partition.ranges, settings.include_headers)
        formats = settings.formats
        if formats is None or not formats.any:
            yield from batches
            return
        from ..formats.columns import BatchDecoder
        from ..schema import arrow_schema

        decode = BatchDecoder(formats, arrow_schema(settings.include_headers))
        for batch in batches:
            yield decode(batch)
