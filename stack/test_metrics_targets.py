"""The stack's metrics ports (fixed under a base, else free; kept across restarts) and its file_sd targets file."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from eroica.runtime.metrics import METRICS_FILE
from eroica.runtime.system import free_port
from eroica.stack import local
from eroica.stack.local import TARGETS_FILE, LocalStack, StackError


def _free_base(span: int = 12) -> int:
    """A base whose ``span`` ports nothing holds now."""
    for _ in range(50):
        base = free_port()
        if base + span < 65535 and all(local._bindable("127.0.0.1", base + i) for i in range(span)):
            return base
    raise AssertionError("no free run of ports")


def _stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: object) -> LocalStack:
    monkeypatch.setattr(local, "worker_command_available", lambda: True)
    now = [0.0]
    stack = LocalStack(tmp_path, summarisers=2, clock=lambda: now[0], on_event=lambda _msg: None,
                       env={k: v for k, v in os.environ.items() if not k.startswith("EROICA_METRICS")},
                       **kw)  # type: ignore[arg-type]
    stack.bootstrap = "127.0.0.1:1"
    for spec in stack._service_specs():
        stack.services[spec.name] = spec
    return stack


def test_fixed_ports_under_a_base_and_the_targets_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = _free_base()
    stack = _stack(tmp_path, monkeypatch, metrics_port_base=base)
    want = {"summariser": base + 10, "summariser-2": base + 11, "detector": base + 1, "sink": base}
    assert {n: s.env["EROICA_METRICS_PORT"] for n, s in stack.services.items()} == \
        {n: str(p) for n, p in want.items()}
    assert {n: s.describe()["metrics_port"] for n, s in stack.services.items()} == want
    stack.write_targets()
    groups = json.loads((tmp_path / TARGETS_FILE).read_text())
    assert groups == [{"targets": [f"127.0.0.1:{want[n]}"], "labels": {"role": n.split("-")[0], "service": n}}
                      for n in ("summariser", "summariser-2", "detector", "sink")]


def test_free_ports_by_default_and_kept_across_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = _stack(tmp_path, monkeypatch)
    ports = [s.metrics_port for s in stack.services.values()]
    web = [s.port for s in stack.services.values()]
    assert all(ports) and len(set(ports) | set(web)) == 2 * len(ports)  # none shared, none with a web port
    # A restarted child runs with the same environment, hence the same metrics port.
    svc = stack.services["sink"]
    svc.argv = [sys.executable, "-c", "import os; print('metrics', os.environ['EROICA_METRICS_PORT'], flush=True)"]
    svc.start(0.0)
    assert svc.proc is not None and svc.proc.wait(10) == 0
    stack._restart_service(svc, 1.0)
    assert svc.proc is not None and svc.proc.wait(10) == 0
    lines = [ln for ln in svc.log_path.read_text().splitlines() if ln.startswith("metrics ")]
    assert lines == [f"metrics {svc.metrics_port}"] * 2


def test_a_taken_fixed_port_stops_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        base = holder.getsockname()[1] - 1  # the detector's port (base + 1) is held
        with pytest.raises(StackError, match=f"metrics port {base + 1} of detector"):
            _stack(tmp_path, monkeypatch, metrics_port_base=base)


def test_a_base_too_high_for_the_summarisers_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="metrics port base"):
        LocalStack(tmp_path, summarisers=30, metrics_port_base=65500)


def test_metrics_off_for_the_whole_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "worker_command_available", lambda: True)
    stack = LocalStack(tmp_path, env={"EROICA_METRICS_PORT": "off"}, on_event=lambda _msg: None)
    specs = stack._service_specs()
    assert {s.env["EROICA_METRICS_PORT"] for s in specs} == {"off"} and not any(s.metrics_port for s in specs)
    stack.services = {s.name: s for s in specs}
    assert stack.targets() == []


def test_an_announced_alert_consumer_joins_the_targets_and_stop_removes_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    stack = _stack(tmp_path, monkeypatch)
    stack.clock = lambda: now[0]
    stack.supervise_once()
    path = tmp_path / TARGETS_FILE
    assert "alert" not in {g["labels"]["role"] for g in json.loads(path.read_text())}
    (tmp_path / METRICS_FILE).write_text(json.dumps({"version": 1, "pid": os.getpid(), "component": "alert",
                                                     "url": "http://127.0.0.1:9402/metrics"}))
    now[0] = 1.0
    stack.supervise_once()  # looked at most every 2 s
    assert "alert" not in {g["labels"]["role"] for g in json.loads(path.read_text())}
    now[0] = 2.5
    stack.supervise_once()
    groups = json.loads(path.read_text())
    assert groups[-1] == {"targets": ["127.0.0.1:9402"], "labels": {"role": "alert", "service": "alert"}}
    stack.stop()
    assert not path.exists()
