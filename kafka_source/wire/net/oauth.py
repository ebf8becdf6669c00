"""OAUTHBEARER tokens for kafka-python's SASL layer: what Kafka's Java login handlers do.

kafka-python speaks SASL/OAUTHBEARER (KIP-255) and re-authenticates when the broker's session
ends (KIP-368), but asks a *token provider* for each token. :class:`TokenProvider` is that
provider for an :class:`~kafka_source.config.oauthbearer.OAuthBearerLogin`:

* **Client credentials** (KIP-768): a POST of ``grant_type=client_credentials`` (and ``scope``)
  to the token endpoint, the client id and secret in HTTP Basic authentication, each
  URL-encoded first (RFC 6749 2.3.1), as Java's ``OAuthBearerLoginCallbackHandler`` sends it.
  The token's lifetime is its JWT ``exp`` claim, else the response's ``expires_in``.
* **A token file** (``file:`` endpoint URL): the file's content, read again at each refresh.
* **Unsecured tokens**: an unsigned JWT (``{"alg":"none"}``) with the configured claims, as
  Kafka's ``OAuthBearerUnsecuredLoginCallbackHandler`` makes for development brokers.

One provider per login and process (:func:`token_provider`), so every connection of a driver
or executor process shares one token, refreshed when Java's refresh thread would refresh it
(:func:`refresh_time`): once ``sasl.login.refresh.window.factor`` (0.8) plus a random share of
up to ``sasl.login.refresh.window.jitter`` (0.05) of its lifetime has passed, but at least
``sasl.login.refresh.buffer.seconds`` (300) before it expires and no sooner than
``sasl.login.refresh.min.period.seconds`` (60) after it came. The jitter matters here as in Java:
every executor process of a job gets its token at about the same moment, and without it they
would all ask the token endpoint again at the same moment too. kafka-python calls
:meth:`TokenProvider.token` on its network thread while it authenticates a connection, so a
token request blocks that thread: it is bounded by
``sasl.login.connect.timeout.ms``/``read.timeout.ms`` (10 s each by default here; Java has none),
and only made when the token is due. While the current token is still valid a failed
refresh (also a refused one) is logged and the current token used, and tried again after
``sasl.login.retry.backoff.ms``, as Java's refresh thread keeps the credential it has. Without
a valid token the request is retried with backoff for up to
``sasl.login.retry.backoff.max.ms``, then the connection fails as retriable; the token
endpoint refusing the client (HTTP 4xx other than 408 and 429) fails it at once with a
:class:`~kafka_source.errors.BrokerSecurityError` that names the options. Neither the client
secret nor a token ever goes into a message or a log line.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import kafka.errors as Errors
from kafka.net.sasl.oauth import AbstractTokenProvider

from ...config.oauthbearer import OAuthBearerLogin
from ...errors import BrokerSecurityError, OptionError
from .tls import ssl_context

log = logging.getLogger(__name__)

_providers: dict[OAuthBearerLogin, "TokenProvider"] = {}
_providers_lock = threading.Lock()
_DETAIL_CHARS = 300


def token_provider(login: OAuthBearerLogin) -> "TokenProvider":
    """The process's provider for ``login`` (one token shared by all its connections)."""
    with _providers_lock:
        provider = _providers.get(login)
        if provider is None:
            provider = _providers[login] = TokenProvider(login)
        return provider


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def jwt_claims(token: str) -> dict | None:
    """The claims of a JWT (its middle part), unverified; None when ``token`` is not one."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = json.loads(payload)
    except (ValueError, TypeError):
        return None
    return claims if isinstance(claims, dict) else None


def unsecured_token(login: OAuthBearerLogin, now: float) -> tuple[str, float]:
    """An unsigned JWT with the login's claims, and when it expires.

    ``iat`` is ``now`` in whole seconds, rounded down, and ``exp`` that plus the lifetime. The
    brokers' validator refuses a token whose ``1000 * iat`` lies after its own clock in
    milliseconds (no clock skew allowed by default). A fractional ``now`` was refused whenever
    the broker checked within the millisecond the token was made: seen once in CI, a batch
    read's executor on the same machine as the broker failed with ``invalid_token``. Java's
    unsecured login writes whole milliseconds; whole seconds, as JWTs usually carry them, also
    leave room for a client clock a little ahead of the broker's."""
    issued = int(now)
    expires = issued + login.lifetime_s
    claims = {**dict(login.unsecured_claims), "iat": issued, "exp": expires}
    header = _b64url(json.dumps({"alg": "none"}).encode())
    return f"{header}.{_b64url(json.dumps(claims).encode())}.", expires


class TokenRequestFailed(Errors.KafkaConnectionError):
    """A token could not be had now; a later connection attempt may get one."""


