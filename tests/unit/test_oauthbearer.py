"""SASL/OAUTHBEARER: the Java client's options, and the tokens they get (kafka_source.config.
oauthbearer, kafka_source.wire.net.oauth), against a local token endpoint."""

from __future__ import annotations

import base64
import json
import pickle
import urllib.parse

import pytest
from kafka.net.sasl.oauth import SaslMechanismOAuth

import kafka.errors as Errors
from kafka_source.config.client_config import client_config_from_options, connection_settings
from kafka_source.config.oauthbearer import OIDC_HANDLERS, UNSECURED_HANDLER, OAuthBearerLogin
from kafka_source.errors import BrokerSecurityError, OptionError
from kafka_source.testing.oauth import TokenEndpoint
from kafka_source.wire.net.handshake import diagnose
from kafka_source.wire.net.oauth import (TokenProvider, TokenRequestFailed, jwt_claims,
                                         refresh_time, token_provider, unsecured_token)

pytestmark = pytest.mark.pyspark_free

SECRET = "Recognisable-client-secret/+:=?&"   # characters that must be URL-encoded
MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required"


def options(jaas: str, **more) -> dict[str, str]:
    return {"kafka.bootstrap.servers": "127.0.0.1:9092", "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "OAUTHBEARER", "kafka.sasl.jaas.config": jaas,
            **{f"kafka.{k.replace('_', '.')}": v for k, v in more.items()}}


def oidc_options(url: str, jaas_more: str = "", **more) -> dict[str, str]:
    return {**options(f'{MODULE} clientId="svc-1" clientSecret=\'{SECRET}\' scope="kafka read"'
                      f"{jaas_more};"),
            "kafka.sasl.login.callback.handler.class": OIDC_HANDLERS[0],
            "kafka.sasl.oauthbearer.token.endpoint.url": url,
            **{f"kafka.{k}": v for k, v in more.items()}}


def login_of(opts) -> OAuthBearerLogin:
    return client_config_from_options(opts)["sasl_oauthbearer"]


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


# --- options ----------------------------------------------------------------------------------

def test_client_credentials_options_as_java_takes_them():
    login = login_of(oidc_options("https://idp.example.com/token",
                                  ' extension_logicalCluster="lkc-1" extension_identityPoolId="p"',
                                  **{"sasl.login.retry.backoff.ms": "250",
                                     "sasl.login.refresh.window.factor": "0.9",
                                     "sasl.login.refresh.buffer.seconds": "300"}))
    assert login.token_endpoint_url == "https://idp.example.com/token"
    assert login.client_id == "svc-1" and login.client_secret.reveal() == SECRET
    assert login.scope == "kafka read"
    assert login.extensions == (("identityPoolId", "p"), ("logicalCluster", "lkc-1"))
    assert login.retry_backoff_ms == 250 and login.refresh_window_factor == 0.9
    assert login.refresh_buffer_s == 300
    # the secret never shows; the login hashes and pickles (executors, their connection cache)
    assert SECRET not in repr(login) and SECRET not in repr(client_config_from_options(
        oidc_options("https://idp.example.com/token")))
    assert pickle.loads(pickle.dumps(login)) == login and hash(login) == hash(pickle.loads(
        pickle.dumps(login)))
    assert "sasl_oauthbearer" in connection_settings(client_config_from_options(
        oidc_options("https://x/t")))


def test_the_3_x_handler_name_and_a_missing_handler_with_an_endpoint_mean_client_credentials():
    for opts in (oidc_options("https://x/t", **{"sasl.login.callback.handler.class":
                                                 OIDC_HANDLERS[1]}),
                 {k: v for k, v in oidc_options("https://x/t").items()
                  if k != "kafka.sasl.login.callback.handler.class"}):
        assert login_of(opts).token_endpoint_url == "https://x/t"


