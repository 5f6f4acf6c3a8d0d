"""``eroica report``: one self-contained HTML page per run, from files or from ClickHouse.

The page escapes names itself (:mod:`eroica.report.render`); the messages here
name jobs too, and print them through :func:`~eroica.cli.tables.printable`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from .main import EXIT_NO_VALID_RECORD
from .stack_options import clickhouse_option, data_dir_option, query_target, resolve_data_dir
from .tables import printable


@click.command("report", epilog="""\b
Exit codes: 0 page written, 1 runtime error (unreadable input; with --job:
no stack found, ClickHouse unreachable, nothing stored for the job), 2 usage
error, 3 no valid record in the input FILEs.""")
@click.argument("files", nargs=-1, type=click.Path(allow_dash=True))
@click.option("--job", default=None, help="Build the page from ClickHouse (verdicts + summaries) for this job "
                                          "instead of from FILEs; with FILEs, keep only this job.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("report.html"),
              show_default=True, help="The HTML file to write ('-' for stdout).")
@click.option("--out-dir", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write one page per job into this folder, named as `eroica alert --report-url-base` "
                   "links to it (the job URL-encoded, .html); instead of -o.")
@click.option("--window", "window_s", type=click.FloatRange(min=1.0), default=30.0, show_default=True,
              help="Window length in seconds when analysing FILEs (as `eroica analyze`).")
@click.option("--since", default=None, metavar="DURATION",
              help="With --job: only windows ending within this long before now (1h, 2d) [default: all].")
@clickhouse_option
@data_dir_option
@click.option("-q", "--quiet", is_flag=True, help="No progress or summary on stderr.")
@click.pass_context
def report(ctx: click.Context, files: tuple[str, ...], job: str | None, output: Path, out_dir: Path | None,
           window_s: float, since: str | None, clickhouse_url: str | None, data_dir: Path | None,
           quiet: bool) -> None:
    """Write one HTML page (no network needed to open it) for a job: who is slow, when, why.

    From FILEs (contract JSON Lines, gzip or '-'), the detection core runs
    over them in one pass, as `eroica analyze`. With --job and no FILE, the
    page is built from the verdicts and window summaries stored in ClickHouse
    (found as `eroica verdicts` finds them).

    The page shows a rank x function heat-map of slowdown against peers (the
    culprit's row framed), a step-time timeline with the windows where
    verdicts fired, the verdicts with their evidence, and the culprit's
    counters against the peer median.

    \b
    Examples:
      eroica report run.jsonl -o run.html
      eroica report run.jsonl.gz --window 20 -o - > run.html
      eroica report --job sim-1 --since 2h -o sim-1.html
      eroica report --job sim-1 --clickhouse clickhouse://127.0.0.1:9000/eroica
      eroica report --job sim-1 --out-dir /srv/eroica-reports   # -> sim-1.html, what alerts link to
    """
    from eroica.report.render import render_page

    if not files and not job:
        raise click.UsageError("give FILE(s) to analyse, or --job J to read a job from ClickHouse")
    if out_dir is not None and ctx.get_parameter_source("output") != click.core.ParameterSource.DEFAULT:
        raise click.UsageError("give -o FILE or --out-dir DIR, not both")
    if files:
        reports = _from_files(files, job, window_s, quiet)
    else:
        assert job is not None
        reports = _from_clickhouse(job, since, clickhouse_url, data_dir)
    if out_dir is not None:
        _write_per_job(reports, out_dir, quiet)
        return
    page = render_page(reports, time.time_ns(), title=f"Eroica report: {', '.join(r.job for r in reports)}")
    if str(output) == "-":
        sys.stdout.write(page)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(page, encoding="utf-8")
    if not quiet:
        found = sum(len(r.verdicts) for r in reports)
        where = "stdout" if str(output) == "-" else printable(output)
        click.echo(f"eroica report: {len(reports)} job(s), {found} verdict(s) -> {where}", err=True)


def _write_per_job(reports: list, out_dir: Path, quiet: bool) -> None:
    """One page per job, ``DIR/<report_file_name(job)>`` (the name alert links point to; sinks/alerts/links.py)."""
    from eroica.report.render import render_page
    from eroica.sinks.alerts.links import report_file_name

    out_dir.mkdir(parents=True, exist_ok=True)
    now = time.time_ns()
    for r in reports:
        path = out_dir / report_file_name(r.job)
        tmp = path.with_name(f".{path.name}.tmp")  # a reader following a link never sees half a page
        tmp.write_text(render_page([r], now, title=f"Eroica report: {r.job}"), encoding="utf-8")
        tmp.replace(path)
        if not quiet:
            click.echo(f"eroica report: job {printable(repr(r.job))}, {len(r.verdicts)} verdict(s) -> "
                       f"{printable(path)}", err=True)


def _from_files(files: tuple[str, ...], job: str | None, window_s: float, quiet: bool) -> list:
    from eroica.models.reader import read_batches
    from eroica.report.core import run_core
    from eroica.report.data import from_windows

    from .progress import track_batches

    for f in files:
        if f != "-" and not Path(f).is_file():
            raise click.UsageError(f"no such file: {f}")
    counts = {"valid": 0, "invalid": 0}

    def batches():
        for path in files:
            for batch in read_batches(path):
                counts["valid"] += batch.valid_count
                counts["invalid"] += len(batch.invalid)
                yield batch

    window_ns = int(window_s * 1e9)
    try:
        results = list(run_core(track_batches(batches(), files, enabled=not quiet), window_ns,
                                detected_at_ns=time.time_ns()))
    except OSError as exc:
        click.echo(f"eroica report: {printable(exc)}", err=True)
        sys.exit(1)
    if counts["valid"] == 0:
        click.echo("eroica report: no valid record in the input; nothing to report", err=True)
        sys.exit(EXIT_NO_VALID_RECORD)
    if counts["invalid"] and not quiet:
        click.echo(f"eroica report: {counts['invalid']} invalid record(s) skipped "
                   "(`eroica analyze` shows the reasons)", err=True)
    jobs = sorted({r.job for r in results})
    if job is not None:
        if job not in jobs:
            click.echo(f"eroica report: job {printable(repr(job))} is not in the input "
                       f"(jobs: {printable(', '.join(jobs)) or 'none'})", err=True)
            sys.exit(1)
        jobs = [job]
    source = "files: " + ", ".join(Path(f).name if f != "-" else "stdin" for f in files)
    return [from_windows(j, results, source, window_ns) for j in jobs]


def _from_clickhouse(job: str, since: str | None, clickhouse_url: str | None, data_dir: Path | None) -> list:
    from eroica.sinks.clickhouse.client import ClickHouseError
    from eroica.report.data import from_rows
    from eroica.report.query import load_job
    from .verdicts_cmd import parse_since

    since_ns = parse_since(since)
    resolved_dir = resolve_data_dir(data_dir)
    try:
        target = query_target(clickhouse_url, resolved_dir)
        try:
            verdicts, summaries = load_job(target, job, since_ns, clickhouse_url, resolved_dir)
        finally:
            target.close()
    except (ClickHouseError, ValueError) as exc:
        click.echo(f"eroica report: {printable(exc)}", err=True)
        sys.exit(1)
    if not verdicts and not summaries:
        click.echo(f"eroica report: nothing stored for job {printable(repr(job))}" + (" in that period" if since_ns else ""),
                   err=True)
        sys.exit(1)
    return [from_rows(job, verdicts, summaries, f"ClickHouse ({target.description})")]
