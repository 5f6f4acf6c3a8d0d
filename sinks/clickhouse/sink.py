"""VerdictSink: verdicts and per-window summaries into ClickHouse, and back.

Writes are idempotent (ReplacingMergeTree keyed by verdict_id / summary cell),
so a replay, a restart or a retried INSERT never shows a verdict twice; reads
use ``FINAL`` and deduplicate again in Python. User SQL goes through
:meth:`VerdictSink.run_readonly_sql`, which accepts one read of Eroica's own
tables (``readonly.py``: the tokenizer guard, and on chdb the engine's own
parse tree as well) and runs it on the read path (``readonly=1``, time,
memory and result limits, its own connection or session). Every read of this
class goes that path, so no read ever holds up an insert.

Sharded (``config.cluster``): writes and reads go through the Distributed
tables, which keep the names ``verdicts``/``summaries`` (``schema.py``);
:meth:`VerdictSink.ensure_schema` and :meth:`VerdictSink.optimize` also reach
every server of the cluster, at the address the server's ``remote_servers``
names, with this config's credentials.

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
from .readonly import ReadOnlySQLError, SQLPolicy, check_ast, check_readonly_sql
from .schema import (
    SUMMARY_COLUMNS,
    SUMMARY_NAMES,
    VERDICT_COLUMNS,
    VERDICT_NAMES,
    cluster_shards_sql,
    ddl_statements,
    local_table_name,
    shard_ddl_statements,
    view_statements,
)
from .shaping import WindowSummary, batched, summaries_from_rows, summary_rows, verdict_rows, verdicts_from_rows

__all__ = ["VerdictSink", "SchemaMismatchError", "MAX_FILTER_VALUE", "check_filter_int"]

# Numeric filters must be within [0, 2**63): a UInt64 parameter of 2**64 would wrap to 0.
MAX_FILTER_VALUE = (1 << 63) - 1


def check_filter_int(name: str, value: Any, low: int = 0, high: int = MAX_FILTER_VALUE) -> int:
    """``value`` as an int within ``[low, high]``, else ValueError naming the filter and the bounds."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value), 10)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not an integer") from None
    if not low <= value <= high:
        raise ValueError(f"{name}={value} is out of range: it must be within {low}..{high}")
    return value


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
        self._open_client: Callable[[ClickHouseConfig], Client] = open_client  # a shard's client

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> VerdictSink:
        return cls(ClickHouseConfig.from_url(url, **overrides))

    @classmethod
    def from_env(cls) -> VerdictSink:
        return cls(ClickHouseConfig.from_env())

    # -- schema -------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Create the database and both tables if absent, then check their columns.

        Safe to call at every start and from several writers at once. Sharded, every
        server of the cluster gets its local tables and the Distributed tables first
        (no ``ON CLUSTER`` without ZooKeeper), then this server its Distributed tables.
        """
        cfg = self.config
        tables = [(cfg.verdicts_table, VERDICT_COLUMNS), (cfg.summaries_table, SUMMARY_COLUMNS)]
        if cfg.cluster:
            local = [(local_table_name(t), cols) for t, cols in tables]
            for shard_config in self.shard_configs():
                shard = self._open_client(shard_config)
                try:
                    for stmt in shard_ddl_statements(cfg):
                        shard.execute(stmt)
                    self._check_columns(shard, local + tables)
                    for stmt in view_statements(cfg):
                        shard.execute(stmt)
                finally:
                    shard.close()
        for stmt in ddl_statements(cfg):
            self.client.execute(stmt)
        self._check_columns(self.client, tables)
        for stmt in view_statements(cfg):
            self.client.execute(stmt)

    def shard_configs(self) -> list[ClickHouseConfig]:
        """This config once per server of ``config.cluster``, as the server this sink talks to names
        them in its ``remote_servers`` (SchemaMismatchError when it knows no such cluster)."""
        cfg, c = self.config, self.client
        if not cfg.cluster:
            return []
        res = c.query(cluster_shards_sql(c.placeholder("cluster", "String")), {"cluster": cfg.cluster})
        if not res.rows:
            raise SchemaMismatchError(
                f"{c.target} has no cluster {cfg.cluster!r} in its remote_servers "
                "(EROICA_CLICKHOUSE_CLUSTER names one of the server's clusters)"
            )
        return [cfg.replace(host=host, port=int(port)) for _shard, _replica, host, port in res.rows]

    def _check_columns(self, client: Client, tables: list[tuple[str, tuple[tuple[str, str], ...]]]) -> None:
        res = client.query(
            f"SELECT `table`, `name` FROM system.columns WHERE database = {client.placeholder('db', 'String')}",
            {"db": self.config.database},
        )
        have: dict[str, set[str]] = {}
        for table, name in res.rows:
            have.setdefault(table, set()).add(name)
        for table, cols in tables:
            missing = [n for n, _ in cols if n not in have.get(table, set())]
            if missing:
                raise SchemaMismatchError(
                    f"table {self.config.database}.{table} on {client.target} lacks columns {missing}; "
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
        """Merge parts now (``OPTIMIZE ... FINAL``); reads are correct without it.

        Sharded: the local tables of every server (a Distributed table cannot be optimized).
        """
        cfg = self.config
        if not cfg.cluster:
            for table in (cfg.verdicts, cfg.summaries):
                self.client.execute(f"OPTIMIZE TABLE {table} FINAL")
            return
        for shard_config in self.shard_configs():
            shard = self._open_client(shard_config)
            try:
                for table in (cfg.verdicts_table, cfg.summaries_table):
                    shard.execute(f"OPTIMIZE TABLE `{cfg.database}`.`{local_table_name(table)}` FINAL")
            finally:
                shard.close()

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
        res = c.query(sql, params or None, readonly=True)
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
        rank = None if rank is None else check_filter_int("rank", rank, low=-(1 << 31), high=(1 << 31) - 1)
        where, params = self._where(job, since_ns, [("rank", "Int32", rank), ("fn", "String", fn)])
        sql = (
            f"SELECT {', '.join(f'`{n}`' for n in SUMMARY_NAMES)} FROM {self.config.summaries} FINAL"
            + where
            + " ORDER BY window_start_ns, rank, fn, node, kind"
            + self._limit(limit, params)
        )
        res = c.query(sql, params or None, readonly=True)
        return summaries_from_rows(res.columns, res.rows)

    def sql_policy(self) -> SQLPolicy:
        """Eroica's database against every other one the engine holds (asked each time: cheap)."""
        return SQLPolicy.for_database(self.config.database, self.client.databases())

    def check_user_sql(self, sql: str) -> str:
        """The statement to run, or ReadOnlySQLError: tokenizer guard, then the engine's parse tree (chdb)."""
        policy = self.sql_policy()
        stmt = check_readonly_sql(sql, policy)
        explain = getattr(self.client, "explain_ast", None)
        if explain is not None:  # chdb; 18.16 has no EXPLAIN
            try:
                tree = explain(stmt)
            except ClickHouseError as exc:
                # SYNTAX_ERROR, READONLY (a setting), UNKNOWN_QUERY_PARAMETER: the user's to fix
                if exc.code in (62, 164, 456):
                    raise ReadOnlySQLError(f"the engine cannot parse it: {exc}") from None
                raise
            check_ast(tree, policy)
        return stmt

    def run_readonly_sql(self, sql: str) -> QueryResult:
        """Run one user read of Eroica's tables (SELECT/WITH, SHOW, DESCRIBE, EXISTS) on the read path.

        Raises ReadOnlySQLError (a ValueError) before the statement runs when it is
        not a single read of Eroica's tables (``readonly.py``), and ClickHouseError
        when the engine refuses it or a read limit stops it.
        """
        return self.client.query(self.check_user_sql(sql), None, readonly=True)

    def _where(self, job: str | None, since_ns: int | None,
               equal: list[tuple[str, str, Any]]) -> tuple[str, dict[str, Any]]:
        """`` WHERE ...`` (or "") and its bound parameters: job, window end >= since, column = value."""
        c = self.client
        filters = [("job", "String", job)] + equal
        where = [f"`{col}` = {c.placeholder(col, typ)}" for col, typ, value in filters if value is not None]
        params = {col: value for col, _typ, value in filters if value is not None}
        if since_ns is not None:
            where.append(f"window_end_ns >= {c.placeholder('since_ns', 'UInt64')}")
            params["since_ns"] = check_filter_int("since_ns", since_ns)
        return (f" WHERE {' AND '.join(where)}" if where else ""), params

    def _limit(self, limit: int | None, params: dict[str, Any]) -> str:
        if limit is None:
            return ""
        params["limit"] = check_filter_int("limit", limit, low=1)
        return f" LIMIT {self.client.placeholder('limit', 'UInt64')}"

    # -- lifecycle ------------------------------------------------------------
    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> VerdictSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
