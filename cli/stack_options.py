"""How every command that talks to a stack finds it: one place, reading ``runtime/state.py``.

``replay``, ``alert`` (Kafka) and ``status``, ``verdicts``, ``sql``,
``report --job`` (ClickHouse) resolve their target in the same order:

1. the explicit flag (``--kafka HOST:PORT`` / ``--clickhouse URL``);
2. the environment (``$EROICA_KAFKA_BOOTSTRAP`` / ``$EROICA_CLICKHOUSE_URL``);
3. the stack ``eroica up`` runs in the data directory (``--data-dir``, else
   ``$EROICA_DATA_DIR``, else ``~/.local/share/eroica``): its ``stack.json``
   names the broker, the ClickHouse URL and the sink's query endpoint;
4. for reads only, a stopped stack's chdb directory (``DATA_DIR/chdb``), opened
   directly, so the data of a finished run stays readable.

Nothing else: no guessed ``127.0.0.1:9092`` or ``:9000``. When none of them
applies the command fails at once with one line that says what to do
(``no stack: run `eroica up` or pass `--clickhouse```), exit code 1.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from eroica.stack.query import QueryTarget
    from eroica.runtime.state import RunningStack

DATA_DIR_HELP = "Stack data directory [default: $EROICA_DATA_DIR or ~/.local/share/eroica]."

STACK_EXIT_CODES = """\b
Exit codes: 0 success, 1 runtime error (no stack found, stack or ClickHouse
unreachable), 2 usage error."""


class NoStack(click.ClickException):
    """No target given and no running stack: one actionable line, exit code 1."""

    exit_code = 1

    def __init__(self, flag: str, data_dir: Path, what: str = "") -> None:
        self.flag = flag
        self.data_dir = data_dir
        ctx = click.get_current_context(silent=True)
        self.command = ctx.command_path if ctx is not None else "eroica"
        super().__init__(f"no stack: run `eroica up` or pass `{flag}`"
                         f" (no running stack in {data_dir}{what})")

    def show(self, file: Any = None) -> None:
        click.echo(f"{self.command}: {self.format_message()}", err=True, file=file)


def data_dir_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help=DATA_DIR_HELP)(f)


def clickhouse_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--clickhouse", "clickhouse_url", default=None, metavar="URL",
                        help="clickhouse://HOST:9000/DB or chdb:///DIR [default: $EROICA_CLICKHOUSE_URL, else "
                             "the running stack in the data directory].")(f)


def kafka_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--kafka", "bootstrap", default=None, metavar="HOST:PORT",
                        help="Kafka bootstrap servers [default: $EROICA_KAFKA_BOOTSTRAP, else the broker of the "
                             "running stack in the data directory].")(f)


def resolve_data_dir(data_dir: Path | None) -> Path:
    from eroica.runtime.state import default_data_dir

    return (data_dir or default_data_dir()).expanduser()


def running_stack(data_dir: Path | None) -> RunningStack | None:
    """The stack `eroica up` runs in the data directory, or None."""
    from eroica.runtime.state import find_stack

    return find_stack(resolve_data_dir(data_dir))


def kafka_bootstrap(bootstrap: str | None, data_dir: Path | None) -> str:
    """``--kafka``, else ``$EROICA_KAFKA_BOOTSTRAP``, else the running stack's broker; else :class:`NoStack`."""
    chosen = bootstrap or os.environ.get("EROICA_KAFKA_BOOTSTRAP") or None
    if chosen:
        return chosen
    stack = running_stack(data_dir)
    if stack is not None and stack.bootstrap:
        return stack.bootstrap
    raise NoStack("--kafka HOST:PORT", resolve_data_dir(data_dir),
                  "" if stack is None else "; its state names no broker")


def query_target(clickhouse_url: str | None, data_dir: Path | None, timeout_s: float = 30.0) -> QueryTarget:
    """Where reads go (order in the module docstring); :class:`NoStack` when there is nowhere."""
    from eroica.stack.query import resolve_query_target

    resolved = resolve_data_dir(data_dir)
    explicit = clickhouse_url or os.environ.get("EROICA_CLICKHOUSE_URL") or None
    if explicit is None and running_stack(resolved) is None and not (resolved / "chdb").is_dir():
        raise NoStack("--clickhouse URL", resolved)
    return resolve_query_target(explicit, resolved, timeout_s=timeout_s)
