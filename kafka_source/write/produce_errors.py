"""What the producer's failures say: the Kafka error codes the producer reads, and the
messages of the :class:`~kafka_source.errors.ProduceError` it raises.

A failed write fails the Spark task, and the message is all the user sees of it; so a message
names the topic and partition (also as the error's ``topic`` and ``partition`` attributes),
what Kafka answered, and the option or broker setting that would help. The messages live here,
apart from the code that decides to fail (:mod:`kafka_source.write.sending`,
:mod:`kafka_source.write.transactions`), so that code reads as control flow.

The lowest of the producer's modules: every other one imports it, so it imports none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import kafka.errors as Errors

from ..errors import ProduceError

if TYPE_CHECKING:
    from ..config.producer_settings import ProducerSettings

__all__ = ["FATAL_NETWORK_ERRORS", "FENCED", "NONE", "describe", "fatal_produce_message",
           "produce_error"]

NONE = Errors.NoError.errno
# The producer's epoch is not the current one of its id: a newer producer of the id fenced it.
FENCED = (Errors.InvalidProducerEpochError, Errors.ProducerFencedError,
          Errors.TransactionCoordinatorFencedError)

# Network failures that no retry can fix (a TLS or SASL failure is raised by node_ready).
FATAL_NETWORK_ERRORS = (Errors.IncompatibleBrokerVersion, Errors.UnsupportedVersionError)


class _EncodedBatch(Protocol):
    """What a message reads of a failed record batch, a
    :class:`~kafka_source.write.batches.Batch` (a protocol: batches imports this module)."""

    data: bytes


def produce_error(tp: tuple[str, int] | None, message: str, kind=ProduceError) -> ProduceError:
    """A :class:`ProduceError` (or ``kind``) with ``topic`` and ``partition`` attributes."""
    error = kind(message)
    error.topic, error.partition = tp if tp is not None else (None, None)
    return error


def describe(error, message: str | None, record_errors) -> str:
    text = error.__name__
    details = [message] if message else []
    for item in record_errors or ():
        detail = getattr(item, "batch_index_error_message", None)
        details.append(f"record {getattr(item, 'batch_index', '?')}"
                       + (f": {detail}" if detail else ""))
    return text + (f" ({'; '.join(details[:3])})" if details else "")


def fatal_produce_message(error, what: str, batch: _EncodedBatch, settings: ProducerSettings,
                          transactional_id: str | None) -> str:
    if error in (Errors.MessageSizeTooLargeError, Errors.RecordListTooLargeError):
        return (f"{what}: the broker rejected a record batch of {len(batch.data)} bytes as too "
                "large. The topic's 'max.message.bytes' (or the broker's 'message.max.bytes') "
                f"is smaller; lower 'kafka.batch.size' ({settings.batch_size}) or raise that "
                "limit.")
    if error in FENCED:
        return (f"{what}: this producer was fenced" + (
            f" -- a newer producer with transactional id '{transactional_id}' was started"
            if transactional_id else "") + ".")
    if error is Errors.OutOfOrderSequenceNumberError or error is Errors.UnknownProducerIdError:
        return (f"{what}: the broker lost track of this idempotent producer's sequence numbers "
                "(its state for the producer expired or was truncated). The task fails rather "
                "than risk duplicates; a retry starts a new producer.")
    if error is Errors.TopicAuthorizationFailedError:
        return f"{what}: not authorized to write to this topic (ACL: Write on the topic)."
    if error is Errors.CorruptRecordError:
        return f"{what}: the broker found the record batch corrupt (CRC mismatch)."
    return f"{what} ({getattr(error, 'description', '')})"
