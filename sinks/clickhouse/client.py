"""The sink's only I/O: two ClickHouse backends behind one small interface.

``NativeClient`` talks to a server over the native protocol (clickhouse-driver);
``ChdbClient`` runs the embedded engine in this process (chdb). Both offer:

- ``execute(sql, params)``: DDL and other statements without a result;
- ``insert(table, columns, rows)``: one batch of rows;
- ``query(sql, params, readonly=)``: column names, types and rows;
  ``readonly=True`` runs on a separate read connection (server) or session
  (chdb) whose current database is Eroica's, with ``readonly=1`` and the
  config's read limits (:func:`read_settings`), so a user read never waits
  for, nor holds up, an insert;
- ``databases()``: the engine's database names (the SQL guard refuses them);
- ``explain_ast(sql)`` (chdb only): the engine's parse tree, without running it;
- ``placeholder(name, type)``: how a bound value is written in SQL text.

Values are never formatted into SQL by us. clickhouse-driver substitutes
``%(name)s`` placeholders on the client with its own escaping (18.16 has no
server-side parameters). chdb 4 binds ``{name:Type}`` query parameters in the
engine, which parses each value as text of the declared type; strings reach it
in ClickHouse's escaped form made by clickhouse-driver's ``escape_param``, so
the escaping is a library's. Inserts go as data, never as SQL: native blocks
(driver) or JSONCompactEachRow bytes encoded by msgspec (chdb).

Operations are retried with exponential backoff while the server is
unreachable (connection refused, network errors, "too many parts/queries"),
then fail with :class:`ClickHouseUnavailableError` naming the target. Retrying
an INSERT is safe because both tables deduplicate by key.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec

from .config import ClickHouseConfig, RetryPolicy

__all__ = [
    "ClickHouseError", "ClickHouseUnavailableError", "QueryResult", "Client",
    "NativeClient", "ChdbClient", "open_client", "call_with_retries", "read_settings",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


class ClickHouseError(RuntimeError):
    """A statement failed on ClickHouse (bad SQL, refused by the server...)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class ClickHouseUnavailableError(ClickHouseError):
    """ClickHouse could not be reached within the retry policy."""


@dataclass
class QueryResult:
    """A query's answer: column names and types, rows as tuples."""

    columns: list[str]
    types: list[str]
    rows: list[tuple] = field(default_factory=list)

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r, strict=True)) for r in self.rows]


