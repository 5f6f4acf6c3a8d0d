"""Pipeline health metrics: bounded labels, the exposition, scraping back, and `eroica status` reading them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eroica.runtime import metrics
from eroica.stack import health


def test_reason_labels_are_normalised_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_reasons", set())
    a = metrics.reason_label("Expected `int`, got `str` - at `$.rank`")
    b = metrics.reason_label("Expected `int`, got `str` - at `$.step`")
    assert a == b == "expected _, got _ - at _"
    assert metrics.reason_label("invalid JSON: unexpected character at byte 17\nmore") == \
        "invalid json: unexpected character at byte _"
    for i in range(100):
        metrics.reason_label(f"reason {chr(97 + i % 26)}{chr(97 + i // 26)}")
    assert len(metrics._reasons) == metrics._MAX_REASONS
    assert metrics.reason_label("a brand new reason") == "other"


def test_exposition_scrape_and_summary(tmp_path: Path) -> None:
    server = metrics.MetricsServer("test", "127.0.0.1", 0)
    try:
        metrics.records_in("test", "eroica.verdicts", 5)
        metrics.records_out("test", "verdicts", 3)
        metrics.invalid("test", "empty message")
        metrics.sink_insert("test", 0.02)
        metrics.sink_insert_failure("test")
        metrics.queue_drop("test", 2)
        metrics.records_dropped("test", "repeated", 4)
        metrics.records_dropped("test", "late", 0)  # nothing dropped: no series made
        samples = metrics.scrape(server.url)
        assert samples["eroica_records_dropped_total{component=test,reason=repeated}"] == 4
        assert "eroica_records_dropped_total{component=test,reason=late}" not in samples
        assert samples["eroica_records_in_total{component=test,source=eroica.verdicts}"] >= 5
        assert samples["eroica_invalid_records_total{component=test,reason=empty message}"] >= 1
        line = metrics.summarise(samples)
        assert line.startswith("in ") and "invalid" in line and "insert failures" in line and "queue drops" in line
        assert "repeated " in line
        server.announce(tmp_path)
        ann = metrics.read_announcement(tmp_path)
        assert ann is not None and ann["pid"] == os.getpid() and ann["url"] == server.url
    finally:
        server.stop()
    assert metrics.read_announcement(tmp_path) is None       # removed with the server
    assert metrics.scrape_summary(server.url).startswith("metrics unreachable")


def test_port_from_the_environment() -> None:
    assert metrics.metrics_port({}) == 0
    assert metrics.metrics_port({"EROICA_METRICS_PORT": "off"}) is None
    assert metrics.metrics_port({"EROICA_METRICS_PORT": "9464"}) == 9464
    with pytest.raises(ValueError):
        metrics.metrics_port({"EROICA_METRICS_PORT": "lots"})


def test_status_summarises_the_metrics_a_service_announces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "_broker", lambda bootstrap: health.Check("kafka", True, "stub"))
    monkeypatch.setattr(health, "_clickhouse", lambda state: health.Check("clickhouse", True, "stub"))
    server = metrics.MetricsServer("sink", "127.0.0.1", 0)
    try:
        metrics.records_in("sink", "eroica.verdicts", 7)
        server.announce(tmp_path / "sink")
        state = {"version": 1, "pid": os.getpid(), "data_dir": str(tmp_path), "kafka": {"bootstrap": "x:1"},
                 "services": {"sink": {"pid": os.getpid(), "port": server.port, "health_url": server.url,
                                       "state": "running"}}}
        (tmp_path / "stack.json").write_text(json.dumps(state))
        sink = next(c for c in health.check_stack(tmp_path) if c.part == "sink")
        assert sink.ok and f"metrics {server.url}: in " in sink.detail
        # a process outside the stack announcing in the data directory itself gets its own line
        server.component = "alert"
        server.announce(tmp_path)
        extra = health.check_stack(tmp_path)[-1]
        assert extra.part == "alert" and extra.ok and extra.detail.startswith("metrics ")
    finally:
        server.stop()


def test_role_ports_under_a_base() -> None:
    """EROICA_METRICS_PORT_BASE gives each role a fixed port; EROICA_METRICS_PORT still wins."""
    assert [metrics.role_port(9400, n) for n in ("sink", "detector", "alert", "agent", "summariser",
                                                  "summariser-2", "summariser-90")] == \
        [9400, 9401, 9402, 9403, 9410, 9411, 9499]
    assert metrics.role_port(9400, "summariser-91") is None and metrics.role_port(9400, "sink-2") is None
    assert metrics.role_port(9400, "test") is None
    env = {"EROICA_METRICS_PORT_BASE": "9400"}
    assert metrics.metrics_port(env, "detector") == 9401
    assert metrics.metrics_port(env, "test") == 0                       # unknown role: any free port
    assert metrics.metrics_port({**env, "EROICA_METRICS_PORT": "9999"}, "detector") == 9999
    assert metrics.metrics_port({**env, "EROICA_METRICS_PORT": "off"}, "detector") is None
    with pytest.raises(ValueError, match="EROICA_METRICS_PORT_BASE"):
        metrics.metrics_port({"EROICA_METRICS_PORT_BASE": "x"}, "sink")


_FAMILIES_OF = """
import sys
from prometheus_client import REGISTRY
from eroica.runtime import metrics
import eroica.kafka.publisher, eroica.runtime.state  # importers of metrics: they must register nothing
server = metrics.serve(sys.argv[1], 0, announce=False)
metrics.records_in(sys.argv[1], "t", 1)
print(sorted(m.name for m in REGISTRY.collect() if m.name.startswith("eroica_")))
server.stop()
"""


@pytest.mark.parametrize(("role", "families"), [
    ("sink", ["eroica_detection_delay_seconds", "eroica_offset_commits", "eroica_records_in",
              "eroica_sink_insert_failures", "eroica_sink_insert_seconds"]),
    ("alert", ["eroica_alert_delivery_failures", "eroica_alert_delivery_seconds", "eroica_alert_open_incidents",
               "eroica_offset_commits", "eroica_records_in"]),
    ("summariser", ["eroica_records_dropped", "eroica_records_in", "eroica_windows_closed"]),
])
def test_each_process_exports_only_its_own_families(role: str, families: list[str]) -> None:
    """A fresh process serving ``role`` shows its role's families and the ones it used, nothing else."""
    r = subprocess.run([sys.executable, "-c", _FAMILIES_OF, role], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == repr(families)
