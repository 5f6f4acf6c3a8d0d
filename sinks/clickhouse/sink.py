"""VerdictSink: verdicts and per-window summaries into ClickHouse, and back.

Writes are idempotent (ReplacingMergeTree keyed by verdict_id / summary cell),
so a replay, a restart or a retried INSERT never shows a verdict twice; reads
use ``FINAL`` and deduplicate again in Python. User SQL goes through
:meth:`VerdictSink.run_readonly_sql`, which accepts one read statement and runs
it with the server's ``readonly=1``.

chdb note: the embedded engine lives in one process per data directory. A
sink on ``chdb://`` is therefore usable only in the process that owns the
directory; other processes must ask that process (an endpoint the service
layer provides), not open the directory themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from eroica.models.verdict import Verdict

from .client import ClickHouseError, Client, QueryResult, open_client
from .config import ClickHouseConfig
from .readonly import check_readonly_sql
from .schema import SUMMARY_COLUMNS, SUMMARY_NAMES, VERDICT_COLUMNS, VERDICT_NAMES, ddl_statements
from .shaping import WindowSummary, batched, summaries_from_rows, summary_rows, verdict_rows, verdicts_from_rows

__all__ = ["VerdictSink", "SchemaMismatchError"]


class SchemaMismatchError(ClickHouseError):
    """A table exists under our name but lacks columns we write."""


class VerdictSink:
    """Write and read Eroica's verdicts and summaries in ClickHouse (server or chdb)."""

    def __init__(
        self,
        config: ClickHouseConfig | None = None,
        *,
        client: Client | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.config = config if config is not None else ClickHouseConfig.from_env()
        self.client: Client = client if client is not None else open_client(self.config)
        self._clock_ns = clock_ns

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> VerdictSink:
        return cls(ClickHouseConfig.from_url(url, **overrides))

    @classmethod
    def from_env(cls) -> VerdictSink:
        return cls(ClickHouseConfig.from_env())

    # -- schema -------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Create the database and both tables if absent, then check their columns.

        Safe to call at every start and from several writers at once.
        """
        for stmt in ddl_statements(self.config):
            self.client.execute(stmt)
        c = self.client
        res = c.query(
            f"SELECT `table`, `name` FROM system.columns WHERE database = {c.placeholder('db', 'String')}",
            {"db": self.config.database},
        )
        have: dict[str, set[str]] = {}
        for table, name in res.rows:
            have.setdefault(table, set()).add(name)
        for table, cols in (
            (self.config.verdicts_table, VERDICT_COLUMNS),
            (self.config.summaries_table, SUMMARY_COLUMNS),
        ):
            missing = [n for n, _ in cols if n not in have.get(table, set())]
            if missing:
                raise SchemaMismatchError(
                    f"table {self.config.database}.{table} on {c.target} lacks columns {missing}; "
                    "it was created by another version: migrate or choose another table name"
                )

    # -- writes -------------------------------------------------------------
    def write_verdicts(self, verdicts: Sequence[Verdict]) -> int:
        """Insert verdicts in batches; returns rows sent. Re-sending the same ones is harmless."""
        rows = verdict_rows(verdicts)  # validate everything before the first batch goes
        for batch in batched(rows, self.config.batch_size):
            self.client.insert(self.config.verdicts, VERDICT_NAMES, batch)
        return len(rows)

    def write_summaries(self, summaries: Sequence[WindowSummary], *, written_at_ns: int | None = None) -> int:
        """Insert per-window summaries; a later write of the same window replaces them."""
        version = self._clock_ns() if written_at_ns is None else written_at_ns
        rows = summary_rows(summaries, version)
        for batch in batched(rows, self.config.batch_size):
            self.client.insert(self.config.summaries, SUMMARY_NAMES, batch)
        return len(rows)

    def optimize(self) -> None:
        """Merge parts now (``OPTIMIZE ... FINAL``); reads are correct without it."""
        for table in (self.config.verdicts, self.config.summaries):
            self.client.execute(f"OPTIMIZE TABLE {table} FINAL")

    # -- reads --------------------------------------------------------------
    def query_verdicts(
        self,
        job: str | None = None,
        since_ns: int | None = None,
        component: str | None = None,
        limit: int | None = 1000,
    ) -> list[Verdict]:
        """Verdicts, newest window first, one per verdict_id.

        ``since_ns`` keeps verdicts whose window ends at or after it (windows
        that overlap ``[since_ns, now]``); every filter is on a column that a
        verdict_id fixes, so filtering commutes with deduplication.
        """
        c = self.client
        where, params = self._where(job, since_ns, [("component", "String", component)])
        sql = (
            f"SELECT {', '.join(f'`{n}`' for n in VERDICT_NAMES)} FROM {self.config.verdicts} FINAL"
            + where
            + " ORDER BY window_start_ns DESC, verdict_id"
            + self._limit(limit, params)
        )
        res = c.query(sql, params or None)
        return verdicts_from_rows(res.columns, res.rows)

    def query_summaries(
        self,
        job: str | None = None,
        since_ns: int | None = None,
        rank: int | None = None,
        fn: str | None = None,
        limit: int | None = 100_000,
    ) -> list[WindowSummary]:
        """Summaries ordered by window, rank, fn (latest write of each cell)."""
        c = self.client
        where, params = self._where(job, since_ns, [("rank", "Int32", None if rank is None else int(rank)),
                                                    ("fn", "String", fn)])
        sql = (
            f"SELECT {', '.join(f'`{n}`' for n in SUMMARY_NAMES)} FROM {self.config.summaries} FINAL"
            + where
            + " ORDER BY window_start_ns, rank, fn, node, kind"
            + self._limit(limit, params)
        )
        res = c.query(sql, params or None)
        return summaries_from_rows(res.columns, res.rows)

    def run_readonly_sql(self, sql: str) -> QueryResult:
        """Run one user read statement (SELECT/SHOW/DESCRIBE/EXISTS) with readonly=1.

        Raises ReadOnlySQLError (a ValueError) before anything is sent when the
        text is not a single read statement, and ClickHouseError when the server
        refuses it.
        """
        return self.client.query(check_readonly_sql(sql), None, readonly=True)

    def _where(self, job: str | None, since_ns: int | None,
               equal: list[tuple[str, str, Any]]) -> tuple[str, dict[str, Any]]:
        """`` WHERE ...`` (or "") and its bound parameters: job, window end >= since, column = value."""
        c = self.client
        filters = [("job", "String", job)] + equal
        where = [f"`{col}` = {c.placeholder(col, typ)}" for col, typ, value in filters if value is not None]
        params = {col: value for col, _typ, value in filters if value is not None}
        if since_ns is not None:
            where.append(f"window_end_ns >= {c.placeholder('since_ns', 'UInt64')}")
            params["since_ns"] = max(int(since_ns), 0)
        return (f" WHERE {' AND '.join(where)}" if where else ""), params

    def _limit(self, limit: int | None, params: dict[str, Any]) -> str:
        if limit is None:
            return ""
        if int(limit) < 1:
            raise ValueError("limit must be >= 1 (or None for no limit)")
        params["limit"] = int(limit)
        return f" LIMIT {self.client.placeholder('limit', 'UInt64')}"

    # -- lifecycle ------------------------------------------------------------
    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> VerdictSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
