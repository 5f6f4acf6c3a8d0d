"""``eroica bench``: measured accuracy (and throughput) of the detector."""

from __future__ import annotations

import sys

import click


@click.group()
def bench() -> None:
    """Benchmarks that report measured numbers (no pass/fail thresholds in tests)."""


@bench.command()
@click.option("--seeds", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--scale", "scales", type=click.Choice(["small", "medium"]), multiple=True,
              help="Scale(s) to run (default: both).")
@click.option("--only", default=None, help="Run only scenarios whose name contains this text.")
@click.option("--verbose", "-v", is_flag=True, help="Show every verdict of failing scenarios.")
def accuracy(seeds: int, scales: tuple[str, ...], only: str | None, verbose: bool) -> None:
    """Run every simulator fault and healthy runs, print a scorecard.

    \b
    Examples:
      eroica bench accuracy --seeds 3
      eroica bench accuracy --scale small --only nic -v
    """
    from rich.console import Console
    from rich.table import Table

    from eroica.bench.accuracy import run_all, run_real_straggler_trace, totals

    console = Console(stderr=False, width=None if sys.stdout.isatty() else 200)
    table = Table(title="Eroica detection scorecard")
    for col in ("scale", "seed", "scenario", "result", "expected", "found", "s"):
        table.add_column(col, overflow="fold")

    def progress(r) -> None:
        if sys.stderr.isatty():
            print(f"  {r.scale} seed {r.seed} {r.scenario.name}: {'pass' if r.passed else 'FAIL'}", file=sys.stderr)

    results = run_all(seeds, list(scales) or ["small", "medium"], only, progress)
    for r in results:
        s = r.score
        expected = "; ".join(f.expected for f in s.faults) or "no alarm"
        found = "; ".join(f.found for f in s.faults) if s.faults else ", ".join(s.false_alarms) or "no alarm"
        extra = []
        if s.victims_blamed:
            extra.append("victims blamed: " + ", ".join(s.victims_blamed))
        if s.false_alarms and s.faults:
            extra.append("false alarms: " + ", ".join(s.false_alarms))
        table.add_row(r.scale, str(r.seed), r.scenario.name, "pass" if r.passed else "FAIL", expected,
                      found + ("; " + "; ".join(extra) if extra else ""), f"{r.seconds:.1f}")
        if verbose and not r.passed:
            for v in r.verdicts:
                console.print(f"    [{r.scenario.name}] {v.confidence:.2f} {v.kind}/{v.component} {v.scope} "
                              f"node={v.node} rank={v.rank}: {v.summary}")
    console.print(table)
    t = totals(results)
    console.print(
        f"faults localised with the right component and culprit: {t['localised']}/{t['faults']} "
        f"({100 * t['share_localised']:.1f}%)\nvictims blamed: {t['victims_blamed']}\n"
        f"false alarms on healthy runs: {t['false_alarms_healthy']} (over {t['healthy_runs']} runs); "
        f"extra alarms on faulty runs: {t['false_alarms_faulty']}\n"
        f"scenarios passed: {t['passed']}/{t['scenarios']}"
    )
    real = run_real_straggler_trace()
    if real is None:
        console.print("real trace (stragglers/trace-ST.parquet): not found (set EROICA_SHARED)")
    else:
        console.print(f"real trace {real.path.name} (published cause: last pipeline stage, ranks 6-7, workload): "
                      f"{'pass' if real.passed else 'FAIL'}; found {real.found}")
