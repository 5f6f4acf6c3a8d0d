"""Where the single-machine stack keeps its files, and its state file ``stack.json``.

Data directory (``--data-dir``, else ``$EROICA_DATA_DIR``, else
``$XDG_DATA_HOME/eroica``, i.e. ``~/.local/share/eroica``): one per stack, so
that ``eroica status``/``verdicts``/``sql`` find the running stack from any
working directory. Layout::

    stack.json          state of the running stack (removed at a clean shutdown)
    stack.lock          held (flock) by the ``eroica up`` process while it runs
    logs/<service>.log  each child's stdout and stderr (tansu: tansu/tansu.log)
    kafka/node-1/       Apache Kafka's config, server.log and data (``up --broker kafka``)
    chdb/               ClickHouse data when the stack runs chdb (+ eroica-sink.json)
    summariser/ detector/ sink/   each worker's own EROICA_DATA_DIR (its metrics-<role>-<pid>.json inside)
    metrics-alert-<pid>.json      one per ``eroica alert`` run with EROICA_DATA_DIR set to this directory:
                                  where its metrics answer (``runtime/metrics.py``); ``eroica status``
                                  lists every one whose process lives

``stack.json`` (version 1) is written atomically whenever something changes::

    {
     "version": 1,
     "pid": 1234,                       # the `eroica up` supervisor
     "started_at_ns": 1700000000000000000,
     "data_dir": "/home/me/.local/share/eroica",
     "kafka": {"bootstrap": "127.0.0.1:40123", "managed": true, "pid": 1235,
               "kind": "tansu",             # or "kafka" (Apache Kafka); null for an external --kafka
               "state": "running",          # restarting, failed; "external" for --kafka
               "restarts": 0},              # broker restarts by the supervisor
     "clickhouse": {"url": "chdb:///home/me/.local/share/eroica/chdb", "backend": "chdb"},
     "query_endpoint": "http://127.0.0.1:40125",   # the sink's read-only HTTP endpoint
     "services": {
       "summariser": {"pid": 1236, "port": 40126, "health_url": "http://127.0.0.1:40126/eroica/stats",
                      "state": "running", "restarts": 0, "recent_restarts": 0, "exit_code": null,
                      "log": ".../logs/summariser.log",
                      "argv": ["...", "-m", "eroica.streams.faust", "summariser"]},
       "detector": {...},
       "sink": {"pid": 1238, "port": 40125, "health_url": "http://127.0.0.1:40125/health", ...}
     }
    }
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from dataclasses import dataclass
from typing import Any

from eroica.runtime.system import atomic_write_json, pid_alive

__all__ = ["STATE_FILE", "LOCK_FILE", "default_data_dir", "read_state", "write_state", "remove_state",
           "live_state", "RunningStack", "find_stack"]

STATE_FILE = "stack.json"
LOCK_FILE = "stack.lock"
STATE_VERSION = 1


def default_data_dir() -> Path:
    """``$EROICA_DATA_DIR``, else ``$XDG_DATA_HOME/eroica`` (``~/.local/share/eroica``)."""
    env = os.environ.get("EROICA_DATA_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "eroica"


def read_state(data_dir: Path) -> dict[str, Any] | None:
    """The state file's content, or None when there is none (or it is unreadable)."""
    try:
        doc = json.loads((Path(data_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def live_state(data_dir: Path) -> dict[str, Any] | None:
    """The state of a stack whose supervisor still runs (a stale file counts as none)."""
    doc = read_state(data_dir)
    if doc is None or not pid_alive(int(doc.get("pid", 0))):
        return None
    return doc


@dataclass(frozen=True)
class RunningStack:
    """Where the running stack of a data directory answers (what every client command needs of it)."""

    data_dir: Path
    pid: int                        # the `eroica up` supervisor
    bootstrap: str | None           # Kafka bootstrap servers
    clickhouse_url: str | None      # where the sink writes (chdb:///DIR or clickhouse://HOST:PORT/DB)
    query_endpoint: str | None      # the sink's read-only HTTP endpoint (chdb: the only reader)


def find_stack(data_dir: Path) -> RunningStack | None:
    """The stack whose supervisor runs in ``data_dir`` (None when none does: no file, stale file).

    The one place the client commands (``replay``, ``alert``, ``status``,
    ``verdicts``, ``sql``, ``report --job``) learn the stack's addresses, so no
    port is ever copied by hand (``cli/stack_options.py`` builds on it).
    """
    doc = live_state(data_dir)
    if doc is None:
        return None
    kafka_doc, clickhouse_doc = doc.get("kafka"), doc.get("clickhouse")
    kafka: dict[str, Any] = kafka_doc if isinstance(kafka_doc, dict) else {}
    clickhouse: dict[str, Any] = clickhouse_doc if isinstance(clickhouse_doc, dict) else {}
    return RunningStack(data_dir=Path(data_dir), pid=int(doc.get("pid", 0)),
                        bootstrap=kafka.get("bootstrap") or None, clickhouse_url=clickhouse.get("url") or None,
                        query_endpoint=doc.get("query_endpoint") or None)


def write_state(data_dir: Path, doc: dict[str, Any]) -> None:
    atomic_write_json(Path(data_dir) / STATE_FILE, {"version": STATE_VERSION, **doc})


def remove_state(data_dir: Path) -> None:
    try:
        (Path(data_dir) / STATE_FILE).unlink()
    except FileNotFoundError:
        pass
