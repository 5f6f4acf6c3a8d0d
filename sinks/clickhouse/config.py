"""Where and how the verdict sink writes: one URL plus a few knobs.

Like Vector's ClickHouse sink, the whole destination is one endpoint string and
the rest (tables, batching, retries) has defaults that work. Two backends:

- ``clickhouse://[user[:password]@]HOST[:PORT]/DB[?secure=1]``: a ClickHouse
  server over the native protocol (clickhouse-driver), port 9000 by default.
- ``chdb:///abs/path/to/datadir[?database=DB]``: the embedded engine (chdb),
  keeping its data in that directory; ``chdb://:memory:`` keeps nothing.

Environment variables (read by :meth:`ClickHouseConfig.from_env`):

=====================================  ==========================================
EROICA_CLICKHOUSE_URL                  endpoint, default ``clickhouse://127.0.0.1:9000/eroica``
EROICA_CLICKHOUSE_DATABASE             overrides the database named in the URL
EROICA_CLICKHOUSE_USER                 overrides the URL's user (default ``default``)
EROICA_CLICKHOUSE_PASSWORD             overrides the URL's password (keeps it out of URLs)
EROICA_CLICKHOUSE_VERDICTS_TABLE       default ``verdicts``
EROICA_CLICKHOUSE_SUMMARIES_TABLE      default ``summaries``
EROICA_CLICKHOUSE_BATCH_SIZE           rows per INSERT, default 10000
EROICA_CLICKHOUSE_RETRY_ATTEMPTS       tries per operation while unreachable, default 8
EROICA_CLICKHOUSE_RETRY_INITIAL_S      first backoff, default 0.2 s (doubles each try)
EROICA_CLICKHOUSE_RETRY_MAX_S          backoff cap, default 5 s
EROICA_CLICKHOUSE_RETRY_DEADLINE_S     give up after this long in total, default 60 s
EROICA_CLICKHOUSE_CONNECT_TIMEOUT_S    TCP connect timeout, default 3 s
EROICA_CLICKHOUSE_QUERY_TIMEOUT_S      send/receive timeout, default 60 s
EROICA_CLICKHOUSE_CLUSTER              a ``remote_servers`` cluster of the server: write and read
                                       through ``Distributed`` tables over it (default: none)
=====================================  ==========================================

Sharding (``EROICA_CLICKHOUSE_CLUSTER``, server only: chdb has no cluster): the
tables readers know (``verdicts``, ``summaries``) become ``Distributed`` tables
over ``<name>_local`` tables on every shard of the cluster, which
``VerdictSink.ensure_schema`` creates on each shard (``schema.py``). Rows go to
the shard ``cityHash64(job) % shards``, so a verdict id always lands on the same
shard and ReplacingMergeTree replaces its duplicates there. Writes use
``insert_distributed_sync=1``: an INSERT returns only once every row is on its
shard, so an acknowledged write is stored and a shard that is down fails it
(the sink then retries and commits nothing).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

from eroica.runtime.backoff import delay as backoff_delay

__all__ = ["ClickHouseConfig", "RetryPolicy", "check_identifier", "DEFAULT_URL", "ENV_VARS"]

DEFAULT_URL = "clickhouse://127.0.0.1:9000/eroica"
DEFAULT_DATABASE = "eroica"
Backend = Literal["native", "chdb"]

# Every variable from_env reads (deployments are checked against it: tests/test_compose.py).
ENV_VARS: tuple[str, ...] = (
    "EROICA_CLICKHOUSE_URL", "EROICA_CLICKHOUSE_DATABASE", "EROICA_CLICKHOUSE_USER", "EROICA_CLICKHOUSE_PASSWORD",
    "EROICA_CLICKHOUSE_VERDICTS_TABLE", "EROICA_CLICKHOUSE_SUMMARIES_TABLE", "EROICA_CLICKHOUSE_BATCH_SIZE",
    "EROICA_CLICKHOUSE_RETRY_ATTEMPTS", "EROICA_CLICKHOUSE_RETRY_INITIAL_S", "EROICA_CLICKHOUSE_RETRY_MAX_S",
    "EROICA_CLICKHOUSE_RETRY_DEADLINE_S", "EROICA_CLICKHOUSE_CONNECT_TIMEOUT_S", "EROICA_CLICKHOUSE_QUERY_TIMEOUT_S",
    "EROICA_CLICKHOUSE_CLUSTER",
)

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def check_identifier(name: str, what: str = "identifier") -> str:
    """Return ``name`` if it is a plain identifier, else raise ValueError.

    Database and table names are the only things ever placed in SQL text that
    do not come from our own constants; values never are (they are bound). A
    strict allow-list keeps quoting trivial on every server version.
    """
    if not isinstance(name, str) or not _IDENT.match(name):
        raise ValueError(f"invalid {what} {name!r}: use letters, digits and '_' (not first)")
    return name


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff while the server is unreachable (Vector's request.retry_*).

    An operation is tried at most ``attempts`` times and never past
    ``deadline_s`` after its first try; the n-th wait is
    ``min(initial_s * multiplier**n, max_s)``. Retrying writes is safe because
    the tables deduplicate by key (see schema.py).
    """

    attempts: int = 8
    initial_s: float = 0.2
    max_s: float = 5.0
    multiplier: float = 2.0
    deadline_s: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("retry attempts must be >= 1")
        if self.initial_s < 0 or self.max_s < 0 or self.deadline_s < 0 or self.multiplier < 1:
            raise ValueError("retry delays must be >= 0 and the multiplier >= 1")

    def delay(self, failures: int) -> float:
        """Wait before the next try after ``failures`` (>= 1) failed tries."""
        return backoff_delay(failures, self.initial_s, self.max_s, self.multiplier)


