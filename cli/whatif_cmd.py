"""``eroica whatif``: how much faster each job would run without its stragglers, and whose fault it is."""

from __future__ import annotations

import json
import sys

import click
import numpy as np

from eroica.streams.detection.cost import lost_share  # share of throughput lost to S (below 1: negative)

from .main import EXIT_NO_VALID_RECORD
from .tables import printable

# members shown per dimension in the table, and the least cost worth a line
SHOWN = 5
MIN_SHOWN_COST = 0.005


def _jobs(files: tuple[str, ...]):
    """Per job: (OpTable, rank -> stage, rank -> dp), plus the count of valid and invalid records."""
    from eroica.models.columns import concat
    from eroica.models.reader import read_batches, read_merged
    from eroica.streams.detection.whatif import OpTable

    source = read_batches(files[0]) if len(files) == 1 else read_merged(list(files))
    cols, metas, valid, invalid = [], {}, 0, 0
    for batch in source:
        valid += batch.valid_count
        invalid += len(batch.invalid)
        fn = batch.columns.get("fn")
        if fn is not None and len(fn):
            cols.append(fn)
        for j in batch.jobs:
            metas[j.job] = j
    out = []
    if cols:
        c = concat(cols)
        a = c.arrays
        none = c.code_of("group", "")
        group = np.where(a["group"] == none, -1, a["group"]).astype(np.int64)
        jobs = c.strings("job")
        for job in sorted(set(jobs.tolist())):
            sel = np.flatnonzero((jobs == job) & ~a["in_flight"])
            t = OpTable(
                rank=a["rank"][sel].astype(np.int64), step=a["step"][sel], fn=a["fn"][sel].astype(np.int64),
                kind=a["kind"][sel], start=a["ts_ns"][sel], dur=a["dur_ns"][sel], op=a["op"][sel],
                group=group[sel], stream=a["stream"][sel], fn_names=c.vocab["fn"], group_names=c.vocab["group"],
            )
            meta = metas.get(job)
            stages = dict(enumerate(meta.rank_stages)) if meta is not None and meta.rank_stages else {}
            dps = dict(enumerate(meta.rank_dp)) if meta is not None and meta.rank_dp else {}
            # each rank's node: the job record's, else the records' own node field
            nodes = dict(zip(a["rank"][sel].tolist(), c.strings("node")[sel].tolist()))
            if meta is not None and meta.rank_nodes:
                nodes.update(enumerate(meta.rank_nodes))
            out.append((job, t, stages, dps, nodes))
    return out, valid, invalid


def _headline(r: dict) -> str:
    """The job's sentence: its S and cost, or why S is not measurable on it (never a negative cost)."""
    head = f"{printable(r['job'])}: {r['steps']} steps, {r['step_s']['actual']:.3f} s per step measured"
    if not r["measurable"]:
        return f"{head}: S not measurable: {r['reason']}"
    s = r["slowdown"]
    return (f"{head}, {r['step_s']['ideal']:.3f} s with every operation at its typical duration: "
            f"S = {s:.3f}, stragglers cost the job {lost_share(s):.0%} of its throughput")


def _ring_note(r: dict) -> str | None:
    """When the costliest rank's figure is mostly a communicator's (a slow link or ring), say whose it is.

    A rank's S_X keeps its collectives measured (the study's definition), so every member of a slow ring
    shows the ring's cost. When the costliest communicator alone explains at least 90% of the costliest
    rank's loss, the ranks are the ring's victims, not its cause: the link (or the member's data path
    feeding it) is, and ``eroica analyze`` names which.
    """
    ranks, groups = r.get("by_rank") or {}, r.get("by_group") or {}
    if not ranks or not groups:
        return None
    g, g_sx = max(groups.items(), key=lambda kv: kv[1])
    _, r_sx = max(ranks.items(), key=lambda kv: kv[1])
    if lost_share(g_sx) < MIN_SHOWN_COST or lost_share(g_sx) < 0.9 * lost_share(r_sx):
        return None
    return (f"the ranks' figures are mostly communicator {printable(g)}'s ({lost_share(g_sx):.0%}): its members wait "
            f"on it; the slow link or data path behind it is the cause (eroica analyze names it)")


