"""The pipeline's own health: Prometheus metrics of every long-running Eroica process.

One set of metrics, defined here once and shared by every process (the
``component`` label says which part counts): the sink worker, the alert
consumer, and (hooks below) the stream workers and producers. Each process
serves them on ``http://127.0.0.1:PORT/metrics`` (:func:`serve`), and ``eroica
status`` reads them back (:func:`scrape_summary`).

====================================  ==================  ===============================================
variable                              default             meaning
====================================  ==================  ===============================================
EROICA_METRICS_PORT                   0                   port of the exposition: 0 = any free port,
                                                          ``off`` = none
EROICA_METRICS_ADDR                   127.0.0.1           address it listens on (0.0.0.0 in a container
                                                          that Prometheus scrapes from outside)
====================================  ==================  ===============================================

Where the bound address goes: it is logged, and when ``EROICA_DATA_DIR`` is
set (``eroica up`` gives every child its own) it is announced in
``$EROICA_DATA_DIR/metrics.json`` (``{"pid", "url", "component",
"started_at_ns"}``), which is how ``eroica status`` finds each child's
metrics.

Metrics (all names start with ``eroica_``; counters end in ``_total`` on the wire):

======================================  =========  ==========================================================
name                                    labels     what
======================================  =========  ==========================================================
records_in                              component,  records or messages read (source: topic or file)
                                        source
records_out                             component,  rows / messages written (sink: table, topic, webhook)
                                        sink
invalid_records                         component,  records rejected, by a short normalised reason
                                        reason
windows_closed                          component   job windows closed (summarised or analysed)
detection_delay_seconds (histogram)     component   window end -> verdict emitted (event time to wall time)
sink_insert_seconds (histogram)         component   duration of a successful batch INSERT
sink_insert_failures                    component   failed INSERT attempts (each retried)
producer_queue_drops                    component   records dropped because a local producer queue was full
offset_commits                          component   Kafka offset commits after a durable write
alert_notifications                     event,      notifications handled by the alert consumer (outcome:
                                        outcome     delivered, refused, duplicate)
alert_delivery_seconds (histogram)                 duration of an accepted webhook delivery
alert_delivery_failures                 kind       failed webhook attempts (transient: retried; refused)
alert_open_incidents (gauge)                       incidents currently open (notified, not resolved)
======================================  =========  ==========================================================

Hooks for the stream workers and producers (one call each, cheap, no-op
safe): ``records_in("summariser", topic, n)``, ``window_closed("summariser")``,
``detection_delay("detector", seconds)``, ``records_out("detector",
topic, n)``, ``invalid("summariser", reason)``, ``queue_drop("agent", n)``;
and ``serve("summariser")`` once at process start.

Wired: the sink worker (``sinks/clickhouse/worker.py``), the alert consumer
(``sinks/alerts/consumer.py``), the Kafka publisher's queue drops
(``kafka/publisher.py``) and the stream workers:

- ``streams/faust/workers.py``, where a worker process starts: ``serve(role)``;
- ``streams/faust/summariser.py`` ``_on_frame`` (beside ``stats.records += n``):
  ``records_in("summariser", source, n)``; ``_dead``: ``invalid("summariser",
  reason)``; ``_close``: ``window_closed("summariser", len(windows))``;
- ``streams/faust/detector.py`` ``_detect`` (beside ``stats.windows += 1``):
  ``window_closed("detector")``, ``detection_delay("detector", (wall_ns -
  merged.end_ns) / 1e9)``, ``records_out("detector", "verdicts", len(verdicts))``;
- the agent (``producers/agent``): nothing more, its publisher already counts drops.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, generate_latest

__all__ = [
    "serve", "stop_serving", "MetricsServer", "records_in", "records_out", "invalid", "window_closed",
    "detection_delay", "sink_insert", "sink_insert_failure", "queue_drop", "offset_commit", "reason_label",
    "scrape", "scrape_summary", "METRICS_FILE", "ENV_VARS",
]

log = logging.getLogger("eroica.metrics")

ENV_VARS: tuple[str, ...] = ("EROICA_METRICS_PORT", "EROICA_METRICS_ADDR")
METRICS_FILE = "metrics.json"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_DELAY_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
_FAST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

RECORDS_IN = Counter("eroica_records_in", "Records or messages read.", ["component", "source"])
RECORDS_OUT = Counter("eroica_records_out", "Rows or messages written.", ["component", "sink"])
INVALID = Counter("eroica_invalid_records", "Records rejected, by reason.", ["component", "reason"])
WINDOWS_CLOSED = Counter("eroica_windows_closed", "Job windows closed.", ["component"])
DETECTION_DELAY = Histogram("eroica_detection_delay_seconds", "Window end to verdict emitted.", ["component"],
                            buckets=_DELAY_BUCKETS)
SINK_INSERT = Histogram("eroica_sink_insert_seconds", "Duration of a successful batch insert.", ["component"],
                        buckets=_FAST_BUCKETS)
SINK_INSERT_FAILURES = Counter("eroica_sink_insert_failures", "Failed insert attempts (retried).", ["component"])
# Valid records a window did not count: ``late`` (their window had closed) or ``repeated`` (a copy of one
# already in it: an at-least-once producer re-sent it). Either, steadily non-zero, names a producer problem.
RECORDS_DROPPED = Counter("eroica_records_dropped", "Valid records not counted in their window, by reason.",
                          ["component", "reason"])
QUEUE_DROPS = Counter("eroica_producer_queue_drops", "Records dropped on a full producer queue.", ["component"])
OFFSET_COMMITS = Counter("eroica_offset_commits", "Kafka offset commits after a durable write.", ["component"])
ALERT_NOTIFICATIONS = Counter("eroica_alert_notifications", "Alert notifications by event and outcome.",
                              ["event", "outcome"])
ALERT_DELIVERY = Histogram("eroica_alert_delivery_seconds", "Duration of an accepted webhook delivery.",
                           buckets=_FAST_BUCKETS)
ALERT_DELIVERY_FAILURES = Counter("eroica_alert_delivery_failures", "Failed webhook attempts.", ["kind"])
ALERT_OPEN_INCIDENTS = Gauge("eroica_alert_open_incidents", "Incidents open (notified, not resolved).")

# --- hooks -------------------------------------------------------------------------

_MAX_REASONS = 64
_reasons: set[str] = set()
_reasons_lock = threading.Lock()
_NOISE = re.compile(r"(`[^`]*`|'[^']*'|\"[^\"]*\"|0x[0-9a-f]+|\d+(\.\d+)?)", re.I)


def reason_label(reason: str) -> str:
    """A bounded label for a rejection reason: quoted values and numbers removed, 60 chars, 64 distinct.

    ``"Expected `int`, got `str` - at `$.rank`"`` and the same with another
    path count as one reason; past 64 distinct reasons the rest count as ``other``.
    """
    text = _NOISE.sub("_", str(reason).split("\n", 1)[0]).strip().lower()
    text = re.sub(r"\s+", " ", text)[:60] or "unknown"
    with _reasons_lock:
        if text in _reasons:
            return text
        if len(_reasons) >= _MAX_REASONS:
            return "other"
        _reasons.add(text)
        return text


# The labelled children of the per-message counters, looked up once: ``labels()`` builds a key and
# takes a lock (~10 us), once per frame on the summariser's hot path. Labels here are fixed names.
_CHILDREN: dict[tuple[Any, str, str], Any] = {}


def _child(counter: Any, component: str, label: str) -> Any:
    child = _CHILDREN.get((counter, component, label))
    if child is None:
        child = _CHILDREN[(counter, component, label)] = counter.labels(component, label)
    return child


def records_in(component: str, source: str, n: int = 1) -> None:
    _child(RECORDS_IN, component, source).inc(n)


def records_out(component: str, sink: str, n: int = 1) -> None:
    _child(RECORDS_OUT, component, sink).inc(n)


def invalid(component: str, reason: str, n: int = 1) -> None:
    INVALID.labels(component, reason_label(reason)).inc(n)


def records_dropped(component: str, reason: str, n: int = 1) -> None:
    """``reason``: ``late``, ``repeated`` or ``out_of_time`` (see ``RECORDS_DROPPED``)."""
    if n:
        _child(RECORDS_DROPPED, component, reason).inc(n)


def window_closed(component: str, n: int = 1) -> None:
    WINDOWS_CLOSED.labels(component).inc(n)


def detection_delay(component: str, seconds: float) -> None:
    DETECTION_DELAY.labels(component).observe(max(0.0, float(seconds)))


def sink_insert(component: str, seconds: float) -> None:
    SINK_INSERT.labels(component).observe(max(0.0, float(seconds)))


def sink_insert_failure(component: str) -> None:
    SINK_INSERT_FAILURES.labels(component).inc()


def queue_drop(component: str, n: int = 1) -> None:
    QUEUE_DROPS.labels(component).inc(n)


def offset_commit(component: str) -> None:
    OFFSET_COMMITS.labels(component).inc()


# --- exposition --------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    server_version = "eroica-metrics"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404)
            return
        body = generate_latest(REGISTRY)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt: str, *args: Any) -> None:  # scrapes are not worth a log line
        pass


class MetricsServer:
    """The process's exposition server (a daemon thread); ``url`` ends in ``/metrics``."""

    def __init__(self, component: str, addr: str, port: int) -> None:
        self.component = component
        self._httpd = ThreadingHTTPServer((addr, port), _Handler)
        self._httpd.daemon_threads = True
        host, bound = self._httpd.server_address[:2]
        self.port = int(bound)
        self.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{self.port}/metrics"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="eroica-metrics", daemon=True)
        self._thread.start()
        self.announced: Path | None = None

    def announce(self, data_dir: Path) -> None:
        from eroica.runtime.system import atomic_write_json

        path = Path(data_dir) / METRICS_FILE
        atomic_write_json(path, {"version": 1, "pid": os.getpid(), "url": self.url, "component": self.component,
                                 "started_at_ns": time.time_ns()})
        self.announced = path

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self.announced is not None:
            try:
                if json.loads(self.announced.read_text()).get("pid") == os.getpid():
                    self.announced.unlink()
            except (OSError, ValueError):
                pass