def refresh_time(login: OAuthBearerLogin, *, now: float, start: float, expires: float,
                 draw: float) -> float:
    """When to get the next token (seconds, as ``now``), for a token valid from ``start`` to
    ``expires``, as Kafka's Java clients decide it (``ExpiringCredentialRefreshingLogin``):

    * at ``start`` plus the share ``factor + jitter * draw`` of the lifetime;
    * but no later than ``buffer`` seconds before it expires, and no sooner than
      ``min period`` seconds from ``now``;
    * when what is left of the lifetime cannot hold both (``now + min period + buffer`` past the
      expiry: a short-lived token), at that share of what is left, the two bounds ignored.
    """
    share = login.refresh_window_factor + login.refresh_window_jitter * draw
    min_period, buffer = login.refresh_min_period_s, login.refresh_buffer_s
    if now + min_period + buffer > expires:
        return now + (expires - now) * share
    proposed = start + (expires - start) * share
    return max(min(proposed, expires - buffer), now + min_period)


# The least a token handed to a SASL exchange must have left. A broker ends the session at the
# token's expiry and accepts a re-authentication at most once a second per connection
# (:data:`kafka_source.wire.net.reauth.MIN_REAUTH_INTERVAL_S`); the connection re-authenticates
# at :data:`~kafka_source.wire.net.reauth.REAUTH_AT` (0.7) of the session. A session shorter than
# about 1.5 s therefore cannot be renewed, and the broker closes the connection at its end. Java
# refreshes at the same times as this provider and would hand out such a token too, but only
# tokens of a few seconds ever get there: with the default buffer (300 s) a token of an hour is
# refreshed 5 minutes before it expires. Seen with tokens of 4 s (refreshed with 0.6-0.8 s
# left): a re-authentication in that window got a session of 505 ms, and the next request,
# 0.5 s later, found the connection closed (tests/integration/test_security.py, 1 CI run).
# That test's sessions, two runs each way: 3-6 of 0.62-1.06 s a run before, none under 3.0 s
# after.
MIN_SESSION_S = 2.0