def render_table(results: list[dict]) -> None:
    from rich.table import Table
    from rich.text import Text

    from eroica.report.render import column_labels

    from .tables import console as make_console
    from .tables import wrap

    console = make_console()
    # a kernel name is one 100-character word: shortened to distinct heads and tails, never cut mid-line
    room = max(24, console.width - 41)  # borders 13, by 8, S_X 5, throughput cost 15
    if not results:
        console.print("no job with a complete step to analyse")
        return
    names = {"by_rank": "rank", "by_dp": "dp index", "by_stage": "stage", "by_fn": "function", "by_node": "node",
             "by_group": "communicator"}
    for r in results:
        console.print(wrap(_headline(r), console.width - 1), markup=False, highlight=False)
        if not r["measurable"]:
            continue
        table = Table(show_lines=False)
        for col in ("by", "who", "S_X", "throughput cost"):
            table.add_column(col, no_wrap=col != "who", overflow="fold")
        words = []
        for dim, label in names.items():
            ranked = [kv for kv in sorted(r[dim].items(), key=lambda kv: -kv[1]) if lost_share(kv[1]) >= MIN_SHOWN_COST]
            # names are data: control and bidi characters shown escaped (cli/tables.printable)
            shown = dict(zip((who for who, _ in ranked[:SHOWN]),
                             column_labels([printable(w) for w, _ in ranked[:SHOWN]], room)))
            for who, sx in ranked[:SHOWN]:
                table.add_row(label, Text(shown[who]), f"{sx:.3f}", f"{lost_share(sx):.1%}")
            if ranked:
                who, sx = ranked[0]
                words.append(f"{label} {shown[who]} alone costs the job {lost_share(sx):.0%} of its throughput")
        victims = _ring_note(r)
        if victims:
            words.append(victims)
        if table.row_count:
            console.print(table)
            for w in words:
                console.print(wrap(w, console.width - 1, "  "), markup=False, highlight=False)
        else:
            console.print("no rank, stage or function costs the job 0.5% or more")


@click.command(epilog="""\b
Exit codes: 0 analysed, 1 runtime error, 2 usage error, 3 no valid record in the input.""")
@click.argument("files", nargs=-1, required=True, type=click.Path(allow_dash=True))
@click.option("--format", "fmt", type=click.Choice(["json", "table"]), default="table", show_default=True)
@click.option("--peers", type=click.Choice(["job", "stage"]), default="job", show_default=True,
              help="Whose durations are typical: every rank running the operation (a slow pipeline stage is a "
                   "straggler, as in the OSDI'25 study), or only the ranks of the same stage.")
@click.option("--stat", type=click.Choice(["auto", "study", "median", "mean"]), default="auto", show_default=True,
              help="Typical duration: 'study' (the OSDI'25 study's: per function, the mean over every rank, "
                   "micro-batch and step; a collective's transfer, the median), 'median' / 'mean' over the "
                   "peers and steps of each function and position; 'auto': study on a pipeline-parallel job "
                   "(ranks in several stages), median otherwise.")
@click.option("-q", "--quiet", is_flag=True, help="No invalid-record summary on stderr.")
def whatif(files: tuple[str, ...], fmt: str, peers: str, stat: str, quiet: bool) -> None:
    """What-if analysis of contract JSON Lines FILES: each job's slowdown S due to stragglers.

    \b
    S = mean measured step time / mean step time replayed on the job's
    dependency graph (each rank's ops in sequence with their measured gaps,
    collectives ending together, pipeline send/recv paired) with every
    operation at its typical duration (median over the peer ranks of the same
    function and micro-batch position). S_X = the replayed step time when only
    the operations of X keep their measured durations / the ideal, for X =
    each rank, data-parallel index, pipeline stage and function (their
    collectives included, as in the OSDI'25 study), each node (its ranks'
    own work: compute, copies, loader) and each communicator (its collectives
    alone: a slow link is its ring's cost, not every member's).

    \b
    S is reported only where the replay fits the job: replaying the measured
    durations must give the measured step time within 5%, and S must not be
    below 1. Otherwise the job is "not measurable", with the reason (JSON:
    "measurable": false, "slowdown": null, "reason"), never a negative cost.

    \b
    Examples:
      eroica whatif run.jsonl
      eroica whatif rank-*.jsonl --format json
    """
    from eroica.streams.detection.whatif import whatif as run

    for f in files:
        if f != "-" and not click.Path(exists=True, dir_okay=False).convert(f, None, None):
            raise click.UsageError(f"no such file: {f}")
    jobs, valid, invalid = _jobs(files)
    if invalid and not quiet:
        click.echo(f"eroica: {invalid} invalid record(s) skipped", err=True)
    if valid == 0:
        click.echo("eroica: no valid record in the input; nothing to analyse", err=True)
        sys.exit(EXIT_NO_VALID_RECORD)
    results = []
    for job, table, stages, dps, nodes in jobs:
        res = run(table, stages, dps, peers=peers, stat=stat, rank_node=nodes)
        if res is not None:
            results.append(res.to_json(job))
    if fmt == "json":
        sys.stdout.write(json.dumps({"jobs": results}) + "\n")
    else:
        render_table(results)
