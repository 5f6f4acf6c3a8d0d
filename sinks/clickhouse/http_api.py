"""The sink worker's read-only HTTP endpoint (stdlib ``http.server`` in a thread).

Why it exists: on chdb the worker is the only process that may open the data
directory, so ``eroica verdicts``/``eroica sql``/``eroica status`` ask it.
It listens on 127.0.0.1 only and can only read:

- ``GET /health``: ``{"status": "ok", "clickhouse": "up"|"down", ...counters}``
- ``GET /verdicts?job=&since_ns=&component=&limit=``: JSON array of contract
  verdicts (``VerdictSink.query_verdicts``), newest window first.
- ``POST /sql`` (body: the SQL text, or JSON ``{"sql": "..."}``): one read
  statement through ``VerdictSink.run_readonly_sql`` (statement guard and
  ``readonly=1``), answered as ``{"columns", "types", "rows"}``.

Who may ask (checked before anything else, in this order):

- ``Host`` must be ``127.0.0.1:PORT`` or ``localhost:PORT`` (a page that
  rebinds its own DNS name to 127.0.0.1 sends its own name: refused, 403);
- an ``Origin``, when present, must be the endpoint's own (a web page's
  cross-site POST carries its origin: refused, 403);
- every path but ``/health`` needs ``Authorization: Bearer <token>`` (401
  otherwise; the token file is described in ``endpoint.py``). ``/health``
  stays open because the supervisor's readiness probe and ``eroica status``
  poll it: it answers liveness and counters only, never stored data, and
  leaves out the ClickHouse target unless the token comes with it;
- a body must announce its length (411) and stay within 64 KiB (413); a
  slow client is dropped after 30 s; a reply stays within
  ``MAX_REPLY_BYTES`` (400 with a hint to add a LIMIT).

Errors are JSON ``{"error": "..."}``: 400 for a refused statement or a bad
parameter (``read-only SQL: ...`` when the guard refused it; numeric
parameters must be within 0..2^63-1), 404/405 for other paths and methods,
503 while ClickHouse is unreachable.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec

from .client import ClickHouseError, ClickHouseUnavailableError
from .endpoint import MAX_REPLY_BYTES
from .messages import jsonable
from .readonly import ReadOnlySQLError
from .sink import MAX_FILTER_VALUE, VerdictSink

__all__ = ["QueryServer", "MAX_BODY_BYTES", "MAX_LIMIT", "MAX_REPLY_BYTES"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 << 10
MAX_LIMIT = 100_000
REQUEST_TIMEOUT_S = 30.0
_encoder = msgspec.json.Encoder(enc_hook=jsonable)


class _BadRequest(ValueError):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _int_param(params: dict[str, list[str]], name: str, low: int = 0, high: int = MAX_FILTER_VALUE) -> int | None:
    values = params.get(name)
    if not values or values[-1] == "":
        return None
    raw = values[-1]
    if len(raw) > 40 or not raw.strip().lstrip("+-").isdigit():
        raise _BadRequest(f"{name}={raw[:40]!r} is not an integer")
    value = int(raw)
    if not low <= value <= high:
        raise _BadRequest(f"{name}={value} is out of range: it must be within {low}..{high}")
    return value


def _str_param(params: dict[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    return values[-1] if values and values[-1] != "" else None


class QueryServer:
    """Serves one VerdictSink read-only on ``127.0.0.1:port`` (0 = any free port) from a thread."""

    def __init__(self, sink: VerdictSink, port: int = 0, *, health: Callable[[], dict[str, Any]] | None = None,
                 host: str = "127.0.0.1", token: str | None = None) -> None:
        self.sink = sink
        self._health = health or (lambda: {})
        # Without a token given, a fresh one (tests; the worker passes the one in its token file).
        self.token = token or secrets.token_urlsafe(32)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "eroica-sink"
            protocol_version = "HTTP/1.1"
            timeout = REQUEST_TIMEOUT_S  # a client that stalls mid-request is dropped

            def log_message(self, fmt: str, *args: Any) -> None:  # stderr is for the worker's own log
                log.debug("%s %s", self.address_string(), fmt % args)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                outer._dispatch(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                outer._dispatch(self, "POST")

            def _refuse(self) -> None:
                outer._send(self, 405, {"error": f"{self.command} is not allowed: this endpoint is read-only"})

            do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> QueryServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="eroica-sink-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    # -- request handling ----------------------------------------------------
    def _send(self, handler: BaseHTTPRequestHandler, status: int, doc: Any, *, close: bool = False) -> None:
        body = _encoder.encode(doc)
        if len(body) > MAX_REPLY_BYTES:
            status, body = 400, _encoder.encode({"error": f"the result is {len(body)} bytes, over this endpoint's "
                                                          f"{MAX_REPLY_BYTES}-byte limit: add a LIMIT"})
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.send_header("Cache-Control", "no-store")
        handler.send_header("X-Content-Type-Options", "nosniff")
        if close:
            handler.send_header("Connection", "close")
            handler.close_connection = True
        handler.end_headers()
        handler.wfile.write(body)

    def _own_origins(self) -> tuple[set[str], set[str]]:
        hosts = {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}
        return hosts, {f"http://{h}" for h in hosts}

    def _refusal(self, h: BaseHTTPRequestHandler, path: str) -> tuple[int, str] | None:
        """(status, reason) when the request may not be served at all, else None."""
        hosts, origins = self._own_origins()
        host = (h.headers.get("Host") or "").strip().lower()
        if len(h.headers.get_all("Host") or []) != 1 or host not in hosts:
            return 403, f"Host {host[:100]!r} is not allowed: use http://127.0.0.1:{self.port}"
        origins_sent = h.headers.get_all("Origin") or []
        if any(o.strip().lower() not in origins for o in origins_sent):
            return 403, "cross-origin requests are not allowed"
        if path != "/health" and not self._authorized(h):
            return 401, "a valid token is required (Authorization: Bearer <token>)"
        return None

    def _authorized(self, h: BaseHTTPRequestHandler) -> bool:
        auth = h.headers.get_all("Authorization") or []
        if len(auth) != 1 or not auth[0].startswith("Bearer "):
            return False
        return hmac.compare_digest(auth[0][7:].strip().encode(), self.token.encode())

    def _dispatch(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(h.path)
        path = url.path.rstrip("/") or "/"
        refused = self._refusal(h, path)
        if refused is not None:
            self._send(h, refused[0], {"error": refused[1]}, close=True)
            return
        params = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        routes = {"/health": ("GET", self._get_health), "/verdicts": ("GET", self._get_verdicts),
                  "/sql": ("POST", self._post_sql)}
        route = routes.get(url.path.rstrip("/") or "/")
        if route is None:
            self._send(h, 404, {"error": f"no such path {url.path!r}; try /health, /verdicts, /sql"})
            return
        if route[0] != method:
            self._send(h, 405, {"error": f"{url.path} takes {route[0]}"})
            return
        try:
            status, doc = route[1](h, params)
        except ReadOnlySQLError as exc:
            status, doc = 400, {"error": f"read-only SQL: {exc}"}
        except _BadRequest as exc:
            self._send(h, exc.status, {"error": str(exc)}, close=True)
            return
        except ClickHouseUnavailableError as exc:
            status, doc = 503, {"error": str(exc)}
        except ClickHouseError as exc:
            status, doc = 400, {"error": str(exc)}
        except ValueError as exc:
            status, doc = 400, {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a request must never take the worker down
            log.exception("query endpoint: %s %s failed", method, h.path)
            status, doc = 500, {"error": f"{type(exc).__name__}: {exc}"}
        self._send(h, status, doc)

    def _get_health(self, h: BaseHTTPRequestHandler, params: dict[str, list[str]]) -> tuple[int, Any]:
        doc = {"status": "ok", "backend": self.sink.config.backend, **self._health()}
        if self._authorized(h):
            doc["target"] = self.sink.config.target
        return 200, doc

    def _get_verdicts(self, h: BaseHTTPRequestHandler, params: dict[str, list[str]]) -> tuple[int, Any]:
        limit = _int_param(params, "limit")
        limit = 1000 if limit is None else limit
        if not 1 <= limit <= MAX_LIMIT:
            raise _BadRequest(f"limit must be within 1..{MAX_LIMIT}")
        verdicts = self.sink.query_verdicts(job=_str_param(params, "job"), since_ns=_int_param(params, "since_ns"),
                                            component=_str_param(params, "component"), limit=limit)
        return 200, msgspec.to_builtins(verdicts)

    def _post_sql(self, h: BaseHTTPRequestHandler, params: dict[str, list[str]]) -> tuple[int, Any]:
        if h.headers.get("Transfer-Encoding") or h.headers.get("Content-Length") is None:
            raise _BadRequest("POST /sql needs a Content-Length (no chunked bodies)", 411)
        raw = h.headers.get("Content-Length", "").strip()
        if not raw.isdigit() or len(raw) > 19:
            raise _BadRequest("bad Content-Length", 400)
        length = int(raw)
        if length > MAX_BODY_BYTES:
            raise _BadRequest(f"request body of {length} bytes is over the {MAX_BODY_BYTES}-byte limit", 413)
        if length <= 0:
            raise _BadRequest("POST /sql needs the SQL text as the request body")
        body = h.rfile.read(length).decode("utf-8", errors="replace")
        sql = body
        if "json" in (h.headers.get("Content-Type") or ""):
            try:
                sql = json.loads(body)["sql"]
            except (ValueError, KeyError, TypeError):
                raise _BadRequest('a JSON body must be {"sql": "..."}') from None
        res = self.sink.run_readonly_sql(sql)
        return 200, {"columns": res.columns, "types": res.types, "rows": [list(r) for r in res.rows]}
