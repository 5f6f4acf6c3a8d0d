"""Status tells the truth under a frozen broker (issue 34, item 6).

A stream worker whose broker is frozen is alive and its ``/eroica/stats`` page
answers, so ``eroica status`` showed it ``up`` ("out 0"). The worker now says on
that page what its broker probe found (``state``/``stuck``/``broker``,
``streams/faust/workers.broker_health``), and status takes a service's own
word that it is degraded (``stack/health.py``):

- ``broker_health`` on probe results: answered -> up; a failed probe, a long
  silence, or no answer ever since start -> degraded with the reason; up again
  with the next answer;
- ``eroica status`` against a stand-in worker page: ``degraded`` with "broker
  not answering for 42 s", exit 1; ``up`` again when the page says so;
- a real worker on a real tansu: SIGSTOP the broker, status shows the worker
  degraded; SIGCONT, up again.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from eroica.cli.main import cli
from eroica.runtime.state import write_state


# --------------------------------------------------------------------------- the worker's side


def test_broker_health_follows_the_probe() -> None:
    from eroica.streams.cores.broker_watch import BrokerWatch
    from eroica.streams.faust.workers import MAX_SILENCE_S, NEVER_ANSWERED_S, broker_health

    w = BrokerWatch(MAX_SILENCE_S)
    # never answered yet: up during start-up, degraded once that has lasted too long
    assert broker_health(w, started=100.0, now=101.0)["state"] == "up"
    late = broker_health(w, started=100.0, now=100.0 + NEVER_ANSWERED_S + 1)
    assert late["state"] == "degraded" and "since the worker started" in late["stuck"][0]
    w.result(True, 200.0)
    ok = broker_health(w, started=100.0, now=200.5)
    assert ok["state"] == "up" and ok["stuck"] == [] and ok["broker"]["answering"] is True
    # the broker freezes: the next probe fails (after its timeout)
    w.result(False, 203.0)
    h = broker_health(w, started=100.0, now=242.0)
    assert h["state"] == "degraded" and h["stuck"] == ["broker not answering for 42 s"], h
    assert h["broker"] == {"answering": False, "last_answer_s": 42.0, "outages": 1}
    # it answers again: up at once
    w.result(True, 243.0)
    assert broker_health(w, started=100.0, now=243.1)["state"] == "up"
    # no probe result at all for longer than MAX_SILENCE_S (the probes themselves held up): degraded too
    silent = broker_health(w, started=100.0, now=243.0 + MAX_SILENCE_S + 5)
    assert silent["state"] == "degraded" and silent["stuck"][0].startswith("broker not answering for ")


# --------------------------------------------------------------------------- what status makes of it


class _Page:
    """A stand-in worker's ``/eroica/stats`` page whose body the test sets."""

    def __init__(self) -> None:
        self.body: dict = {}
        page = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                data = json.dumps(page.body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def page() -> Iterator[_Page]:
    p = _Page()
    yield p
    p.close()


def test_a_service_saying_degraded_is_degraded(page: _Page) -> None:
    from eroica.stack.health import _service

    svc = {"pid": os.getpid(), "port": page.port, "state": "running",
           "health_url": f"http://127.0.0.1:{page.port}/eroica/stats"}
    page.body = {"role": "summariser", "state": "degraded", "stuck": ["broker not answering for 42 s"], "sent": 0}
    got = _service("summariser", svc)
    assert (got.state, got.ok, got.port) == ("degraded", False, page.port)
    assert got.detail.startswith("STUCK: broker not answering for 42 s; alive, port")
    page.body = {"role": "summariser", "state": "up", "stuck": [], "sent": 0}
    assert _service("summariser", svc).state == "up"


def _state(data_dir: Path, bootstrap: str, services: dict, broker_pid: int | None = None) -> None:
    write_state(data_dir, {"pid": os.getpid(), "data_dir": str(data_dir),
                           "kafka": {"bootstrap": bootstrap, "kind": "tansu" if broker_pid else None,
                                     "pid": broker_pid, "state": "running" if broker_pid else "external"},
                           "clickhouse": {"url": f"chdb://{data_dir}/chdb", "backend": "chdb"},
                           "query_endpoint": None, "services": services})


def test_status_shows_a_worker_degraded_while_it_says_its_broker_does_not_answer(
        page: _Page, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eroica.stack import health

    monkeypatch.setattr(health, "_broker", lambda kafka, timeout_s=3.0: health.Check("kafka", True, "stub"))
    monkeypatch.setattr(health, "_clickhouse", lambda state, timeout_s=3.0: health.Check("clickhouse", True, "stub"))
    _state(tmp_path, "127.0.0.1:9", {"summariser": {
        "pid": os.getpid(), "port": page.port, "state": "running",
        "health_url": f"http://127.0.0.1:{page.port}/eroica/stats"}})
    page.body = {"role": "summariser", "sent": 0, "state": "degraded", "stuck": ["broker not answering for 42 s"],
                 "broker": {"answering": False, "last_answer_s": 42.0, "outages": 1}}
    res = CliRunner().invoke(cli, ["status", "--data-dir", str(tmp_path), "--format", "json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.output)
    (worker,) = [c for c in doc["checks"] if c["part"] == "summariser"]
    assert doc["state"] == "degraded" and worker["state"] == "degraded", doc
    assert worker["detail"].startswith("STUCK: broker not answering for 42 s; alive, port"), worker
    table = CliRunner().invoke(cli, ["status", "--data-dir", str(tmp_path)], env={"COLUMNS": "200"})
    assert table.exit_code == 1 and "DEGRADED" in table.output and "broker not answering for 42 s" in table.output
    page.body = {"role": "summariser", "sent": 5, "state": "up", "stuck": []}
    res = CliRunner().invoke(cli, ["status", "--data-dir", str(tmp_path), "--format", "json"])
    assert res.exit_code == 0 and json.loads(res.output)["state"] == "up", res.output


# --------------------------------------------------------------------------- a real worker, a real frozen tansu


def _wait(pred, timeout_s: float, what: str, interval_s: float = 0.25):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(interval_s)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")


def test_status_under_a_frozen_tansu(tmp_path: Path, kafka_names, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGSTOP the broker: the detector is ``degraded`` (broker not answering); SIGCONT: ``up`` again."""
    from eroica.stack import health
    from eroica.stack.tansu import TansuBroker
    from eroica.streams.faust.process import WorkerProcess, worker_env

    monkeypatch.setattr(health, "_clickhouse", lambda state, timeout_s=3.0: health.Check("clickhouse", True, "stub"))
    try:
        broker = TansuBroker(data_dir=tmp_path / "tansu").start()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"tansu did not start: {exc}")
    worker = None
    try:
        config = kafka_names.config(broker.bootstrap)
        worker = WorkerProcess("detector", worker_env(config, app_id=f"{kafka_names.prefix}-det", data_dir=tmp_path / "detector",
                                                      shutdown_timeout_s=3, stats_interval_s=0),
                               tmp_path / "detector.log").start()
        worker.wait_ready(45)
        _wait(lambda: ((worker.stats() or {}).get("broker") or {}).get("answering"), 15, "a first probe answer")
        _state(tmp_path, broker.bootstrap, {"detector": {
            "pid": worker.pid, "port": worker.port, "state": "running",
            "health_url": f"http://127.0.0.1:{worker.port}/eroica/stats"}}, broker_pid=broker._proc.pid)

        def status() -> dict[str, dict]:
            res = CliRunner().invoke(cli, ["status", "--data-dir", str(tmp_path), "--format", "json",
                                           "--timeout", "3"])
            return {c["part"]: c for c in json.loads(res.output)["checks"]}

        assert status()["detector"]["state"] == "up"
        os.kill(broker._proc.pid, signal.SIGSTOP)
        try:
            frozen = _wait(lambda: (s := status())["detector"]["state"] == "degraded" and s, 20,
                           "status to show the detector degraded")
            assert "broker not answering for" in frozen["detector"]["detail"], frozen
            assert frozen["kafka"]["state"] == "down", frozen       # the broker itself does not answer
        finally:
            os.kill(broker._proc.pid, signal.SIGCONT)
        _wait(lambda: status()["detector"]["state"] == "up", 20, "status to show the detector up after SIGCONT")
    finally:
        if worker is not None:
            worker.stop(timeout_s=5)
        broker.stop()
