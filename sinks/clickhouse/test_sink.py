"""VerdictSink on both engines: a real clickhouse-server (18.16 here) and chdb.

Every test runs once per backend (the ``clickhouse_config`` fixture is
parametrised) on a fresh database.
"""

from __future__ import annotations

import math

import msgspec
import pytest
from eroica.sinks.clickhouse import (
    ClickHouseError,
    ReadOnlySQLError,
    SchemaMismatchError,
    VerdictSink,
    WindowSummary,
)

HOUR_NS = 3_600_000_000_000


def _count(sink: VerdictSink, table: str, final: bool = False) -> int:
    res = sink.run_readonly_sql(f"SELECT count() FROM {table}{' FINAL' if final else ''}")
    return int(res.rows[0][0])


def test_ensure_schema_is_idempotent(verdict_sink: VerdictSink) -> None:
    verdict_sink.ensure_schema()
    verdict_sink.ensure_schema()
    cfg = verdict_sink.config
    tables = {r[0] for r in verdict_sink.run_readonly_sql(f"SHOW TABLES FROM {cfg.database}").rows}
    assert {cfg.verdicts_table, cfg.summaries_table} <= tables
    described = verdict_sink.run_readonly_sql(f"DESCRIBE TABLE {cfg.verdicts}").rows
    types = {r[0]: r[1] for r in described}
    assert types["peers"] == "Array(Int32)" and types["evidence"] == "String"
    assert types["detected_at_ns"] == "UInt64" and types["rank"] == "Int32"
    assert verdict_sink.run_readonly_sql(f"EXISTS TABLE {cfg.summaries}").rows == [(1,)]


def test_schema_mismatch_is_reported(verdict_sink: VerdictSink) -> None:
    cfg = verdict_sink.config
    verdict_sink.client.execute(f"CREATE DATABASE IF NOT EXISTS `{cfg.database}`")
    verdict_sink.client.execute(f"CREATE TABLE {cfg.verdicts} (verdict_id String) ENGINE = Memory")
    with pytest.raises(SchemaMismatchError, match="lacks columns"):
        verdict_sink.ensure_schema()


def test_round_trip_field_by_field(verdict_sink: VerdictSink, make_verdict) -> None:
    verdict_sink.ensure_schema()
    tricky = "quote ' dq \" backslash \\ tab \t newline \n nul \x00 unicode héllo ✓ %(x)s {x:String}"
    written = [
        make_verdict(rank=1),
        make_verdict(rank=2, component="nic", scope="node", gpu=-1, fn="", peers=[], victims=[],
                     evidence={}, summary=tricky, incident_id=""),
        make_verdict(rank=3, kind="hang", slowdown=0.1 + 0.2, score=-4.2e-300, confidence=1.0,
                     peers=[2**31 - 1, -(2**31)], window_start_ns=2**63 + 12_345),
        # infinities (msgspec would write null for them) and the text null where a value could be
        make_verdict(rank=4, slowdown=math.inf, score=-math.inf, fn="null", summary='null "null"\n[null]'),
    ]
    assert verdict_sink.write_verdicts(written) == 4
    got = {v.verdict_id: v for v in verdict_sink.query_verdicts()}
    assert len(got) == 4
    for v in written:
        back = got[v.verdict_id]
        for name in v.__struct_fields__:
            assert getattr(back, name) == getattr(v, name), name
        assert back == v


def test_reinsert_does_not_duplicate(verdict_sink: VerdictSink, make_verdict) -> None:
    verdict_sink.ensure_schema()
    vs = [make_verdict(rank=r) for r in range(5)]
    verdict_sink.write_verdicts(vs)
    verdict_sink.write_verdicts(vs)  # a replay
    newer = msgspec.structs.replace(vs[0], detected_at_ns=vs[0].detected_at_ns + 1, summary="re-detected")
    verdict_sink.write_verdicts([newer])
    table = verdict_sink.config.verdicts

    def check() -> None:
        got = verdict_sink.query_verdicts()
        assert len(got) == 5
        assert {v.verdict_id for v in got} == {v.verdict_id for v in vs}
        assert next(v for v in got if v.verdict_id == newer.verdict_id).summary == "re-detected"
        assert _count(verdict_sink, table, final=True) == 5

    check()  # before any merge: FINAL collapses at read time
    assert _count(verdict_sink, table) >= 5
    verdict_sink.optimize()
    check()  # after the merge: the rows are gone for good
    assert _count(verdict_sink, table) == 5


