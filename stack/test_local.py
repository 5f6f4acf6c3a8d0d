"""LocalStack's process handling: deadline then SIGKILL, process groups, restarts, no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from eroica.runtime.system import pid_alive
from eroica.stack.local import LocalStack, Service
from eroica.stack.tansu import TansuBroker

PY = sys.executable


def _service(tmp_path: Path, name: str, code: str) -> Service:
    return Service(name, [PY, "-c", code], dict(os.environ), 0, "", tmp_path / f"{name}.log")


def _wait_log(svc: Service, text: str, timeout_s: float = 10.0) -> str:
    """The first log line starting with ``text`` (the header line quotes the code, so match whole lines)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [ln for ln in svc.log_path.read_text().splitlines() if ln.startswith(text)]
        if lines:
            return lines[0]
        assert time.monotonic() < deadline, f"{svc.name} never logged {text!r}: {svc.log_tail()}"
        time.sleep(0.02)


def test_stop_kills_what_ignores_sigterm_and_what_a_child_left_behind(tmp_path: Path) -> None:
    events: list[str] = []
    stack = LocalStack(tmp_path, stop_timeout_s=0.5, on_event=events.append)
    stubborn = _service(tmp_path, "stubborn", "import signal, time\n"
                        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)")
    # exits on SIGTERM but leaves a grandchild (same process group) behind
    parent = _service(tmp_path, "parent", "import subprocess, sys, time\n"
                      "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
                      "print('grandchild', p.pid, flush=True)\ntime.sleep(60)")
    for svc in (stubborn, parent):
        svc.start()
        stack.services[svc.name] = svc
    _wait_log(stubborn, "ready")
    grandchild = int(_wait_log(parent, "grandchild ").split()[1])
    t0 = time.monotonic()
    stack.stop()
    assert time.monotonic() - t0 < 5
    assert not pid_alive(stubborn.proc.pid) and not pid_alive(parent.proc.pid)
    time.sleep(0.2)
    assert not pid_alive(grandchild)
    assert any("stubborn" in e and "killed" in e for e in events)
    assert all(s.state == "stopped" for s in stack.services.values())


def test_a_crashing_child_is_restarted_then_given_up(tmp_path: Path) -> None:
    events: list[str] = []
    stack = LocalStack(tmp_path, max_restarts=1, on_event=events.append)
    svc = _service(tmp_path, "crasher", "import sys; print('boom', flush=True); sys.exit(3)")
    svc.start()
    stack.services["crasher"] = svc
    stack.write_state()
    deadline = time.monotonic() + 15
    while svc.state != "failed" and time.monotonic() < deadline:
        stack.supervise_once()
        time.sleep(0.05)
    assert svc.state == "failed" and svc.restarts == 1 and svc.exit_code == 3
    assert any("restarting in 1 s" in e for e in events) and any("not restarted" in e and "boom" in e for e in events)
    assert not stack.healthy
    stack.stop()