def test_unsecured_login_options():
    login = login_of(options(
        f"{MODULE} unsecuredLoginStringClaim_sub=\"alice\" unsecuredLoginNumberClaim_n=\"7\" "
        "unsecuredLoginListClaim_groups=\",ops,dev\" unsecuredLoginLifetimeSeconds=\"600\" "
        "unsecuredLoginExtension_traceId=\"abc\";"))
    assert login.token_endpoint_url is None
    assert dict(login.unsecured_claims) == {"sub": "alice", "n": 7, "groups": ("ops", "dev")}
    assert login.lifetime_s == 600 and login.extensions == (("traceId", "abc"),)
    hash(login)
    # Kafka's unsecured handler named: unsecured, even with a token endpoint set
    assert login_of({**options(f'{MODULE} unsecuredLoginStringClaim_sub="bob";'),
                     "kafka.sasl.login.callback.handler.class": UNSECURED_HANDLER,
                     "kafka.sasl.oauthbearer.token.endpoint.url": "https://idp/t"}
                    ).token_endpoint_url is None


@pytest.mark.parametrize("opts, fragments", [
    (options(f"{MODULE};"), ["needs a token source", "'kafka.sasl.oauthbearer.token.endpoint.url'",
                             "unsecuredLoginStringClaim_sub"]),
    ({k: v for k, v in options("").items() if k != "kafka.sasl.jaas.config"},
     ["needs 'kafka.sasl.jaas.config'", "OAuthBearerLoginModule"]),
    ({**options(f"{MODULE};"), "kafka.sasl.login.callback.handler.class": OIDC_HANDLERS[0]},
     ["'kafka.sasl.oauthbearer.token.endpoint.url' is required"]),
    (oidc_options("ftp://idp/token"), ["must be an https:, http: or file: URL"]),
    ({**oidc_options("https://idp/t"), "kafka.sasl.jaas.config": f'{MODULE} clientId="a";'},
     ["needs clientId and clientSecret", "'kafka.sasl.jaas.config'"]),
    (oidc_options("https://idp/t", **{"sasl.login.callback.handler.class": "com.acme.Handler"}),
     ["'com.acme.Handler'", "can't run in Python", OIDC_HANDLERS[0]]),
    (oidc_options("https://idp/t", ' extension_auth="x"'), ["'auth'"]),
    (oidc_options("https://idp/t", ' extension_bad_name="x"'), ["letters only"]),
    (oidc_options("https://idp/t", **{"sasl.login.refresh.window.factor": "0.2"}),
     ["'kafka.sasl.login.refresh.window.factor' must be between 0.5 and 1.0"]),
    (oidc_options("https://idp/t", **{"sasl.login.refresh.window.jitter": "0.3"}),
     ["'kafka.sasl.login.refresh.window.jitter' must be between 0.0 and 0.25"]),
    (oidc_options("https://idp/t", **{"sasl.login.refresh.min.period.seconds": "901"}),
     ["'kafka.sasl.login.refresh.min.period.seconds' must be between 0 and 900"]),
    (oidc_options("https://idp/t", **{"sasl.login.refresh.buffer.seconds": "3601"}),
     ["'kafka.sasl.login.refresh.buffer.seconds' must be between 0 and 3600"]),
    (oidc_options("https://idp/t", **{"sasl.login.refresh.buffer.seconds": "5m"}),
     ["'kafka.sasl.login.refresh.buffer.seconds' must be an integer"]),
    (oidc_options("https://idp/t", **{"sasl.login.read.timeout.ms": "soon"}),
     ["'kafka.sasl.login.read.timeout.ms' must be an integer"]),
    (options(f'{MODULE} unsecuredLoginStringClaim_sub="a" unsecuredLoginStringClaim_exp="1";'),
     ["unsecuredLoginStringClaim_exp cannot be set"]),
    ({**options(f'{MODULE} unsecuredLoginStringClaim_sub="a";'), "kafka.sasl.mechanism": "PLAIN"},
     ["OAuthBearerLoginModule", "'kafka.sasl.mechanism' PLAIN"]),
])
def test_oauthbearer_options_that_cannot_work_fail_naming_the_option(opts, fragments):
    with pytest.raises(OptionError) as info:
        client_config_from_options(opts)
    assert all(f in str(info.value) for f in fragments), str(info.value)
    assert SECRET not in str(info.value)


