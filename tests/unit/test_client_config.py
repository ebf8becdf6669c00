"""kafka.* security options -> client settings: names, secrets, SASL consistency."""

import logging

import pytest

from kafka_source.config.client_config import (SECRET_SETTINGS, client_config_from_options,
                                               connection_settings)
from kafka_source.config.secrets import Secret
from kafka_source.errors import OptionError

pytestmark = pytest.mark.pyspark_free

PASSWORD = "pw-Recognisable-0815"
BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def config(**options):
    return client_config_from_options({**BASE, **{f"kafka.{k}": v for k, v in options.items()}})


def error_of(**options) -> str:
    with pytest.raises(OptionError) as info:
        config(**options)
    return str(info.value)


def jaas(module: str, password: str = PASSWORD) -> str:
    pkg = "plain" if module == "PlainLoginModule" else "scram"
    return (f"org.apache.kafka.common.security.{pkg}.{module} required "
            f'username="alice" password="{password}";')


def test_java_trust_and_key_store_options_map_to_tls_settings():
    c = config(**{"security.protocol": "ssl",
                  "ssl.truststore.location": "/t.p12", "ssl.truststore.type": "PKCS12",
                  "ssl.truststore.password": PASSWORD + "1",
                  "ssl.keystore.location": "/k.pem", "ssl.keystore.type": "PEM",
                  "ssl.key.password": PASSWORD + "2",
                  "ssl.endpoint.identification.algorithm": ""})
    assert c["security_protocol"] == "SSL"
    assert c["ssl_truststore_location"] == "/t.p12" and c["ssl_truststore_type"] == "PKCS12"
    assert c["ssl_keystore_location"] == "/k.pem" and c["ssl_keystore_type"] == "PEM"
    assert c["ssl_truststore_password"] == Secret(PASSWORD + "1")
    assert c["ssl_key_password"] == Secret(PASSWORD + "2")
    assert c["ssl_check_hostname"] is False
    settings = connection_settings(c)
    assert settings["ssl_truststore_location"] == "/t.p12"  # reaches the client (executors too)
    assert PASSWORD not in repr(c) and PASSWORD not in repr(settings)


def test_inline_pem_options_are_secrets():
    c = config(**{"security.protocol": "SSL", "ssl.truststore.certificates": "CERTS",
                  "ssl.keystore.key": "KEY", "ssl.keystore.certificate.chain": "CHAIN",
                  "ssl.keystore.password": "P"})
    for name in ("ssl_truststore_certificates", "ssl_keystore_key",
                 "ssl_keystore_certificate_chain", "ssl_keystore_password"):
        assert isinstance(c[name], Secret) and name in SECRET_SETTINGS
    assert c["ssl_keystore_key"].reveal() == "KEY"


def test_a_password_keeps_its_spaces():
    c = config(**{"security.protocol": "SSL", "ssl.truststore.password": " a b "})
    assert c["ssl_truststore_password"].reveal() == " a b "


@pytest.mark.parametrize("mechanism,module", [("PLAIN", "PlainLoginModule"),
                                              ("SCRAM-SHA-256", "ScramLoginModule"),
                                              ("scram-sha-512", "ScramLoginModule")])
def test_sasl_credentials_from_the_jaas_line(mechanism, module):
    c = config(**{"security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
                  "sasl.jaas.config": jaas(module)})
    assert c["sasl_mechanism"] == mechanism.upper()
    assert c["sasl_plain_username"] == "alice"
    assert c["sasl_plain_password"] == Secret(PASSWORD)
    assert "sasl_login_module" not in c


@pytest.mark.parametrize("options,fragments", [
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.jaas.config": jaas("ScramLoginModule")},
     ["'kafka.sasl.mechanism' is required", "SCRAM-SHA-256 or SCRAM-SHA-512"]),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
      "sasl.jaas.config": jaas("PlainLoginModule")},
     ["PlainLoginModule", "SCRAM-SHA-256", "is for PLAIN"]),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
      "sasl.jaas.config": jaas("ScramLoginModule")},
     ["ScramLoginModule", "'kafka.sasl.mechanism' PLAIN"]),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-1"},
     ["'kafka.sasl.mechanism'", "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, GSSAPI"]),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
     ["needs a username and password", "kafka.sasl.jaas.config", "ScramLoginModule"]),
    ({"sasl.jaas.config": f'org.apache.kafka.common.security.plain.PlainLoginModule required '
                          f'username="alice" pass="{PASSWORD}";'},
     ["kafka.sasl.jaas.config", 'password="..."']),
])
def test_sasl_settings_that_cannot_work_fail_naming_the_options(options, fragments):
    message = error_of(**options)
    assert all(f in message for f in fragments), message
    assert PASSWORD not in message


def test_sasl_or_tls_options_without_that_protocol_are_reported(caplog):
    with caplog.at_level(logging.WARNING, logger="kafka_source"):
        config(**{"sasl.mechanism": "PLAIN", "sasl.jaas.config": jaas("PlainLoginModule"),
                  "ssl.truststore.location": "/t.p12"})
    assert "'kafka.sasl.mechanism' and 'kafka.sasl.jaas.config' are set" in caplog.text
    assert "TLS options are set" in caplog.text and "PLAINTEXT" in caplog.text
    assert PASSWORD not in caplog.text


def test_receive_limit_option_sets_the_largest_response_but_never_below_the_fetch_sizes(caplog):
    with caplog.at_level(logging.WARNING):
        default = connection_settings(config())["receive_message_max_bytes"]
        raised = connection_settings(config(**{"receive.message.max.bytes": "300000000"}))
    assert default == max(100_000_000, 2 * 52_428_800 + (1 << 20))
    assert raised["receive_message_max_bytes"] == 300_000_000
    assert "not known" not in caplog.text                     # mapped, not ignored
    # Lower than what a Fetch with these sizes may bring back: the fetch sizes win.
    low = connection_settings(config(**{"receive.message.max.bytes": "1000",
                                        "max.partition.fetch.bytes": str(64 << 20)}))
    assert low["receive_message_max_bytes"] == 2 * (64 << 20) + (1 << 20)
    assert "must be an integer" in error_of(**{"receive.message.max.bytes": "lots"})


def test_reconnect_backoff_stops_growing_at_javas_second_unless_set():
    """kafka-python lets the pause before reconnecting double up to 30 s, which outlasts a
    restart; Java's clients stop at 1 s. The option still wins."""
    assert connection_settings(config())["reconnect_backoff_max_ms"] == 1000
    assert connection_settings(config(**{"reconnect.backoff.max.ms": "5000"})
                               )["reconnect_backoff_max_ms"] == 5000
