"""Secret option values: passwords and key material that must never be shown.

Options such as ``kafka.sasl.jaas.config``, ``kafka.ssl.keystore.password`` or an inline
``kafka.ssl.keystore.key`` travel a long way: parsed on the driver into the client settings,
held by :class:`~kafka_source.config.options.SourceOptions`, pickled into every input partition
for the executors. Any ``repr`` of those objects -- in a log line, an exception message, a
debugger, a test failure -- would print the password if it were a plain ``str``.

So a secret is wrapped in :class:`Secret` as soon as it is parsed. Its ``repr``/``str``/format
are redacted, it compares and hashes by value (the executors' connection cache keys on the
settings), and it pickles (executors need the value). The plain value comes out only through
:meth:`Secret.reveal`, called where it is handed to the TLS or SASL layer
(:mod:`kafka_source.wire.net.tls`, :class:`kafka_source.wire.net.client.BrokerClient`). Nothing has to
remember to scrub a string: leaking takes an explicit ``reveal()``.

Before they are parsed, the options are plain strings in Spark's hands. Spark shows no option of
a Python data source in ``explain()``, query progress or checkpoints, but py4j's DEBUG log of the
driver prints every ``.option(...)`` call; :func:`redact_py4j_option_logs` filters those values.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re

REDACTED = "*****"


class Secret:
    """A string that is never shown. ``reveal()`` returns it."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        if isinstance(value, Secret):
            value = value.reveal()
        object.__setattr__(self, "_value", str(value))

    def reveal(self) -> str:
        return self._value

    def __setattr__(self, name, value):
        raise AttributeError("Secret is immutable")

    def __repr__(self) -> str:
        return f"Secret({REDACTED})"

    def __str__(self) -> str:
        return REDACTED

    def __format__(self, spec: str) -> str:
        return format(REDACTED, spec)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, hashlib.sha256(self._value.encode()).digest()))

    def __reduce__(self):
        return (Secret, (self._value,))


def reveal(value):
    """``value.reveal()`` for a :class:`Secret`, ``value`` itself otherwise."""
    return value.reveal() if isinstance(value, Secret) else value


# --- py4j's log of what the Python driver sends to the JVM -------------------------------------

# Spark's own default for spark.redaction.regex: option names whose values are never shown.
_SPARK_REDACTION = re.compile(r"(?i)secret|password|token|access[.]?key")
# A py4j call of DataFrameReader.option(key, value): "...\noption\ns<key>\ns<value>\n..."
_OPTION_CALL = re.compile(r"(\noption\ns)([^\n]*)(\ns)([^\n]*)")


class _Py4JOptionRedactor(logging.Filter):
    """py4j logs every command the Python driver sends to the JVM at DEBUG level, formatted
    before logging, so ``.option("kafka.sasl.jaas.config", ...)`` would put the password into
    the user's own driver log. This filter replaces the value of such option calls: those named
    in ``names`` and those Spark itself redacts (``spark.redaction.regex``'s default)."""

    def __init__(self, names):
        super().__init__()
        self.names = frozenset(n.lower() for n in names)

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if isinstance(msg, str) and "\noption\n" in msg:
            record.msg = _OPTION_CALL.sub(self._redact, msg)
        return True

    def _redact(self, match: re.Match) -> str:
        key = match.group(2)
        if key.lower() in self.names or _SPARK_REDACTION.search(key):
            return match.group(1) + key + match.group(3) + REDACTED
        return match.group(0)


_PY4J_LOGGERS = ("py4j.clientserver", "py4j.java_gateway")


def redact_py4j_option_logs(option_names) -> None:
    """Keep the values of the secret options ``option_names`` out of py4j's DEBUG log of this
    process (idempotent; called by :func:`kafka_source.register`)."""
    for name in _PY4J_LOGGERS:
        logger = logging.getLogger(name)
        for f in list(logger.filters):
            if isinstance(f, _Py4JOptionRedactor):
                logger.removeFilter(f)
        logger.addFilter(_Py4JOptionRedactor(option_names))
