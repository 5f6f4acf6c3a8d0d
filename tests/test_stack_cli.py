"""``eroica up`` / ``status`` / ``verdicts`` / ``sql`` as a user runs them.

- ``eroica up`` as a subprocess: the state file, ``eroica status`` exit 0,
  verdicts published to the stack's topic readable through ``eroica
  verdicts``/``eroica sql`` (the chdb dir is owned by the sink child, so this
  goes through its endpoint), a crashed child restarted, and SIGTERM stopping
  every child (none left) with the state file removed.
- ``eroica verdicts``/``eroica sql`` against a ClickHouse server directly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from eroica.cli.main import cli
from eroica.models.verdict import Verdict, encode_verdict
from eroica.sinks.clickhouse import ClickHouseConfig, VerdictSink
from eroica.runtime.system import pid_alive
from eroica.stack.clickhouse_server import ClickHouseServer
from sink_helpers import publish, wait_for

# Children inherit this: tansu's JoinGroup then waits ~1 s instead of ~3 s.
FAST_ENV = {"EROICA_SINK_SESSION_TIMEOUT_MS": "2000", "EROICA_SINK_FLUSH_MS": "100"}


def _eroica(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "eroica.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **FAST_ENV, **(env or {})})


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EROICA_CLICKHOUSE")}
    return {**env, **FAST_ENV}


def test_up_status_query_restart_and_sigterm(tmp_path: Path, make_verdict: Callable[..., Verdict]) -> None:
    pytest.importorskip("chdb")
    data = tmp_path / "stack"
    log = open(tmp_path / "up.log", "wb")
    up = subprocess.Popen([sys.executable, "-m", "eroica.cli", "up", "--data-dir", str(data), "--stop-timeout", "5"],
                          stdout=log, stderr=subprocess.STDOUT, env=_clean_env(), start_new_session=True)
    state: dict = {}
    try:
        def running() -> bool:
            if up.poll() is not None:
                raise AssertionError(f"eroica up exited with {up.returncode}: "
                                     f"{(tmp_path / 'up.log').read_text()[-3000:]}")
            return "stack up" in (tmp_path / "up.log").read_text()

        wait_for(running, 120, "eroica up to report the stack up", interval_s=0.25)
        state = json.loads((data / "stack.json").read_text())
        assert state["version"] == 1 and state["pid"] == up.pid
        assert state["kafka"]["managed"] and state["clickhouse"]["backend"] == "chdb"
        assert state["query_endpoint"].startswith("http://127.0.0.1:")
        assert "sink" in state["services"] and all(s["pid"] for s in state["services"].values())
        from eroica.cli.main import COMMANDS

        if "worker" in COMMANDS:  # the faust workers run (and are checked by status) when installed
            assert {"summariser", "detector"} <= set(state["services"])

        st = _eroica("status", "--data-dir", str(data), "--format", "json")
        doc = json.loads(st.stdout)
        assert st.returncode == 0, st.stdout + st.stderr
        assert doc["ok"] and {c["part"] for c in doc["checks"]} >= {"supervisor", "kafka", "sink", "clickhouse"}

        verdicts = [make_verdict(job="stack-job", rank=r) for r in range(3)]
        publish(state["kafka"]["bootstrap"], "eroica.verdicts", [(b"stack-job", encode_verdict(v)) for v in verdicts])

        def listed() -> list:
            r = _eroica("verdicts", "--data-dir", str(data), "--job", "stack-job", "--format", "json",
                        env={"EROICA_CLICKHOUSE_URL": ""})
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout)

        got = wait_for(lambda: len(listed()) == 3 and listed(), 30, "verdicts through `eroica verdicts`")
        assert sorted(v["rank"] for v in got) == [0, 1, 2]
        r = _eroica("sql", "--data-dir", str(data), "--format", "json",
                    "SELECT count() AS n FROM eroica.verdicts FINAL WHERE job = 'stack-job'")
        assert r.returncode == 0 and json.loads(r.stdout) == [{"n": 3}], r.stderr
        refused = _eroica("sql", "--data-dir", str(data), "DROP TABLE eroica.verdicts")
        assert refused.returncode == 2 and "refused" in refused.stderr

        # A crashed child is reported and restarted; the stack is whole again.
        sink_pid = state["services"]["sink"]["pid"]
        os.kill(sink_pid, signal.SIGKILL)
        wait_for(lambda: json.loads((data / "stack.json").read_text())["services"]["sink"]["restarts"] == 1, 30,
                 "the sink to be restarted")
        wait_for(lambda: _eroica("status", "--data-dir", str(data)).returncode == 0, 30, "status ok after restart")
        assert "exited with status -9" in (tmp_path / "up.log").read_text()
        state = json.loads((data / "stack.json").read_text())
        assert len(listed()) == 3  # the data survived the crash
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
        try:
            code = up.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            raise
        log.close()
    assert code == 0, (tmp_path / "up.log").read_text()[-3000:]
    pids = [s["pid"] for s in state.get("services", {}).values()] + [state.get("kafka", {}).get("pid")]
    assert pids and all(not pid_alive(p) for p in pids if p), "a child outlived `eroica up`"
    assert not (data / "stack.json").exists()
    assert _eroica("status", "--data-dir", str(data)).returncode == 1
    # With the stack down, the chdb directory is free: `eroica verdicts` opens it directly.
    r = _eroica("verdicts", "--data-dir", str(data), "--format", "json")
    assert r.returncode == 0 and len(json.loads(r.stdout)) == 3, r.stderr


def test_status_without_a_stack_fails(tmp_path: Path) -> None:
    r = _eroica("status", "--data-dir", str(tmp_path))
    assert r.returncode == 1 and "no stack state" in r.stdout


@pytest.fixture
def server_with_verdicts(clickhouse_server: ClickHouseServer, make_verdict: Callable[..., Verdict]):
    database = f"t_{uuid.uuid4().hex[:10]}"
    config = ClickHouseConfig.from_url(clickhouse_server.url, database=database)
    now = time.time_ns()
    verdicts = [make_verdict(job="old", rank=1, window_start_ns=now - 5 * 3600 * 10**9),
                make_verdict(job="new", rank=2, window_start_ns=now - 120 * 10**9),
                make_verdict(job="new", rank=3, component="nic", window_start_ns=now - 60 * 10**9)]
    with VerdictSink(config) as sink:
        sink.ensure_schema()
        sink.write_verdicts(verdicts)
    yield f"clickhouse://127.0.0.1:{clickhouse_server.native_port}/{database}", database, verdicts


def test_verdicts_and_sql_against_a_server(server_with_verdicts, tmp_path: Path) -> None:
    url, database, _ = server_with_verdicts
    runner = CliRunner()
    base = ["--clickhouse", url, "--data-dir", str(tmp_path)]

    def ranks(*args: str) -> list[int]:
        r = runner.invoke(cli, ["verdicts", *base, "--format", "json", *args])
        assert r.exit_code == 0, r.output
        return [v["rank"] for v in json.loads(r.stdout)]

    assert ranks() == [3, 2, 1]
    assert ranks("--job", "new") == [3, 2]
    assert ranks("--since", "1h") == [3, 2]
    assert ranks("--component", "nic") == [3]
    assert ranks("--limit", "1") == [3]
    table = runner.invoke(cli, ["verdicts", *base, "--job", "old"])
    assert table.exit_code == 0 and "rank 1" in table.stdout
    assert runner.invoke(cli, ["verdicts", *base, "--since", "soon"]).exit_code == 2

    r = runner.invoke(cli, ["sql", *base, "--format", "json",
                            f"SELECT job, count() AS n FROM {database}.verdicts FINAL GROUP BY job ORDER BY job"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == [{"job": "new", "n": 2}, {"job": "old", "n": 1}]
    tsv = runner.invoke(cli, ["sql", *base, "--format", "tsv", "SELECT 1 AS a, 'x' AS b"])
    assert tsv.stdout.splitlines() == ["a\tb", "1\tx"]
    refused = runner.invoke(cli, ["sql", *base, f"TRUNCATE TABLE {database}.verdicts"])
    assert refused.exit_code == 2 and "refused" in refused.output
    bad = runner.invoke(cli, ["sql", *base, f"SELECT nope FROM {database}.verdicts"])
    assert bad.exit_code == 1
    # system tables are not Eroica's (issue 10): refused before they reach the server
    assert runner.invoke(cli, ["sql", *base, "SELECT * FROM system.one"]).exit_code == 2


def test_verdicts_reports_an_unreachable_server(tmp_path: Path) -> None:
    from eroica.runtime.system import free_port

    r = CliRunner().invoke(cli, ["verdicts", "--clickhouse", f"clickhouse://127.0.0.1:{free_port()}/x",
                                 "--data-dir", str(tmp_path)])
    assert r.exit_code == 1 and "unavailable" in r.output


def test_a_frozen_clickhouse_is_reported_degraded_and_nothing_hangs(
        server_with_verdicts, clickhouse_server: ClickHouseServer, kafka_bootstrap: str,
        make_verdict: Callable[..., Verdict], tmp_path: Path) -> None:
    """Issue 10 item 6: SIGSTOP the server; the sink says what is stuck, status/verdicts answer in seconds."""
    from eroica.stack.health import check_stack, overall_state
    from eroica.runtime.state import write_state
    from sink_helpers import kafka_for, running_worker, worker_config

    url, _database, _ = server_with_verdicts
    kafka = kafka_for(kafka_bootstrap, f"frozen{uuid.uuid4().hex[:6]}")
    config = worker_config(kafka, ClickHouseConfig.from_url(url), http_port=0, stuck_after_s=1.0)
    server_pid = clickhouse_server._proc.pid  # type: ignore[union-attr]
    with running_worker(config) as worker:
        publish(kafka.bootstrap, kafka.verdicts_topic, [(b"j", encode_verdict(make_verdict(job="f", rank=0)))])
        wait_for(lambda: worker.stats.verdicts >= 1, 20, "the first verdict stored")
        assert worker.health()["state"] == "up"
        write_state(tmp_path, {"pid": os.getpid(), "data_dir": str(tmp_path),
                               "kafka": {"bootstrap": kafka.bootstrap, "kind": None, "state": "external"},
                               "clickhouse": {"url": url, "backend": "native"}, "query_endpoint": None,
                               "services": {"sink": {"pid": os.getpid(), "port": 0, "state": "running",
                                                     "health_url": f"{worker.http_url}/health"}}})
        os.killpg(server_pid, signal.SIGSTOP)
        try:
            publish(kafka.bootstrap, kafka.verdicts_topic, [(b"j", encode_verdict(make_verdict(job="f", rank=1)))])
            wait_for(lambda: worker.health()["state"] == "degraded", 15, "the sink to report degraded")
            assert any("insert" in s or "waiting" in s for s in worker.health()["stuck"])
            t0 = time.monotonic()
            checks = {c.part: c for c in check_stack(tmp_path, timeout_s=3.0)}
            assert time.monotonic() - t0 < 6
            assert checks["sink"].state == "degraded" and "STUCK" in checks["sink"].detail
            assert checks["clickhouse"].state == "down" and "did not answer" in checks["clickhouse"].detail
            assert overall_state(list(checks.values())) == "down"
            t0 = time.monotonic()
            r = CliRunner().invoke(cli, ["verdicts", "--clickhouse", url, "--data-dir", str(tmp_path),
                                         "--timeout", "2"])
            assert r.exit_code == 1 and "did not answer within 2 s" in r.output, r.output
            assert time.monotonic() - t0 < 6
        finally:
            os.killpg(server_pid, signal.SIGCONT)
        wait_for(lambda: worker.stats.verdicts >= 2 and worker.health()["state"] == "up", 60,
                 "the sink to catch up after SIGCONT")
        checks = {c.part: c for c in check_stack(tmp_path, timeout_s=3.0)}
        assert checks["sink"].state == "up" and checks["clickhouse"].state == "up", checks
