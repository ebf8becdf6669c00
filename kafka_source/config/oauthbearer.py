"""SASL/OAUTHBEARER options, as a Java client takes them, into one :class:`OAuthBearerLogin`.

Spark's JVM source takes OAUTHBEARER through the Java client's options, and users copy them:

* **OIDC client credentials** (KIP-768, Kafka 3.1+), what production clusters use::

    kafka.sasl.mechanism                       OAUTHBEARER
    kafka.sasl.login.callback.handler.class    org.apache.kafka.common.security.oauthbearer.
                                               OAuthBearerLoginCallbackHandler (one word)
    kafka.sasl.oauthbearer.token.endpoint.url  https://idp.example.com/oauth2/token
    kafka.sasl.jaas.config  org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule
                            required clientId="..." clientSecret="..." scope="..."
                            extension_logicalCluster="...";

  An OAuth server with a certificate from a private CA: its trust store goes into the JAAS line,
  as in Java (``ssl.truststore.location="..." ssl.truststore.type="PEM"``); without, the
  system's CAs are trusted. The token endpoint may also be a ``file:`` URL naming a file that
  holds the token (as a Kubernetes-projected service account token is); it is read again at
  each refresh.
* **Unsecured tokens** (Kafka's default login handler, for development clusters whose brokers
  accept unsigned tokens):
  ``OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="alice";``
  with the ``unsecuredLogin*`` options of Kafka's ``OAuthBearerUnsecuredLoginCallbackHandler``.

The Java handler classes cannot run in Python: the two of Kafka's own that these options name
are done in Python by :mod:`kafka_source.wire.net.oauth`, any other class is refused. The client
secret is a :class:`~kafka_source.config.secrets.Secret` from the moment it is parsed. The
result is hashable and picklable: it travels to the executors inside the client settings and
keys their connection cache.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from ..errors import OptionError
from .secrets import Secret
from .values import convert

_PACKAGE = "org.apache.kafka.common.security.oauthbearer."
#: Kafka's OIDC login handler, under its 3.4+ name and its 3.1-3.3 name (still accepted by Java).
OIDC_HANDLERS = (_PACKAGE + "OAuthBearerLoginCallbackHandler",
                 _PACKAGE + "secured.OAuthBearerLoginCallbackHandler")
#: Kafka's default login handler (unsecured tokens).
UNSECURED_HANDLER = _PACKAGE + "internals.unsecured.OAuthBearerUnsecuredLoginCallbackHandler"

# The Java client's options for OAUTHBEARER logins, by name (without "kafka."): (field, kind).
OPTIONS = {
    "sasl.login.callback.handler.class": ("handler", str),
    "sasl.oauthbearer.token.endpoint.url": ("token_endpoint_url", str),
    "sasl.login.connect.timeout.ms": ("connect_timeout_ms", int),
    "sasl.login.read.timeout.ms": ("read_timeout_ms", int),
    "sasl.login.retry.backoff.ms": ("retry_backoff_ms", int),
    "sasl.login.retry.backoff.max.ms": ("retry_backoff_max_ms", int),
    "sasl.login.refresh.window.factor": ("refresh_window_factor", float),
    "sasl.login.refresh.window.jitter": ("refresh_window_jitter", float),
    "sasl.login.refresh.min.period.seconds": ("refresh_min_period_s", int),
    "sasl.login.refresh.buffer.seconds": ("refresh_buffer_s", int),
}
#: The refresh options' valid ranges, Java's (``SaslConfigs``): (low, high).
_REFRESH_RANGES = {
    "sasl.login.refresh.window.factor": (0.5, 1.0),
    "sasl.login.refresh.window.jitter": (0.0, 0.25),
    "sasl.login.refresh.min.period.seconds": (0, 900),
    "sasl.login.refresh.buffer.seconds": (0, 3600),
}
#: Accepted and ignored: Java's client-side checks of the token's claims (the broker validates
#: the token; these are not sent to it).
IGNORED = frozenset({"sasl.oauthbearer.scope.claim.name", "sasl.oauthbearer.sub.claim.name",
                     "sasl.oauthbearer.clock.skew.seconds", "sasl.oauthbearer.expected.audience",
                     "sasl.oauthbearer.expected.issuer"})

# RFC 7628 / KIP-342: SASL extension names are letters only, values printable ASCII.
_EXTENSION_NAME = re.compile(r"^[A-Za-z]+$")
_EXTENSION_VALUE = re.compile(r"^[\x21-\x7E \t\r\n]+$")
_UNSECURED_CLAIM = re.compile(r"^unsecuredLogin(String|Number|List)Claim_(.+)$")
_JAAS_HINT = ("e.g. org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
              'clientId="..." clientSecret="...";')


@dataclass(frozen=True)
class OAuthBearerLogin:
    """How this client gets its OAUTHBEARER tokens. ``token_endpoint_url`` set: from an OAuth
    server by the client-credentials grant (``https:``/``http:``) or from a file (``file:``);
    unset: unsecured tokens made here from ``unsecured_claims``."""

    token_endpoint_url: str | None = None
    client_id: str | None = None
    client_secret: Secret | None = None
    scope: str | None = None
    extensions: tuple[tuple[str, str], ...] = ()
    # unsecured tokens: (claim, JSON value) pairs; the principal claim's name; the lifetime
    unsecured_claims: tuple[tuple[str, object], ...] = ()
    principal_claim: str = "sub"
    lifetime_s: int = 3600
    connect_timeout_ms: int = 10_000
    read_timeout_ms: int = 10_000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 10_000
    # when a token is refreshed, as Java's refresh thread decides (wire.net.oauth.refresh_time)
    refresh_window_factor: float = 0.8
    refresh_window_jitter: float = 0.05
    refresh_min_period_s: int = 60
    refresh_buffer_s: int = 300
    # TLS to the token endpoint (https:): kafka_source.wire.net.tls settings, from the
    # ``ssl.*`` options inside the JAAS line; empty: the system's CAs, the name checked
    tls: tuple[tuple[str, object], ...] = ()

    @property
    def source(self) -> str:
        """Where the tokens come from, for messages (no secret)."""
        if self.token_endpoint_url is None:
            principal = dict(self.unsecured_claims).get(self.principal_claim)
            return f"unsecured tokens for '{principal}' made by this client"
        if self.token_endpoint_url.lower().startswith("file:"):
            return f"the token file {self.token_endpoint_url}"
        who = f" for clientId '{self.client_id}'" if self.client_id else ""
        return f"the token endpoint {self.token_endpoint_url}{who}"


def _number(name: str, text: str) -> object:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise OptionError(f"Option 'kafka.sasl.jaas.config': {name} must be a number, got "
                              f"'{text}'.") from None


def _unsecured_claims(fields: Mapping[str, str]) -> tuple[tuple[str, object], ...]:
    claims: list[tuple[str, object]] = []
    for key, text in fields.items():
        m = _UNSECURED_CLAIM.match(key)
        if not m:
            continue
        kind, claim = m.groups()
        if claim in ("iat", "exp"):
            raise OptionError(f"Option 'kafka.sasl.jaas.config': {key} cannot be set; the "
                              "token's 'iat' and 'exp' follow unsecuredLoginLifetimeSeconds.")
        if kind == "Number":
            value: object = _number(key, text)
        elif kind == "List":  # Java's form: the first character is the separator
            value = tuple(text[1:].split(text[0])) if text else ()
        else:
            value = text
        claims.append((claim, value))
    return tuple(claims)


def _extensions(fields: Mapping[str, str], prefix: str) -> tuple[tuple[str, str], ...]:
    out = []
    for key, value in fields.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        if not _EXTENSION_NAME.match(name) or name == "auth":
            raise OptionError(f"Option 'kafka.sasl.jaas.config': the SASL extension '{name}' "
                              f"({key}) must be a name of letters only, other than 'auth'.")
        if not _EXTENSION_VALUE.match(value):
            raise OptionError(f"Option 'kafka.sasl.jaas.config': the value of {key} must be "
                              "printable ASCII, and not empty.")
        out.append((name, value))
    return tuple(sorted(out))


def check_handler(handler: str | None) -> None:
    """A ``sasl.login.callback.handler.class`` is one of Kafka's, which pykafka does in Python
    (whatever the mechanism: no other Java class can run here)."""
    if handler is not None and handler not in OIDC_HANDLERS + (UNSECURED_HANDLER,):
        raise OptionError(f"Option 'kafka.sasl.login.callback.handler.class' is '{handler}', a "
                          "Java class: Java callback handlers can't run in Python. pykafka does "
                          f"in Python what Kafka's own handlers do: {OIDC_HANDLERS[0]} (an OAuth "
                          "token endpoint, 'kafka.sasl.oauthbearer.token.endpoint.url') and, by "
                          f"default, {UNSECURED_HANDLER.rsplit('.', 1)[1]} (unsecured tokens).")


def oauthbearer_login(jaas: Mapping[str, str] | None, options: Mapping[str, object], *,
                      tls: tuple[tuple[str, object], ...] = ()) -> OAuthBearerLogin:
    """The OAUTHBEARER login of the fields of an ``OAuthBearerLoginModule`` JAAS line (``jaas``;
    ``None`` when none was given) and the OAUTHBEARER ``options`` (Java names, no ``kafka.``);
    ``tls``: the token endpoint's TLS settings, from the JAAS line's ``ssl.*`` fields."""
    if jaas is None:
        raise OptionError("SASL mechanism OAUTHBEARER needs 'kafka.sasl.jaas.config' with the "
                          f"OAuthBearerLoginModule, {_JAAS_HINT}")
    settings: dict[str, object] = {}
    for name, raw in options.items():
        field, kind = OPTIONS[name]
        settings[field] = convert(name, raw, kind)
    handler = settings.pop("handler", None)
    url = settings.pop("token_endpoint_url", None) or None
    for name, (low, high) in _REFRESH_RANGES.items():
        value = settings.get(OPTIONS[name][0])
        if value is not None and not low <= value <= high:
            raise OptionError(f"Option 'kafka.{name}' must be between {low} and {high} (as in "
                              f"Java), got {value}.")
    check_handler(handler)
    unsecured = handler == UNSECURED_HANDLER or (handler is None and url is None)
    if unsecured:
        claims = _unsecured_claims(jaas)
        principal = jaas.get("unsecuredLoginPrincipalClaimName", "sub")
        if not dict(claims).get(principal):
            raise OptionError(
                "SASL mechanism OAUTHBEARER needs a token source: for an OAuth server set "
                f"'kafka.sasl.login.callback.handler.class' to {OIDC_HANDLERS[0]}, "
                "'kafka.sasl.oauthbearer.token.endpoint.url' to its token endpoint, and "
                f"clientId and clientSecret in 'kafka.sasl.jaas.config' ({_JAAS_HINT}); for "
                "unsecured tokens (development brokers only) set "
                f"unsecuredLoginStringClaim_{principal}=\"<principal>\" in "
                "'kafka.sasl.jaas.config'.")
        lifetime = convert("sasl.jaas.config unsecuredLoginLifetimeSeconds",
                            jaas.get("unsecuredLoginLifetimeSeconds", "3600"), int)
        return OAuthBearerLogin(unsecured_claims=claims, principal_claim=principal,
                                lifetime_s=max(1, int(lifetime)),
                                extensions=_extensions(jaas, "unsecuredLoginExtension_"),
                                **settings)
    if url is None:
        raise OptionError("Option 'kafka.sasl.oauthbearer.token.endpoint.url' is required with "
                          f"'kafka.sasl.login.callback.handler.class' {handler}: the OAuth "
                          "server's token endpoint (https://...), or file:/path of a token file.")
    scheme = url.split(":", 1)[0].lower()
    if scheme not in ("https", "http", "file"):
        raise OptionError(f"Option 'kafka.sasl.oauthbearer.token.endpoint.url' is '{url}'; it "
                          "must be an https:, http: or file: URL.")
    client_id = jaas.get("clientId") or None
    secret = jaas.get("clientSecret")
    if scheme != "file" and not (client_id and secret):
        raise OptionError("SASL mechanism OAUTHBEARER with the token endpoint "
                          f"'{url}' needs clientId and clientSecret in "
                          f"'kafka.sasl.jaas.config', {_JAAS_HINT}")
    return OAuthBearerLogin(token_endpoint_url=url, client_id=client_id,
                            client_secret=Secret(secret) if secret else None,
                            scope=jaas.get("scope") or None, tls=tls,
                            extensions=_extensions(jaas, "extension_"), **settings)
