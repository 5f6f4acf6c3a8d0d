"""Issue 13 item 5: ClickHouse as two shards behind ``Distributed`` tables (two local 18.16 servers).

One test, on the ``clickhouse_shards`` fixture (two private servers, each one
shard of the cluster ``eroica_shards``; skipped locally without the binary,
failed under ``CI``): the sink creates the schema on both shards, writes the
same verdicts twice through the Distributed table (``insert_distributed_sync``),
and then

- each shard holds part of them, every verdict id on exactly one shard, the
  one ``cityHash64(job) % 2`` names (the documented partitioning rule);
- ``SELECT count() ... FINAL`` through the Distributed table equals the
  distinct ids, and a later detection replaces the earlier one;
- ``eroica verdicts``, ``eroica sql`` and ``eroica report --job`` read the full
  set through either shard, with no cluster setting on the reading side;
- ``eroica sql`` still refuses ``remote(...)``/``cluster(...)``;
- a write while a shard is down fails (retried by the sink, never acknowledged)
  and, once the shard is back, lands.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from eroica.cli.main import cli
from eroica.models.verdict import Verdict
from eroica.sinks.clickhouse import ClickHouseConfig, RetryPolicy, VerdictSink, WindowSummary
from eroica.sinks.clickhouse.client import ClickHouseUnavailableError, NativeClient
from eroica.sinks.clickhouse.schema import SHARDING_KEY, local_table_name
from eroica.stack.clickhouse_server import ClickHouseShards

WINDOW_NS = 10_000_000_000
JOBS = [f"sharded-job-{i}" for i in range(8)]


@pytest.fixture
def sharded(clickhouse_shards: ClickHouseShards, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClickHouseConfig]:
    """A config writing through the cluster, on a fresh database (dropped from both shards after)."""
    for var in ("EROICA_CLICKHOUSE_URL", "EROICA_CLICKHOUSE_CLUSTER", "EROICA_CLICKHOUSE_DATABASE"):
        monkeypatch.delenv(var, raising=False)
    database = f"t_{uuid.uuid4().hex[:12]}"
    retry = RetryPolicy(attempts=3, initial_s=0.05, max_s=0.2, deadline_s=2.0)
    config = ClickHouseConfig.from_url(clickhouse_shards.urls[0], database=database, retry=retry,
                                       cluster=clickhouse_shards.cluster)
    yield config
    for server in clickhouse_shards.servers:
        if server.running:
            with NativeClient(ClickHouseConfig.from_url(server.url, retry=retry)) as c:
                c.execute(f"DROP DATABASE IF EXISTS `{database}`")


def _verdicts(make_verdict: Callable[..., Verdict], start_ns: int, detected_delay_ns: int = 0,
              jobs: list[str] = JOBS) -> list[Verdict]:
    out = []
    for job in jobs:
        for w in range(2):
            ws = start_ns + w * WINDOW_NS
            for rank in (3, 11, 13):
                out.append(make_verdict(job=job, rank=rank, window_start_ns=ws, window_ns=WINDOW_NS,
                                        detected_at_ns=ws + WINDOW_NS + 1_000_000 + detected_delay_ns,
                                        summary=f"{job} rank {rank} detected +{detected_delay_ns}",
                                        job_slowdown=1.25, cost=1.2, gpu_hours_lost_per_hour=64 * (1 - 1 / 1.2)))
    return out


def _local(config: ClickHouseConfig, url: str, sql: str) -> list[tuple]:
    """``sql`` on one server directly (``{local}``: its local verdicts table)."""
    with NativeClient(ClickHouseConfig.from_url(url, database=config.database, retry=config.retry)) as c:
        table = f"`{config.database}`.`{local_table_name(config.verdicts_table)}`"
        return c.query(sql.format(local=table)).rows


def test_two_shards_behind_distributed_tables(clickhouse_shards: ClickHouseShards, sharded: ClickHouseConfig,
                                              make_verdict: Callable[..., Verdict], tmp_path: Path) -> None:
    t_start = time.monotonic()
    config = sharded
    urls = clickhouse_shards.urls
    start_ns = (time.time_ns() // WINDOW_NS - 30) * WINDOW_NS  # within `--since 1h`
    first = _verdicts(make_verdict, start_ns)
    again = _verdicts(make_verdict, start_ns, detected_delay_ns=5_000_000)  # same ids, a later detection
    ids = {v.verdict_id for v in first}
    assert {v.verdict_id for v in again} == ids and len(ids) == len(first) == 48

    with VerdictSink(config) as sink:
        sink.ensure_schema()
        sink.ensure_schema()  # idempotent, on both shards
        assert sink.write_verdicts(first) == 48
        assert sink.write_verdicts(again[:24]) == 24  # re-sent: replaces, never doubles
        assert sink.write_verdicts(first[24:]) == 24  # a replay of the same batch
        summaries = [WindowSummary(job=JOBS[0], window_start_ns=start_ns, window_end_ns=start_ns + WINDOW_NS,
                                   rank=r, node=f"node-{r // 8}", fn="aten::mm", kind="kernel", count=40,
                                   median_ns=1.5e6, p90_ns=2e6, p99_ns=3e6, total_ns=6e7, beta=0.4,
                                   slowdown_vs_peers=1.6 if r == 13 else 1.0) for r in range(16)]
        sink.write_summaries(summaries, written_at_ns=1)
        sink.write_summaries(summaries, written_at_ns=2)

        # Each shard holds part of the verdicts; each id on exactly one shard, the one the key names.
        per_shard = [{r[0] for r in _local(config, url, "SELECT verdict_id FROM {local}")} for url in urls]
        assert all(per_shard), [len(s) for s in per_shard]
        assert per_shard[0].isdisjoint(per_shard[1]) and per_shard[0] | per_shard[1] == ids
        for i, url in enumerate(urls):
            # Distributed's rule: shard number (key % total weight) + 1, equal weights.
            assert _local(config, url, f"SELECT DISTINCT {SHARDING_KEY} % 2 FROM {{local}}") == [(i,)]
            # The duplicates landed beside their originals: FINAL per shard = distinct ids there.
            assert _local(config, url, "SELECT count() FROM {local} FINAL") == [(len(per_shard[i]),)]

        # Through the Distributed table: every id once, the latest detection of the re-sent half.
        assert sink.run_readonly_sql("SELECT count(), uniqExact(verdict_id) FROM verdicts FINAL").rows == [(48, 48)]
        stored = {v.verdict_id: v for v in sink.query_verdicts(limit=None)}
        assert set(stored) == ids
        assert {stored[v.verdict_id].summary for v in again[:24]} == {v.summary for v in again[:24]}
        assert {stored[v.verdict_id].summary for v in first[24:]} == {v.summary for v in first[24:]}
        # The job_windows view (aggregates over the Distributed table): one row per job window.
        assert sink.run_readonly_sql("SELECT count() FROM job_windows").rows == [(len(JOBS) * 2,)]
        assert len(sink.query_summaries(job=JOBS[0])) == 16
        sink.optimize()  # the local tables of each shard (a Distributed table cannot be optimized)
        assert sink.run_readonly_sql("SELECT count() FROM verdicts FINAL").rows == [(48,)]

    # The CLI reads through either shard, with no cluster setting: the Distributed tables have the names.
    runner = CliRunner()
    for url in urls:
        base = ["--clickhouse", url.replace("/default", f"/{config.database}"), "--data-dir", str(tmp_path)]
        r = runner.invoke(cli, ["verdicts", *base, "--format", "json", "--limit", "1000", "--since", "1h"])
        assert r.exit_code == 0, r.output
        assert {v["verdict_id"] for v in json.loads(r.stdout)} == ids
        r = runner.invoke(cli, ["sql", *base, "--format", "json",
                                "SELECT job, count() AS n FROM verdicts FINAL GROUP BY job ORDER BY job"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout) == [{"job": j, "n": 6} for j in sorted(JOBS)]
        for refused in (f"SELECT count() FROM remote('127.0.0.1:{clickhouse_shards.servers[1].native_port}', "
                        f"{config.database}.{local_table_name('verdicts')})",
                        f"SELECT count() FROM cluster('{clickhouse_shards.cluster}', {config.database}, verdicts_local)",
                        "SELECT * FROM verdicts WHERE verdict_id IN (SELECT verdict_id FROM remote('127.0.0.1', "
                        "system.one))"):
            r = runner.invoke(cli, ["sql", *base, refused])
            assert r.exit_code == 2 and "refused" in r.output, r.output
    out = tmp_path / "report.html"
    r = runner.invoke(cli, ["report", "--job", JOBS[0], "-q", "-o", str(out), *base])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert f"{JOBS[0]} rank 13 detected +5000000" in page  # the replacing detection, read through the cluster

    # A shard down: the write through the Distributed table fails (the sink retries, commits nothing) ...
    late = _verdicts(make_verdict, start_ns + 10 * WINDOW_NS, jobs=JOBS[:4])
    down = clickhouse_shards.servers[1]
    down.stop()
    try:
        with VerdictSink(config) as sink, pytest.raises(ClickHouseUnavailableError):
            sink.write_verdicts(late)
    finally:
        down.start()  # same port and data directory
    # ... and the same write once the shard is back stores everything, each id once.
    with VerdictSink(config) as sink:
        sink.write_verdicts(late)
        n = len(ids | {v.verdict_id for v in late})
        assert sink.run_readonly_sql("SELECT count() FROM verdicts FINAL").rows == [(n,)]
    assert time.monotonic() - t_start < 60


def test_sharded_ddl_is_server_only_and_names_the_key() -> None:
    """The sharded DDL (no server needed): local tables, Distributed tables keyed by job, validated names."""
    from eroica.sinks.clickhouse.schema import ddl_statements, shard_ddl_statements
    from eroica.stack.clickhouse_server import _remote_servers_xml

    plain = ClickHouseConfig.from_url("clickhouse://h/e")
    assert not any("Distributed" in s for s in ddl_statements(plain))
    with pytest.raises(ValueError):
        shard_ddl_statements(plain)
    config = plain.replace(cluster="shards")
    shard = shard_ddl_statements(config)
    assert [s.split("(")[0].split("`e`.")[-1].strip() for s in shard[1:]] == [
        "`verdicts_local`", "`summaries_local`", "`verdicts`", "`summaries`"]
    assert "ReplacingMergeTree(detected_at_ns)" in shard[1]
    assert shard[3].endswith("ENGINE = Distributed('shards', 'e', 'verdicts_local', cityHash64(job))")
    assert "`window_start` DateTime ALIAS" in shard[4]  # 18.16: no MATERIALIZED column through Distributed
    assert ddl_statements(config) == [shard[0], *shard[3:]]  # the entry server: the Distributed tables only
    for bad in ("a'b", "x) ENGINE", "1x"):
        with pytest.raises(ValueError):
            plain.replace(cluster=bad)
        with pytest.raises(ValueError):
            _remote_servers_xml({bad: [("127.0.0.1", 9000)]})
    with pytest.raises(ValueError):
        ClickHouseShards(cluster="a b")
