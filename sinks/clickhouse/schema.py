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
  protocol and chdb from JSONCompactEachRow. ``evidence`` is a JSON string.
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

Sharded (``config.cluster``, a ``remote_servers`` cluster of ClickHouse
servers; server only, chdb has no cluster). All of its DDL is in this module:
:func:`shard_ddl_statements` (every shard), :func:`ddl_statements` (the server
the sink talks to), :func:`distributed_table_sql`, :data:`SHARDING_KEY`.

- Each shard holds the tables above under ``<name>_local``
  (:func:`local_table_name`), the same ReplacingMergeTree.
- ``<name>`` itself is a ``Distributed`` table over them, on every shard (any
  shard can take writes and reads), so everything that reads ``verdicts`` /
  ``summaries`` (``eroica verdicts``/``sql``/``report``/``fleet``, the
  ``job_windows`` view, the dashboards) reads every shard, unchanged.
- Rows go to shard ``cityHash64(job) % shards`` (:data:`SHARDING_KEY`, equal
  weights). Replacement works only within a shard, so every copy of a row
  must land on the same one: both tables' keys start with ``job`` and a
  verdict id hashes its job, so a job key sends each verdict id, and each
  summary cell, always to the same shard (``verdict_id`` could not shard the
  summaries, which have none). A job's whole history stays on one shard.
  Skew is bounded by the size of one job, which is small for these tables.
- ``FINAL`` through a Distributed table runs on each shard and the shards'
  rows are disjoint, so ``SELECT ... FINAL`` reads each key once.