def test_children_die_with_a_killed_supervisor(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG: a SIGKILLed supervisor leaves no worker behind."""
    script = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from eroica.stack.local import Service\n"
        f"s = Service('w', [sys.executable, '-c', 'import time; time.sleep(60)'], dict(os.environ), 0, '', "
        f"Path({str(tmp_path / 'w.log')!r}))\n"
        "s.start()\nprint(s.pid, flush=True)\ntime.sleep(60)\n"
    )
    sup = subprocess.Popen([PY, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(sup.stdout.readline())
    assert pid_alive(child)
    sup.send_signal(signal.SIGKILL)
    sup.wait(5)
    deadline = time.monotonic() + 5
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child)


def test_leftovers_of_a_killed_stack_are_stopped_and_nothing_else(tmp_path: Path) -> None:
    from eroica.runtime.state import write_state

    ours = subprocess.Popen([PY, "-c", "import time; time.sleep(60)", "eroica.cli"])
    other = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead.wait()
    try:
        write_state(tmp_path, {"pid": dead.pid, "kafka": {"pid": other.pid},
                               "services": {"sink": {"pid": ours.pid}, "gone": {"pid": None}}})
        events: list[str] = []
        LocalStack(tmp_path, on_event=events.append)._reap_stale()
        assert ours.wait(5) == -signal.SIGKILL
        assert other.poll() is None  # recorded, but not a tansu command line: left alone
        assert not (tmp_path / "stack.json").exists() and any("previous stack" in e for e in events)
    finally:
        for p in (ours, other):
            if p.poll() is None:
                p.kill()
                p.wait()


class _FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _supervise_until(stack: LocalStack, svc: Service, state: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while svc.state != state:
        assert time.monotonic() < deadline, f"{svc.name} never {state}: {svc.state}"
        stack.supervise_once()
        time.sleep(0.02)


def test_restart_budget_is_per_window_with_exponential_backoff(tmp_path: Path) -> None:
    """A child crashing 4+ times over simulated hours keeps being restarted; a fast crash loop is paused."""
    clock = _FakeClock()
    events: list[str] = []
    stack = LocalStack(tmp_path, max_restarts=3, restart_window_s=600, backoff_s=1, backoff_max_s=60,
                       clock=clock, on_event=events.append)
    svc = _service(tmp_path, "crasher", "import sys; sys.exit(3)")
    svc.start(clock())
    stack.services["crasher"] = svc
    # Crashes 11 simulated minutes apart, six times: each one finds its budget full again.
    for i in range(6):
        _supervise_until(stack, svc, "restarting")
        assert svc.restart_at == clock() + 1  # first of its window: the shortest backoff
        clock.t += 1
        stack.supervise_once()
        assert svc.state == "running" and svc.restarts == i + 1
        clock.t += 11 * 60
    assert not any("not restarted" in e for e in events)
    # Now a fast crash loop: backoff 1, 2, 4 s, then the budget is spent until the window moves on.
    delays = []
    for _ in range(3):
        _supervise_until(stack, svc, "restarting")
        delays.append(svc.restart_at - clock())
        clock.t = svc.restart_at
        stack.supervise_once()
        assert svc.state == "running"
    assert delays == [1, 2, 4]
    _supervise_until(stack, svc, "failed")
    assert any("not restarted" in e and "budget is back" in e for e in events)
    back = svc.restart_at
    assert back is not None and back == svc.restart_times[0] + 600
    clock.t = back - 1
    stack.supervise_once()
    assert svc.state == "failed" and not stack.healthy
    clock.t = back
    stack.supervise_once()
    assert svc.state == "running" and svc.restarts == 10
    assert any("restart budget is back" in e for e in events)
    stack.stop()


def test_a_killed_tansu_broker_is_restarted_with_the_sink(tmp_path: Path) -> None:
    """The broker child dies: same port, topics again, the sink restarted, the stack healthy again."""
    import pytest

    pytest.importorskip("chdb")
    from eroica.stack.health import check_stack

    events: list[str] = []
    env = {**os.environ, "EROICA_SINK_SESSION_TIMEOUT_MS": "2000", "EROICA_SINK_FLUSH_MS": "100"}
    env = {k: v for k, v in env.items() if not k.startswith("EROICA_CLICKHOUSE")}
    stack = LocalStack(tmp_path / "stack", workers=(), env=env, backoff_s=0.2, stop_timeout_s=3,
                       on_event=events.append)
    try:
        stack.start(ready_timeout_s=25)
        bootstrap, sink_pid = stack.bootstrap, stack.services["sink"].pid
        assert isinstance(stack.broker, TansuBroker)
        stack.broker._proc.kill()  # type: ignore[union-attr]
        stack.broker._proc.wait()  # type: ignore[union-attr]
        deadline = time.monotonic() + 20
        while stack.broker_restarts == 0 or stack.broker_state != "running":
            assert time.monotonic() < deadline, events
            stack.supervise_once()
            time.sleep(0.1)
        assert stack.bootstrap == bootstrap and stack.broker.running
        assert stack.services["sink"].pid != sink_pid and stack.services["sink"].restarts == 0
        assert any("memory" in e and "lost" in e for e in events), events
        stack.wait_ready(20)
        checks = check_stack(stack.data_dir)
        assert all(c.state == "up" for c in checks), checks
        kafka = next(c for c in checks if c.part == "kafka")
        assert "restarted 1x" in kafka.detail
    finally:
        stack.stop()
