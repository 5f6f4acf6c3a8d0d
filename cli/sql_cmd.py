"""``eroica sql "SELECT ..."``: one read-only statement against the verdict store.

Rows hold names (jobs, nodes, functions: free text under the contract), so the
table and TSV outputs print every cell through :func:`~eroica.cli.tables.printable`:
a control or bidirectional character is shown as its escape, never sent to the
terminal (in TSV, a TAB or newline inside a field is ``\\t``/``\\n``, so the
lines and columns stay the rows and fields). ``--format json`` is the same JSON
value with those characters written as ``\\uXXXX`` escapes
(:func:`~eroica.cli.tables.printable_json`).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import click

from .stack_options import clickhouse_option, data_dir_option, query_target
from .tables import printable, printable_json


def _cell(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


@click.command("sql", epilog="""\b
Exit codes: 0 rows printed, 1 runtime error (no stack found, ClickHouse
unreachable, the statement failed), 2 usage error or a refused statement.""")
@click.argument("statement")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "tsv"]), default="table", show_default=True)
@clickhouse_option
@data_dir_option
def sql(statement: str, fmt: str, clickhouse_url: str | None, data_dir: Path | None) -> None:
    """Run one read statement (SELECT, WITH, SHOW, DESCRIBE, EXISTS) and print the rows.

    \b
    Examples:
      eroica sql "SELECT job, component, rank, summary FROM eroica.verdicts FINAL"
      eroica sql "SHOW TABLES FROM eroica" --format tsv
    """
    from eroica.sinks.clickhouse.client import ClickHouseError
    from eroica.sinks.clickhouse.readonly import ReadOnlySQLError

    try:
        target = query_target(clickhouse_url, data_dir)
        try:
            res = target.sql(statement)
        finally:
            target.close()
    except ReadOnlySQLError as exc:
        raise click.UsageError(f"refused: {exc}") from None
    except (ClickHouseError, ValueError) as exc:
        click.echo(f"eroica sql: {printable(exc)}", err=True)
        sys.exit(1)
    if fmt == "json":
        import msgspec

        rows = [dict(zip(res.columns, r, strict=True)) for r in res.rows]
        # msgspec writes NaN/inf as null (json.dumps would write invalid JSON) and dates as text.
        encoded = msgspec.json.encode(rows, enc_hook=str).decode()
        sys.stdout.buffer.write(printable_json(encoded).encode() + b"\n")
    elif fmt == "tsv":
        click.echo("\t".join(printable(c) for c in res.columns))
        for r in res.rows:
            click.echo("\t".join(printable(_cell(v)) for v in r))
    else:
        from .tables import print_rows

        print_rows(res.columns, [[_cell(v) for v in r] for r in res.rows])  # print_rows escapes each cell
        click.echo(f"{len(res.rows)} row(s)", err=True)
