"""Configuration of the sink worker: which topics it drains, how it batches, where it answers.

The worker is the Kafka -> ClickHouse half of the sink (Vector's grain: config,
a consume loop, pure shaping, I/O with retries). Where ClickHouse is comes from
:class:`~eroica.sinks.clickhouse.config.ClickHouseConfig` (``EROICA_CLICKHOUSE_*``),
where Kafka is and the shared topic names from
:class:`~eroica.kafka.config.KafkaConfig` (``EROICA_KAFKA_*``, of
which the worker uses BOOTSTRAP, TOPIC_VERDICTS, TOPIC_WINDOW_SUMMARIES, TOPIC_DEADLETTER
and PARTITIONS for the topics it creates when missing). The worker's own
variables:

====================================  ==================  ===============================================
variable                              default             meaning
====================================  ==================  ===============================================
EROICA_SINK_GROUP                     eroica-sink         consumer group id (one group per sink deployment)
EROICA_SINK_FLUSH_MS                  500                 insert a non-empty batch at least this often
EROICA_SINK_HTTP_PORT                 auto                query endpoint on 127.0.0.1: a port, 0 = any free
                                                          port, ``off``; ``auto`` = any free port on chdb
                                                          (the only way other processes can read it), off
                                                          on a server (query the server itself)
EROICA_SINK_SESSION_TIMEOUT_MS        6000                consumer group session timeout (a dead sink's
                                                          partitions move after this long)
EROICA_SINK_TOKEN_FILE                see right           the query endpoint's token (0600 file; see
                                                          endpoint.py): default ``eroica-sink.token`` in
                                                          ``$EROICA_DATA_DIR``, else in the chdb directory
EROICA_SINK_STUCK_S                   20                  ``/health`` says ``degraded`` when an insert has
                                                          run this long, or messages have waited this long
                                                          without a successful insert (frozen ClickHouse)
====================================  ==================  ===============================================

A batch is also inserted as soon as it holds ``EROICA_CLICKHOUSE_BATCH_SIZE``
rows. The per-operation retry policy (``EROICA_CLICKHOUSE_RETRY_*``) is not
used as is: a worker never gives up on a batch, it retries it for as long as
it runs, with the policy's backoff (``initial_s`` doubling up to ``max_s``),
and commits nothing meanwhile.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from eroica.kafka.config import KafkaConfig

from .config import ClickHouseConfig

__all__ = ["SinkWorkerConfig", "ENV_VARS", "DEFAULT_GROUP"]

DEFAULT_GROUP = "eroica-sink"

# Every variable this module reads (tests/test_compose.py checks deployments against it).
ENV_VARS: tuple[str, ...] = (
    "EROICA_SINK_GROUP", "EROICA_SINK_FLUSH_MS", "EROICA_SINK_HTTP_PORT",
    "EROICA_SINK_SESSION_TIMEOUT_MS", "EROICA_SINK_TOKEN_FILE", "EROICA_SINK_STUCK_S",
)


def _parse_http_port(raw: str, backend: str) -> int | None:
    """``auto``/``off``/a port number -> a port (0 = any free one) or None (no endpoint)."""
    value = raw.strip().lower()
    if value in ("", "auto"):
        return 0 if backend == "chdb" else None
    if value in ("off", "none", "-1"):
        return None
    try:
        port = int(value)
    except ValueError:
        raise ValueError(f"EROICA_SINK_HTTP_PORT={raw!r}: use a port number, 0, 'auto' or 'off'") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"EROICA_SINK_HTTP_PORT={raw!r}: port out of range")
    return port


@dataclass(frozen=True)
class SinkWorkerConfig:
    """Everything one sink worker needs; build it with :meth:`from_env`."""

    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    clickhouse: ClickHouseConfig = field(default_factory=ClickHouseConfig)
    group_id: str = DEFAULT_GROUP
    flush_interval_s: float = 0.5
    http_port: int | None = None  # None: no endpoint; 0: any free port
    # tansu's JoinGroup waits half the session timeout (streaming-notes); 6 s is
    # also real Kafka's group.min.session.timeout.ms, so it works on both.
    session_timeout_ms: int = 6000
    max_poll_messages: int = 1000
    # How long SIGTERM may spend inserting the last batch before giving up
    # (uncommitted, so nothing is lost: the next start reads it again).
    shutdown_timeout_s: float = 10.0
    create_topics: bool = True
    # The query endpoint's token file; None: the worker picks (see the module doc).
    token_file: str | None = None
    # /health turns "degraded" when storing is stuck this long (see the module doc).
    stuck_after_s: float = 20.0

    def __post_init__(self) -> None:
        if self.flush_interval_s <= 0:
            raise ValueError("flush interval must be > 0")
        if self.stuck_after_s <= 0:
            raise ValueError("stuck_after_s must be > 0")
        if not self.group_id:
            raise ValueError("consumer group id is empty")
        if self.max_poll_messages < 1:
            raise ValueError("max_poll_messages must be >= 1")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, bootstrap: str | None = None,
                 clickhouse_url: str | None = None, http_port: int | None | str = "env",
                 **overrides: object) -> SinkWorkerConfig:
        """Defaults, then environment, then explicit arguments (CLI flags) win.

        ``http_port="env"`` means: take it from ``EROICA_SINK_HTTP_PORT``.
        """
        env = os.environ if environ is None else environ
        kafka = KafkaConfig.from_env(env, bootstrap=bootstrap)
        if clickhouse_url:
            env = {**env, "EROICA_CLICKHOUSE_URL": clickhouse_url}
        clickhouse = ClickHouseConfig.from_env(env)
        kw: dict[str, object] = {"kafka": kafka, "clickhouse": clickhouse}
        if env.get("EROICA_SINK_GROUP"):
            kw["group_id"] = env["EROICA_SINK_GROUP"]
        if env.get("EROICA_SINK_FLUSH_MS"):
            try:
                kw["flush_interval_s"] = float(env["EROICA_SINK_FLUSH_MS"]) / 1000.0
            except ValueError:
                raise ValueError(f"EROICA_SINK_FLUSH_MS={env['EROICA_SINK_FLUSH_MS']!r} is not a number") from None
        if env.get("EROICA_SINK_SESSION_TIMEOUT_MS"):
            try:
                kw["session_timeout_ms"] = int(env["EROICA_SINK_SESSION_TIMEOUT_MS"])
            except ValueError:
                raise ValueError("EROICA_SINK_SESSION_TIMEOUT_MS="
                                 f"{env['EROICA_SINK_SESSION_TIMEOUT_MS']!r} is not an integer") from None
        if env.get("EROICA_SINK_STUCK_S"):
            try:
                kw["stuck_after_s"] = float(env["EROICA_SINK_STUCK_S"])
            except ValueError:
                raise ValueError(f"EROICA_SINK_STUCK_S={env['EROICA_SINK_STUCK_S']!r} is not a number") from None
        if env.get("EROICA_SINK_TOKEN_FILE"):
            kw["token_file"] = env["EROICA_SINK_TOKEN_FILE"]
        elif env.get("EROICA_DATA_DIR"):
            from .endpoint import TOKEN_FILE

            kw["token_file"] = os.path.join(env["EROICA_DATA_DIR"], TOKEN_FILE)
        if http_port == "env":
            kw["http_port"] = _parse_http_port(env.get("EROICA_SINK_HTTP_PORT", ""), clickhouse.backend)
        elif isinstance(http_port, str):
            kw["http_port"] = _parse_http_port(http_port, clickhouse.backend)
        else:
            kw["http_port"] = http_port
        kw.update(overrides)
        return cls(**kw)  # type: ignore[arg-type]

    def replace(self, **changes: object) -> SinkWorkerConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def window_summaries_topic(self) -> str:
        return self.kafka.window_summaries_topic

    @property
    def topics(self) -> tuple[str, str]:
        """The topics the worker consumes: verdicts and window summaries."""
        return (self.kafka.verdicts_topic, self.kafka.window_summaries_topic)
