"""``eroica status``: is each part of the local stack up? Exit 0 only when all are.

Each part is ``up``, ``degraded`` (alive but stuck on something, said in its
detail) or ``down``; every check has ``--timeout`` seconds, so a frozen part is
reported as not answering instead of hanging the command.

A service's health page may itself say it is degraded (``"state":
"degraded"`` with the reasons in ``"stuck"``): the sink when its inserts do not
progress, a stream worker while its broker probe gets no answer ("broker not
answering for 42 s", ``streams/faust/workers.py``). ``stack/health.py`` takes
that word from every service, so a worker alive on a frozen broker is
``degraded``, not ``up``, and ``up`` again once the broker answers.

Each line says what the part did, in its role's words (``stack/health.py``):
a summariser the frames and records it read, the digests it sent and its
dead letters; the detector the digests it read, the windows it analysed, the
verdicts it sent and its verdict delay (from a window's close at the
summariser to its verdicts, wall clock: a replay of old files shows seconds,
not their age); the sink the rows it stored; each ``eroica alert`` sharing
the data directory (one line each: ``alert``, ``alert-2``...) the
notifications it sent and the deliveries that failed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .stack_options import data_dir_option, resolve_data_dir


@click.command("status", epilog="""\b
Exit codes: 0 every part is up, 1 a part is down or degraded (or no stack
runs in the data directory), 2 usage error.""")
@data_dir_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.5, max=120), default=4.0, show_default=True,
              metavar="SECONDS", help="Time given to the checks (run side by side); what has not answered by "
                                      "then is reported as not answering.")
def status(data_dir: Path | None, fmt: str, timeout_s: float) -> None:
    """Health of the stack started by `eroica up`: supervisor, broker, workers, sink, ClickHouse.

    Exit 0 when every part is up, 1 when one is down or degraded.
    """
    from eroica.stack.health import check_stack, overall_state

    root = resolve_data_dir(data_dir)
    checks = check_stack(root, timeout_s=timeout_s)
    ok = all(c.ok for c in checks)
    overall = overall_state(checks)
    if fmt == "json":
        from .tables import printable_json  # details quote brokers, paths, errors: no raw bidi/C1 on the terminal

        click.echo(printable_json(json.dumps({"ok": ok, "state": overall, "checks": [c.__dict__ for c in checks]},
                                             indent=1)))
    else:
        from .tables import print_rows

        title = {"up": "up", "degraded": "DEGRADED", "down": "NOT all up"}[overall]
        print_rows(["part", "state", "pid", "port", "detail"],
                   [[c.part, c.state, "" if c.pid is None else str(c.pid), "" if c.port is None else str(c.port),
                     c.detail] for c in checks], wide={"detail"}, title=f"eroica stack: {title}")
    sys.exit(0 if ok else 1)
