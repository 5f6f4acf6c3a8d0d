"""Where Eroica's Kafka topics are and how its producers batch and bound their queues.

One frozen object passed everywhere, so a test can point a whole pipeline at
fresh topic names with ``dataclasses.replace`` and a deployment can do the
same with environment variables (read once, by :meth:`KafkaConfig.from_env`):

==================================  ===================  ==========================================
variable                            default              meaning
==================================  ===================  ==========================================
EROICA_KAFKA_BOOTSTRAP              127.0.0.1:9092       bootstrap servers (host:port[,host:port])
EROICA_KAFKA_TOPIC_RAW              eroica.raw           columnar frames (models.frames)
EROICA_KAFKA_TOPIC_INGEST           eroica.ingest        contract JSON lines sent by outside collectors
EROICA_KAFKA_TOPIC_DEADLETTER       eroica.deadletter    rejected input, JSON {source,line,reason,raw}
EROICA_KAFKA_TOPIC_DIGESTS          eroica.digests       window digests, progress, job and end messages
                                                         (summariser or edge node -> detector)
EROICA_KAFKA_TOPIC_VERDICTS         eroica.verdicts      verdicts, one JSON object per message
EROICA_KAFKA_TOPIC_WINDOW_SUMMARIES eroica.window-summaries  rows of the ``summaries`` table (msgpack list
                                                         of WindowSummary per job window; detector -> sink)
EROICA_KAFKA_PARTITIONS             8                    partitions of each topic we create
EROICA_KAFKA_FRAME_RECORDS          1000                 most records in one frame
EROICA_KAFKA_LINGER_MS              20                   producer linger (batching delay)
EROICA_KAFKA_COMPRESSION            lz4                  producer compression (lz4, zstd, none...)
EROICA_KAFKA_QUEUE_MAX_MESSAGES     10000                bound of the local producer queue, messages
EROICA_KAFKA_QUEUE_MAX_KBYTES       65536                bound of the local producer queue, KiB
EROICA_KAFKA_DELIVERY_TIMEOUT_MS    60000                a message not acknowledged by then fails
EROICA_KAFKA_CLIENT_ID              eroica               prefix of every client's ``client.id``
                                                         (``<prefix>-sink``, ``<prefix>-alert``...)
EROICA_KAFKA_SECURITY_PROTOCOL      plaintext            plaintext, ssl, sasl_plaintext, sasl_ssl
EROICA_KAFKA_SASL_MECHANISM         SCRAM-SHA-512        with sasl_*: SCRAM-SHA-256, SCRAM-SHA-512, PLAIN
EROICA_KAFKA_SASL_USERNAME          (none)               SASL user
EROICA_KAFKA_SASL_PASSWORD          (none)               SASL password (or EROICA_KAFKA_SASL_PASSWORD_FILE,
                                                         a file holding it; never logged)
EROICA_KAFKA_SSL_CA                 (system store)       PEM file of the CA that signed the brokers
EROICA_KAFKA_SSL_CERT               (none)               PEM client certificate (mutual TLS)
EROICA_KAFKA_SSL_KEY                (none)               PEM private key of that certificate
EROICA_KAFKA_SSL_KEY_PASSWORD       (none)               its password
EROICA_KAFKA_SSL_VERIFY_HOSTNAME    on                   check the broker's name against its certificate
==================================  ===================  ==========================================

Every Kafka client of Eroica (librdkafka producers, consumers and admin
clients, faust's and aiokafka's) gets its connection settings from this object
through :mod:`eroica.kafka.client`; nothing else builds them.

**Renamed topics** (issue 14): the digests topic was ``eroica.summaries``
(``EROICA_KAFKA_TOPIC_SUMMARIES``) and the window-summaries topic
``eroica.patterns`` (``EROICA_KAFKA_TOPIC_PATTERNS``). The old variables are
still read when the new ones are unset (a warning says so), and the old
attribute names ``summaries_topic`` / ``patterns_topic`` remain as read-only
aliases. A deployment upgraded with data still on the old topics must either
keep their names (``EROICA_KAFKA_TOPIC_DIGESTS=eroica.summaries``,
``EROICA_KAFKA_TOPIC_WINDOW_SUMMARIES=eroica.patterns``) or let them drain
first: :func:`eroica.kafka.admin.create_topics` warns at every start while an
old-named topic holds messages and the new name is in use.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, fields, replace
from typing import Mapping

ENV_PREFIX = "EROICA_KAFKA_"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"

# field name -> environment variable suffix
_ENV_NAMES = {
    "bootstrap": "BOOTSTRAP",
    "raw_topic": "TOPIC_RAW",
    "ingest_topic": "TOPIC_INGEST",
    "deadletter_topic": "TOPIC_DEADLETTER",
    "digests_topic": "TOPIC_DIGESTS",
    "verdicts_topic": "TOPIC_VERDICTS",
    "window_summaries_topic": "TOPIC_WINDOW_SUMMARIES",
    "partitions": "PARTITIONS",
    "frame_records": "FRAME_RECORDS",
    "linger_ms": "LINGER_MS",
    "compression": "COMPRESSION",
    "queue_max_messages": "QUEUE_MAX_MESSAGES",
    "queue_max_kbytes": "QUEUE_MAX_KBYTES",
    "delivery_timeout_ms": "DELIVERY_TIMEOUT_MS",
    "client_id": "CLIENT_ID",
    "security_protocol": "SECURITY_PROTOCOL",
    "sasl_mechanism": "SASL_MECHANISM",
    "sasl_username": "SASL_USERNAME",
    "sasl_password": "SASL_PASSWORD",
    "ssl_ca": "SSL_CA",
    "ssl_cert": "SSL_CERT",
    "ssl_key": "SSL_KEY",
    "ssl_key_password": "SSL_KEY_PASSWORD",
    "ssl_verify_hostname": "SSL_VERIFY_HOSTNAME",
}

# Renamed topics (issue 14): field -> (former variable suffix, former default name).
LEGACY_TOPICS: dict[str, tuple[str, str]] = {
    "digests_topic": ("TOPIC_SUMMARIES", "eroica.summaries"),
    "window_summaries_topic": ("TOPIC_PATTERNS", "eroica.patterns"),
}

log = logging.getLogger("eroica.kafka")

SECURITY_PROTOCOLS = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")
SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")


@dataclass(frozen=True)
class KafkaConfig:
    """Broker address, topic names and producer tuning shared by Eroica's Kafka code."""

    bootstrap: str = DEFAULT_BOOTSTRAP
    raw_topic: str = "eroica.raw"
    ingest_topic: str = "eroica.ingest"
    deadletter_topic: str = "eroica.deadletter"
    digests_topic: str = "eroica.digests"
    verdicts_topic: str = "eroica.verdicts"
    window_summaries_topic: str = "eroica.window-summaries"
    partitions: int = 8
    frame_records: int = 1000
    linger_ms: int = 20
    compression: str = "lz4"
    queue_max_messages: int = 10000
    queue_max_kbytes: int = 65536
    delivery_timeout_ms: int = 60000
    # Connection and identity (eroica.kafka.client turns them into client settings).
    client_id: str = "eroica"
    security_protocol: str = "plaintext"
    sasl_mechanism: str = "SCRAM-SHA-512"
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_ca: str | None = None
    ssl_cert: str | None = None
    ssl_key: str | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    ssl_verify_hostname: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "security_protocol", self.security_protocol.strip().lower())
        object.__setattr__(self, "sasl_mechanism", self.sasl_mechanism.strip().upper())
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"KafkaConfig.security_protocol {self.security_protocol!r}: use one of "
                             f"{', '.join(SECURITY_PROTOCOLS)}")
        if self.sasl:
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise ValueError(f"KafkaConfig.sasl_mechanism {self.sasl_mechanism!r}: use one of "
                                 f"{', '.join(SASL_MECHANISMS)}")
            if not self.sasl_username or self.sasl_password is None:
                raise ValueError(f"security protocol {self.security_protocol} needs a SASL username and password "
                                 f"({ENV_PREFIX}SASL_USERNAME, {ENV_PREFIX}SASL_PASSWORD[_FILE])")
        if not self.client_id:
            raise ValueError("KafkaConfig.client_id is empty")
        for name in ("partitions", "frame_records", "queue_max_messages", "queue_max_kbytes",
                     "delivery_timeout_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"KafkaConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.linger_ms < 0:
            raise ValueError(f"KafkaConfig.linger_ms must be >= 0, got {self.linger_ms}")
        if not self.bootstrap:
            raise ValueError("KafkaConfig.bootstrap is empty")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> "KafkaConfig":
        """Defaults, then ``EROICA_KAFKA_*`` variables, then explicit overrides (e.g. from a CLI flag).

        A malformed number names its variable instead of failing deep inside librdkafka.
        """
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        types = {f.name: f.type for f in fields(cls)}
        password_file = env.get(ENV_PREFIX + "SASL_PASSWORD_FILE")
        if password_file and not env.get(ENV_PREFIX + "SASL_PASSWORD"):
            try:
                with open(password_file, encoding="utf-8") as f:
                    values["sasl_password"] = f.read().rstrip("\r\n")
            except OSError as exc:
                raise ValueError(f"{ENV_PREFIX}SASL_PASSWORD_FILE={password_file!r}: {exc.strerror}") from None
        for name, suffix in _ENV_NAMES.items():
            raw = env.get(ENV_PREFIX + suffix)
            if (raw is None or raw == "") and name in LEGACY_TOPICS:
                old = ENV_PREFIX + LEGACY_TOPICS[name][0]
                raw = env.get(old)
                if raw:
                    log.warning("%s is the former name of %s%s (issue 14): read as such; rename it", old,
                                ENV_PREFIX, suffix)
            if raw is None or raw == "":
                continue
            if types[name] in ("bool", bool):
                text = raw.strip().lower()
                if text not in ("1", "0", "on", "off", "true", "false", "yes", "no"):
                    raise ValueError(f"{ENV_PREFIX}{suffix}={raw!r}: use on or off")
                values[name] = text in ("1", "on", "true", "yes")
            elif types[name] in ("int", int):
                try:
                    values[name] = int(raw)
                except ValueError:
                    raise ValueError(f"{ENV_PREFIX}{suffix}={raw!r} is not an integer") from None
            else:
                values[name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]

    @property
    def summaries_topic(self) -> str:
        """Former name of :attr:`digests_topic` (kept for callers not yet renamed)."""
        return self.digests_topic

    @property
    def patterns_topic(self) -> str:
        """Former name of :attr:`window_summaries_topic` (kept for callers not yet renamed)."""
        return self.window_summaries_topic

    def legacy_topic_names(self) -> dict[str, str]:
        """Configured name -> the name the same topic had before issue 14, for topics whose name changed.

        A prefixed name (:meth:`with_topic_prefix`) maps to the old name with
        the same prefix; a name set by hand to anything else has no former name.
        """
        out = {}
        for name, (_suffix, old) in LEGACY_TOPICS.items():
            new_default = next(f.default for f in fields(self) if f.name == name)
            current = getattr(self, name)
            if isinstance(new_default, str) and current.endswith(new_default):
                out[current] = current[: len(current) - len(new_default)] + old
        return out

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("sasl_")

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("ssl", "sasl_ssl")

    def with_topic_prefix(self, prefix: str) -> "KafkaConfig":
        """The same config with every topic renamed ``<prefix>.<topic>`` (tests, side-by-side runs)."""
        return replace(self, **{k: f"{prefix}.{getattr(self, k)}" for k in self.topic_fields()})

    @staticmethod
    def topic_fields() -> tuple[str, ...]:
        return ("raw_topic", "ingest_topic", "deadletter_topic", "digests_topic", "verdicts_topic",
                "window_summaries_topic")

    def topics(self) -> dict[str, int]:
        """Every topic with its partition count, for ``create_topics``."""
        return {getattr(self, k): self.partitions for k in self.topic_fields()}
