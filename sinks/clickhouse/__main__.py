"""``python -m eroica.sinks.clickhouse``: the Kafka -> ClickHouse sink worker, configured by the environment only.

How the single-machine stack (:mod:`eroica.stack.local`) starts its sink: the
sinks layer owns its process entry point, so the stack never runs the CLI.
``EROICA_KAFKA_*``, ``EROICA_CLICKHOUSE_*`` and ``EROICA_SINK_*`` configure it
(``worker_config.py``); ``eroica sink`` is the same with command-line flags.
Exit codes: 0 stopped by SIGTERM / Ctrl-C, 1 runtime error, 2 bad configuration.
"""

from __future__ import annotations

import sys

from .worker import serve
from .worker_config import SinkWorkerConfig


def main(argv: list[str] | None = None) -> int:
    if list(sys.argv[1:] if argv is None else argv):
        print("usage: python -m eroica.sinks.clickhouse (configured by EROICA_* variables; "
              "`eroica sink --help` lists them)", file=sys.stderr)
        return 2
    try:
        config = SinkWorkerConfig.from_env()
    except ValueError as exc:
        print(f"eroica sink: {exc}", file=sys.stderr)
        return 2
    return serve(config)


if __name__ == "__main__":
    sys.exit(main())