_server: MetricsServer | None = None
_server_lock = threading.Lock()


def _port_from_env(env: dict[str, str] | os._Environ) -> int | None:
    raw = str(env.get("EROICA_METRICS_PORT", "")).strip().lower()
    if raw in ("", "auto", "0"):
        return 0
    if raw in ("off", "none", "-1", "false", "no"):
        return None
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"EROICA_METRICS_PORT={raw!r}: use a port number, 0 (any free port) or 'off'") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"EROICA_METRICS_PORT={raw!r}: port out of range")
    return port


def serve(component: str, port: int | None | str = "env", *, addr: str | None = None,
          announce: bool = True) -> MetricsServer | None:
    """Start this process's exposition once (later calls return the same server); None when off.

    ``port="env"``: from ``EROICA_METRICS_PORT`` (default 0 = any free port).
    A port already taken is logged and the process runs without metrics: a
    metrics endpoint must never keep a worker from working.
    """
    global _server
    with _server_lock:
        if _server is not None:
            return _server
        try:
            bound_port = _port_from_env(os.environ) if port == "env" else port
        except ValueError as exc:
            log.warning("%s; metrics off", exc)
            return None
        if bound_port is None:
            return None
        address = addr or os.environ.get("EROICA_METRICS_ADDR") or "127.0.0.1"
        try:
            _server = MetricsServer(component, address, int(bound_port))
        except OSError as exc:
            log.warning("metrics exposition on %s:%s failed (%s); running without it", address, bound_port, exc)
            return None
        data_dir = os.environ.get("EROICA_DATA_DIR")
        if announce and data_dir:
            try:
                _server.announce(Path(data_dir))
            except OSError as exc:
                log.warning("cannot announce the metrics URL in %s: %s", data_dir, exc)
        log.info("%s metrics on %s", component, _server.url)
        return _server


