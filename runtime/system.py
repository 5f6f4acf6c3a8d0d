"""Operating-system helpers every Eroica process shares (standard library only).

Whether a pid is alive, what ``/proc`` says of a process (its command line,
CPU time and memory: the one place that parses ``/proc/<pid>/stat`` and
``status``), a free loopback port, a JSON file written so that readers never
see half of it (the stack's state file, the sink's endpoint announcement and
the metrics announcement all use them), and the garbage collector's settings
for processes that hold columnar windows. Host-wide counters (``/proc/stat``,
``loadavg``, ``meminfo`` under a configurable root) are the node agent's:
:mod:`eroica.producers.counters.host`.
"""

from __future__ import annotations

import gc
import json
import os
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

__all__ = ["atomic_write_json", "cmdline", "columnar_gc", "columnar_gc_during", "cpu_seconds", "free_port",
           "pid_alive", "status_kib"]


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (zombies count as gone)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat_fields(pid)  # a zombie (exited, not yet reaped) is not alive for our purposes
    return not fields or fields[0] != b"Z"


def _stat_fields(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` after the command name (which may hold spaces and parentheses): state first."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()
    except (OSError, ValueError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time the process has used so far (all its threads); None when unreadable."""
    fields = _stat_fields(pid)  # utime and stime: the 14th and 15th fields, in clock ticks
    if fields is None or len(fields) < 13:
        return None
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except ValueError:
        return None


def status_kib(pid: int, key: str) -> int | None:
    """A ``kB`` line of ``/proc/<pid>/status`` (``VmRSS``: resident now, ``VmHWM``: peak); None when absent."""
    try:
        with open(f"/proc/{int(pid)}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def cmdline(pid: int) -> bytes | None:
    """The process's arguments, NUL-separated as ``/proc/<pid>/cmdline`` holds them; None when gone."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            return f.read()
    except (OSError, ValueError):
        return None


def atomic_write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write JSON so that readers never see half a file (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")  # insertion order: services in pipeline order
    os.replace(tmp, path)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (another process may still take it: we retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# Container allocations between young collections, and young collections between
# full ones. A summariser or `eroica analyze` holds a window's frames, columns and
# digest rows (tens of thousands of containers, lists of a million elements): with
# CPython's defaults (700, 10, 10) the collector's older passes rescan them again and
# again (measured: up to a third of a worker's time; 0.09 of 1.2 CPU-s of a
# 1,024-rank `analyze`) while almost nothing they hold is cyclic garbage. Young
# collections stay frequent enough that a real cycle is still freed within a window.
COLUMNAR_GC_THRESHOLDS = (10_000, 20, 1_000)


def columnar_gc() -> None:
    """Freeze what the process has built so far (imports, settings) and collect the rest less often.

    Called once at the start of every process whose work is columnar windows
    (the stream workers, ``eroica analyze``, the throughput bench, so it
    measures stages as they run in production).
    """
    gc.freeze()
    gc.set_threshold(*COLUMNAR_GC_THRESHOLDS)


@contextmanager
def columnar_gc_during() -> Iterator[None]:
    """:func:`columnar_gc` for one block, the previous settings after it.

    For work that may run inside a longer process (``eroica analyze`` and the
    bench are also called in-process by tests and notebooks): what was frozen
    is collectable again afterwards.
    """
    before = gc.get_threshold()
    columnar_gc()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
