"""ClickHouse fixtures (Debian clickhouse-server 18.16 started by hand, and chdb).

- ``clickhouse_server_binary``: the server's argv, or skip/fail as below.
- ``clickhouse_server``: one private server for the test session
  (:class:`eroica.stack.clickhouse_server.ClickHouseServer`). When the binary
  is missing the test is skipped, except under ``CI`` where it fails: CI must
  never silently skip the real server path. Install it with
  ``.ci/install-clickhouse.sh``.
- ``clickhouse_shards``: two private servers for the test session, each one
  shard of the cluster ``eroica_shards`` named in both configs
  (:class:`eroica.stack.clickhouse_server.ClickHouseShards`); skips or fails
  like ``clickhouse_server``.
- ``clickhouse_config``: parametrised over both backends ("server", "chdb");
  a fresh database per test (and, for chdb, a fresh data directory, because
  chdb serves one directory per process and must be free for the next test).
- ``verdict_sink``: a VerdictSink on that config (schema not yet created).
- ``make_verdict``: a factory of realistic verdicts.

Docker/testcontainers is not used: the machines this runs on have no Docker
engine, and the Debian server starts in about a tenth of a second.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from eroica.models.verdict import Verdict, finding_key, incident_id, verdict_id
from eroica.sinks.clickhouse import ClickHouseConfig, RetryPolicy, VerdictSink
from eroica.stack.clickhouse_server import (
    ClickHouseServer,
    ClickHouseServerError,
    ClickHouseShards,
    find_server_binary,
)

BACKENDS = ("server", "chdb")


def _unavailable(reason: str) -> None:
    """Skip locally; fail under CI (a missing server there is a broken pipeline)."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: the real ClickHouse path must run here)", pytrace=False)
    pytest.skip(reason)


def _require_module(name: str) -> None:
    try:
        __import__(name)
    except ImportError:
        _unavailable(f"python package {name!r} is not installed (pip install -e '.[sink]')")


@pytest.fixture(scope="session")
def clickhouse_server_binary() -> list[str]:
    """The argv that starts a server (skip locally / fail in CI when not installed)."""
    _require_module("clickhouse_driver")
    argv = find_server_binary()
    if argv is None:
        _unavailable("clickhouse-server binary not found; run .ci/install-clickhouse.sh")
    assert argv is not None
    return argv


@pytest.fixture(scope="session")
def clickhouse_server(
    clickhouse_server_binary: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClickHouseServer]:
    """A started private clickhouse-server on 127.0.0.1 (free ports)."""
    server = ClickHouseServer(tmp_path_factory.mktemp("clickhouse-server"))
    try:
        server.start()
    except ClickHouseServerError as exc:
        # The binary is there but does not start: that is a failure everywhere.
        pytest.fail(f"clickhouse-server did not start: {exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def clickhouse_shards(
    clickhouse_server_binary: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClickHouseShards]:
    """Two started private servers, the shards of the cluster ``eroica_shards`` (free 127.0.0.1 ports)."""
    shards = ClickHouseShards(tmp_path_factory.mktemp("clickhouse-shards"), count=2, cluster="eroica_shards")
    try:
        shards.start()
    except ClickHouseServerError as exc:
        pytest.fail(f"the two clickhouse-server shards did not start: {exc}", pytrace=False)
    yield shards
    shards.stop()


@pytest.fixture(params=BACKENDS)
def clickhouse_config(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ClickHouseConfig]:
    """A ClickHouseConfig on a fresh database, for each backend in turn."""
    database = f"t_{uuid.uuid4().hex[:12]}"
    # Tests want fast, bounded failures rather than a minute of patience.
    retry = RetryPolicy(attempts=3, initial_s=0.05, max_s=0.2, deadline_s=2.0)
    if request.param == "server":
        server: ClickHouseServer = request.getfixturevalue("clickhouse_server")
        config = ClickHouseConfig.from_url(server.url, database=database, retry=retry)
    else:
        _require_module("chdb")
        config = ClickHouseConfig.from_url(f"chdb://{tmp_path / 'chdb'}", database=database, retry=retry)
    yield config
    if request.param == "server":
        _drop_database(config)


def _drop_database(config: ClickHouseConfig) -> None:
    """Keep the session's server small; a failure here must not fail the test."""
    from clickhouse_driver import Client

    client = Client(host=config.host, port=config.port, connect_timeout=2)
    try:
        client.execute(f"DROP DATABASE IF EXISTS `{config.database}`")
    except Exception:  # noqa: BLE001
        pass
    finally:
        client.disconnect()


@pytest.fixture
def verdict_sink(clickhouse_config: ClickHouseConfig) -> Iterator[VerdictSink]:
    """A VerdictSink on the fresh database (call ensure_schema yourself)."""
    sink = VerdictSink(clickhouse_config)
    try:
        yield sink
    finally:
        sink.close()


def _make_verdict(
    *,
    job: str = "job-1",
    window_start_ns: int = 1_700_000_000_000_000_000,
    window_ns: int = 10_000_000_000,
    rank: int = 17,
    node: str = "node-3",
    component: str = "gpu",
    fn: str = "aten::mm",
    detected_at_ns: int | None = None,
    kind: str = "slow",
    scope: str = "rank",
    gpu: int = 1,
    **fields: object,
) -> Verdict:
    """A realistic verdict whose ids are computed the way the detector computes them."""
    key = finding_key(job, kind, component, scope, node, rank, gpu, fn)
    end = window_start_ns + window_ns
    base: dict[str, object] = dict(
        verdict_id=verdict_id(window_start_ns, end, key),
        job=job, window_start_ns=window_start_ns, window_end_ns=end,
        detected_at_ns=end + 150_000_000 if detected_at_ns is None else detected_at_ns,
        kind=kind, component=component, scope=scope, node=node, rank=rank, gpu=gpu, fn=fn,
        slowdown=1.32, score=7.25, confidence=0.93,
        peers=[r for r in range(8) if r != rank], victims=[0, 1, 2],
        evidence={"sm_clock_mhz": {"culprit": 1410, "peer_median": 1980.5}, "throttle": [1, 2], "note": "a'b\\c"},
        summary=f"rank {rank} on {node}: GPU {gpu} thermally throttled (1410 vs 1980 MHz)",
        incident_id=incident_id(key),
    )
    base.update(fields)
    return Verdict(**base)  # type: ignore[arg-type]


@pytest.fixture
def make_verdict() -> Callable[..., Verdict]:
    """Factory of realistic verdicts: ``make_verdict(job=..., rank=..., window_start_ns=...)``."""
    return _make_verdict