def stop_serving() -> None:
    global _server
    with _server_lock:
        if _server is not None:
            _server.stop()
            _server = None


def read_announcement(data_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((Path(data_dir) / METRICS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("url") else None


# --- reading them back (eroica status) ---------------------------------------------------

def scrape(url: str, timeout_s: float = 1.0) -> dict[str, float]:
    """``{"name{label=value,...}": value}`` of Eroica's samples at ``url`` (raises OSError when down)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            text = resp.read(4 << 20).decode("utf-8", errors="replace")
    except (urllib.error.URLError, ValueError) as exc:
        raise OSError(str(getattr(exc, "reason", exc))) from exc
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("eroica_"):
            continue
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = float(s.value)
    return out


def _total(samples: dict[str, float], name: str, **match: str) -> float:
    total = 0.0
    for key, value in samples.items():
        base, _, labels = key.partition("{")
        if base != name:
            continue
        got = dict(item.split("=", 1) for item in labels.rstrip("}").split(",") if "=" in item)
        if all(got.get(k) == v for k, v in match.items()):
            total += value
    return total


def summarise(samples: dict[str, float]) -> str:
    """One line for ``eroica status``: only what is non-zero (plus records in/out)."""
    parts = [f"in {_total(samples, 'eroica_records_in_total'):,.0f}",
             f"out {_total(samples, 'eroica_records_out_total'):,.0f}"]
    optional = (("invalid", "eroica_invalid_records_total"), ("windows", "eroica_windows_closed_total"),
                ("insert failures", "eroica_sink_insert_failures_total"),
                ("queue drops", "eroica_producer_queue_drops_total"),
                ("late", "eroica_records_dropped_total", {"reason": "late"}),
                ("repeated", "eroica_records_dropped_total", {"reason": "repeated"}),
                ("delivery failures", "eroica_alert_delivery_failures_total"))
    for label, name, *match in optional:
        v = _total(samples, name, **(match[0] if match else {}))
        if v:
            parts.append(f"{label} {v:,.0f}")
    for label, name in (("detection delay", "eroica_detection_delay_seconds"),
                        ("insert", "eroica_sink_insert_seconds")):
        n = _total(samples, f"{name}_count")
        if n:
            mean = _total(samples, f"{name}_sum") / n
            parts.append(f"{label} avg {mean * 1000:.0f} ms" if mean < 1 else f"{label} avg {mean:.1f} s")
    open_incidents = [v for k, v in samples.items() if k.startswith("eroica_alert_open_incidents")]
    if open_incidents:
        parts.append(f"open incidents {sum(open_incidents):.0f}")
    return ", ".join(parts)


def scrape_summary(url: str, timeout_s: float = 1.0) -> str:
    """:func:`summarise` of a live endpoint, or ``"metrics unreachable: why"``."""
    try:
        return summarise(scrape(url, timeout_s))
    except OSError as exc:
        return f"metrics unreachable: {exc}"
