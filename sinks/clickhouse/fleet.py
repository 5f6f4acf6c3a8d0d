"""A fleet that remembers: hardware blamed across jobs, from the stored verdicts.

A node, GPU or NIC blamed in several jobs is a machine to drain, not a job to
debug. :func:`fleet_sql` reads ``verdicts FINAL`` (read-only SQL in the subset
ClickHouse 18.16 and chdb share, accepted by the sink's read endpoint, which
takes no bind parameters: the only value in it is an integer bound rendered by
``int()``, the table names are checked identifiers); :func:`fleet_rows`
aggregates its answer per machine part:

* one row per (job, window, node, component, GPU) first, so a window that
  names the same part twice (a rank and its node) counts once;
* times blamed (windows), distinct jobs, GPU-hours lost (the verdicts'
  ``gpu_hours_lost_per_hour`` times the window's length; 0 where a verdict
  carries no cost), first and last seen;
* ``open``: the part is still blamed near the end of a job's stored history,
  within :data:`RESOLVE_AFTER_WINDOWS` windows of that job's latest one (the
  alert consumer's default ``--resolve-after``: after that many windows
  without a verdict an incident is resolved).

Sorted by GPU-hours lost, then times blamed. :func:`drain_list` is the nodes
of parts blamed in at least ``min_jobs`` distinct jobs, costliest first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .config import check_identifier
from .schema import HARDWARE_COMPONENTS

__all__ = ["FleetRow", "fleet_sql", "job_ends_sql", "fleet_rows", "drain_list", "RESOLVE_AFTER_WINDOWS"]

RESOLVE_AFTER_WINDOWS = 3   # sinks/alerts: --resolve-after's default
NS_PER_HOUR = 3_600 * 10**9


@dataclass
class FleetRow:
    node: str
    component: str
    gpu: int                 # -1: the node (or its NIC), not one GPU
    times_blamed: int        # windows
    jobs: int
    gpu_hours_lost: float
    first_seen_ns: int
    last_seen_ns: int
    open: bool
    job_list: list[str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _table(qualified: str) -> str:
    """```db`.`table``` or ``db.table`` -> checked, backquoted."""
    parts = [p.strip("`") for p in qualified.replace("`.`", ".").split(".")]
    if len(parts) != 2:
        raise ValueError(f"table {qualified!r} must be database.table")
    return ".".join(f"`{check_identifier(p, 'name')}`" for p in parts)


def fleet_sql(verdicts_table: str, since_ns: int | None) -> str:
    """Per (node, component, GPU, job): windows blamed, GPU-hours lost, first and last seen."""
    comps = ", ".join(f"'{c}'" for c in HARDWARE_COMPONENTS)  # constants of the schema, not input
    since = f" AND window_end_ns >= {int(since_ns)}" if since_ns is not None else ""
    return (
        "SELECT node, component, gpu, job, count() AS windows, sum(lost) AS gpu_hours_lost,\n"
        "    min(window_start_ns) AS first_seen_ns, max(window_end_ns) AS last_seen_ns\n"
        "FROM (\n"
        "    SELECT job, window_start_ns, window_end_ns, node, component, if(scope = 'rank', gpu, -1) AS gpu,\n"
        "        maxIf(gpu_hours_lost_per_hour, NOT isNaN(gpu_hours_lost_per_hour))\n"
        f"            * (window_end_ns - window_start_ns) / {NS_PER_HOUR} AS lost\n"
        f"    FROM {_table(verdicts_table)} FINAL\n"
        f"    WHERE kind = 'slow' AND node != '' AND component IN ({comps}){since}\n"
        "    GROUP BY job, window_start_ns, window_end_ns, node, component, gpu\n"
        ")\n"
        "GROUP BY node, component, gpu, job\n"
        "ORDER BY node, component, gpu, job"
    )


def job_ends_sql(verdicts_table: str, summaries_table: str, since_ns: int | None) -> str:
    """Each job's latest stored window (verdicts and window summaries: a healthy window has no verdict)."""
    since = f" WHERE window_end_ns >= {int(since_ns)}" if since_ns is not None else ""
    return (
        "SELECT job, max(window_end_ns) AS end_ns,\n"
        "    argMax(window_end_ns - window_start_ns, window_end_ns) AS window_ns\n"
        "FROM (\n"
        f"    SELECT job, window_start_ns, window_end_ns FROM {_table(verdicts_table)}{since}\n"
        "    UNION ALL\n"
        f"    SELECT job, window_start_ns, window_end_ns FROM {_table(summaries_table)}{since}\n"
        ")\n"
        "GROUP BY job"
    )


def fleet_rows(per_job: list[dict[str, Any]], job_ends: list[dict[str, Any]]) -> list[FleetRow]:
    """The answer of :func:`fleet_sql` (as dicts) per machine part, costliest first."""
    ends = {r["job"]: (int(r["end_ns"]), int(r["window_ns"] or 0)) for r in job_ends}
    out: dict[tuple[str, str, int], FleetRow] = {}
    for r in per_job:
        key = (str(r["node"]), str(r["component"]), int(r["gpu"]))
        job = str(r["job"])
        lost = float(r["gpu_hours_lost"] or 0.0)
        first, last = int(r["first_seen_ns"]), int(r["last_seen_ns"])
        end, window = ends.get(job, (last, 0))
        still = last >= end - RESOLVE_AFTER_WINDOWS * window
        row = out.get(key)
        if row is None:
            out[key] = FleetRow(*key, times_blamed=int(r["windows"]), jobs=1, gpu_hours_lost=lost,
                                first_seen_ns=first, last_seen_ns=last, open=still, job_list=[job])
        else:
            row.times_blamed += int(r["windows"])
            row.jobs += 1
            row.gpu_hours_lost += lost
            row.first_seen_ns = min(row.first_seen_ns, first)
            row.last_seen_ns = max(row.last_seen_ns, last)
            row.open = row.open or still
            row.job_list.append(job)
    for row in out.values():
        row.gpu_hours_lost = round(row.gpu_hours_lost, 4)
        row.job_list.sort()
    return sorted(out.values(), key=lambda f: (-f.gpu_hours_lost, -f.times_blamed, f.node, f.component, f.gpu))


def drain_list(rows: list[FleetRow], min_jobs: int = 2) -> list[str]:
    """Nodes whose hardware was blamed in at least ``min_jobs`` distinct jobs, costliest first."""
    jobs: dict[str, set[str]] = {}
    lost: dict[str, float] = {}
    for r in rows:
        jobs.setdefault(r.node, set()).update(r.job_list)
        lost[r.node] = lost.get(r.node, 0.0) + r.gpu_hours_lost
    return sorted((n for n, js in jobs.items() if len(js) >= min_jobs), key=lambda n: (-lost[n], n))
