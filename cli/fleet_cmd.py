"""``eroica fleet``: hardware blamed across jobs (node, GPU, NIC), costliest first, from ClickHouse.

Node names are free text under the contract: the table and the drain list print
them through :func:`~eroica.cli.tables.printable` (a control or bidirectional
character shown as its escape), so a node name cannot drive the terminal nor
add a line, i.e. another node, to the drain list. ``--format json`` is written
with ``ensure_ascii`` (every non-ASCII character escaped).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .stack_options import STACK_EXIT_CODES, NoStack, clickhouse_option, data_dir_option, query_target
from .tables import printable
from .verdicts_cmd import parse_since


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
        sys.stdout.write(json.dumps({"since_ns": since_ns, "culprits": [r.to_json() for r in rows]}, indent=1) + "\n")
        return
    if not rows:
        click.echo("no hardware blamed" + (f" since {printable(since)}" if since_ns is not None else ""))
        return
    from datetime import datetime, timezone

    def when(ns: int) -> str:
        return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")

    head = ["node", "component", "gpu", "windows", "jobs", "GPU-h lost", "first seen (UTC)", "last seen (UTC)", "state"]
    body = [[printable(r.node), printable(r.component), "-" if r.gpu < 0 else str(r.gpu), str(r.times_blamed), str(r.jobs),
             f"{r.gpu_hours_lost:.2f}", when(r.first_seen_ns), when(r.last_seen_ns), "open" if r.open else "resolved"]
            for r in rows]
    # plain aligned columns (no box drawing): readable at any width and easy to grep
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    for line in [head, *body]:
        click.echo("  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip())
