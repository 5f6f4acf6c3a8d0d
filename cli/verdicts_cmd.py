"""``eroica verdicts``: the verdicts stored in ClickHouse (server, running stack, or chdb dir)."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import click

from .stack_options import STACK_EXIT_CODES, NoStack, clickhouse_option, data_dir_option, query_target
from .tables import printable

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_since(value: str | None, now_ns: int | None = None) -> int | None:
    """``90s``/``15m``/``1h``/``2d``/``1w`` before now -> ns since the epoch; ``all``/None -> no bound."""
    if value is None or value.strip().lower() in ("", "all"):
        return None
    m = _DURATION.match(value.lower())
    if not m:
        raise click.BadParameter(f"{value!r}: use a duration like 90s, 15m, 1h, 2d, 1w (or 'all')",
                                 param_hint="--since")
    now = time.time_ns() if now_ns is None else now_ns
    return max(0, now - int(float(m.group(1)) * _UNITS_S[m.group(2)] * 1_000_000_000))


def _components() -> list[str]:
    from eroica.models.verdict import COMPONENTS

    return list(COMPONENTS)


@click.command("verdicts", epilog=STACK_EXIT_CODES)
@click.option("--job", default=None, help="Only this job.")
@click.option("--since", default=None, metavar="DURATION",
              help="Only windows ending within this long before now (90s, 15m, 1h, 2d, 1w) [default: all].")
@click.option("--component", type=click.Choice(_components()), default=None, help="Only this component.")
@click.option("--limit", type=click.IntRange(min=1, max=100_000), default=100, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@clickhouse_option
@data_dir_option
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.5, max=3600), default=5.0, show_default=True,
              metavar="SECONDS", help="Give up (exit 1, saying what did not answer) after this long.")
def verdicts(job: str | None, since: str | None, component: str | None, limit: int, fmt: str,
             clickhouse_url: str | None, data_dir: Path | None, timeout_s: float) -> None:
    """List stored verdicts, newest window first (JSON: one array of contract verdicts).

    \b
    Examples:
      eroica verdicts --since 1h
      eroica verdicts --job sim-1 --component gpu --format json
      eroica verdicts --clickhouse clickhouse://127.0.0.1:9000/eroica
    """
    from eroica.models.verdict import encode_verdicts
    from eroica.sinks.clickhouse.client import ClickHouseError
    from eroica.stack.health import DeadlineExceeded, call_with_deadline

    since_ns = parse_since(since)
    where = "ClickHouse"

    def query() -> list:
        nonlocal where
        target = query_target(clickhouse_url, data_dir, timeout_s=timeout_s)
        where = target.description
        try:
            return target.verdicts(job=job, since_ns=since_ns, component=component, limit=limit)
        finally:
            target.close()

    try:
        # The target's own timeouts are set from timeout_s; the deadline also covers what they miss
        # (a frozen server that accepted the connection, a chdb directory whose lock is held).
        found = call_with_deadline(query, timeout_s, "the query")
    except NoStack as exc:  # raised in the deadline's thread, where click has no context
        exc.command = "eroica verdicts"
        raise
    except DeadlineExceeded:
        click.echo(f"eroica verdicts: {printable(where)} did not answer within {timeout_s:g} s (frozen or overloaded?); "
                   f"`eroica status` says which part is stuck", err=True)
        sys.exit(1)
    except (ClickHouseError, ValueError) as exc:
        click.echo(f"eroica verdicts: {printable(exc)}", err=True)
        sys.exit(1)
    if fmt == "json":
        sys.stdout.buffer.write(encode_verdicts(found) + b"\n")
    elif not found:
        click.echo("no verdict stored" + (" matching the filters" if job or since_ns or component else ""))
    else:
        from .tables import render_verdicts

        # several jobs may be stored: each row names its job (through printable(), as every name)
        render_verdicts(found, show_job=True)