def test_oauthbearer_options_with_another_mechanism_are_reported(caplog):
    opts = {"kafka.bootstrap.servers": "h:1", "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule '
                                      'required username="u" password="p";',
            "kafka.sasl.oauthbearer.token.endpoint.url": "https://idp/t"}
    client_config_from_options(opts)
    assert ("'kafka.sasl.oauthbearer.token.endpoint.url': only for 'kafka.sasl.mechanism' "
            "OAUTHBEARER, ignored") in caplog.text


# --- tokens from a token endpoint -------------------------------------------------------------

@pytest.fixture
def idp():
    with TokenEndpoint({"svc-1": SECRET}, lifetime_s=1000) as endpoint:
        yield endpoint


def test_a_token_is_requested_as_java_requests_it_and_shared(idp):
    login = login_of(oidc_options(idp.url, ' extension_logicalCluster="lkc-1"'))
    provider = TokenProvider(login)
    token = provider.token()
    assert token == idp.issued[0] and jwt_claims(token)["sub"] == "svc-1"
    sent = idp.requests[0]
    assert sent["body"] == {"grant_type": ["client_credentials"], "scope": ["kafka read"]}
    basic = base64.b64decode(sent["headers"]["Authorization"][len("Basic "):]).decode()
    assert basic == "svc-1:" + urllib.parse.quote(SECRET, safe="")
    assert sent["headers"]["Content-Type"] == "application/x-www-form-urlencoded"
    assert provider.token() == token and len(idp.requests) == 1       # cached
    # what kafka-python sends the broker: the token and the extensions (RFC 7628)
    mechanism = SaslMechanismOAuth(sasl_oauth_token_provider=provider)
    assert mechanism.auth_bytes() == (f"n,,\x01auth=Bearer {token}\x01logicalCluster=lkc-1"
                                      "\x01\x01").encode()
    # one provider per login in a process
    assert token_provider(login) is token_provider(login)


# (factor, jitter, min period, buffer), now, start, expiry, draw -> the refresh time, worked out
# by hand from Java's ExpiringCredentialRefreshingLogin.refreshMs.
@pytest.mark.parametrize("settings, now, start, expires, draw, expected", [
    ((0.8, 0.05, 60, 300), 0, 0, 3600, 0.0, 2880),    # an hour: the window's share
    ((0.8, 0.05, 60, 300), 0, 0, 3600, 1.0, 3060),    # with the whole jitter
    ((0.8, 0.05, 60, 300), 0, 0, 3600, 0.5, 2970),
    ((0.8, 0.05, 60, 300), 0, 0, 1000, 0.0, 700),     # 800 would be inside the buffer
    ((0.8, 0.05, 60, 900), 0, 0, 3600, 0.0, 2700),    # a longer buffer
    ((0.8, 0.05, 60, 300), 0, -3400, 600, 0.0, 60),   # issued long ago: the minimum period
    ((0.8, 0.05, 60, 300), 0, 0, 300, 0.0, 240),      # too short for both bounds: 0.8 of it
    ((0.8, 0.05, 60, 300), 0, 0, 300, 1.0, 255),
    ((0.8, 0.05, 60, 300), 100, 0, 400, 0.0, 340),    # of what is left, not of the lifetime
    ((0.5, 0.0, 0, 0), 0, 0, 1000, 0.7, 500),         # bounds of 0: the window alone
])
def test_the_refresh_time_is_javas(settings, now, start, expires, draw, expected):
    factor, jitter, min_period, buffer = settings
    login = OAuthBearerLogin(refresh_window_factor=factor, refresh_window_jitter=jitter,
                             refresh_min_period_s=min_period, refresh_buffer_s=buffer)
    assert refresh_time(login, now=now, start=start, expires=expires,
                        draw=draw) == pytest.approx(expected)


