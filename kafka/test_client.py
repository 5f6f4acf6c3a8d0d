"""Client settings built in one place (``client.py``) from config and environment."""

from __future__ import annotations

import pytest

from eroica.kafka.client import (admin_conf, aiokafka_kwargs, consumer_conf, faust_broker_kwargs,
                                           producer_conf)
from eroica.kafka.config import KafkaConfig


def test_plaintext_defaults() -> None:
    k = KafkaConfig(bootstrap="a:1,b:2")
    c = consumer_conf(k, "sink", "g", session_timeout_ms=2000)
    assert c["bootstrap.servers"] == "a:1,b:2" and c["security.protocol"] == "PLAINTEXT"
    assert c["client.id"] == "eroica-sink" and c["group.id"] == "g"
    assert c["enable.auto.commit"] is False and c["enable.auto.offset.store"] is False
    assert c["heartbeat.interval.ms"] == 500 and "sasl.username" not in c
    p = producer_conf(k, "replay", **{"linger.ms": 5})
    assert p["acks"] == "all" and p["enable.idempotence"] is True and p["linger.ms"] == 5
    assert admin_conf(k)["client.id"] == "eroica-admin"
    assert faust_broker_kwargs(k) == {"broker": ["kafka://a:1", "kafka://b:2"], "broker_client_id": "eroica-faust"}


def test_sasl_scram_over_tls_from_the_environment(tmp_path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    env = {"EROICA_KAFKA_BOOTSTRAP": "k1:9093", "EROICA_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "EROICA_KAFKA_SASL_MECHANISM": "scram-sha-256", "EROICA_KAFKA_SASL_USERNAME": "eroica",
           "EROICA_KAFKA_SASL_PASSWORD_FILE": str(secret), "EROICA_KAFKA_SSL_VERIFY_HOSTNAME": "off",
           "EROICA_KAFKA_CLIENT_ID": "fleet-a"}
    k = KafkaConfig.from_env(env)
    assert "s3cret" not in repr(k)
    for conf in (consumer_conf(k, "alert", "g"), producer_conf(k, "sink-deadletter"), admin_conf(k)):
        assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.mechanism"] == "SCRAM-SHA-256"
        assert conf["sasl.username"] == "eroica" and conf["sasl.password"] == "s3cret"
        assert conf["ssl.endpoint.identification.algorithm"] == "none"
        assert conf["client.id"].startswith("fleet-a-")
    a = aiokafka_kwargs(k, "state-loader")
    assert a["security_protocol"] == "SASL_SSL" and a["sasl_plain_password"] == "s3cret"
    assert a["ssl_context"] is not None and a["client_id"] == "fleet-a-state-loader"
    creds = faust_broker_kwargs(k)["broker_credentials"]
    assert creds.username == "eroica" and str(creds.protocol.value) == "SASL_SSL"


def test_mutual_tls_files_are_passed_on() -> None:
    k = KafkaConfig(security_protocol="ssl", ssl_ca="/ca.pem", ssl_cert="/c.pem", ssl_key="/k.pem")
    c = producer_conf(k, "x")
    assert (c["ssl.ca.location"], c["ssl.certificate.location"], c["ssl.key.location"]) == ("/ca.pem", "/c.pem",
                                                                                          "/k.pem")
    assert c["ssl.endpoint.identification.algorithm"] == "https"


@pytest.mark.parametrize("env, message", [
    ({"EROICA_KAFKA_SECURITY_PROTOCOL": "kerberos"}, "security_protocol"),
    ({"EROICA_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext"}, "username and password"),
    ({"EROICA_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext", "EROICA_KAFKA_SASL_USERNAME": "u",
      "EROICA_KAFKA_SASL_PASSWORD": "p", "EROICA_KAFKA_SASL_MECHANISM": "GSSAPI"}, "sasl_mechanism"),
    ({"EROICA_KAFKA_SSL_VERIFY_HOSTNAME": "maybe"}, "on or off"),
])
def test_bad_settings_name_what_is_wrong(env: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KafkaConfig.from_env(env)