def test_filters(verdict_sink: VerdictSink, make_verdict) -> None:
    verdict_sink.ensure_schema()
    t0 = 1_700_000_000_000_000_000
    a1 = make_verdict(job="a", window_start_ns=t0, component="gpu")
    a2 = make_verdict(job="a", window_start_ns=t0 + HOUR_NS, component="nic", scope="node", rank=-1)
    a3 = make_verdict(job="a", window_start_ns=t0 + 2 * HOUR_NS, component="gpu")
    b1 = make_verdict(job="b'; DROP TABLE x; --", window_start_ns=t0 + HOUR_NS, component="gpu")
    verdict_sink.write_verdicts([a1, a2, a3, b1])

    def ids(**kw: object) -> list[str]:
        return [v.verdict_id for v in verdict_sink.query_verdicts(**kw)]  # type: ignore[arg-type]

    assert ids(job="a") == [a3.verdict_id, a2.verdict_id, a1.verdict_id]  # newest window first
    assert ids(job="b'; DROP TABLE x; --") == [b1.verdict_id]
    assert ids(job="nope") == []
    assert ids(component="nic") == [a2.verdict_id]
    assert set(ids(since_ns=a2.window_end_ns)) == {a2.verdict_id, a3.verdict_id, b1.verdict_id}
    assert ids(job="a", component="gpu", since_ns=a1.window_end_ns + 1) == [a3.verdict_id]
    assert len(ids(limit=2)) == 2
    with pytest.raises(ValueError):
        verdict_sink.query_verdicts(limit=0)


def test_batches(clickhouse_config, make_verdict) -> None:
    with VerdictSink(clickhouse_config.replace(batch_size=2)) as sink:
        sink.ensure_schema()
        vs = [make_verdict(rank=r) for r in range(5)]
        assert sink.write_verdicts(vs) == 5
        assert len(sink.query_verdicts()) == 5


def _summary(rank: int, fn: str, window: int, beta: float = 0.1, **kw: object) -> WindowSummary:
    t0 = 1_700_000_000_000_000_000 + window * 10_000_000_000
    base: dict[str, object] = dict(
        job="j", window_start_ns=t0, window_end_ns=t0 + 10_000_000_000, rank=rank, node=f"node-{rank // 8}",
        fn=fn, kind="kernel", count=120, median_ns=1.5e6, p90_ns=2.25e6, p99_ns=3.125e6, total_ns=1.9e8,
        beta=beta, slowdown_vs_peers=1.0,
    )
    base.update(kw)
    return WindowSummary(**base)  # type: ignore[arg-type]


