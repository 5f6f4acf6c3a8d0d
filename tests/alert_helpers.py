"""Helpers for the alert consumer's tests: a local webhook and a replayed detector.

Not a test module (``tests`` is on sys.path through the root conftest).

- :class:`Webhook`: a stdlib HTTP server on 127.0.0.1 that records every POST
  and can be switched ``down`` (it then answers 503) and back up.
- :func:`detector_windows`: a simulated 16-rank job whose GPU 1 of node-1
  (rank 5) is throttled from step 0 to step 40 of 80, run through the
  detection core in 10 s windows: per window, the verdict messages and the
  window-summary message the streaming detector publishes (same encodings).
- :func:`publish`: send such windows to the test's topics, key = job;
  :func:`publish_job_end`: the detector's job-end marker after them.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec

WINDOW_S = 10


class Webhook:
    """Records POSTs; ``down = True`` makes it answer 503 (a webhook that is away)."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.attempts = 0
        self.down = False
        self._lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with hook._lock:
                    hook.attempts += 1
                    if hook.down:
                        self.send_response(503)
                        self.end_headers()
                        return
                    hook.received.append({"path": self.path, "headers": dict(self.headers),
                                          "body": json.loads(body)})
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/hook"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def events(self) -> list[str]:
        with self._lock:
            return [r["body"]["event"] for r in self.received]

    def ids(self) -> list[str]:
        with self._lock:
            return [r["body"]["notification_id"] for r in self.received]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@dataclass
class Window:
    job: str
    start_ns: int
    end_ns: int
    verdicts: list[bytes] = field(default_factory=list)   # one JSON verdict per message
    patterns: bytes | None = None                         # msgpack list of WindowSummary
    incidents: list[tuple[str, float]] = field(default_factory=list)  # (incident_id, confidence)


@functools.lru_cache(maxsize=2)
def _windows_cached(tmp: str) -> tuple[Window, ...]:
    from eroica.models.reader import read_batches
    from eroica.models.verdict import encode_verdict
    from eroica.producers.simulator import SimConfig, write_jsonl
    from eroica.report.core import run_core

    path = Path(tmp) / "throttle-stops.jsonl"
    cfg = SimConfig(nodes=4, gpus=4, steps=80, faults=["gpu_throttle:rank=5,start=0,end=40"], seed=2)
    write_jsonl(cfg, path, truth_path=False)
    out = []
    enc = msgspec.msgpack.Encoder()
    for w in run_core(read_batches(path), WINDOW_S * 10**9, detected_at_ns=1):
        out.append(Window(w.job, w.start_ns, w.end_ns, [encode_verdict(v) for v in w.verdicts],
                          enc.encode(w.summaries) if w.summaries else None,
                          [(v.incident_id, v.confidence) for v in w.verdicts]))
    return tuple(out)


def detector_windows(tmp_dir: Path) -> list[Window]:
    """The replayed detector output (computed once per directory)."""
    return list(_windows_cached(str(tmp_dir)))


def publish(bootstrap: str, verdicts_topic: str, window_summaries_topic: str, windows: Sequence[Window]) -> None:
    """Each window's verdicts, then its summaries (the detector's order), key = job; flushed."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for w in windows:
        for value in w.verdicts:
            p.produce(verdicts_topic, value, w.job.encode())
        if w.patterns is not None:
            p.produce(window_summaries_topic, w.patterns, w.job.encode())
    left = p.flush(15)
    assert left == 0, f"{left} messages not delivered to the broker"


def publish_job_end(bootstrap: str, verdicts_topic: str, job: str, last_window_start_ns: int) -> None:
    """The detector's job-end marker for ``job`` (models/job_end.py) on the verdict topic, key = job; flushed."""
    from confluent_kafka import Producer

    from eroica.models.job_end import JobEnd, encode_job_end

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    p.produce(verdicts_topic, encode_job_end(JobEnd(job=job, last_window_start_ns=last_window_start_ns)),
              job.encode())
    left = p.flush(15)
    assert left == 0, "the job-end marker was not delivered to the broker"


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets on ``topic`` (partition -> offset; negative = none)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in got}
    finally:
        c.close()
