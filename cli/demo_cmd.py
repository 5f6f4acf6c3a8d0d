"""``eroica demo``: stack up, a 64-rank job with a throttled GPU, the verdict from ClickHouse, stack down."""

from __future__ import annotations

import sys

import click


@click.command("demo")
@click.option("--nodes", type=click.IntRange(min=2), default=8, show_default=True)
@click.option("--gpus", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--steps", type=click.IntRange(min=10), default=40, show_default=True)
@click.option("--fault", default="gpu_throttle:rank=13", show_default=True, metavar="NAME[:k=v,...]",
              help="Fault to inject (see `eroica simulate --list-faults`).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=10), default=120.0, show_default=True,
              metavar="SECONDS", help="Give up when no verdict landed within this time.")
@click.option("--keep", is_flag=True, help="Keep the temporary data directory (query it afterwards).")
def demo(nodes: int, gpus: int, steps: int, fault: str, timeout_s: float, keep: bool) -> None:
    """Run the whole pipeline once on this machine and show the culprit it names (about a minute)."""
    from eroica.sinks.clickhouse.client import ClickHouseError
    from eroica.stack.demo import run_demo
    from eroica.stack.local import StackError
    from eroica.stack.tansu import BrokerError

    from .sql_cmd import _cell

    try:
        res = run_demo(nodes=nodes, gpus=gpus, steps=steps, fault=fault, timeout_s=timeout_s, keep=keep,
                       say=lambda m: click.echo(m, err=True))
    except (StackError, BrokerError, ClickHouseError) as exc:
        click.echo(f"eroica demo: {exc}", err=True)
        sys.exit(1)
    if not res.verdicts:
        click.echo(f"eroica demo: no verdict for job {res.job} landed within {timeout_s:.0f} s", err=True)
        sys.exit(1)
    t = res.timings
    click.echo(f"\n{len(res.verdicts)} verdict(s) for job {res.job} landed in ClickHouse, the first "
               f"{t.get('verdict_after_replay_s', 0):.1f} s after the replay ended ({t.get('total_s', 0):.0f} s in all"
               f"{'' if res.streamed else '; batch detection stood in for the stream workers'}):\n")
    seen: set[tuple] = set()
    for v in sorted(res.verdicts, key=lambda v: (-v.confidence, v.window_start_ns)):
        culprit = (v.component, v.scope, v.node, v.rank, v.gpu, v.fn)
        if culprit in seen:
            continue
        seen.add(culprit)
        windows = sum(1 for w in res.verdicts if (w.component, w.scope, w.node, w.rank, w.gpu, w.fn) == culprit)
        click.echo(f"  CULPRIT [{v.component}] {v.summary}\n    ({windows} window(s), slowdown {v.slowdown:.2f}x, "
                   f"confidence {v.confidence:.2f})")
    click.echo("\nThe SQL that shows them (`eroica sql \"...\"` against a running stack):\n")
    click.echo(res.sql + "\n")
    if res.rows is not None:
        for r in res.rows.rows[:10]:
            click.echo("  " + " | ".join(_cell(v) for v in r))
    if res.data_dir is not None:
        click.echo(f"\nData kept in {res.data_dir}: eroica sql --data-dir {res.data_dir} \"SELECT ...\"")