def test_summaries_round_trip_and_rewrite(verdict_sink: VerdictSink) -> None:
    verdict_sink.ensure_schema()
    cells = [_summary(r, f, w) for w in range(2) for r in range(4) for f in ("aten::mm", "ncclAllReduce")]
    cells.append(_summary(9, "gc", 0, kind="python", slowdown_vs_peers=math.nan))  # no peers
    assert verdict_sink.write_summaries(cells, written_at_ns=1) == len(cells)
    got = verdict_sink.query_summaries(job="j")
    assert len(got) == len(cells)
    key = lambda s: (s.window_start_ns, s.rank, s.fn)  # noqa: E731
    by_key = {key(s): s for s in got}
    for s in cells:
        back = by_key[key(s)]
        if math.isnan(s.slowdown_vs_peers):
            assert math.isnan(back.slowdown_vs_peers)
            back = msgspec.structs.replace(back, slowdown_vs_peers=s.slowdown_vs_peers)
        assert back == s
    # The detector rewrites window 0 (e.g. late data): new values replace old rows.
    rewrite = [_summary(r, "aten::mm", 0, beta=0.5) for r in range(4)]
    verdict_sink.write_summaries(rewrite, written_at_ns=2)
    again = verdict_sink.query_summaries(job="j", fn="aten::mm", since_ns=0)
    assert len(again) == 8
    assert sorted(s.beta for s in again) == [0.1] * 4 + [0.5] * 4
    assert len(verdict_sink.query_summaries(rank=9)) == 1
    # Heat map input: rank x fn for a window, straight from SQL.
    heat = verdict_sink.run_readonly_sql(
        f"SELECT rank, fn, max(beta) FROM {verdict_sink.config.summaries} FINAL "
        "GROUP BY rank, fn ORDER BY rank, fn"
    )
    assert heat.columns[:2] == ["rank", "fn"]
    assert (0, "aten::mm", 0.5) in heat.rows
    ts = verdict_sink.run_readonly_sql(
        f"SELECT toUInt64(min(window_start)) FROM {verdict_sink.config.summaries}"
    ).rows[0][0]
    assert ts == cells[0].window_start_ns // 1_000_000_000


def test_readonly_sql(verdict_sink: VerdictSink, make_verdict) -> None:
    verdict_sink.ensure_schema()
    verdict_sink.write_verdicts([make_verdict()])
    table = verdict_sink.config.verdicts
    res = verdict_sink.run_readonly_sql(f"SELECT job, rank FROM {table} FINAL;")
    assert (res.columns, res.rows) == (["job", "rank"], [("job-1", 17)])
    for bad in (f"DROP TABLE {table}", f"INSERT INTO {table} (job) VALUES ('x')",
                f"SELECT 1; DROP TABLE {table}", "SELECT 1 INTO OUTFILE '/tmp/eroica-outfile'"):
        with pytest.raises(ReadOnlySQLError):
            verdict_sink.run_readonly_sql(bad)
    assert _count(verdict_sink, table) == 1


def test_engine_readonly_backs_the_guard(verdict_sink: VerdictSink) -> None:
    """Past the guard (called directly), the engine's readonly=1 still refuses writes."""
    verdict_sink.ensure_schema()
    client, table = verdict_sink.client, verdict_sink.config.verdicts
    for sql in (
        f"DROP TABLE {table}",
        f"OPTIMIZE TABLE {table}",
        "SELECT * FROM file('/etc/hostname', 'CSV', 'l String')",  # table functions read files
    ):
        with pytest.raises(ClickHouseError) as info:
            client.query(sql, readonly=True)
        assert info.value.code == 164, info.value  # READONLY
    assert client.query(f"EXISTS TABLE {table}", readonly=True).rows == [(1,)]
    # The writer path is unaffected by the read-only one.
    client.execute(f"OPTIMIZE TABLE {table}")


def test_bad_sql_fails_fast_with_the_server_message(verdict_sink: VerdictSink) -> None:
    with pytest.raises(ClickHouseError, match="(?i)unknown|doesn't exist|does not exist"):
        verdict_sink.run_readonly_sql("SELECT * FROM no_such_db_zz.no_such_table")


def test_json_compact_rows_keeps_non_finite_floats_apart_from_null() -> None:
    from eroica.sinks.clickhouse.client import json_compact_rows

    rows = [(1, 2.5, "a", [1, 2]), (2, math.nan, "null", []), (3, math.inf, "x\ny", [3]), (4, -math.inf, "", [])]
    lines = json_compact_rows(rows).split(b"\n")
    assert lines[-1] == b"" and len(lines) == 5
    assert [msgspec.json.decode(line) for line in lines[:-1]] == [
        [1, 2.5, "a", [1, 2]], [2, "nan", "null", []], [3, "inf", "x\ny", [3]], [4, "-inf", "", []]]
    finite = [(1, 0.5, "null", [1])]
    assert json_compact_rows(finite) == b'[1,0.5,"null",[1]]\n'
