"""The ``eroica`` command: a thin shell that registers one module per command.

Each command lives in its own ``cli/<name>_cmd.py`` and is imported only when
invoked, so ``eroica analyze`` never pays for Kafka or ClickHouse imports.

Exit codes (shared by all commands; each command's ``--help`` states its own):
  0  success (for ``analyze``: ran, whether or not it found something)
  1  runtime error (including "no stack: run `eroica up` or pass `--clickhouse`")
  2  bad command-line usage (click's own)
  3  no valid record in the input

Errors are one line on stderr; ``--debug`` (anywhere before a ``--``, or
``EROICA_DEBUG=1``) shows the traceback of an unexpected error and the
tracebacks libraries log (a ClickHouse driver's failed connection). The
long-running services (``up``, ``worker``, ``sink``, ``alert``, ``agent``,
``trace``) keep their logs as they are.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

import click

# command name -> "module:attribute" under eroica.cli
COMMANDS: dict[str, str] = {
    "simulate": "simulate_cmd:simulate",
    "analyze": "analyze_cmd:analyze",
    "whatif": "whatif_cmd:whatif",
    "replay": "replay_cmd:replay",
    "alert": "alert_cmd:alert",
    "report": "report_cmd:report",
    "worker": "worker_cmd:worker",
    "import": "import_cmd:import_",
    "sink": "sink_cmd:sink",
    "up": "up_cmd:up",
    "status": "status_cmd:status",
    "verdicts": "verdicts_cmd:verdicts",
    "sql": "sql_cmd:sql",
    "demo": "demo_cmd:demo",
    "bench": "bench_cmd:bench",
    "fleet": "fleet_cmd:fleet",
    "trace": "trace_cmd:trace",
    "agent": "agent_cmd:agent",
}

EXIT_NO_VALID_RECORD = 3

# What `--help` says when a command states no exit codes of its own.
EXIT_CODES_EPILOG = """\b
Exit codes: 0 success, 1 runtime error, 2 usage error, 3 no valid record in
the input (commands that read records)."""

# Commands that run until stopped: their logs keep library tracebacks.
SERVICES = frozenset({"up", "worker", "sink", "alert", "agent", "trace"})


def _with_exit_codes(cmd: click.Command) -> click.Command:
    if "Exit codes" not in (cmd.epilog or ""):
        cmd.epilog = EXIT_CODES_EPILOG
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _with_exit_codes(sub)
    return cmd


class LazyGroup(click.Group):
    """Imports a command's module only when that command runs (fast start-up)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return _with_exit_codes(getattr(importlib.import_module(f"eroica.cli.{module}"), attr))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog="""\b
Exit codes (each command's --help states its own): 0 success, 1 runtime
error, 2 usage error, 3 no valid record in the input.""")
@click.version_option(package_name="eroica")
@click.option("--debug", is_flag=True, default=False,
              help="Show tracebacks (also anywhere before a `--`, or EROICA_DEBUG=1).")
def cli(debug: bool) -> None:
    """Eroica: find why a synchronous GPU training job is slow and name the culprit."""


class _OneLine(logging.Formatter):
    """``eroica: message (ExcType: text)``: an exception's text without its traceback."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"eroica: {record.getMessage()}"
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            text += f" ({type(exc).__name__}: {exc})"
        return text


class _OwnOrSevere(logging.Filter):
    """Eroica's own warnings, other libraries' errors only; retries a read client logs are left out
    (the command's own last line says how many failed)."""

    RETRY_LOGGERS = ("eroica.sinks.clickhouse.client",)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        return record.name.startswith("eroica") and not record.name.startswith(self.RETRY_LOGGERS)


def _split_debug(argv: list[str]) -> tuple[list[str], bool]:
    """``--debug`` anywhere before a ``--`` (``eroica verdicts --debug`` as well as ``eroica --debug verdicts``)."""
    head, sep, tail = (argv, [], []) if "--" not in argv else (
        argv[:argv.index("--")], ["--"], argv[argv.index("--") + 1:])
    debug = "--debug" in head or os.environ.get("EROICA_DEBUG", "").lower() in ("1", "on", "true", "yes")
    return [a for a in head if a != "--debug"] + sep + tail, debug


def _command_name(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> None:
    args, debug = _split_debug(list(sys.argv[1:] if argv is None else argv))
    name = _command_name(args)
    if not debug and name not in SERVICES:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_OneLine())
        handler.addFilter(_OwnOrSevere())
        logging.basicConfig(level=logging.WARNING, handlers=[handler])
    try:
        cli.main(args=args, prog_name="eroica", standalone_mode=True)
    except Exception as exc:  # click handles its own errors, Ctrl-C and exits; this is the unexpected rest
        if debug:
            raise
        from .tables import printable  # the message may quote any input (names are data)

        click.echo(f"eroica{' ' + printable(name) if name else ''}: {type(exc).__name__}: {printable(exc)} "
                   "(`--debug` shows the traceback)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
