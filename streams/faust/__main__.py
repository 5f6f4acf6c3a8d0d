"""``python -m eroica.streams.faust ROLE``: one stream worker (summariser or detector), configured by the environment only.

How the single-machine stack (:mod:`eroica.stack.local`) and
:class:`~eroica.streams.faust.process.WorkerProcess` start workers: the
streams layer owns its process entry point, so nothing below the CLI runs the
CLI. ``EROICA_KAFKA_*`` and the variables of ``settings.py`` configure it;
``eroica worker ROLE`` is the same with command-line overrides.
Exit codes: 0 stopped by SIGTERM / Ctrl-C, 1 runtime error, 2 usage or bad configuration.
"""

from __future__ import annotations

import sys

from eroica.kafka.config import KafkaConfig

from .settings import ROLES, WorkerSettings


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] not in ROLES:
        print(f"usage: python -m eroica.streams.faust {{{','.join(ROLES)}}}", file=sys.stderr)
        return 2
    try:
        settings = WorkerSettings.from_env()
        config = KafkaConfig.from_env()
    except ValueError as exc:
        print(f"eroica worker {args[0]}: {exc}", file=sys.stderr)
        return 2
    from .workers import run  # faust itself: only once the arguments are known good

    return run(args[0], settings, config)


if __name__ == "__main__":
    sys.exit(main())
