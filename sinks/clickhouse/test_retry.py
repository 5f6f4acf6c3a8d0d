"""Retries with backoff while ClickHouse is down; chdb's one-directory rule."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest
from eroica.sinks.clickhouse import (
    ClickHouseConfig,
    ClickHouseError,
    ClickHouseUnavailableError,
    RetryPolicy,
    VerdictSink,
)
from eroica.sinks.clickhouse.client import ChdbClient, NativeClient, call_with_retries
from eroica.stack.clickhouse_server import ClickHouseServer


def _need(module: str) -> ModuleType:
    """Skip locally when an optional package is missing; in CI a missing one is an error."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens


class FakeTime:
    """A clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    def clock(self) -> float:
        return self.now


def test_backoff_sequence_and_attempt_limit() -> None:
    t, calls = FakeTime(), []

    def down() -> None:
        calls.append(t.now)
        raise ConnectionRefusedError(111, "Connection refused")

    policy = RetryPolicy(attempts=5, initial_s=0.1, max_s=0.3, deadline_s=60)
    with pytest.raises(ClickHouseUnavailableError, match=r"h:1 unavailable: insert failed 5 time\(s\)"):
        call_with_retries(down, policy=policy, what="insert", target="h:1", sleep=t.sleep, clock=t.clock)
    assert t.sleeps == pytest.approx([0.1, 0.2, 0.3, 0.3])
    assert len(calls) == 5


def test_deadline_bounds_the_wait() -> None:
    t = FakeTime()

    def down() -> None:
        raise OSError("network unreachable")

    policy = RetryPolicy(attempts=1000, initial_s=0.5, max_s=0.5, deadline_s=2.0)
    with pytest.raises(ClickHouseUnavailableError):
        call_with_retries(down, policy=policy, what="query", target="h:1", sleep=t.sleep, clock=t.clock)
    assert t.now <= 2.0 and len(t.sleeps) == 4


def test_statement_errors_are_not_retried() -> None:
    t, calls = FakeTime(), []

    def wrong() -> None:
        calls.append(1)
        raise RuntimeError("Code: 62. DB::Exception: Syntax error")

    with pytest.raises(ClickHouseError, match="Syntax error") as info:
        call_with_retries(wrong, policy=RetryPolicy(), what="query", target="h:1", sleep=t.sleep, clock=t.clock)
    assert not isinstance(info.value, ClickHouseUnavailableError)
    assert info.value.code == 62 and calls == [1] and t.sleeps == []


def test_nothing_listening_fails_clearly_and_quickly() -> None:
    _need("clickhouse_driver")
    port = _closed_port()
    retry = RetryPolicy(attempts=4, initial_s=0.05, max_s=0.2, deadline_s=5)
    config = ClickHouseConfig.from_url(f"clickhouse://127.0.0.1:{port}/db", retry=retry, connect_timeout_s=1)
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        time.sleep(s)

    start = time.monotonic()
    with VerdictSink(config, client=NativeClient(config, sleep=sleep)) as sink:
        with pytest.raises(ClickHouseUnavailableError) as info:
            sink.ensure_schema()
    elapsed = time.monotonic() - start
    assert f"127.0.0.1:{port}" in str(info.value) and "4 time(s)" in str(info.value)
    assert slept == pytest.approx([0.05, 0.1, 0.2])
    assert elapsed < 3.0


def test_writer_started_before_the_server(clickhouse_server_binary: list[str], tmp_path: Path, make_verdict) -> None:
    """The writer retries until the server comes up, then its batch lands once."""
    port = _closed_port()
    retry = RetryPolicy(attempts=200, initial_s=0.05, max_s=0.2, deadline_s=30)
    config = ClickHouseConfig.from_url(f"clickhouse://127.0.0.1:{port}/late", retry=retry, connect_timeout_s=1)
    first_retry = threading.Event()
    verdicts = [make_verdict(rank=r) for r in range(3)]
    errors: list[BaseException] = []

    def sleep(s: float) -> None:
        first_retry.set()
        time.sleep(s)

    sink = VerdictSink(config, client=NativeClient(config, sleep=sleep))

    def writer() -> None:
        try:
            sink.ensure_schema()
            sink.write_verdicts(verdicts)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        assert first_retry.wait(10), "the writer never retried"
        with ClickHouseServer(tmp_path / "late-server", native_port=port) as server:
            assert server.native_port == port
            thread.join(30)
            assert not thread.is_alive() and not errors, errors
            assert {v.verdict_id for v in sink.query_verdicts()} == {v.verdict_id for v in verdicts}
            sink.close()
    finally:
        sink.close()


def test_chdb_one_directory_per_process(tmp_path: Path) -> None:
    _need("chdb")
    a = ClickHouseConfig.from_url(f"chdb://{tmp_path / 'a'}", database="x")
    b = ClickHouseConfig.from_url(f"chdb://{tmp_path / 'b'}", database="x")
    first, second = ChdbClient(a), ChdbClient(a)  # same directory: one shared session
    try:
        first.execute("CREATE DATABASE IF NOT EXISTS x")
        assert second.query("EXISTS DATABASE x").rows == [(1,)]
        with pytest.raises(ClickHouseError, match="route queries through one owner"):
            ChdbClient(b)
        # Another process cannot open a directory this one owns.
        probe = (
            "from eroica.sinks.clickhouse import ClickHouseConfig, ClickHouseError\n"
            "from eroica.sinks.clickhouse.client import ChdbClient\n"
            f"try:\n    ChdbClient(ClickHouseConfig.from_url({('chdb://' + str(tmp_path / 'a'))!r}))\n"
            "except ClickHouseError as e:\n    print('refused:', e)\n"
        )
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        assert "refused:" in out.stdout and "another process" in out.stdout, out.stdout + out.stderr
    finally:
        first.close()
        second.close()
    with ChdbClient(b) as other:  # all closed: the process may move to another directory
        assert other.query("SELECT 1 AS one").rows == [(1,)]
