"""The ``eroica`` command: a thin shell that registers one module per command.

Each command lives in its own ``cli/<name>_cmd.py`` and is imported only when
invoked, so ``eroica analyze`` never pays for Kafka or ClickHouse imports.

Exit codes (shared by all commands):
  0  success (for ``analyze``: ran, whether or not it found something)
  1  usage or runtime error
  2  bad command-line usage (click's own)
  3  no valid record in the input
"""

from __future__ import annotations

import importlib

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
    "trace": "trace_cmd:trace",
    "agent": "agent_cmd:agent",
}

EXIT_NO_VALID_RECORD = 3


class LazyGroup(click.Group):
    """Imports a command's module only when that command runs (fast start-up)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(f"eroica.cli.{module}"), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="eroica")
def cli() -> None:
    """Eroica: find why a synchronous GPU training job is slow and name the culprit."""


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
