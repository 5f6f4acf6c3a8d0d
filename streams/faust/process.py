"""Run ``eroica worker ROLE`` as a child process (tests, the benchmark, supervisors).

:func:`worker_env` turns a :class:`~eroica.kafka.config.KafkaConfig`
and settings into the environment the worker reads; :class:`WorkerProcess`
starts it in its own session with a fixed web port, waits until it holds
partitions (``/eroica/stats``), and stops it with SIGTERM and a deadline (then
SIGKILL), or kills it outright.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Mapping

from eroica.kafka.config import _ENV_NAMES, ENV_PREFIX, KafkaConfig
from eroica.runtime import system


def worker_env(config: KafkaConfig, base: Mapping[str, str] | None = None, **settings: object) -> dict[str, str]:
    """Environment for a worker: every ``EROICA_KAFKA_*`` of ``config`` plus ``EROICA_<NAME>`` settings.

    ``worker_env(cfg, window_s=10, app_id="x")`` sets ``EROICA_WINDOW_S=10`` and ``EROICA_APP_ID=x``.
    """
    env = dict(os.environ if base is None else base)
    for field, suffix in _ENV_NAMES.items():
        env[ENV_PREFIX + suffix] = str(getattr(config, field))
    for name, value in settings.items():
        if value is not None:
            env[f"EROICA_{name.upper()}"] = str(value)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class WorkerProcess:
    """One ``python -m eroica.streams.faust ROLE`` child (``eroica worker ROLE``, no options), its log file and web port."""

    def __init__(self, role: str, env: Mapping[str, str], log_path: Path, web_port: int | None = None) -> None:
        from eroica.runtime.system import free_port

        self.role = role
        self.port = web_port or free_port()
        self.env = dict(env)
        self.env["EROICA_WEB_PORT"] = str(self.port)
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> "WorkerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "eroica.streams.faust", self.role], env=self.env,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stats(self, timeout_s: float = 1.0) -> dict | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/eroica/stats", timeout=timeout_s) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def wait_ready(self, timeout_s: float = 60.0) -> dict:
        """Until the worker holds partitions of its input topic; RuntimeError (with the log tail) otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.role} exited with {self.proc.returncode}:\n{self.log_tail()}")
            s = self.stats()
            if s and s.get("assigned"):
                return s
            time.sleep(0.2)
        raise RuntimeError(f"{self.role} not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

    def peak_rss_mb(self) -> float | None:
        """Peak resident memory of the running worker (VmHWM), MiB."""
        kib = system.status_kib(self.proc.pid, "VmHWM") if self.proc is not None else None
        return None if kib is None else kib / 1024

    def cpu_seconds(self) -> float | None:
        """User + system CPU time the worker has used so far (all its threads)."""
        return system.cpu_seconds(self.proc.pid) if self.proc is not None else None

    def kill(self) -> None:
        """SIGKILL, no goodbye (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 15.0) -> tuple[int | None, float]:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL; returns (exit status, seconds it took)."""
        if self.proc is None:
            return None, 0.0
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode, time.monotonic() - t0

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"