def _refreshed_at(login, idp, draw: float) -> float:
    """When the provider first asks the endpoint again, to the second."""
    clock = Clock(__import__("time").time())
    provider = TokenProvider(login, clock=clock, sleep=clock.sleep, draw=lambda: draw)
    began, first = clock.now, provider.token()
    asked = len(idp.requests)
    while provider.token() == first:
        assert len(idp.requests) == asked
        clock.now += 1
    return clock.now - began


def test_the_token_is_refreshed_as_java_refreshes_it(idp):
    # A token of 1,000 s (idp): the buffer's 300 s come before the window's 800 s.
    assert _refreshed_at(login_of(oidc_options(idp.url)), idp, draw=0.9) == 700
    no_buffer = login_of(oidc_options(idp.url, **{"sasl.login.refresh.buffer.seconds": "0"}))
    assert _refreshed_at(no_buffer, idp, draw=0.0) == 800
    jitter = login_of(oidc_options(idp.url, **{"sasl.login.refresh.buffer.seconds": "0",
                                               "sasl.login.refresh.window.jitter": "0.1"}))
    assert _refreshed_at(jitter, idp, draw=0.5) == 850


def write_token(path, iat: float, exp: float) -> str:
    """An unsigned JWT with these ``iat`` and ``exp`` written to the token file ``path``."""
    token = (base64.urlsafe_b64encode(b'{"alg":"none"}').rstrip(b"=").decode() + "."
             + base64.urlsafe_b64encode(json.dumps({"sub": "pod", "iat": iat, "exp": exp})
                                        .encode()).rstrip(b"=").decode() + ".")
    path.write_text(token)
    return token


def test_the_refresh_counts_the_lifetime_from_the_tokens_iat(tmp_path):
    # A token file with a token issued 3,000 s ago that expires in 600 s: its window (0.8 of
    # 3,600 s) has passed, so it is refreshed after the minimum period, 60 s, not after 300.
    path = tmp_path / "token"
    clock = Clock(__import__("time").time())

    def write(iat: float, exp: float) -> str:
        return write_token(path, iat, exp)

    first = write(clock.now - 3000, clock.now + 600)
    provider = TokenProvider(login_of({**oidc_options(f"file://{path}"),
                                       "kafka.sasl.jaas.config": f"{MODULE};"}),
                             clock=clock, sleep=clock.sleep, draw=lambda: 0.0)
    assert provider.token() == first
    clock.now += 59
    write(clock.now, clock.now + 3600)
    assert provider.token() == first
    clock.now += 1
    assert provider.token() != first


def test_a_failed_refresh_keeps_the_valid_token_and_tries_again_after_the_backoff(idp, caplog):
    login = login_of(oidc_options(idp.url, **{"sasl.login.retry.backoff.ms": "2000"}))
    clock = Clock(__import__("time").time())
    provider = TokenProvider(login, clock=clock, sleep=clock.sleep)
    first = provider.token()
    clock.now += 850                       # due for refresh, valid for 150 s more
    idp.fail_next(1, 503)
    assert provider.token() == first and len(idp.requests) == 2
    assert "could not refresh the token" in caplog.text and SECRET not in caplog.text
    clock.now += 1
    assert provider.token() == first and len(idp.requests) == 2     # within the backoff
    clock.now += 2
    assert provider.token() != first and len(idp.requests) == 3
    assert clock.slept == []               # a refresh never waits


def test_without_a_token_an_outage_is_retried_with_backoff_then_fails_as_retriable(idp):
    login = login_of(oidc_options(idp.url, **{"sasl.login.retry.backoff.ms": "100",
                                              "sasl.login.retry.backoff.max.ms": "1000"}))
    clock = Clock()
    provider = TokenProvider(login, clock=clock, sleep=clock.sleep)
    idp.fail_next(3, 503)
    assert jwt_claims(provider.token())["sub"] == "svc-1"     # rode out 3 failures
    assert clock.slept == [0.1, 0.2, 0.4] and len(idp.requests) == 4
    provider = TokenProvider(login, clock=clock, sleep=clock.sleep)
    idp.fail_next(100, 500)
    with pytest.raises(TokenRequestFailed) as info:
        provider.token()
    assert isinstance(info.value, Errors.KafkaConnectionError)           # retriable
    assert "HTTP 500" in str(info.value) and idp.url in str(info.value)
    assert sum(clock.slept[3:]) <= 1.0


