"""kafka_source.read.executor.worker_client: a worker's Kafka client is kept for the next task
only when a task ended normally; one that failed or was abandoned is closed, since its
connections may hold responses that will never be read."""

import pytest

from kafka_source.config.options import parse_batch_options
from kafka_source.read import executor


class FakeClient:
    made = []

    def __init__(self, config):
        self.closed = False
        FakeClient.made.append(self)

    def close(self):
        self.closed = True


@pytest.fixture
def config(monkeypatch):
    monkeypatch.setattr(executor, "BrokerClient", FakeClient)
    monkeypatch.setattr(executor, "_clients", {})
    FakeClient.made = []
    return parse_batch_options({"kafka.bootstrap.servers": "b:9092",
                                "subscribe": "t"}).client_config


def test_a_client_that_finished_is_kept_for_the_next_task(config):
    with executor.worker_client(config) as first:
        pass
    with executor.worker_client(config) as second:
        pass
    assert second is first and not first.closed and len(FakeClient.made) == 1


def test_a_client_whose_task_failed_is_closed_not_kept(config):
    with pytest.raises(RuntimeError):
        with executor.worker_client(config) as client:
            raise RuntimeError("fetch failed")
    assert client.closed
    with executor.worker_client(config) as fresh:
        pass
    assert fresh is not client and not fresh.closed


def test_a_client_of_a_task_stopped_early_is_closed(config):
    def task():
        with executor.worker_client(config) as client:
            yield client
            yield client

    rows = task()
    client = next(rows)
    rows.close()                     # Spark stops reading (a limit, a cancelled task)
    assert client.closed
    assert executor._clients == {}
