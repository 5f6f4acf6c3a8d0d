"""Configuration of the alert consumer (``eroica alert``): defaults, then environment, then flags.

Kafka (bootstrap, the verdict and window-summary topics) comes from
:class:`~eroica.kafka.config.KafkaConfig` (``EROICA_KAFKA_*``). The
consumer's own variables:

====================================  ====================  =============================================
variable                              default               meaning
====================================  ====================  =============================================
EROICA_ALERT_WEBHOOK                  (required)            URL every notification is POSTed to
EROICA_ALERT_FORMAT                   json                  body: json, slack or alertmanager
EROICA_ALERT_MIN_CONFIDENCE           0.7                   an incident opens at its first verdict
                                                            with at least this confidence
EROICA_ALERT_COMPONENTS               (all)                 comma-separated components to alert on
EROICA_ALERT_GROUP                    eroica-alert          consumer group (one per alert deployment)
EROICA_ALERT_REMINDER                 30m                   reminder interval while open (``off``: none)
EROICA_ALERT_RESOLVE_AFTER            3                     windows of the job without a verdict for
                                                            the incident before it resolves
EROICA_ALERT_STALE_AFTER              auto                  wall time without any message for a job
                                                            after which its incidents resolve (auto:
                                                            2 x resolve-after windows, at least 5 min)
EROICA_ALERT_STATE                    DATA_DIR/alerts/      incident state file (JSON, written
                                      GROUP.json            atomically before each offset commit)
EROICA_ALERT_RETRY_MAX_S              30                    longest wait between delivery attempts
EROICA_ALERT_TIMEOUT_S                10                    HTTP timeout of one delivery attempt
EROICA_ALERT_WINDOW_CLOCK             on                    read the window-summary topic as the jobs'
                                                            event-time clock (``off``: verdicts only,
                                                            so a healthy job resolves by wall clock)
EROICA_ALERT_SESSION_TIMEOUT_MS       6000                  consumer group session timeout
EROICA_REPORT_URL_BASE                (none)                where the jobs' report pages are published:
                                                            each notification links to BASE/<job file>
                                                            (links.py; ``eroica report --out-dir``)
====================================  ====================  =============================================
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from eroica.models.verdict import COMPONENTS
from eroica.kafka.config import KafkaConfig
from eroica.runtime.backoff import delay as backoff_delay

from .incidents import TrackerSettings
from .links import check_base
from .payloads import FORMATS

__all__ = ["AlertConfig", "ENV_VARS", "DEFAULT_GROUP", "parse_duration_ns", "default_state_path"]

DEFAULT_GROUP = "eroica-alert"
ENV_VARS: tuple[str, ...] = (
    "EROICA_ALERT_WEBHOOK", "EROICA_ALERT_FORMAT", "EROICA_ALERT_MIN_CONFIDENCE", "EROICA_ALERT_COMPONENTS",
    "EROICA_ALERT_GROUP", "EROICA_ALERT_REMINDER", "EROICA_ALERT_RESOLVE_AFTER", "EROICA_ALERT_STALE_AFTER",
    "EROICA_ALERT_STATE", "EROICA_ALERT_RETRY_MAX_S", "EROICA_ALERT_TIMEOUT_S", "EROICA_ALERT_WINDOW_CLOCK",
    "EROICA_ALERT_SESSION_TIMEOUT_MS", "EROICA_REPORT_URL_BASE",
)

_UNITS = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9, "d": 86400 * 10**9}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration_ns(value: str | float | int, what: str = "duration") -> int:
    """``30m``/``90s``/``1.5h``/``250ms``/a number of seconds -> ns; ``off``/``0``/``none`` -> 0."""
    if isinstance(value, (int, float)):
        return int(float(value) * 10**9)
    text = str(value).strip().lower()
    if text in ("off", "none", "no", "never", ""):
        return 0
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{what} {value!r}: use e.g. 90s, 30m, 1h, 250ms, or 'off'")
    return int(float(m.group(1)) * _UNITS[m.group(2) or "s"])


def default_state_path(group: str) -> Path:
    from eroica.runtime.state import default_data_dir

    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", group) or "alert"
    return default_data_dir() / "alerts" / f"{safe}.json"


def _flag(raw: str, name: str) -> bool:
    text = raw.strip().lower()
    if text in ("1", "on", "true", "yes"):
        return True
    if text in ("0", "off", "false", "no"):
        return False
    raise ValueError(f"{name}={raw!r}: use on or off")


@dataclass(frozen=True)
class AlertConfig:
    webhook: str
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    fmt: str = "json"
    min_confidence: float = 0.7
    components: tuple[str, ...] = ()
    group_id: str = DEFAULT_GROUP
    reminder_ns: int = 30 * 60 * 10**9
    resolve_after: int = 3
    stale_ns: int = 0                   # 0: automatic (TrackerSettings.stale_after)
    state_path: Path | None = None      # None: default_state_path(group_id)
    retry_initial_s: float = 0.5
    retry_max_s: float = 30.0
    timeout_s: float = 10.0
    window_clock: bool = True
    session_timeout_ms: int = 6000
    checkpoint_interval_s: float = 1.0  # commit read offsets at least this often when nothing is sent
    shutdown_timeout_s: float = 10.0
    create_topics: bool = True
    max_poll_messages: int = 500
    report_url_base: str = ""           # "": notifications carry no report link

    def __post_init__(self) -> None:
        if self.report_url_base:
            object.__setattr__(self, "report_url_base", check_base(self.report_url_base))
        if not self.webhook or not re.match(r"^https?://", self.webhook):
            raise ValueError(f"webhook {self.webhook!r}: an http:// or https:// URL is required")
        if self.fmt not in FORMATS:
            raise ValueError(f"format {self.fmt!r}: use one of {', '.join(FORMATS)}")
        if not 0.0 <= self.min_confidence <= 1.0:
            raise ValueError("min confidence must be within 0..1")
        unknown = [c for c in self.components if c not in COMPONENTS]
        if unknown:
            raise ValueError(f"unknown component(s) {', '.join(unknown)}; known: {', '.join(COMPONENTS)}")
        if self.resolve_after < 1:
            raise ValueError("resolve-after must be >= 1 window")
        if self.retry_max_s <= 0 or self.retry_initial_s <= 0 or self.timeout_s <= 0:
            raise ValueError("retry and timeout durations must be > 0")

    @property
    def state_file(self) -> Path:
        return Path(self.state_path) if self.state_path is not None else default_state_path(self.group_id)

    @property
    def topics(self) -> list[str]:
        return [self.kafka.verdicts_topic] + ([self.kafka.window_summaries_topic] if self.window_clock else [])

    def tracker_settings(self) -> TrackerSettings:
        return TrackerSettings(min_confidence=self.min_confidence, components=tuple(self.components),
                               resolve_after=self.resolve_after, reminder_ns=self.reminder_ns,
                               stale_ns=self.stale_ns)

    def backoff(self, failures: int) -> float:
        return backoff_delay(failures, self.retry_initial_s, self.retry_max_s)

    def replace(self, **changes: object) -> AlertConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, bootstrap: str | None = None,
                 **overrides: object) -> AlertConfig:
        """Defaults, then ``EROICA_ALERT_*``, then ``overrides`` (CLI flags; None means not given)."""
        env = os.environ if environ is None else environ
        kw: dict[str, object] = {"kafka": KafkaConfig.from_env(env, bootstrap=bootstrap),
                                 "webhook": env.get("EROICA_ALERT_WEBHOOK", "")}

        def number(name: str, conv: type) -> object | None:
            raw = env.get(name)
            if raw is None or raw.strip() == "":
                return None
            try:
                return conv(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a valid {conv.__name__}") from None

        if env.get("EROICA_ALERT_FORMAT"):
            kw["fmt"] = env["EROICA_ALERT_FORMAT"].strip().lower()
        for name, key, conv in (("EROICA_ALERT_MIN_CONFIDENCE", "min_confidence", float),
                                ("EROICA_ALERT_RESOLVE_AFTER", "resolve_after", int),
                                ("EROICA_ALERT_RETRY_MAX_S", "retry_max_s", float),
                                ("EROICA_ALERT_TIMEOUT_S", "timeout_s", float),
                                ("EROICA_ALERT_SESSION_TIMEOUT_MS", "session_timeout_ms", int)):
            value = number(name, conv)
            if value is not None:
                kw[key] = value
        if env.get("EROICA_ALERT_COMPONENTS"):
            kw["components"] = tuple(c.strip() for c in env["EROICA_ALERT_COMPONENTS"].split(",") if c.strip())
        if env.get("EROICA_ALERT_GROUP"):
            kw["group_id"] = env["EROICA_ALERT_GROUP"]
        if env.get("EROICA_ALERT_REMINDER"):
            kw["reminder_ns"] = parse_duration_ns(env["EROICA_ALERT_REMINDER"], "EROICA_ALERT_REMINDER")
        stale = env.get("EROICA_ALERT_STALE_AFTER", "").strip().lower()
        if stale and stale != "auto":
            kw["stale_ns"] = parse_duration_ns(stale, "EROICA_ALERT_STALE_AFTER")
        if env.get("EROICA_ALERT_STATE"):
            kw["state_path"] = Path(env["EROICA_ALERT_STATE"]).expanduser()
        if env.get("EROICA_REPORT_URL_BASE", "").strip():
            kw["report_url_base"] = env["EROICA_REPORT_URL_BASE"]
        if env.get("EROICA_ALERT_WINDOW_CLOCK"):
            kw["window_clock"] = _flag(env["EROICA_ALERT_WINDOW_CLOCK"], "EROICA_ALERT_WINDOW_CLOCK")
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)  # type: ignore[arg-type]
