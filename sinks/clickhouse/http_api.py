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

Errors are JSON ``{"error": "..."}``: 400 for a refused statement or a bad
parameter (``read-only SQL: ...`` when the guard refused it), 404/405 for
other paths and methods, 503 while ClickHouse is unreachable.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec

from .client import ClickHouseError, ClickHouseUnavailableError
from .messages import jsonable
from .readonly import ReadOnlySQLError
from .sink import VerdictSink

__all__ = ["QueryServer", "MAX_BODY_BYTES", "MAX_LIMIT"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20
MAX_LIMIT = 100_000
_encoder = msgspec.json.Encoder(enc_hook=jsonable)


class _BadRequest(ValueError):
    pass


def _int_param(params: dict[str, list[str]], name: str) -> int | None:
    values = params.get(name)
    if not values or values[-1] == "":
        return None
    try:
        return int(values[-1])
    except ValueError:
        raise _BadRequest(f"{name}={values[-1]!r} is not an integer") from None


def _str_param(params: dict[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    return values[-1] if values and values[-1] != "" else None


class QueryServer:
    """Serves one VerdictSink read-only on ``127.0.0.1:port`` (0 = any free port) from a thread."""

    def __init__(self, sink: VerdictSink, port: int = 0, *, health: Callable[[], dict[str, Any]] | None = None,
                 host: str = "127.0.0.1") -> None:
        self.sink = sink
        self._health = health or (lambda: {})
        outer = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "eroica-sink"
            protocol_version = "HTTP/1.1"

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
    def _send(self, handler: BaseHTTPRequestHandler, status: int, doc: Any) -> None:
        body = _encoder.encode(doc)
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _dispatch(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(h.path)
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
            status, doc = 400, {"error": str(exc)}
        except ClickHouseUnavailableError as exc:
            status, doc = 503, {"error": str(exc)}
        except ClickHouseError as exc:
            status, doc = 400, {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a request must never take the worker down
            log.exception("query endpoint: %s %s failed", method, h.path)
            status, doc = 500, {"error": f"{type(exc).__name__}: {exc}"}
        self._send(h, status, doc)

    def _get_health(self, h: BaseHTTPRequestHandler, params: dict[str, list[str]]) -> tuple[int, Any]:
        return 200, {"status": "ok", "backend": self.sink.config.backend, "target": self.sink.config.target,
                     **self._health()}

    def _get_verdicts(self, h: BaseHTTPRequestHandler, params: dict[str, list[str]]) -> tuple[int, Any]:
        limit = _int_param(params, "limit")
        limit = 1000 if limit is None else limit
        if not 1 <= limit <= MAX_LIMIT:
            raise _BadRequest(f"limit must be within 1..{MAX_LIMIT}")
        verdicts = self.sink.query_verdicts(job=_str_param(params, "job"), since_ns=_int_param(params, "since_ns"),
                                            component=_str_param(params, "component"), limit=limit)
        return 200, msgspec.to_builtins(verdicts)

    def _post_sql(self, h: BaseHTTPRequestHandler, params: dict[str, list[str]]) -> tuple[int, Any]:
        length = int(h.headers.get("Content-Length") or 0)
        if length <= 0:
            raise _BadRequest("POST /sql needs the SQL text as the request body")
        if length > MAX_BODY_BYTES:
            raise _BadRequest(f"request body over {MAX_BODY_BYTES} bytes")
        body = h.rfile.read(length).decode("utf-8", errors="replace")
        sql = body
        if "json" in (h.headers.get("Content-Type") or ""):
            try:
                sql = json.loads(body)["sql"]
            except (ValueError, KeyError, TypeError):
                raise _BadRequest('a JSON body must be {"sql": "..."}') from None
        res = self.sink.run_readonly_sql(sql)
        return 200, {"columns": res.columns, "types": res.types, "rows": [list(r) for r in res.rows]}