class TokenProvider(AbstractTokenProvider):
    """Tokens of one :class:`OAuthBearerLogin`, cached and refreshed; thread-safe."""

    def __init__(self, login: OAuthBearerLogin, *, clock=time.time, sleep=time.sleep,
                 draw=random.random):
        super().__init__()
        self.login = login
        self._clock = clock
        self._sleep = sleep
        self._draw = draw             # the jitter's random share, in [0, 1)
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires = 0.0
        self._replace_early = False   # replaced in its last MIN_SESSION_S (see _ending)
        self._refresh_at = 0.0
        self._next_try = 0.0          # no new request before this (after a failure)
        self._tls = None
        if str(login.token_endpoint_url or "").lower().startswith("https:"):
            try:  # at once, where the client is made: a wrong trust store is an option error
                self._tls = ssl_context(dict(login.tls))
            except OptionError as exc:
                raise OptionError(f"The token endpoint's TLS settings (the ssl.* fields of "
                                  f"'kafka.sasl.jaas.config'): {exc}") from None

    def extensions(self) -> dict:
        return dict(self.login.extensions)

    def token(self) -> str:
        with self._lock:
            now = self._clock()
            if self._token is not None and now < self._refresh_at and not self._ending(now):
                return self._token
            valid = self._token is not None and now < self._expires
            if valid and now < self._next_try:
                return self._token
            try:
                self._renew(retry=not valid)
            except (TokenRequestFailed, BrokerSecurityError) as exc:
                if not valid:
                    raise
                # Also a refusal: during a secret's rotation the endpoint may refuse for a
                # while; connections keep being made with the token until it expires.
                self._next_try = self._clock() + self.login.retry_backoff_ms / 1000
                log.warning("OAUTHBEARER: could not refresh the token (%s); the current one is "
                            "valid for %.0f s more and still used.", exc, self._expires - now)
            return self._token

    def _ending(self, now: float) -> bool:
        """Whether the token has less than :data:`MIN_SESSION_S` left, too little for a
        session the connection can renew, and a new one would last at least twice that.

        A token is kept to its refresh time, not asked for again at every call, when its whole
        lifetime is shorter, or when it already had less than that left when it was got: an
        endpoint that hands out the same cached token until it expires (or a token file not
        yet rewritten) has nothing fresher to give before then."""
        return self._replace_early and self._expires - now < MIN_SESSION_S

    # --- getting a token --------------------------------------------------------------------

    def _renew(self, *, retry: bool) -> None:
        login = self.login
        if login.token_endpoint_url is None:
            start = self._clock()
            token, expires = unsecured_token(login, start)
        else:
            deadline = self._clock() + login.retry_backoff_max_ms / 1000
            backoff = max(login.retry_backoff_ms, 1) / 1000
            while True:
                start = self._clock()
                try:
                    token, expires = self._request(start)
                    break
                except TokenRequestFailed as exc:
                    if not retry or self._clock() + backoff > deadline:
                        raise TokenRequestFailed(
                            f"OAUTHBEARER: no token from {login.source}: {exc}") from None
                    self._sleep(backoff)
                    backoff = min(backoff * 2, login.retry_backoff_max_ms / 1000)
        lifetime = max(expires - start, 0.0)
        self._token, self._expires = token, expires
        # The lifetime's start is the token's 'iat' claim when it has one in the past (an
        # endpoint may hand out a token it issued earlier), as Java takes the token's start.
        issued = (jwt_claims(token) or {}).get("iat") if login.token_endpoint_url else None
        began = (issued if isinstance(issued, (int, float)) and not isinstance(issued, bool)
                 and issued <= start else start)
        # What a new token would bring (its whole lifetime), and what this one had left when got.
        self._replace_early = expires - began >= 2 * MIN_SESSION_S and lifetime >= MIN_SESSION_S
        self._refresh_at = refresh_time(login, now=start, start=began, expires=expires,
                                        draw=self._draw())
        self._next_try = 0.0
        log.info("OAUTHBEARER: got a token from %s, valid for %.0f s.", login.source, lifetime)

    def _request(self, now: float) -> tuple[str, float]:
        """A token and its expiry time from the endpoint or file; :class:`TokenRequestFailed`
        when it may work later, :class:`BrokerSecurityError` when it will not."""
        login = self.login
        url = str(login.token_endpoint_url)
        if url.lower().startswith("file:"):
            path = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
            try:
                with open(path, encoding="utf-8") as f:
                    token = f.read().strip()
            except OSError as exc:
                raise TokenRequestFailed(f"cannot read the token file: {exc.strerror}") from None
            return token, self._expiry(token, None, now)
        body = {"grant_type": "client_credentials"}
        if login.scope:
            body["scope"] = login.scope
        secret = login.client_secret.reveal() if login.client_secret else ""
        basic = (urllib.parse.quote(str(login.client_id), safe="") + ":"
                 + urllib.parse.quote(secret, safe=""))
        request = urllib.request.Request(url, data=urllib.parse.urlencode(body).encode(),
                                         method="POST", headers={
            "Authorization": "Basic " + base64.b64encode(basic.encode()).decode(),
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json", "Cache-Control": "no-cache"})
        timeout = max(login.connect_timeout_ms, login.read_timeout_ms) / 1000
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self._tls) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = _error_detail(exc)
            if 400 <= exc.code < 500 and exc.code not in (408, 429):
                raise BrokerSecurityError(
                    f"SASL OAUTHBEARER: {login.source} refused the token request (HTTP "
                    f"{exc.code}{': ' + detail if detail else ''}). Check clientId, "
                    "clientSecret and scope in 'kafka.sasl.jaas.config' and "
                    "'kafka.sasl.oauthbearer.token.endpoint.url'.") from None
            raise TokenRequestFailed(f"HTTP {exc.code}" + (f": {detail}" if detail else "")
                                     ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise BrokerSecurityError(
                    f"SASL OAUTHBEARER: the certificate of {login.source} is not trusted "
                    f"({reason.verify_message}). Trust the CA that signed it: "
                    'ssl.truststore.location="..." (and ssl.truststore.type) inside '
                    "'kafka.sasl.jaas.config', or the system's CAs.") from None
            raise TokenRequestFailed(f"{type(reason).__name__}: {reason}") from None
        try:
            answer = json.loads(raw)
            token = answer["access_token"]
            if not isinstance(token, str) or not token:
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise BrokerSecurityError(
                f"SASL OAUTHBEARER: {login.source} answered without an access_token (a JSON "
                "object with 'access_token' was expected): check "
                "'kafka.sasl.oauthbearer.token.endpoint.url'.") from None
        return token, self._expiry(token, answer.get("expires_in"), now)

    def _expiry(self, token: str, expires_in, now: float) -> float:
        claims = jwt_claims(token)
        exp = claims.get("exp") if claims else None
        if isinstance(exp, (int, float)) and not isinstance(exp, bool):
            if exp <= now:
                raise BrokerSecurityError(
                    f"SASL OAUTHBEARER: the token from {self.login.source} expired "
                    f"{now - exp:.0f} s ago (its 'exp' claim).")
            return float(exp)
        if isinstance(expires_in, (int, float)) and expires_in > 0:
            return now + float(expires_in)
        raise BrokerSecurityError(
            f"SASL OAUTHBEARER: the token from {self.login.source} has no expiry: it is not a "
            "JWT with an 'exp' claim and the answer had no 'expires_in'.")


def _error_detail(exc: urllib.error.HTTPError) -> str:
    """The OAuth error of a refused request ("error: description"), or the start of its body."""
    try:
        body = exc.read(4096).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - the detail is a courtesy
        return ""
    try:
        answer = json.loads(body)
        text = ": ".join(str(answer[k]) for k in ("error", "error_description") if answer.get(k))
    except (ValueError, TypeError, AttributeError):
        text = " ".join(body.split())
    return text[:_DETAIL_CHARS]
