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
(:mod:`kafka_source.wire.tls`, :class:`kafka_source.wire.client.BrokerClient`). Nothing has to
remember to scrub a string: leaking takes an explicit ``reveal()``.
"""

from __future__ import annotations

import hashlib
import hmac

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