def test_an_unreachable_endpoint_fails_as_retriable_naming_it():
    provider = TokenProvider(login_of(oidc_options(
        "http://127.0.0.1:9/token", **{"sasl.login.retry.backoff.max.ms": "0",
                                       "sasl.login.connect.timeout.ms": "2000",
                                       "sasl.login.read.timeout.ms": "2000"})))
    with pytest.raises(TokenRequestFailed) as info:
        provider.token()
    assert "127.0.0.1:9/token" in str(info.value) and "svc-1" in str(info.value)


@pytest.mark.parametrize("clients", [{"svc-1": "another"}, {"svc-2": SECRET}])
def test_refused_client_credentials_fail_at_once_naming_the_options(clients):
    with TokenEndpoint(clients) as endpoint:
        clock = Clock()
        provider = TokenProvider(login_of(oidc_options(endpoint.url)), clock=clock,
                                 sleep=clock.sleep)
        with pytest.raises(BrokerSecurityError) as info:
            provider.token()
        assert len(endpoint.requests) == 1 and clock.slept == []     # no retry
    message = str(info.value)
    assert "HTTP 401: invalid_client: Invalid client" in message
    assert "clientId, clientSecret and scope in 'kafka.sasl.jaas.config'" in message
    assert "'svc-1'" in message and SECRET not in message
    # the connection manager's diagnosis keeps it: fatal, reported as it is
    fatal, _ = diagnose(Errors.KafkaConnectionError("x", info.value), address="h:1", host="h",
                        config={"security_protocol": "SASL_SSL",
                                "sasl_mechanism": "OAUTHBEARER"})
    assert fatal is info.value


def test_a_token_without_expiry_is_refused():
    with TokenEndpoint({"svc-1": SECRET}, expires_in=False) as endpoint:
        provider = TokenProvider(login_of(oidc_options(endpoint.url)))
        token = provider.token()        # a JWT with exp: fine without expires_in
        assert jwt_claims(token)["exp"] > 0
    with pytest.raises(BrokerSecurityError) as info:
        provider._expiry("opaque-token", None, 0.0)
    assert "has no expiry" in str(info.value)
    assert provider._expiry("opaque-token", 60, 100.0) == 160.0


def test_a_token_file(tmp_path):
    path = tmp_path / "token"
    now = __import__("time").time()
    token = (base64.urlsafe_b64encode(b'{"alg":"none"}').rstrip(b"=").decode() + "."
             + base64.urlsafe_b64encode(json.dumps({"sub": "pod", "exp": now + 100}).encode())
             .rstrip(b"=").decode() + ".")
    path.write_text(token + "\n")
    provider = TokenProvider(login_of({**oidc_options(f"file://{path}"),
                                       "kafka.sasl.jaas.config": f"{MODULE};"}))
    assert provider.token() == token
    path.unlink()
    missing = TokenProvider(login_of({**oidc_options(f"file://{path}"),
                                      "kafka.sasl.jaas.config": f"{MODULE};",
                                      "kafka.sasl.login.retry.backoff.max.ms": "0"}))
    with pytest.raises(TokenRequestFailed) as info:
        missing.token()
    assert "cannot read the token file" in str(info.value) and str(path) in str(info.value)


# --- unsecured tokens ---------------------------------------------------------------------------

