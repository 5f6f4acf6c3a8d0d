"""``eroica fleet``: hardware blamed across jobs (node, GPU, NIC), costliest first, from ClickHouse.

Node names are free text under the contract: the table and the drain list print
them through :func:`~eroica.cli.tables.printable` (a control or bidirectional
character shown as its escape), so a node name cannot drive the terminal nor
add a line, i.e. another node, to the drain list. ``--format json`` is written
with ``ensure_ascii`` (every non-ASCII character escaped).

The hardware column names the part blamed: ``GPU 1`` for a GPU (or its memory),
``GPU 1 PCIe`` / ``GPU 1 NVLink`` for a GPU's link (``NVLink`` when no one GPU's is),
the port (``mlx5_0``) for a NIC, ``CPU`` for the host's CPU. A NIC's port is no
column of the verdicts table: it is the verdict's ``evidence["nic"]["culprit"]``
(the JSON string column), read by :func:`nic_ports_sql` and :func:`nic_ports`;
the JSON output lists them as ``nic_ports``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from .stack_options import STACK_EXIT_CODES, NoStack, clickhouse_option, data_dir_option, query_target
from .tables import aligned, printable
from .verdicts_cmd import parse_since


def nic_ports_sql(verdicts_table: str, since_ns: int | None) -> str:
    """The evidence of the NIC verdicts :func:`~eroica.sinks.clickhouse.fleet.fleet_sql` counts, per node.

    Same filter as ``fleet_sql``'s (a NIC finding has node scope, so its rows are the node's NIC row);
    ``DISTINCT`` drops the windows whose evidence is the same. Shared-subset SQL, no bind parameters:
    the table name is checked, the bound rendered by ``int()``.
    """
    from eroica.sinks.clickhouse.fleet import _table

    since = f" AND window_end_ns >= {int(since_ns)}" if since_ns is not None else ""
    return (f"SELECT DISTINCT node, evidence FROM {_table(verdicts_table)} FINAL\n"
            f"WHERE kind = 'slow' AND component = 'nic' AND node != ''{since}")


def nic_ports(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """node -> the NIC ports its verdicts blamed (``evidence["nic"]["culprit"]``), sorted; unreadable evidence skipped."""
    out: dict[str, set[str]] = {}
    for r in rows:
        try:
            ev = json.loads(r["evidence"]) if isinstance(r["evidence"], (str, bytes)) else r["evidence"]
        except ValueError:
            continue
        nic = ev.get("nic") if isinstance(ev, dict) else None
        port = nic.get("culprit") if isinstance(nic, dict) else nic
        if isinstance(port, str) and port:
            out.setdefault(str(r["node"]), set()).add(port)
    return {node: sorted(ports) for node, ports in out.items()}


def hardware(component: str, gpu: int, ports: list[str]) -> str:
    """What was blamed, in words: ``GPU 1``, ``GPU 1 NVLink``, ``mlx5_0``, ``CPU`` ('-' where unknown)."""
    if component == "nic":
        return ",".join(ports) or "-"
    if component in ("pcie", "nvlink"):
        link = "PCIe" if component == "pcie" else "NVLink"
        return f"GPU {gpu} {link}" if gpu >= 0 else link
    if component == "host_cpu":
        return "CPU"
    return f"GPU {gpu}" if gpu >= 0 else "-"


@click.command("fleet", epilog=STACK_EXIT_CODES)
@click.option("--since", default="7d", show_default=True, metavar="DURATION",
              help="Only verdicts of windows that ended this long ago or later (90s, 15m, 1h, 2d, 1w, all).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--drain-list", "drain", is_flag=True,
              help="Print only the nodes to drain, one per line (blamed in at least --min-jobs jobs).")
@click.option("--min-jobs", type=click.IntRange(min=1), default=2, show_default=True,
              help="Distinct jobs that must blame a node's hardware for the drain list.")
@clickhouse_option
@data_dir_option
def fleet(since: str, fmt: str, drain: bool, min_jobs: int, clickhouse_url: str | None,
          data_dir: Path | None) -> None:
    """List hardware culprits across jobs: times blamed, jobs, GPU-hours lost, first/last seen, open or not.

    \b
    Examples:
      eroica fleet
      eroica fleet --since 30d --format json
      eroica fleet --drain-list > drain.txt      # one node per line, for the scheduler
    """
    from eroica.sinks.clickhouse.client import ClickHouseError
    from eroica.sinks.clickhouse.fleet import drain_list, fleet_rows, fleet_sql, job_ends_sql
    from eroica.report.query import table_names

    since_ns = parse_since(since)
    try:
        target = query_target(clickhouse_url, data_dir)
    except NoStack as exc:
        click.echo(f"eroica fleet: {printable(exc)}", err=True)
        sys.exit(1)
    try:
        from .stack_options import resolve_data_dir

        verdicts_t, summaries_t = table_names(clickhouse_url, resolve_data_dir(data_dir))
        per_job = target.sql(fleet_sql(verdicts_t, since_ns)).dicts()
        ends = target.sql(job_ends_sql(verdicts_t, summaries_t, since_ns)).dicts()
        ports = nic_ports(target.sql(nic_ports_sql(verdicts_t, since_ns)).dicts()) if not drain else {}
    except (ClickHouseError, ValueError) as exc:
        click.echo(f"eroica fleet: {printable(exc)}", err=True)
        sys.exit(1)
    finally:
        target.close()
    rows = fleet_rows(per_job, ends)
    if drain:
        for node in drain_list(rows, min_jobs):
            click.echo(printable(node))
        return
    if fmt == "json":
        culprits = [{**r.to_json(), "nic_ports": ports.get(r.node, []) if r.component == "nic" else []} for r in rows]
        sys.stdout.write(json.dumps({"since_ns": since_ns, "culprits": culprits}, indent=1) + "\n")
        return
    if not rows:
        click.echo("no hardware blamed" + (f" since {printable(since)}" if since_ns is not None else ""))
        return
    from datetime import datetime, timezone

    def when(ns: int) -> str:
        return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")

    head = ["node", "component", "hardware", "windows", "jobs", "GPU-h lost", "first seen (UTC)", "last seen (UTC)",
            "state"]
    body = [[printable(r.node), printable(r.component), printable(hardware(r.component, r.gpu, ports.get(r.node, []))),
             str(r.times_blamed), str(r.jobs),
             f"{r.gpu_hours_lost:.2f}", when(r.first_seen_ns), when(r.last_seen_ns), "open" if r.open else "resolved"]
            for r in rows]
    for line in aligned([head, *body]):  # plain columns: readable at any width and easy to grep
        click.echo(line)
