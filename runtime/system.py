"""Operating-system helpers every Eroica process shares (standard library only).

Whether a pid is alive, a free loopback port, and a JSON file written so that
readers never see half of it: the stack's state file, the sink's endpoint
announcement and the metrics announcement all use them.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_json", "free_port", "pid_alive"]


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
    try:  # a zombie (exited, not yet reaped) is not alive for our purposes
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return True


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