- ClickHouse 18.16 refuses a ``MATERIALIZED`` column in a Distributed
  insert ("Cannot insert column window_start, because it is MATERIALIZED
  column"), so the Distributed summaries table declares ``window_start`` as an
  ``ALIAS`` of the same expression (computed on the shards when read); its
  columns are therefore written out, not copied with ``AS``.
- No ``ON CLUSTER`` (it needs ZooKeeper): the sink runs the DDL on each shard
  itself (``VerdictSink.ensure_schema``, addresses from ``system.clusters``).
"""

from __future__ import annotations

from .config import ClickHouseConfig, check_identifier

__all__ = [
    "VERDICT_COLUMNS", "SUMMARY_COLUMNS", "VERDICT_NAMES", "SUMMARY_NAMES",
    "create_database_sql", "verdicts_table_sql", "summaries_table_sql", "ddl_statements",
    "JOB_WINDOWS_VIEW", "HARDWARE_COMPONENTS", "job_windows_view_sql", "migrate_verdicts_sql", "view_statements",
    "SHARDING_KEY", "LOCAL_SUFFIX", "local_table_name", "distributed_table_sql", "shard_ddl_statements",
    "cluster_shards_sql",
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
    # what the problem costs (optional verdict fields; NaN when the verdict carries none: 18.16 has no
    # Nullable in the subset we use)
    ("job_slowdown", "Float64"),
    ("cost", "Float64"),
    ("gpu_hours_lost_per_hour", "Float64"),
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


JOB_WINDOWS_VIEW = "job_windows"

# Components that name a machine part: a node, GPU or NIC blamed in several jobs is a machine to drain.
HARDWARE_COMPONENTS: tuple[str, ...] = ("gpu", "gpu_memory", "pcie", "nvlink", "nic", "host_cpu")


def job_windows_view_sql(database: str, verdicts_table: str, view: str = JOB_WINDOWS_VIEW) -> str:
    """One row per (job, window) that has a slow verdict: the window's slowdown S (``window_slowdown``),
    the GPU-hours per hour the job loses to it (``job_gpu_hours_lost_per_hour`` = world x (1 - 1/S)),
    and its costliest culprit (``top_cost``, ``top_component``, ``top_node``, ``top_rank``,
    ``culprit_gpu_hours_lost_per_hour``); Grafana: x = ``window_start``. Aliases differ from the
    table's column names (ClickHouse resolves an alias before a column of the same name).

    A plain view over ``verdicts FINAL`` (no second copy to keep in step with the sink): every verdict
    of a window carries the same ``job_slowdown``; the world size is recovered from the costliest
    culprit, ``gpu_hours_lost_per_hour / (1 - 1/cost)`` (0 when no culprit has a cost above 1).
    Windows without a verdict are not in it (the detector emits verdicts, not window records).
    """
    db = check_identifier(database, "database name")
    t, v = check_identifier(verdicts_table, "table name"), check_identifier(view, "view name")
    return (
        f"CREATE VIEW IF NOT EXISTS `{db}`.`{v}` AS\n"
        "SELECT job, window_start_ns, window_end_ns,\n"
        f"    {_WINDOW_START} AS window_start,\n"
        "    max(job_slowdown) AS window_slowdown,\n"
        "    maxIf(cost, cost > 1) AS top_cost,\n"
        "    argMaxIf(component, cost, cost > 1) AS top_component,\n"
        "    argMaxIf(node, cost, cost > 1) AS top_node,\n"
        "    argMaxIf(rank, cost, cost > 1) AS top_rank,\n"
        "    maxIf(gpu_hours_lost_per_hour, cost > 1) AS culprit_gpu_hours_lost_per_hour,\n"
        "    maxIf(round(gpu_hours_lost_per_hour / (1 - 1 / cost)), cost > 1) AS world_size,\n"
        "    world_size * (1 - 1 / window_slowdown) AS job_gpu_hours_lost_per_hour,\n"
        "    count() AS verdicts\n"
        f"FROM `{db}`.`{t}` FINAL\n"
        "WHERE kind = 'slow' AND NOT isNaN(job_slowdown)\n"
        "GROUP BY job, window_start_ns, window_end_ns"
    )


def migrate_verdicts_sql(database: str, verdicts_table: str) -> list[str]:
    """For a verdicts table created before the cost columns (run once by hand; 18.16 has no
    ``ADD COLUMN IF NOT EXISTS``, so these are not run at every start). Sharded: on each shard,
    for ``local_table_name(verdicts_table)`` and for the Distributed ``verdicts_table``."""
    db, t = check_identifier(database, "database name"), check_identifier(verdicts_table, "table name")
    return [f"ALTER TABLE `{db}`.`{t}` ADD COLUMN `{n}` Float64 DEFAULT nan"
            for n in ("job_slowdown", "cost", "gpu_hours_lost_per_hour")]


# -- sharded (server only) ------------------------------------------------------------------
SHARDING_KEY = "cityHash64(job)"
LOCAL_SUFFIX = "_local"


def local_table_name(table: str) -> str:
    """The shard-local table behind the Distributed table ``table``."""
    return check_identifier(check_identifier(table, "table name") + LOCAL_SUFFIX, "local table name")


def distributed_table_sql(database: str, table: str, cluster: str, local_table: str,
                          columns: tuple[tuple[str, str], ...], extra: str = "") -> str:
    """``CREATE TABLE db.table (...) ENGINE = Distributed(cluster, db, local_table, SHARDING_KEY)``."""
    db, t = check_identifier(database, "database name"), check_identifier(table, "table name")
    c, lt = check_identifier(cluster, "cluster name"), check_identifier(local_table, "table name")
    return (
        f"CREATE TABLE IF NOT EXISTS `{db}`.`{t}` (\n{_columns(columns)}{extra}\n)\n"
        f"ENGINE = Distributed('{c}', '{db}', '{lt}', {SHARDING_KEY})"
    )


def _distributed_statements(config: ClickHouseConfig) -> list[str]:
    db, cluster = config.database, config.cluster
    return [
        distributed_table_sql(db, config.verdicts_table, cluster, local_table_name(config.verdicts_table),
                              VERDICT_COLUMNS),
        distributed_table_sql(db, config.summaries_table, cluster, local_table_name(config.summaries_table),
                              SUMMARY_COLUMNS, f",\n    `window_start` DateTime ALIAS {_WINDOW_START}"),
    ]


def shard_ddl_statements(config: ClickHouseConfig) -> list[str]:
    """What each shard of ``config.cluster`` runs, in order (idempotent): the database, the local
    ReplacingMergeTree tables and the Distributed tables over the whole cluster."""
    if not config.cluster:
        raise ValueError("shard_ddl_statements needs a cluster (EROICA_CLICKHOUSE_CLUSTER)")
    return [
        create_database_sql(config.database),
        verdicts_table_sql(config.database, local_table_name(config.verdicts_table)),
        summaries_table_sql(config.database, local_table_name(config.summaries_table)),
        *_distributed_statements(config),
    ]


def cluster_shards_sql(placeholder: str) -> str:
    """Every server of a cluster as the server asked knows it (its ``remote_servers``), the cluster's
    name bound at ``placeholder``: ``(shard_num, replica_num, host_name, port)``. The tables are not
    replicated, so each replica of a shard gets the DDL too (a Distributed insert writes to each)."""
    return ("SELECT shard_num, replica_num, host_name, port FROM system.clusters "
            f"WHERE cluster = {placeholder} ORDER BY shard_num, replica_num")


def ddl_statements(config: ClickHouseConfig) -> list[str]:
    """The statements ensure_schema runs on the server it talks to, in order (each is idempotent).

    Sharded: the database and the Distributed tables only (the shards get
    :func:`shard_ddl_statements`; this server is usually one of them).
    """
    if config.cluster:
        return [create_database_sql(config.database), *_distributed_statements(config)]
    return [
        create_database_sql(config.database),
        verdicts_table_sql(config.database, config.verdicts_table),
        summaries_table_sql(config.database, config.summaries_table),
    ]


def view_statements(config: ClickHouseConfig) -> list[str]:
    """Views over the tables, to run once their columns are checked (idempotent).

    Not part of :func:`ddl_statements`: ClickHouse 18.16 resolves a view's columns when it is
    created, so over a table of an older version (without the cost columns) the ``CREATE VIEW``
    would fail before the sink's column check could say "lacks columns ...: migrate".
    """
    return [job_windows_view_sql(config.database, config.verdicts_table)]
