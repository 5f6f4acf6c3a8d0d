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

Every request but ``/health`` needs the endpoint's token (``Authorization:
Bearer <token>``): random, kept in a file only its owner may read (mode 0600),
``eroica-sink.token`` in the sink's data directory (``DATA_DIR/sink`` in a
stack started by ``eroica up``; the chdb directory for a bare ``eroica sink``;
``EROICA_SINK_TOKEN_FILE`` overrides). The announcement names the file
(``"token_file"``), so a client finds the token where it finds the endpoint.
The token stays the same across restarts of the sink while the file lasts.

:class:`EndpointClient` is the matching client (stdlib urllib, JSON).
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
from eroica.models.verdict import Verdict
from eroica.runtime.system import atomic_write_json, pid_alive

from .client import ClickHouseError, ClickHouseUnavailableError, QueryResult
from .readonly import ReadOnlySQLError

__all__ = [
    "ENDPOINT_FILE", "TOKEN_FILE", "EndpointClient", "EndpointError", "write_endpoint_file", "read_endpoint_file",
    "remove_endpoint_file", "ensure_token_file", "read_token_file",
    "MAX_REPLY_BYTES",
]

ENDPOINT_FILE = "eroica-sink.json"
TOKEN_FILE = "eroica-sink.token"
# The largest reply either side accepts (the report reads up to 2M summary rows through it).
MAX_REPLY_BYTES = 256 << 20
_TOKEN_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_verdicts = msgspec.json.Decoder(list[Verdict])


class EndpointError(ClickHouseUnavailableError):
    """The endpoint did not answer (process gone, port closed, timeout)."""


def _valid_token(text: str) -> bool:
    return 32 <= len(text) <= 256 and set(text) <= _TOKEN_CHARS


def read_token_file(path: str | Path | None) -> str | None:
    """The token in ``path``, or None when absent or unreadable."""
    if not path:
        return None
    try:
        text = Path(path).read_text().strip()
    except (OSError, ValueError):
        return None
    return text if _valid_token(text) else None


def ensure_token_file(path: str | Path) -> str:
    """The endpoint's token: the one in ``path`` when it is ours and private (0600), else a new one there.

    Written atomically with mode 0600 from the start (never world-readable, even briefly).
    """
    path = Path(path)
    try:
        st = path.lstat()
        if (stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077):
            token = read_token_file(path)
            if token is not None:
                return token
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return token


def write_endpoint_file(chdb_dir: str | Path, url: str, target: str, token_file: str | Path | None = None) -> Path:
    path = Path(chdb_dir) / ENDPOINT_FILE
    doc: dict[str, Any] = {"version": 1, "pid": os.getpid(), "url": url, "clickhouse": target,
                           "started_at_ns": time.time_ns()}
    if token_file is not None:
        doc["token_file"] = str(Path(token_file).resolve())
    atomic_write_json(path, doc)
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
    """Read-only queries against a sink worker's HTTP endpoint (``token``: its token, see the module doc)."""

    def __init__(self, url: str, timeout_s: float = 30.0, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.token = token
        self.target = f"sink endpoint {self.url}"

    def _call(self, path: str, body: bytes | None = None) -> Any:
        headers = {"Content-Type": "text/plain; charset=utf-8"} if body else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=body, method="POST" if body is not None else "GET",
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read(MAX_REPLY_BYTES + 1)
                if len(raw) > MAX_REPLY_BYTES:
                    raise ClickHouseError(f"{self.target}: reply over {MAX_REPLY_BYTES} bytes")
                return json.loads(raw)
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read(65536)).get("error", "")
            except (ValueError, AttributeError, OSError):
                detail = exc.reason
            if exc.code == 401:
                raise ClickHouseError(f"{self.target}: HTTP 401: {detail} (the token is in "
                                      f"{TOKEN_FILE} in the sink's data directory)") from None
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
