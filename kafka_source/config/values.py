"""One ``kafka.*`` option's text as the value its setting takes, or an error naming the option.

Shared by the client settings (:mod:`kafka_source.config.client_config`) and the OAUTHBEARER
login options (:mod:`kafka_source.config.oauthbearer`), so every option of a kind reads alike.
"""

from __future__ import annotations

from ..errors import OptionError
from .secrets import Secret


def convert(name: str, raw: object, kind) -> object:
    """``raw`` as ``kind`` (``str``, ``int``, ``float``, ``bool`` or :class:`Secret`) for the
    option ``kafka.<name>``; numbers must not be negative."""
    if kind is Secret:
        return Secret(raw)  # kept as given (a password may start or end with a space)
    text = str(raw).strip()
    if kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise OptionError(f"Option 'kafka.{name}' must be {what}, got '{raw}'.") from None
        if value < 0:
            raise OptionError(f"Option 'kafka.{name}' must not be negative, got '{raw}'.")
        return value
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise OptionError(f"Option 'kafka.{name}' must be 'true' or 'false', got '{raw}'.")
        return text.lower() == "true"
    return text
