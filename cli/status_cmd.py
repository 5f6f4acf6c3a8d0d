"""``eroica status``: is each part of the local stack up? Exit 0 only when all are."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .stack_options import data_dir_option, resolve_data_dir


@click.command("status")
@data_dir_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def status(data_dir: Path | None, fmt: str) -> None:
    """Health of the stack started by `eroica up`: supervisor, broker, workers, sink, ClickHouse."""
    from eroica.stack.health import check_stack

    checks = check_stack(resolve_data_dir(data_dir))
    ok = all(c.ok for c in checks)
    if fmt == "json":
        click.echo(json.dumps({"ok": ok, "checks": [c.__dict__ for c in checks]}, indent=1))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"eroica stack: {'up' if ok else 'NOT all up'}")
        for col in ("part", "state", "pid", "port", "detail"):
            table.add_column(col, overflow="fold")
        for c in checks:
            table.add_row(c.part, "[green]up[/green]" if c.ok else "[red]down[/red]",
                          "" if c.pid is None else str(c.pid), "" if c.port is None else str(c.port), c.detail)
        Console(width=160).print(table)
    sys.exit(0 if ok else 1)