def test_unsecured_tokens_are_unsigned_jwts_with_the_claims():
    login = login_of(options(f'{MODULE} unsecuredLoginStringClaim_sub="alice" '
                             'unsecuredLoginListClaim_groups=",a,b" '
                             'unsecuredLoginLifetimeSeconds="600";'))
    clock = Clock()
    provider = TokenProvider(login, clock=clock)
    token = provider.token()
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header == {"alg": "none"} and token.endswith(".")
    assert jwt_claims(token) == {"sub": "alice", "groups": ["a", "b"], "iat": int(clock.now),
                                 "exp": int(clock.now) + 600}
    clock.now += 0.81 * 600
    assert provider.token() != token


@pytest.mark.parametrize("now", [1_796_110_081.0, 1_796_110_081.0006, 1_796_110_081.9999])
def test_an_unsecured_token_is_never_issued_after_the_brokers_clock(now):
    """Kafka's validator (OAuthBearerValidationUtils.validateIssuedAt) refuses a token whose
    1000 * iat is after its clock in whole milliseconds, with no skew allowed by default: a
    broker checking in the very millisecond the token was made must accept it."""
    login = login_of(options(f'{MODULE} unsecuredLoginStringClaim_sub="alice";'))
    token, expires = unsecured_token(login, now)
    claims = jwt_claims(token)
    broker_clock_ms = int(now * 1000)
    assert 1000 * claims["iat"] <= broker_clock_ms
    assert claims["exp"] == claims["iat"] + 3600 == expires


def test_a_broker_rejecting_the_token_is_reported_with_its_source(idp):
    provider = TokenProvider(login_of(oidc_options(idp.url)))
    cause = Errors.SaslAuthenticationFailedError(
        "SaslAuthenticationFailedError: Authentication failed during authentication due to "
        "invalid credentials with SASL mechanism OAUTHBEARER")
    fatal, _ = diagnose(cause, address="h:1", host="h",
                        config={"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
                                "sasl_oauth_token_provider": provider})
    message = str(fatal)
    assert "rejected the OAUTHBEARER token from the token endpoint" in message
    assert idp.url in message and "'svc-1'" in message
    assert "'kafka.sasl.oauthbearer.token.endpoint.url'" in message


# --- an OAuth server whose certificate a private CA signed --------------------------------------

def test_the_token_endpoint_over_tls_trusts_the_ca_in_the_jaas_line(tmp_path):
    from kafka_source.testing.certs import CertificateAuthority

    ca = CertificateAuthority()
    ca_pem = ca.write_pem(str(tmp_path / "ca.pem"))
    server = ca.issue("idp", ips=("127.0.0.1",)).write_pem(str(tmp_path / "idp.pem"))
    with TokenEndpoint({"svc-1": SECRET}, certfile=server) as endpoint:
        assert endpoint.url.startswith("https://")
        trusted = login_of(oidc_options(endpoint.url, f' ssl.truststore.location="{ca_pem}" '
                                                      'ssl.truststore.type="PEM"'))
        assert dict(trusted.tls) == {"ssl_truststore_location": ca_pem,
                                     "ssl_truststore_type": "PEM"}
        assert jwt_claims(TokenProvider(trusted).token())["sub"] == "svc-1"
        # the system's CAs do not know this one: refused at once, naming the fix
        clock = Clock()
        untrusted = TokenProvider(login_of(oidc_options(endpoint.url)), clock=clock,
                                  sleep=clock.sleep)
        with pytest.raises(BrokerSecurityError) as info:
            untrusted.token()
        assert clock.slept == []
    assert "is not trusted" in str(info.value) and "ssl.truststore.location" in str(info.value)


def test_wrong_tls_fields_in_the_jaas_line_are_option_errors(tmp_path):
    with pytest.raises(OptionError) as info:
        client_config_from_options(oidc_options("https://idp/t", ' ssl.protocol="TLSv1.3"'))
    assert "ssl.protocol" in str(info.value) and "ssl.truststore.location" in str(info.value)
    login = login_of(oidc_options("https://idp/t",
                                  f' ssl.truststore.location="{tmp_path}/missing.pem"'))
    with pytest.raises(OptionError) as info:
        TokenProvider(login)
    assert "'kafka.sasl.jaas.config'" in str(info.value) and "missing.pem" in str(info.value)


