"""Errors raised by the source. Each message names the option, topic or partition at fault."""


class KafkaSourceError(Exception):
    """Base class of every error this package raises on purpose."""


class OptionError(KafkaSourceError, ValueError):
    """An option is missing, malformed or contradicts another option."""


class TopicError(KafkaSourceError):
    """A topic or partition named by the user does not exist or cannot be read."""


class TopicNotFoundError(TopicError):
    """The cluster has no such topic, or the topic no such partition. While a planned range is
    read this is data loss (the topic was deleted meanwhile), subject to ``failOnDataLoss``."""


class BrokerUnavailableError(KafkaSourceError):
    """No broker answered within the time allowed."""


class DataLossError(KafkaSourceError):
    """Offsets that were requested are no longer (or not yet) in the log."""


class CorruptRecordError(KafkaSourceError):
    """A record batch failed its CRC check or could not be decoded."""


class PayloadError(KafkaSourceError):
    """A record's key or value could not be decoded with its format (``valueFormat``, ...): the
    message names the topic, partition, offset, the schema id and what is wrong."""


class BrokerSecurityError(KafkaSourceError):
    """TLS or SASL with a broker failed in a way no retry can fix (an untrusted or misnamed
    certificate, rejected credentials, a mechanism the listener does not enable, ...). Raised on
    the first failed attempt, naming the option that fixes it; never contains a secret."""


class ColumnError(KafkaSourceError, ValueError):
    """A column of the DataFrame written is missing, of the wrong type, or holds a value that
    cannot be written (a null topic)."""


class ProduceError(KafkaSourceError):
    """Records written to Kafka were not acknowledged: the message names the topic and
    partition (and the broker's error), so a failed write task says what it could not write."""


class RetriableBrokerError(Exception):
    """A failure worth retrying after refreshing metadata (leader moved, broker restarting).

    Not a :class:`KafkaSourceError`: it never reaches a user as it is; the retry loops turn it
    into a bounded :class:`BrokerUnavailableError` or :class:`TopicError` when time runs out.
    Raised by the request client and by the executors' fetch connections alike, so it lives
    here rather than in either of them."""


class BrokerUnreachableError(RetriableBrokerError):
    """No connection to a broker could be made or kept (refused, timed out, dropped), as against
    a broker that answered with a retriable error. What a cluster that is gone looks like: a
    group join that gives up on it says so with :class:`BrokerUnavailableError`, which tells the
    stream reader not to retry its last commit against it on the way out.

    Raised by the request client
    (:meth:`kafka_source.wire.net.transport.BrokerTransport.send`), which the driver's planning
    and group calls go through. The executors' fetch connections raise
    plain :class:`RetriableBrokerError` for the same failures: nothing there depends on telling
    the two apart."""
