"""Kafka client settings, built in one place from :class:`~eroica.kafka.config.KafkaConfig`.

Every Kafka client Eroica opens gets its connection settings here: bootstrap
servers, TLS, SASL/SCRAM and ``client.id`` (``<EROICA_KAFKA_CLIENT_ID>-<role>``),
so a deployment that turns on ``sasl_ssl`` turns it on for the replay, the
node agent, the sink, the alert consumer, the topic administration and the
faust workers at once. Three forms:

- :func:`consumer_conf`, :func:`producer_conf`, :func:`admin_conf`:
  librdkafka (confluent-kafka) dicts; the role's tuning comes on top.
- :func:`aiokafka_kwargs`: keyword arguments of ``AIOKafkaConsumer`` /
  ``AIOKafkaProducer``.
- :func:`faust_broker_kwargs`: ``broker`` URLs and ``broker_credentials`` of a
  ``faust.App``.

librdkafka's own log lines go through a rate-limited logger
(:class:`~eroica.runtime.logfilter.RateLimitedLogger`: one line per kind every
30 s, ``EROICA_LOG_REPEAT_S``): a broker that is away must not flood the logs.
"""

from __future__ import annotations

import logging
from typing import Any

from eroica.runtime.logfilter import RateLimitedLogger

from .config import KafkaConfig

__all__ = ["connection_conf", "consumer_conf", "producer_conf", "admin_conf", "aiokafka_kwargs",
           "faust_broker_kwargs", "client_id", "ssl_context"]

_LIBRDKAFKA_PROTOCOL = {"plaintext": "PLAINTEXT", "ssl": "SSL", "sasl_plaintext": "SASL_PLAINTEXT",
                        "sasl_ssl": "SASL_SSL"}


def _librdkafka_logger() -> Any:
    return RateLimitedLogger(logging.getLogger("eroica.kafka.librdkafka"))


def client_id(config: KafkaConfig, role: str) -> str:
    """``<prefix>-<role>`` (the prefix is ``EROICA_KAFKA_CLIENT_ID``, default ``eroica``)."""
    return f"{config.client_id}-{role}" if role else config.client_id


def connection_conf(config: KafkaConfig) -> dict[str, Any]:
    """librdkafka's bootstrap, TLS and SASL settings (nothing role-specific)."""
    conf: dict[str, Any] = {"bootstrap.servers": config.bootstrap,
                            "security.protocol": _LIBRDKAFKA_PROTOCOL[config.security_protocol]}
    if config.sasl:
        conf["sasl.mechanism"] = config.sasl_mechanism
        conf["sasl.username"] = config.sasl_username
        conf["sasl.password"] = config.sasl_password
    if config.tls:
        if config.ssl_ca:
            conf["ssl.ca.location"] = config.ssl_ca
        if config.ssl_cert:
            conf["ssl.certificate.location"] = config.ssl_cert
        if config.ssl_key:
            conf["ssl.key.location"] = config.ssl_key
        if config.ssl_key_password:
            conf["ssl.key.password"] = config.ssl_key_password
        conf["ssl.endpoint.identification.algorithm"] = "https" if config.ssl_verify_hostname else "none"
    return conf


def consumer_conf(config: KafkaConfig, role: str, group_id: str, *, session_timeout_ms: int = 6000,
                  logger: Any = None, **extra: Any) -> dict[str, Any]:
    """A consumer that commits by hand only (at-least-once: :mod:`eroica.kafka.loop`).

    ``fetch.wait.max.ms`` 100: it bounds only empty fetches (Kafka answers as
    soon as data is there), and on tansu the 500 ms default added lag.
    """
    conf = {
        **connection_conf(config),
        "client.id": client_id(config, role),
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": session_timeout_ms,
        "heartbeat.interval.ms": max(500, session_timeout_ms // 5),
        "fetch.wait.max.ms": 100,
        "logger": logger if logger is not None else _librdkafka_logger(),
    }
    conf.update(extra)
    return conf


def producer_conf(config: KafkaConfig, role: str, *, logger: Any = None, **extra: Any) -> dict[str, Any]:
    """An idempotent producer acknowledged by every in-sync replica (no loss, no duplicate on retry)."""
    conf = {
        **connection_conf(config),
        "client.id": client_id(config, role),
        "enable.idempotence": True,
        "acks": "all",
        "logger": logger if logger is not None else _librdkafka_logger(),
    }
    conf.update(extra)
    return conf


def admin_conf(config: KafkaConfig, *, quiet: bool = True, **extra: Any) -> dict[str, Any]:
    """An admin client; ``quiet``: no librdkafka log at all (probing a broker that is starting)."""
    conf: dict[str, Any] = {**connection_conf(config), "client.id": client_id(config, "admin")}
    if quiet:
        conf.update({"log_level": 0, "logger": _NullLogger()})
    conf.update(extra)
    return conf


class _NullLogger:
    def log(self, *args: object, **kwargs: object) -> None:
        pass


def ssl_context(config: KafkaConfig) -> Any:
    """An ``ssl.SSLContext`` for the Python clients (aiokafka, faust), or None without TLS."""
    if not config.tls:
        return None
    import ssl

    ctx = ssl.create_default_context(cafile=config.ssl_ca)
    if config.ssl_cert:
        ctx.load_cert_chain(config.ssl_cert, config.ssl_key, config.ssl_key_password)
    if not config.ssl_verify_hostname:
        ctx.check_hostname = False
    return ctx


def aiokafka_kwargs(config: KafkaConfig, role: str) -> dict[str, Any]:
    """``bootstrap_servers``, ``client_id``, ``security_protocol`` and SASL/TLS arguments for aiokafka."""
    kw: dict[str, Any] = {"bootstrap_servers": [b.strip() for b in config.bootstrap.split(",") if b.strip()],
                          "client_id": client_id(config, role),
                          "security_protocol": config.security_protocol.upper()}
    if config.sasl:
        kw.update(sasl_mechanism=config.sasl_mechanism, sasl_plain_username=config.sasl_username,
                  sasl_plain_password=config.sasl_password)
    if config.tls:
        kw["ssl_context"] = ssl_context(config)
    return kw


def faust_broker_kwargs(config: KafkaConfig) -> dict[str, Any]:
    """``broker``, ``broker_client_id`` and (with TLS or SASL) ``broker_credentials`` of a ``faust.App``."""
    brokers = [f"kafka://{b.strip()}" for b in config.bootstrap.split(",") if b.strip()]
    kw: dict[str, Any] = {"broker": brokers, "broker_client_id": client_id(config, "faust")}
    if config.sasl:
        import faust

        # an ssl_context makes it SASL_SSL, none SASL_PLAINTEXT
        kw["broker_credentials"] = faust.SASLCredentials(
            username=config.sasl_username, password=config.sasl_password, mechanism=config.sasl_mechanism,
            ssl_context=ssl_context(config))
    elif config.tls:
        import faust

        kw["broker_credentials"] = faust.SSLCredentials(ssl_context(config))
    return kw
