"""DDL for the verdict and summary tables.

The SQL is the subset that both ClickHouse 18.16 (Debian's package) and current
ClickHouse (chdb) accept: plain scalar types and ``Array(Int32)``, no
Nullable/Map/DateTime64/TTL/LowCardinality, new-style MergeTree clauses.

Idempotency: both tables are ``ReplacingMergeTree``. Rows with equal sorting
keys collapse to the one with the highest version column when parts merge, and
queries read ``FINAL`` so duplicates never show, merged or not.

- ``verdicts``: key ``(job, window_start_ns, verdict_id)``. ``verdict_id``
  already hashes job and window, so the key is a function of ``verdict_id``
  alone: re-inserting a verdict replaces it. Version ``detected_at_ns``: the
  latest detection of a finding wins (18.16 needs an unsigned version column,
  hence ``UInt64`` times; the contract's times are never negative).
  ``peers``/``victims`` are ``Array(Int32)``: 18.16 takes them over the native
  protocol and chdb from JSONEachRow. ``evidence`` is a JSON string.
- ``summaries``: one row per (job, window, rank, fn), the tidy ("long") form a
  Grafana heat map of rank x fn reads directly (x = fn, y = rank, value = beta
  or slowdown_vs_peers), with ``window_start`` (a ``DateTime`` computed from
  ``window_start_ns``) for Grafana's time filter macros. Version
  ``written_at_ns``: a rewritten window replaces the old rows.

  Example Grafana query (ClickHouse data source)::

      SELECT fn, toString(rank) AS rank, avg(beta) AS beta
      FROM eroica.summaries FINAL
      WHERE job = '$job' AND $__timeFilter(window_start)
      GROUP BY fn, rank ORDER BY fn, rank
"""

from __future__ import annotations

from .config import ClickHouseConfig, check_identifier

__all__ = [
    "VERDICT_COLUMNS", "SUMMARY_COLUMNS", "VERDICT_NAMES", "SUMMARY_NAMES",
    "create_database_sql", "verdicts_table_sql", "summaries_table_sql", "ddl_statements",
]

# (name, type) in the Verdict struct's field order, then incident_id.
VERDICT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("verdict_id", "String"),
    ("job", "String"),
    ("window_start_ns", "UInt64"),
    ("window_end_ns", "UInt64"),
    ("detected_at_ns", "UInt64"),
    ("kind", "String"),
    ("component", "String"),
    ("scope", "String"),
    ("node", "String"),
    ("rank", "Int32"),
    ("gpu", "Int32"),
    ("fn", "String"),
    ("slowdown", "Float64"),
    ("score", "Float64"),
    ("confidence", "Float64"),
    ("peers", "Array(Int32)"),
    ("victims", "Array(Int32)"),
    ("evidence", "String"),
    ("summary", "String"),
    ("incident_id", "String"),
)

# Inserted columns of the summaries table (window_start is MATERIALIZED, never inserted).
SUMMARY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("job", "String"),
    ("window_start_ns", "UInt64"),
    ("window_end_ns", "UInt64"),
    ("rank", "Int32"),
    ("node", "String"),
    ("fn", "String"),
    ("kind", "String"),
    ("count", "UInt64"),
    ("median_ns", "Float64"),
    ("p90_ns", "Float64"),
    ("p99_ns", "Float64"),
    ("total_ns", "Float64"),
    ("beta", "Float64"),
    ("slowdown_vs_peers", "Float64"),
    ("written_at_ns", "UInt64"),
)

VERDICT_NAMES: tuple[str, ...] = tuple(n for n, _ in VERDICT_COLUMNS)
SUMMARY_NAMES: tuple[str, ...] = tuple(n for n, _ in SUMMARY_COLUMNS)

# Seconds since the epoch as DateTime; intDiv keeps it integral on both versions.
_WINDOW_START = "toDateTime(intDiv(window_start_ns, 1000000000))"


def _columns(cols: tuple[tuple[str, str], ...]) -> str:
    return ",\n".join(f"    `{name}` {typ}" for name, typ in cols)


def create_database_sql(database: str) -> str:
    return f"CREATE DATABASE IF NOT EXISTS `{check_identifier(database, 'database name')}`"


def verdicts_table_sql(database: str, table: str) -> str:
    db, t = check_identifier(database, "database name"), check_identifier(table, "table name")
    return (
        f"CREATE TABLE IF NOT EXISTS `{db}`.`{t}` (\n{_columns(VERDICT_COLUMNS)}\n)\n"
        "ENGINE = ReplacingMergeTree(detected_at_ns)\n"
        f"PARTITION BY toYYYYMM({_WINDOW_START})\n"
        "ORDER BY (job, window_start_ns, verdict_id)"
    )


def summaries_table_sql(database: str, table: str) -> str:
    db, t = check_identifier(database, "database name"), check_identifier(table, "table name")
    return (
        f"CREATE TABLE IF NOT EXISTS `{db}`.`{t}` (\n{_columns(SUMMARY_COLUMNS)},\n"
        f"    `window_start` DateTime MATERIALIZED {_WINDOW_START}\n)\n"
        "ENGINE = ReplacingMergeTree(written_at_ns)\n"
        "PARTITION BY toYYYYMM(window_start)\n"
        "ORDER BY (job, window_start_ns, fn, rank, node, kind, window_end_ns)"
    )


def ddl_statements(config: ClickHouseConfig) -> list[str]:
    """The statements ensure_schema runs, in order (each is idempotent)."""
    return [
        create_database_sql(config.database),
        verdicts_table_sql(config.database, config.verdicts_table),
        summaries_table_sql(config.database, config.summaries_table),
    ]
