"""Settings of the stream workers, read once from ``EROICA_*`` environment variables.

Kafka addresses and topic names come from :class:`~eroica.kafka.config.KafkaConfig`
(``EROICA_KAFKA_*``); everything else a worker needs is here:

================================  ====================  =====================================================
variable                          default               meaning
================================  ====================  =====================================================
EROICA_WINDOW_S                   30                    window length, seconds (epoch-aligned, as ``analyze``)
EROICA_LATENESS_S                 = window              how far a key's event time must pass a window's end
                                                        before the window closes (``analyze`` uses one window)
EROICA_MAX_SKEW_S                 = 2 windows           a key lagging the job's most advanced key by more
                                                        than this no longer holds windows open (hung rank)
EROICA_CLOSE_HOLD_S               1                     a window closes this long (wall clock) after the
                                                        watermark passed it (frames of other record types
                                                        sent in the same burst still make it)
EROICA_IDLE_CLOSE_S               5                     a job silent this long (wall clock) on a partition
                                                        has its open windows closed
EROICA_DETECT_GRACE_S             30                    the detector waits at most this long (wall clock,
                                                        from a window's first digest) for missing ranks
EROICA_APP_ID                     eroica-<role>         faust application id = consumer group; workers with
                                                        the same id share partitions (scale-out)
EROICA_DATA_DIR                   ~/.cache/eroica       faust's data directory root (created if missing)
EROICA_WEB_PORT                   0                     faust web server port on 127.0.0.1 (0: a free port,
                                                        ``off``: no web server); serves /eroica/stats
EROICA_SHUTDOWN_TIMEOUT_S         10                    after SIGTERM/SIGINT the worker exits by this deadline
EROICA_LOG_LEVEL                  info                  faust/worker log level (debug, info, warn, error)
EROICA_INGEST                     1                     the summariser worker also runs the ingest agent
EROICA_STATS_INTERVAL_S           30                    period of the counters line in the log (0: never)
EROICA_STATE_STORE                auto                  the detector's job states: ``auto``: a faust Table
                                                        on Apache Kafka (any broker but tansu), the plain
                                                        topic on tansu; ``table`` (a faust Table with its
                                                        changelog; not on tansu) or ``topic`` (a plain topic
                                                        read back to a marker) force one (``state.py``)
================================  ====================  =====================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from eroica.models.frames import DECLARED_LATENESS_NS

if TYPE_CHECKING:
    from eroica.streams.edge import EdgeDigester

ROLES = ("summariser", "detector")

NS = 1_000_000_000


def _float(env: Mapping[str, str], name: str, default: float | None, minimum: float = 0.0) -> float | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r} must be >= {minimum:g}")
    return value


@dataclass(frozen=True)
class WorkerSettings:
    """What a summariser or detector worker needs beyond the Kafka config."""

    window_s: float = 30.0
    lateness_s: float | None = None  # None: one window
    declared_lateness_s: float = DECLARED_LATENESS_NS / NS  # streams whose producers declare watermarks
    max_skew_s: float | None = None  # None: two windows
    close_hold_s: float = 1.0
    idle_close_s: float = 5.0
    detect_grace_s: float = 30.0
    app_id: str | None = None  # None: eroica-<role>
    data_dir: Path = Path.home() / ".cache" / "eroica"
    web_port: int | None = 0  # None: web server off; 0: a free port
    shutdown_timeout_s: float = 10.0
    log_level: str = "info"
    ingest: bool = True
    stats_interval_s: float = 30.0
    state_store: str = "auto"

    def __post_init__(self) -> None:
        if self.window_s < 1.0:
            raise ValueError(f"window must be >= 1 s, got {self.window_s}")
        for name in ("idle_close_s", "detect_grace_s", "shutdown_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.state_store not in ("auto", "table", "topic"):
            raise ValueError(f"EROICA_STATE_STORE must be auto, table or topic, got {self.state_store!r}")
        if self.log_level not in ("debug", "info", "warn", "error", "crit"):
            raise ValueError(f"log level must be debug, info, warn or error, got {self.log_level!r}")

    @property
    def window_ns(self) -> int:
        return int(self.window_s * NS)

    @property
    def lateness_ns(self) -> int:
        return self.window_ns if self.lateness_s is None else int(self.lateness_s * NS)

    @property
    def declared_lateness_ns(self) -> int:
        return int(self.declared_lateness_s * NS)

    @property
    def max_skew_ns(self) -> int:
        return 2 * self.window_ns if self.max_skew_s is None else int(self.max_skew_s * NS)

    def edge_digester(self, source: str, keys: list[str] | None = None, declares: bool = False) -> "EdgeDigester":
        """A node's or rank's edge digester that cuts the windows these workers cut.

        One home for the mapping from the workers' window settings to the
        digester's, so the tracer, the node agent, replay and the bench cannot
        drift from the summariser they stand in for. ``declares``: the source
        declares its watermark (the tracer's and agent's flushes), so a window
        closes ``declared_lateness_ns`` after it is past, as the summariser
        closes a declaring stream's; otherwise every mark is a guess.
        """
        from eroica.streams.edge import EdgeDigester

        return EdgeDigester(source, self.window_ns, self.lateness_ns, self.max_skew_ns, keys=keys,
                            declared_lateness_ns=self.declared_lateness_ns if declares else None)

    def app_id_for(self, role: str) -> str:
        return self.app_id or f"eroica-{role}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> "WorkerSettings":
        """Defaults, then ``EROICA_*`` variables, then explicit overrides (None values ignored).

        A malformed value names its variable.
        """
        env = os.environ if env is None else env
        v: dict[str, object] = {}
        for field, name, minimum in (("window_s", "EROICA_WINDOW_S", 1.0), ("lateness_s", "EROICA_LATENESS_S", 0.0),
                                     ("max_skew_s", "EROICA_MAX_SKEW_S", 0.0),
                                     ("declared_lateness_s", "EROICA_DECLARED_LATENESS_S", 0.0),
                                     ("close_hold_s", "EROICA_CLOSE_HOLD_S", 0.0),
                                     ("idle_close_s", "EROICA_IDLE_CLOSE_S", 0.001),
                                     ("detect_grace_s", "EROICA_DETECT_GRACE_S", 0.001),
                                     ("shutdown_timeout_s", "EROICA_SHUTDOWN_TIMEOUT_S", 0.1),
                                     ("stats_interval_s", "EROICA_STATS_INTERVAL_S", 0.0)):
            value = _float(env, name, None, minimum)
            if value is not None:
                v[field] = value
        if env.get("EROICA_APP_ID"):
            v["app_id"] = env["EROICA_APP_ID"]
        if env.get("EROICA_DATA_DIR"):
            v["data_dir"] = Path(env["EROICA_DATA_DIR"]).expanduser()
        port = env.get("EROICA_WEB_PORT", "")
        if port.lower() in ("off", "none", "no", "false"):
            v["web_port"] = None
        elif port:
            try:
                v["web_port"] = int(port)
            except ValueError:
                raise ValueError(f"EROICA_WEB_PORT={port!r} is neither a port number nor 'off'") from None
            if not 0 <= int(port) <= 65535:
                raise ValueError(f"EROICA_WEB_PORT={port!r} is not a port number")
        if env.get("EROICA_LOG_LEVEL"):
            level = env["EROICA_LOG_LEVEL"].lower()
            v["log_level"] = {"warning": "warn", "critical": "crit"}.get(level, level)
        if env.get("EROICA_STATE_STORE"):
            v["state_store"] = env["EROICA_STATE_STORE"].strip().lower()
        ingest = env.get("EROICA_INGEST", "")
        if ingest:
            v["ingest"] = ingest.lower() not in ("0", "false", "no", "off")
        v.update({k: val for k, val in overrides.items() if val is not None})
        return cls(**v)  # type: ignore[arg-type]

    def with_(self, **changes: object) -> "WorkerSettings":
        return replace(self, **changes)  # type: ignore[arg-type]


def edge_digester_factory(env: Mapping[str, str] | None = None,
                          declares: bool = False) -> Callable[[str], "EdgeDigester"]:
    """A replay's node digester factory (``source`` -> digester) with the windows the stack's workers read from
    ``env`` (default: this process's environment).

    The one construction behind ``eroica replay --edge-digests`` and ``eroica
    bench live --edge-digests``, so the bench measures the digest mode users
    run. ``declares``: the digesters accept the marks the replay declares
    (``replay_digests(declare_watermarks=True)``), as the tracer's and the
    agent's do, and close a window the declared lateness after it is past;
    otherwise they guess their marks and close one lateness after them. A
    malformed variable is a ValueError that names it.
    """
    settings = WorkerSettings.from_env(env)

    def make(source: str) -> "EdgeDigester":
        return settings.edge_digester(source, declares=declares)
    return make
