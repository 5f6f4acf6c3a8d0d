"""``eroica demo``: stack up, a 64-rank job with a throttled GPU, the verdict from ClickHouse, stack down."""

from __future__ import annotations

import shlex
import sys

import click


@click.command("demo", epilog="""\b
Exit codes: 0 a verdict landed and was shown, 1 the stack did not start or no
verdict landed within --timeout, 2 usage error.""")
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
    from eroica.kafka.admin import BrokerError

    from .sql_cmd import _cell
    from .tables import console, print_rows, printable, wrap

    width = console().width - 1

    def say(text: str, indent: str = "") -> None:  # wrapped between words at the terminal's width; names escaped
        click.echo(wrap(printable(text), width, indent))

    try:
        res = run_demo(nodes=nodes, gpus=gpus, steps=steps, fault=fault, timeout_s=timeout_s, keep=keep,
                       say=lambda m: click.echo(printable(m), err=True))
    except (StackError, BrokerError, ClickHouseError) as exc:
        click.echo(f"eroica demo: {printable(exc)}", err=True)
        sys.exit(1)
    if not res.verdicts:
        click.echo(f"eroica demo: no verdict for job {printable(res.job)} landed within {timeout_s:.0f} s", err=True)
        sys.exit(1)
    t = res.timings
    click.echo()
    say(f"{len(res.verdicts)} verdict(s) for job {res.job} landed in ClickHouse, the first "
        f"{t.get('verdict_after_replay_s', 0):.1f} s after the replay ended ({t.get('total_s', 0):.0f} s in all"
        f"{'' if res.streamed else '; batch detection stood in for the stream workers'}):")
    click.echo()
    seen: set[tuple] = set()
    for v in sorted(res.verdicts, key=lambda v: (-v.confidence, v.window_start_ns)):
        culprit = (v.component, v.scope, v.node, v.rank, v.gpu, v.fn)
        if culprit in seen:
            continue
        seen.add(culprit)
        windows = sum(1 for w in res.verdicts if (w.component, w.scope, w.node, w.rank, w.gpu, w.fn) == culprit)
        say(f"CULPRIT [{v.component}] {v.summary}", "  ")
        say(f"({windows} window(s), slowdown {v.slowdown:.2f}x, confidence {v.confidence:.2f})", "    ")
    if res.rows is not None and res.rows.rows:
        click.echo("\nWhat ClickHouse answered while the stack ran (first 10 rows):\n")
        print_rows(res.rows.columns, [[_cell(v) for v in r] for r in res.rows.rows[:10]], wide={"summary"})
    if res.data_dir is not None:
        d = shlex.quote(str(res.data_dir))
        sql = " ".join(res.sql.split())
        quoted = f'"{sql}"' if not set(sql) & set('"$`\\!') else shlex.quote(sql)
        click.echo()
        say(f"The stack is stopped; its data is kept in {res.data_dir}. Query it again (the chdb directory is "
            "opened directly):")
        click.echo()
        click.echo(f"  eroica verdicts --data-dir {d} --since 1h")
        click.echo(f"  eroica report --job {res.job} --data-dir {d} -o {res.job}.html")
        click.echo(f"  eroica sql --data-dir {d} {quoted}")
    else:
        click.echo()
        say("The stack is stopped and its data removed. `eroica demo --keep` keeps the data to query; "
            "`eroica up` runs a stack that stays (then `eroica replay run.jsonl`, `eroica verdicts --since 1h`).")

