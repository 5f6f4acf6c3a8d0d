"""Options shared by the commands that talk to a stack (up, status, verdicts, sql)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

DATA_DIR_HELP = "Stack data directory [default: $EROICA_DATA_DIR or ~/.local/share/eroica]."


def data_dir_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help=DATA_DIR_HELP)(f)


def clickhouse_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--clickhouse", "clickhouse_url", default=None, metavar="URL",
                        help="clickhouse://HOST:9000/DB or chdb:///DIR [default: $EROICA_CLICKHOUSE_URL, else "
                             "the running stack in the data directory].")(f)


def resolve_data_dir(data_dir: Path | None) -> Path:
    from eroica.stack.state import default_data_dir

    return (data_dir or default_data_dir()).expanduser()