class Client(Protocol):
    """What the sink needs from a backend."""

    backend: str
    target: str

    def placeholder(self, name: str, ch_type: str) -> str: ...
    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> None: ...
    def insert(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> int: ...
    def query(self, sql: str, params: Mapping[str, Any] | None = None, *, readonly: bool = False) -> QueryResult: ...
    def databases(self) -> list[str]: ...
    def close(self) -> None: ...


def read_settings(config: ClickHouseConfig) -> dict[str, Any]:
    """The settings of every read on the read path, in the order they are applied (readonly last).

    ClickHouse 18.16 and current releases both know each of them.
    """
    return {
        "max_execution_time": max(1, math.ceil(config.read_timeout_s)),
        "timeout_overflow_mode": "throw",
        "max_memory_usage": int(config.read_max_memory_bytes),
        "max_result_rows": int(config.read_max_rows),
        "max_result_bytes": int(config.read_max_bytes),
        "result_overflow_mode": "throw",
        "readonly": 1,
    }


# -- retries --------------------------------------------------------------------
# Server error codes worth waiting for: the server is busy or briefly unable.
# 3 UNEXPECTED_END_OF_FILE, 202 TOO_MANY_SIMULTANEOUS_QUERIES, 209 SOCKET_TIMEOUT,
# 210 NETWORK_ERROR, 242 TABLE_IS_READ_ONLY, 252 TOO_MANY_PARTS, 279 ALL_CONNECTION_TRIES_FAILED (a shard
# of a Distributed table is unreachable: 18.16 says 210 for a refused write to it, 279 for a read).
RETRYABLE_CODES = frozenset({3, 202, 209, 210, 242, 252, 279})
_CODE_RE = re.compile(r"Code:\s*(\d+)")


def error_code(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    m = _CODE_RE.search(str(exc))
    return int(m.group(1)) if m else None


def is_retryable(exc: BaseException) -> bool:
    """Transient: the endpoint is down or overloaded; not: the statement is wrong."""
    if isinstance(exc, (ConnectionError, EOFError, TimeoutError)):
        return True
    if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
        return True
    return error_code(exc) in RETRYABLE_CODES


def call_with_retries(
    op: Callable[[], T],
    *,
    policy: RetryPolicy,
    what: str,
    target: str,
    retryable: Callable[[BaseException], bool] = is_retryable,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Run ``op``; on a transient failure wait (exponential backoff) and try again.

    Gives up after ``policy.attempts`` tries or when the next wait would pass
    ``policy.deadline_s``, raising ClickHouseUnavailableError with the last cause.
    Non-transient errors are raised at once as ClickHouseError.
    """
    start = clock()
    failures = 0
    while True:
        try:
            return op()
        except ClickHouseError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified below
            if not retryable(exc):
                raise ClickHouseError(f"{what} failed on {target}: {_first_line(exc)}", error_code(exc)) from exc
            failures += 1
            delay = policy.delay(failures)
            elapsed = clock() - start
            if failures >= policy.attempts or elapsed + delay > policy.deadline_s:
                raise ClickHouseUnavailableError(
                    f"ClickHouse at {target} unavailable: {what} failed {failures} time(s) over "
                    f"{elapsed:.1f}s (retry policy: {policy.attempts} attempts, "
                    f"{policy.deadline_s:g}s deadline); last error: {_first_line(exc)}",
                    error_code(exc),
                ) from exc
            log.warning("ClickHouse at %s: %s failed (%s); retry %d in %.2fs",
                        target, what, _first_line(exc), failures, delay)
            sleep(delay)


def _first_line(exc: BaseException) -> str:
    """The server's message without its stack trace, on one line."""
    text = str(exc).split("Stack trace", 1)[0]
    text = " ".join(text.split())
    if len(text) > 500:
        text = text[:497] + "..."
    return f"{type(exc).__name__}: {text}"


def _column_list(columns: Sequence[str]) -> str:
    # Column names come from schema.py constants; backticks keep words like `rank` plain.
    return ", ".join(f"`{c}`" for c in columns)


def _check_rows(config: ClickHouseConfig, target: str, n: int) -> None:
    """The row limit of a read, checked here too: engines check it per block and return a first
    block whole (chdb returns any single-block result, however long)."""
    if n > config.read_max_rows:
        raise ClickHouseError(f"query on {target}: the result has {n} rows, over the read limit of "
                              f"{config.read_max_rows} (add a LIMIT)", 396)


# -- server over the native protocol ---------------------------------------------
class NativeClient:
    """clickhouse-driver client; one connection, serialised by a lock.

    Connects to the ``default`` database and uses qualified table names, so the
    sink's own database can be created through the same connection.
    """

    backend = "native"

    def __init__(self, config: ClickHouseConfig, *, sleep: Callable[[float], None] = time.sleep) -> None:
        from clickhouse_driver import Client as DriverClient

        self.config = config
        self.target = config.target
        self._sleep = sleep
        self._lock = threading.Lock()
        self._driver_cls = DriverClient
        # Sharded: a write through the Distributed tables returns only once every row is on its shard
        # (insert_distributed_sync=1), so an acknowledged batch is stored and a shard that is down
        # fails the INSERT (retried; the sink commits nothing). Without it the server would
        # acknowledge a write queued on its own disk for later sending: the Kafka offsets would be
        # committed for rows that no shard holds yet, and are lost with that disk.
        writer_settings = {"insert_distributed_sync": 1} if config.cluster else None
        self._client = self._connect("default", config.query_timeout_s, writer_settings)
        # Reads go over their own connection: a slow read never holds the writer's lock. Its
        # current database is Eroica's, so unqualified table names in user SQL resolve there.
        self._read_lock = threading.Lock()
        self._reader = self._connect(config.database, config.read_timeout_s + config.connect_timeout_s + 5.0)

    def _connect(self, database: str, timeout_s: float, settings: dict[str, Any] | None = None) -> Any:
        c = self.config
        return self._driver_cls(
            host=c.host,
            port=c.port,
            database=database,
            user=c.user,
            password=c.password,
            secure=c.secure,
            connect_timeout=c.connect_timeout_s,
            send_receive_timeout=timeout_s,
            sync_request_timeout=c.connect_timeout_s,
            client_name="eroica",
            settings=settings,
        )

    def placeholder(self, name: str, ch_type: str) -> str:
        return f"%({name})s"

    def _run(self, what: str, fn: Callable[[], T]) -> T:
        def locked() -> T:
            with self._lock:
                return fn()

        return call_with_retries(locked, policy=self.config.retry, what=what, target=self.target, sleep=self._sleep)

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        self._run("statement", lambda: self._client.execute(sql, dict(params) if params is not None else None))

    def insert(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> int:
        if not rows:
            return 0
        sql = f"INSERT INTO {table} ({_column_list(columns)}) VALUES"
        data = [tuple(r) for r in rows]
        self._run(f"insert into {table}", lambda: self._client.execute(sql, data))
        return len(data)

    def query(self, sql: str, params: Mapping[str, Any] | None = None, *, readonly: bool = False) -> QueryResult:
        bound = dict(params) if params is not None else None
        if readonly:
            settings = read_settings(self.config)

            def read() -> Any:
                with self._read_lock:
                    return self._reader.execute(sql, bound, with_column_types=True, settings=settings)

            rows, meta = call_with_retries(read, policy=self.config.retry, what="query", target=self.target,
                                           sleep=self._sleep)
            _check_rows(self.config, self.target, len(rows))
        else:
            rows, meta = self._run("query", lambda: self._client.execute(sql, bound, with_column_types=True))
        return QueryResult([m[0] for m in meta], [m[1] for m in meta], [tuple(r) for r in rows])

    def databases(self) -> list[str]:
        return [r[0] for r in self.query("SELECT name FROM system.databases", readonly=True).rows]

    def close(self) -> None:
        with self._lock:
            self._client.disconnect()
        with self._read_lock:
            self._reader.disconnect()

    def __enter__(self) -> NativeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- embedded engine ---------------------------------------------------------------
_SESSION_SETTINGS = (
    # Typed JSON output: 64-bit ints as numbers, NaN/inf as "nan"/"inf" strings
    # (the default null would lose them).
    "SET output_format_json_quote_64bit_integers = 0",
    "SET output_format_json_quote_denormals = 1",
)


class _SharedSession:
    """The process's chdb sessions on one data directory, shared by all ChdbClients.

    chdb runs one embedded server per process, bound to one data directory; a
    second directory cannot be opened until every session is closed, and another
    process cannot open the directory at all. So the process keeps one writer
    session (and one read-only session on the same directory) and counts users.
    Other processes must send their queries to the process that owns it.
    """

    def __init__(self, path: str) -> None:
        from chdb.session import Session

        self.path = path
        self.users = 0
        self.lock = threading.RLock()  # the writer session (DDL, inserts, internal statements)
        # The read sessions' own lock: chdb runs queries of different sessions at the same time,
        # so a user read (bounded by max_execution_time) never blocks an insert.
        self.read_lock = threading.RLock()
        self._session_cls = Session
        self.writer = self._open()
        self._readers: dict[str, Any] = {}

    def _open(self) -> Any:
        try:
            session = self._session_cls(self.path)
        except Exception as exc:  # noqa: BLE001 - chdb raises RuntimeError with a terse text
            raise ClickHouseError(
                f"cannot open chdb data directory {self.path!r}: {_first_line(exc)}. chdb serves one "
                "data directory per process, and one process per directory: if another process owns "
                "it, route queries through that process", error_code(exc)
            ) from exc
        for stmt in _SESSION_SETTINGS:
            session.query(stmt)
        return session

    def reader(self, config: ClickHouseConfig, purpose: str = "read") -> Any:
        """A session of its own on the same directory: current database Eroica's, read limits, readonly=1.

        ``purpose="parse"`` (EXPLAIN AST for the SQL guard) has the time limit but no result limits.
        Call under ``read_lock``. Raises ClickHouseError while the database does not exist yet.
        """
        key = f"{purpose}:{config.database}"
        session = self._readers.get(key)
        if session is not None:
            return session
        settings = read_settings(config)
        if purpose == "parse":
            settings = {k: settings[k] for k in ("max_execution_time", "timeout_overflow_mode", "readonly")}
        session = self._open()
        try:
            for name, value in settings.items():
                if name == "readonly":
                    session.query(f"USE `{config.database}`")
                session.query(f"SET {name} = {value!r}" if isinstance(value, str) else f"SET {name} = {value}")
        except Exception as exc:  # noqa: BLE001 - the database is missing: reads wait for the sink's schema
            session.close()
            raise ClickHouseError(f"chdb:{self.path}: cannot open a read session on database "
                                  f"{config.database!r}: {_first_line(exc)}", error_code(exc)) from exc
        self._readers[key] = session
        return session

    def drop_readers(self) -> None:
        """Close the read sessions (a new one opens on the next read). Call under ``read_lock``.

        After a read fails (a limit stopped it), chdb can hand the session's next query leftover
        output, so a failed read never leaves its session for the next one.
        """
        for s in self._readers.values():
            try:
                s.close()
            except Exception:  # noqa: BLE001 - closing a broken session
                pass
        self._readers.clear()

    def close(self) -> None:
        with self.read_lock:
            for s in self._readers.values():
                s.close()
            self._readers.clear()
        self.writer.close()


# Re-entrant: a ChdbClient finalised by the GC inside _acquire releases under the same lock.
_registry_lock = threading.RLock()
_registry: dict[str, _SharedSession] = {}


def _acquire(path: str) -> _SharedSession:
    with _registry_lock:
        shared = _registry.get(path)
        if shared is None:
            other = next(iter(_registry), None)
            if other is not None:
                raise ClickHouseError(
                    f"chdb already serves {other!r} in this process; it cannot also open {path!r}. "
                    "Close the other clients first, or route queries through one owner"
                )
            if path != ":memory:":
                Path(path).mkdir(parents=True, exist_ok=True)
            shared = _registry[path] = _SharedSession(path)
        shared.users += 1
        return shared


def _release(shared: _SharedSession) -> None:
    with _registry_lock:
        shared.users -= 1
        if shared.users <= 0:
            _registry.pop(shared.path, None)
            with shared.lock:
                shared.close()


def _chdb_param(value: Any) -> Any:
    """A value as chdb's ``{name:Type}`` parameters take it: text of the declared type.

    The engine parses a parameter with the type's *escaped* text format, so a
    backslash or a tab must arrive escaped. clickhouse-driver's escape_param
    writes exactly that inside its quotes (and quotes strings inside arrays).
    """
    from clickhouse_driver.util.escape import escape_param

    if value is None:
        raise ValueError("NULL parameters are not supported (the schema has no Nullable columns)")
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        return escape_param(value, None)[1:-1]
    if isinstance(value, (list, tuple)):
        return escape_param(list(value), None)
    if isinstance(value, (int, float)):
        return value
    raise TypeError(f"unsupported parameter type {type(value).__name__}")


_ROWS_JSON = msgspec.json.Encoder()


def json_compact_rows(rows: Sequence[Sequence[Any]]) -> bytes:
    """``JSONCompactEachRow`` lines of ``rows`` (one JSON array per row, in the INSERT's column order).

    One msgspec call encodes the batch; msgspec writes a non-finite float as
    ``null``, which ClickHouse would store as 0, so only the lines that hold a
    ``null`` (rare: a NaN quantile or cost) are encoded again value by value
    with NaN and infinities as the strings ClickHouse reads back as floats.
    A raw newline only ever ends a line (JSON escapes one inside a string).
    The per-row dict and per-value check it replaces were 60% of the sink's
    insert into chdb.
    """
    data = _ROWS_JSON.encode_lines(rows)
    if b"null" not in data:
        return data
    lines = data.split(b"\n")
    for i, line in enumerate(lines[:len(rows)]):
        if b"null" in line:
            lines[i] = _ROWS_JSON.encode([_json_safe(v) for v in rows[i]])
    return b"\n".join(lines)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _convert(ch_type: str, value: Any) -> Any:
    """JSON value -> Python value of the ClickHouse type (ints, floats incl. nan/inf, arrays)."""
    t = ch_type
    while t.startswith(("Nullable(", "LowCardinality(")):
        t = t[t.index("(") + 1 : -1]
    if value is None:
        return None
    if t.startswith("Array(") and isinstance(value, list):
        inner = t[6:-1]
        return [_convert(inner, v) for v in value]
    if t.startswith(("Int", "UInt")) and isinstance(value, str):
        return int(value)
    if t.startswith("Float") and isinstance(value, str):
        return float(value)
    return value


class ChdbClient:
    """The embedded engine; every ChdbClient of a process shares one session per directory."""

    backend = "chdb"

    def __init__(self, config: ClickHouseConfig, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config
        self.path = config.chdb_path if config.chdb_path == ":memory:" else str(Path(config.chdb_path).resolve())
        self.target = f"chdb:{self.path}"
        self._sleep = sleep
        self._shared: _SharedSession | None = _acquire(self.path)

    def _session(self, readonly: bool = False) -> Any:
        if self._shared is None:
            raise ClickHouseError(f"{self.target}: client is closed")
        return self._shared.reader(self.config) if readonly else self._shared.writer

    def _run(self, what: str, fn: Callable[[], T], *, readonly: bool = False) -> T:
        def locked() -> T:
            if self._shared is None:
                raise ClickHouseError(f"{self.target}: client is closed")
            if not readonly:
                with self._shared.lock:
                    return fn()
            with self._shared.read_lock:
                try:
                    return fn()
                except BaseException:
                    self._shared.drop_readers()
                    raise

        return call_with_retries(locked, policy=self.config.retry, what=what, target=self.target, sleep=self._sleep)

    @staticmethod
    def _params(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
        return {k: _chdb_param(v) for k, v in params.items()} if params else None

    def placeholder(self, name: str, ch_type: str) -> str:
        return f"{{{name}:{ch_type}}}"

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        bound = self._params(params)
        self._run("statement", lambda: self._session().query(sql, "CSV", params=bound))

    def insert(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> int:
        if not rows:
            return 0
        cols = list(columns)
        for row in rows:
            if len(row) != len(cols):
                raise ValueError(f"insert into {table}: a row of {len(row)} values for {len(cols)} columns")
        data = json_compact_rows(rows)
        sql = f"INSERT INTO {table} ({_column_list(cols)})"

        def send() -> int:
            with self._session().send_insert(sql, "JSONCompactEachRow") as ins:
                ins.append(data)
                return int(ins.finish().rows_written)

        self._run(f"insert into {table}", send)
        return len(rows)

    def query(self, sql: str, params: Mapping[str, Any] | None = None, *, readonly: bool = False) -> QueryResult:
        bound = self._params(params)
        raw = self._run("query", lambda: self._session(readonly).query(sql, "JSONCompact", params=bound).bytes(),
                        readonly=readonly)
        if not raw.strip():
            return QueryResult([], [], [])
        doc = msgspec.json.decode(raw)
        names = [m["name"] for m in doc.get("meta", [])]
        types = [m["type"] for m in doc.get("meta", [])]
        data = doc.get("data", [])
        if readonly:
            _check_rows(self.config, self.target, len(data))
        rows = [tuple(_convert(t, v) for t, v in zip(types, r, strict=True)) for r in data]
        return QueryResult(names, types, rows)

    def explain_ast(self, sql: str) -> str:
        """The engine's parse tree of ``sql`` (``EXPLAIN AST``: parsed, never run), on a read session.

        ``sql`` must be one statement already (chdb would run a second one).
        """
        def parse() -> bytes:
            if self._shared is None:
                raise ClickHouseError(f"{self.target}: client is closed")
            return self._shared.reader(self.config, "parse").query(f"EXPLAIN AST {sql}", "TSVRaw").bytes()

        raw = self._run("explain", parse, readonly=True)
        return raw.decode("utf-8", errors="replace")

    def databases(self) -> list[str]:
        return [r[0] for r in self.query("SELECT name FROM system.databases", readonly=True).rows]

    def close(self) -> None:
        shared, self._shared = self._shared, None
        if shared is not None:
            _release(shared)

    def __enter__(self) -> ChdbClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def open_client(config: ClickHouseConfig, *, sleep: Callable[[float], None] = time.sleep) -> Client:
    """The backend the config names."""
    if config.backend == "chdb":
        return ChdbClient(config, sleep=sleep)
    return NativeClient(config, sleep=sleep)