@dataclass(frozen=True)
class ClickHouseConfig:
    """Everything the sink needs; build it with :meth:`from_url` or :meth:`from_env`."""

    backend: Backend = "native"
    host: str = "127.0.0.1"
    port: int = 9000
    user: str = "default"
    password: str = field(default="", repr=False)
    secure: bool = False
    chdb_path: str = ""  # data directory, or ":memory:"
    database: str = DEFAULT_DATABASE
    verdicts_table: str = "verdicts"
    summaries_table: str = "summaries"
    batch_size: int = 10_000
    connect_timeout_s: float = 3.0
    query_timeout_s: float = 60.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # Limits of every user read (eroica sql, the endpoint, verdict listings), set by us, never by the
    # user: max_execution_time, max_memory_usage, max_result_rows / max_result_bytes (both engines).
    read_timeout_s: float = 30.0
    read_max_memory_bytes: int = 1 << 30
    read_max_rows: int = 2_000_000  # the report reads up to 2M summary rows (report/query.py)
    read_max_bytes: int = 512 << 20
    # A ``remote_servers`` cluster name: verdicts/summaries are Distributed tables over it ("": none).
    cluster: str = ""

    def __post_init__(self) -> None:
        check_identifier(self.database, "database name")
        check_identifier(self.verdicts_table, "table name")
        check_identifier(self.summaries_table, "table name")
        if self.verdicts_table == self.summaries_table:
            raise ValueError("verdicts and summaries tables must differ")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if self.backend not in ("native", "chdb"):
            raise ValueError(f"unknown backend {self.backend!r}")
        if self.read_timeout_s <= 0 or self.read_max_memory_bytes < 1 or self.read_max_rows < 1 \
                or self.read_max_bytes < 1:
            raise ValueError("read limits must be positive")
        if self.backend == "chdb" and not self.chdb_path:
            raise ValueError("chdb backend needs a data directory (chdb:///path) or :memory:")
        if self.cluster:
            check_identifier(self.cluster, "cluster name")
            if self.backend == "chdb":
                raise ValueError(f"cluster {self.cluster!r}: chdb has no cluster; shard on a ClickHouse server "
                                 "(clickhouse://...) or unset EROICA_CLICKHOUSE_CLUSTER")

    # -- construction -----------------------------------------------------
    @classmethod
    def from_url(cls, url: str, **overrides: object) -> ClickHouseConfig:
        """Parse ``clickhouse://...`` or ``chdb://...``; keyword overrides win."""
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        kw: dict[str, object] = {}
        if parts.scheme in ("clickhouse", "clickhouses"):
            if not parts.hostname:
                raise ValueError(f"no host in ClickHouse URL {url!r}")
            kw["backend"] = "native"
            kw["host"] = parts.hostname
            kw["port"] = parts.port or (9440 if parts.scheme == "clickhouses" else 9000)
            if parts.username:
                kw["user"] = unquote(parts.username)
            if parts.password:
                kw["password"] = unquote(parts.password)
            kw["secure"] = parts.scheme == "clickhouses" or _truthy(query.get("secure", ""))
            db = parts.path.strip("/")
            if db:
                kw["database"] = db
        elif parts.scheme == "chdb":
            kw["backend"] = "chdb"
            if parts.netloc == ":memory:" or parts.path == ":memory:":
                kw["chdb_path"] = ":memory:"
            else:
                # chdb:///abs/dir -> /abs/dir ; chdb://rel/dir -> rel/dir (relative to cwd)
                raw = unquote(parts.netloc + parts.path)
                if not raw:
                    raise ValueError(f"no data directory in chdb URL {url!r}")
                kw["chdb_path"] = str(Path(raw))
        else:
            raise ValueError(f"unsupported ClickHouse URL scheme in {url!r} (use clickhouse:// or chdb://)")
        if "database" in query:
            kw["database"] = query["database"]
        kw.update(overrides)
        return cls(**kw)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> ClickHouseConfig:
        """Read the ``EROICA_CLICKHOUSE_*`` variables listed in this module's docstring."""
        env = os.environ if environ is None else environ
        url = env.get("EROICA_CLICKHOUSE_URL") or DEFAULT_URL
        kw: dict[str, object] = {}
        for var, key, conv in (
            ("EROICA_CLICKHOUSE_DATABASE", "database", str),
            ("EROICA_CLICKHOUSE_USER", "user", str),
            ("EROICA_CLICKHOUSE_PASSWORD", "password", str),
            ("EROICA_CLICKHOUSE_VERDICTS_TABLE", "verdicts_table", str),
            ("EROICA_CLICKHOUSE_SUMMARIES_TABLE", "summaries_table", str),
            ("EROICA_CLICKHOUSE_BATCH_SIZE", "batch_size", int),
            ("EROICA_CLICKHOUSE_CONNECT_TIMEOUT_S", "connect_timeout_s", float),
            ("EROICA_CLICKHOUSE_QUERY_TIMEOUT_S", "query_timeout_s", float),
            ("EROICA_CLICKHOUSE_CLUSTER", "cluster", str),
        ):
            if env.get(var, "") != "":
                kw[key] = _convert(var, env[var], conv)
        retry: dict[str, object] = {}
        for var, key, conv in (
            ("EROICA_CLICKHOUSE_RETRY_ATTEMPTS", "attempts", int),
            ("EROICA_CLICKHOUSE_RETRY_INITIAL_S", "initial_s", float),
            ("EROICA_CLICKHOUSE_RETRY_MAX_S", "max_s", float),
            ("EROICA_CLICKHOUSE_RETRY_DEADLINE_S", "deadline_s", float),
        ):
            if env.get(var, "") != "":
                retry[key] = _convert(var, env[var], conv)
        if retry:
            kw["retry"] = RetryPolicy(**retry)  # type: ignore[arg-type]
        kw.update(overrides)
        return cls.from_url(url, **kw)

    def replace(self, **changes: object) -> ClickHouseConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    # -- derived ------------------------------------------------------------
    @property
    def target(self) -> str:
        """Human description for messages (never includes the password)."""
        if self.backend == "chdb":
            return f"chdb:{self.chdb_path}"
        return f"{self.host}:{self.port}"

    @property
    def verdicts(self) -> str:
        """Qualified, quoted verdicts table name."""
        return f"`{self.database}`.`{self.verdicts_table}`"

    @property
    def summaries(self) -> str:
        """Qualified, quoted summaries table name."""
        return f"`{self.database}`.`{self.summaries_table}`"


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def _convert(var: str, raw: str, conv: type) -> object:
    try:
        return conv(raw)
    except ValueError as exc:
        raise ValueError(f"{var}={raw!r}: {exc}") from None
