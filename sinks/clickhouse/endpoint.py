"""How other processes find and ask the process that owns a chdb directory.

chdb serves one data directory per process (see client.py), so while a sink
worker runs on ``chdb:///dir`` nobody else may open ``dir``. The worker
therefore answers read-only queries over HTTP on 127.0.0.1 and announces the
address *inside the directory it owns*, in ``dir/eroica-sink.json``::

    {"version": 1, "pid": 4242, "url": "http://127.0.0.1:43117",
     "clickhouse": "chdb:/abs/dir", "started_at_ns": 1700000000000000000}

Whoever holds only the chdb URL (``eroica sql --clickhouse chdb:///dir``) can
thus find the owner; a file whose pid is gone is stale and ignored (the
directory is then free to open directly).

:class:`EndpointClient` is the matching client (stdlib urllib, JSON).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
from eroica.models.verdict import Verdict

from .client import ClickHouseError, ClickHouseUnavailableError, QueryResult
from .readonly import ReadOnlySQLError

__all__ = [
    "ENDPOINT_FILE", "EndpointClient", "EndpointError", "write_endpoint_file", "read_endpoint_file",
    "remove_endpoint_file", "pid_alive", "atomic_write_json",
]

ENDPOINT_FILE = "eroica-sink.json"
_verdicts = msgspec.json.Decoder(list[Verdict])


class EndpointError(ClickHouseUnavailableError):
    """The endpoint did not answer (process gone, port closed, timeout)."""


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


def write_endpoint_file(chdb_dir: str | Path, url: str, target: str) -> Path:
    path = Path(chdb_dir) / ENDPOINT_FILE
    atomic_write_json(path, {"version": 1, "pid": os.getpid(), "url": url, "clickhouse": target,
                             "started_at_ns": time.time_ns()})
    return path


def read_endpoint_file(chdb_dir: str | Path) -> dict[str, Any] | None:
    """The owner's announcement, or None when absent, unreadable or stale (owner gone)."""
    try:
        doc = json.loads((Path(chdb_dir) / ENDPOINT_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not pid_alive(int(doc.get("pid", 0))) or not doc.get("url"):
        return None
    return doc


def remove_endpoint_file(chdb_dir: str | Path) -> None:
    """Remove our own announcement (never another live process's)."""
    path = Path(chdb_dir) / ENDPOINT_FILE
    try:
        doc = json.loads(path.read_text())
        if int(doc.get("pid", 0)) == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


class EndpointClient:
    """Read-only queries against a sink worker's HTTP endpoint."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.target = f"sink endpoint {self.url}"

    def _call(self, path: str, body: bytes | None = None) -> Any:
        req = urllib.request.Request(self.url + path, data=body, method="POST" if body is not None else "GET",
                                     headers={"Content-Type": "text/plain; charset=utf-8"} if body else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("error", "")
            except (ValueError, AttributeError, OSError):
                detail = exc.reason
            if exc.code == 400 and str(detail).startswith("read-only SQL:"):
                raise ReadOnlySQLError(str(detail).removeprefix("read-only SQL:").strip()) from None
            if exc.code == 503:
                raise ClickHouseUnavailableError(f"{self.target}: {detail}") from None
            raise ClickHouseError(f"{self.target}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EndpointError(f"{self.target} did not answer: {reason}") from None

    def health(self) -> dict[str, Any]:
        return self._call("/health")

    def verdicts(self, job: str | None = None, since_ns: int | None = None, component: str | None = None,
                 limit: int | None = 1000) -> list[Verdict]:
        params = {k: v for k, v in (("job", job), ("since_ns", since_ns), ("component", component),
                                    ("limit", limit)) if v is not None}
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        return msgspec.convert(self._call("/verdicts" + query), list[Verdict])

    def sql(self, sql: str) -> QueryResult:
        doc = self._call("/sql", sql.encode())
        return QueryResult(list(doc["columns"]), list(doc["types"]), [tuple(r) for r in doc["rows"]])
