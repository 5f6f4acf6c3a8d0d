"""A job's verdicts and window summaries from ClickHouse, through the target ``eroica verdicts`` uses.

The SQL is read-only and in the subset ClickHouse 18.16 and chdb share (the
sink's endpoint accepts it as well): ``FINAL`` for the deduplicated rows, the
job as an escaped string literal (the endpoint takes no parameters).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from eroica.models.verdict import Verdict
from eroica.sinks.clickhouse.config import DEFAULT_URL, ClickHouseConfig
from eroica.runtime.state import live_state

__all__ = ["load_job", "summaries_sql", "sql_string", "table_names"]

SUMMARY_FIELDS = ("window_start_ns", "window_end_ns", "rank", "node", "fn", "kind", "count", "median_ns",
                  "total_ns", "beta", "slowdown_vs_peers")
MAX_SUMMARY_ROWS = 2_000_000


def sql_string(value: str) -> str:
    """A ClickHouse string literal (backslash and quote escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def table_names(clickhouse_url: str | None, data_dir: Path) -> tuple[str, str]:
    """``(database.verdicts, database.summaries)`` for the target the query resolution picks."""
    url = clickhouse_url or os.environ.get("EROICA_CLICKHOUSE_URL") or None
    if url is None:
        state = live_state(data_dir)
        url = (state or {}).get("clickhouse", {}).get("url") or None
    if url is None:
        chdb_dir = Path(data_dir) / "chdb"
        url = f"chdb://{chdb_dir.resolve()}" if chdb_dir.is_dir() else DEFAULT_URL
    env = {k: v for k, v in os.environ.items() if k.startswith("EROICA_CLICKHOUSE_")}
    env["EROICA_CLICKHOUSE_URL"] = url
    cfg = ClickHouseConfig.from_env(env)
    return f"`{cfg.database}`.`{cfg.verdicts_table}`", f"`{cfg.database}`.`{cfg.summaries_table}`"


def summaries_sql(table: str, job: str, since_ns: int | None) -> str:
    where = f"job = {sql_string(job)}"
    if since_ns is not None:
        where += f" AND window_end_ns >= {int(since_ns)}"
    return (f"SELECT {', '.join(SUMMARY_FIELDS)} FROM {table} FINAL WHERE {where} "
            f"ORDER BY window_start_ns, rank, fn LIMIT {MAX_SUMMARY_ROWS}")


def load_job(target: Any, job: str, since_ns: int | None, clickhouse_url: str | None,
             data_dir: Path) -> tuple[list[Verdict], list[dict[str, Any]]]:
    """(verdicts, summary rows as dicts) of ``job``."""
    _verdicts_table, summaries_table = table_names(clickhouse_url, data_dir)
    verdicts = target.verdicts(job=job, since_ns=since_ns, limit=100_000)
    result = target.sql(summaries_sql(summaries_table, job, since_ns))
    rows = result.dicts()
    for r in rows:  # JSON endpoints give NaN as null
        if r.get("slowdown_vs_peers") is None:
            r["slowdown_vs_peers"] = float("nan")
    return verdicts, rows
