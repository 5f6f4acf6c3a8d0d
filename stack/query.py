"""Where read-only queries go: a ClickHouse server, the process that owns a chdb dir, or the dir.

``eroica verdicts`` and ``eroica sql`` (and ``eroica status``) call
:func:`resolve_query_target`, which picks, in order:

1. an explicit URL (``--clickhouse`` or ``$EROICA_CLICKHOUSE_URL``):
   a server is queried directly; a chdb directory through the process that
   owns it (its ``eroica-sink.json``) or, when none does, opened directly;
2. else the running stack in the data directory (``stack.json``): its sink's
   query endpoint;
3. else a stopped stack's chdb directory (``DATA_DIR/chdb``), opened directly;
4. else the default server URL (``clickhouse://127.0.0.1:9000/eroica``).

Both kinds of target answer ``verdicts(...)`` and ``sql(...)`` alike. An
endpoint needs its token: read from the file the owner's announcement names,
else from ``DATA_DIR/sink/eroica-sink.token`` (the stack's sink keeps it there).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from eroica.models.verdict import Verdict
from eroica.sinks.clickhouse.client import QueryResult
from eroica.sinks.clickhouse.config import DEFAULT_URL, ClickHouseConfig, RetryPolicy
from eroica.sinks.clickhouse.endpoint import TOKEN_FILE, EndpointClient, read_endpoint_file, read_token_file

from eroica.runtime.state import live_state

__all__ = ["QueryTarget", "DirectTarget", "EndpointTarget", "open_query_target", "resolve_query_target",
           "stack_token"]


def stack_token(data_dir: Path) -> str | None:
    """The token of the sink endpoint of the stack in ``data_dir`` (None when there is none)."""
    return read_token_file(Path(data_dir) / "sink" / TOKEN_FILE)


class QueryTarget(Protocol):
    description: str

    def verdicts(self, job: str | None = None, since_ns: int | None = None, component: str | None = None,
                 limit: int | None = 1000) -> list[Verdict]: ...
    def sql(self, sql: str) -> QueryResult: ...
    def close(self) -> None: ...


class DirectTarget:
    """This process opens ClickHouse itself (a server, or a chdb directory nobody owns)."""

    def __init__(self, config: ClickHouseConfig) -> None:
        from eroica.sinks.clickhouse.sink import VerdictSink

        self.sink = VerdictSink(config)
        self.description = f"direct, {config.target}"

    def verdicts(self, job: str | None = None, since_ns: int | None = None, component: str | None = None,
                 limit: int | None = 1000) -> list[Verdict]:
        return self.sink.query_verdicts(job=job, since_ns=since_ns, component=component, limit=limit)

    def sql(self, sql: str) -> QueryResult:
        return self.sink.run_readonly_sql(sql)

    def close(self) -> None:
        self.sink.close()


class EndpointTarget(EndpointClient):
    """Queries answered by a running sink worker's HTTP endpoint."""

    def __init__(self, url: str, timeout_s: float = 30.0, token: str | None = None) -> None:
        super().__init__(url, timeout_s, token)
        self.description = f"via sink endpoint {self.url}"

    def close(self) -> None:
        pass


def open_query_target(url: str, data_dir: Path, *, endpoint: str | None = None,
                      timeout_s: float = 30.0) -> QueryTarget:
    """A target for ``url``; ``endpoint`` (a running sink's) wins for chdb, where only it may read."""
    config = ClickHouseConfig.from_url(url)
    if config.backend == "chdb" and config.chdb_path != ":memory:":
        owner = read_endpoint_file(config.chdb_path)
        if owner is not None:
            token = read_token_file(owner.get("token_file")) or stack_token(data_dir)
            return EndpointTarget(owner["url"], timeout_s, token)
        if endpoint:
            return EndpointTarget(endpoint, timeout_s, stack_token(data_dir))
    # A read command should answer or fail within its timeout, not wait out a writer's retry policy.
    retry = RetryPolicy(attempts=3, initial_s=0.2, max_s=1.0, deadline_s=timeout_s)
    return DirectTarget(config.replace(connect_timeout_s=min(config.connect_timeout_s, timeout_s), retry=retry))


def resolve_query_target(clickhouse_url: str | None, data_dir: Path, timeout_s: float = 30.0) -> QueryTarget:
    """The target the CLI's read commands use (order in the module docstring)."""
    url = clickhouse_url or os.environ.get("EROICA_CLICKHOUSE_URL") or None
    if url:
        return open_query_target(url, data_dir, timeout_s=timeout_s)
    state = live_state(data_dir)
    if state is not None:
        stack_url = state.get("clickhouse", {}).get("url") or DEFAULT_URL
        return open_query_target(stack_url, data_dir, endpoint=state.get("query_endpoint"), timeout_s=timeout_s)
    chdb_dir = Path(data_dir) / "chdb"
    if chdb_dir.is_dir():
        return open_query_target(f"chdb://{chdb_dir.resolve()}", data_dir, timeout_s=timeout_s)
    return open_query_target(DEFAULT_URL, data_dir, timeout_s=timeout_s)