def test_a_refused_refresh_keeps_the_valid_token_until_it_expires(caplog):
    with TokenEndpoint({"svc-1": SECRET}, lifetime_s=1000) as endpoint:
        clock = Clock(__import__("time").time())
        provider = TokenProvider(login_of(oidc_options(endpoint.url)), clock=clock,
                                 sleep=clock.sleep)
        first = provider.token()
        endpoint.clients["svc-1"] = "rotated"     # the secret was rotated at the server
        clock.now += 900
        assert provider.token() == first and "could not refresh" in caplog.text
        assert "invalid_client" in caplog.text and SECRET not in caplog.text
        clock.now += 101                          # expired: now the refusal is the answer
        with pytest.raises(BrokerSecurityError):
            provider.token()


def test_a_token_in_its_last_two_seconds_is_not_handed_to_a_new_session(tmp_path):
    # A token of 4 s is refreshed at 0.8 of its lifetime, as Java does: 0.8 s before it
    # expires. A re-authentication on it then got a session the broker ends before the
    # connection may re-authenticate again (at most once a second), and the broker closed the
    # connection. With less than MIN_SESSION_S left, the provider gets a new token first.
    from kafka_source.wire.net.oauth import MIN_SESSION_S

    path = tmp_path / "token"
    clock = Clock(1_000_000.0)
    login = login_of({**oidc_options(f"file://{path}"), "kafka.sasl.jaas.config": f"{MODULE};"})
    first = write_token(path, clock.now, clock.now + 4)
    provider = TokenProvider(login, clock=clock, sleep=clock.sleep, draw=lambda: 0.0)
    assert provider.token() == first
    clock.now += 4 - MIN_SESSION_S - 0.1              # 2.1 s left: kept
    second = write_token(path, clock.now, clock.now + 4)
    assert provider.token() == first
    clock.now += 0.2                                   # 1.9 s left (its refresh is at 3.2 s)
    assert provider.token() == second
    # A token whose whole lifetime is that short is kept to its refresh time, not asked for
    # again at every call.
    clock.now += 3                                     # the 4 s token's refresh time passed
    short = write_token(path, clock.now, clock.now + 1.5)
    assert provider.token() == short
    write_token(path, clock.now, clock.now + 1.5)
    clock.now += 0.5                                   # 1.0 s left, refreshed at 1.2 s
    assert provider.token() == short


def test_a_token_already_ending_when_got_is_kept_to_its_refresh_time(tmp_path, monkeypatch):
    # An endpoint that hands out the same cached token until it expires (here: a token file not
    # rewritten) has nothing fresher in that token's last 2 s. The provider asks once there and
    # keeps what it got to its refresh time, rather than at every new connection.
    from kafka_source.wire.net.oauth import MIN_SESSION_S

    path = tmp_path / "token"
    clock = Clock(1_000_000.0)
    token = write_token(path, clock.now, clock.now + 10)
    login = login_of({**oidc_options(f"file://{path}"), "kafka.sasl.jaas.config": f"{MODULE};"})
    provider = TokenProvider(login, clock=clock, sleep=clock.sleep, draw=lambda: 0.0)
    asked = []
    request = provider._request
    monkeypatch.setattr(provider, "_request", lambda now: (asked.append(now), request(now))[1])
    assert provider.token() == token and len(asked) == 1
    clock.now += 10 - MIN_SESSION_S + 0.5             # 1.5 s left: asked again, the same token
    assert provider.token() == token and len(asked) == 2
    for _ in range(5):                                 # kept to 0.8 of the 1.5 s it had left
        clock.now += 0.2
        assert provider.token() == token
    assert len(asked) == 2
    clock.now += 0.3                                   # its refresh time (1.2 s after) passed
    fresh = write_token(path, clock.now, clock.now + 10)
    assert provider.token() == fresh and len(asked) == 3
