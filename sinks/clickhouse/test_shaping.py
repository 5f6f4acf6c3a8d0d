"""Pure shaping: Verdict/summary <-> rows, validation, dedup, DDL text."""

from __future__ import annotations

import math

import msgspec
import pytest
from eroica.models.verdict import Verdict
from eroica.sinks.clickhouse.config import ClickHouseConfig
from eroica.sinks.clickhouse.schema import SUMMARY_NAMES, VERDICT_NAMES, ddl_statements
from eroica.sinks.clickhouse.shaping import (
    WindowSummary,
    batched,
    dedupe_verdicts,
    summaries_from_rows,
    summary_rows,
    verdict_columns,
    verdict_rows,
    verdicts_from_rows,
)


def test_verdict_columns_follow_the_struct() -> None:
    assert VERDICT_NAMES == Verdict.__struct_fields__


def test_rows_round_trip(make_verdict) -> None:
    vs = [make_verdict(rank=r) for r in range(3)]
    rows = verdict_rows(vs)
    assert len(rows[0]) == len(VERDICT_NAMES)
    assert rows[0][VERDICT_NAMES.index("evidence")].startswith('{"note"')  # sorted keys
    assert verdicts_from_rows(list(VERDICT_NAMES), rows) == vs
    cols = verdict_columns(vs)
    assert cols[VERDICT_NAMES.index("rank")] == [0, 1, 2]


def test_validation_names_the_record(make_verdict) -> None:
    with pytest.raises(ValueError, match="window_start_ns.*UInt64"):
        verdict_rows([make_verdict(window_start_ns=-5)])
    with pytest.raises(ValueError, match="peers.*Int32"):
        verdict_rows([make_verdict(peers=[2**31])])


def test_dedupe_keeps_latest_detection(make_verdict) -> None:
    a = make_verdict(detected_at_ns=10)
    b = msgspec.structs.replace(a, detected_at_ns=20, summary="newer")
    other = make_verdict(rank=3)
    assert dedupe_verdicts([a, other, b, a]) == [b, other]


def test_summary_rows_round_trip() -> None:
    s = WindowSummary(job="j", window_start_ns=10, window_end_ns=20, rank=3, node="n", fn="f",
                      kind="kernel", count=4, median_ns=1.5, p90_ns=2.0, p99_ns=3.0, total_ns=6.0,
                      beta=0.25, slowdown_vs_peers=math.nan)
    rows = summary_rows([s], written_at_ns=99)
    assert rows[0][-1] == 99 and len(rows[0]) == len(SUMMARY_NAMES)
    back = summaries_from_rows(list(SUMMARY_NAMES), rows)[0]
    assert math.isnan(back.slowdown_vs_peers)
    assert msgspec.structs.replace(back, slowdown_vs_peers=0.0) == msgspec.structs.replace(s, slowdown_vs_peers=0.0)


def _outcome(fn, s: WindowSummary, version: object) -> tuple:
    try:
        return ("row", fn(s, version))
    except Exception as exc:  # noqa: BLE001  (the outcome compared: type and text of any refusal)
        return ("refused", type(exc).__name__, str(exc))


ROW, REFUSED = True, False


@pytest.mark.parametrize(("change", "kept"), [
    ({}, ROW), ({"window_start_ns": 2**64 - 1}, ROW), ({"rank": 2**31 - 1}, ROW), ({"count": 7.9}, ROW),
    ({"window_start_ns": "12"}, ROW), ({"version": "7"}, ROW), ({"rank": -(2**31)}, ROW),
    ({"window_start_ns": -1}, REFUSED), ({"window_end_ns": 2**64}, REFUSED), ({"rank": 2**31}, REFUSED),
    ({"rank": -(2**31) - 1}, REFUSED), ({"count": -3}, REFUSED), ({"job": 5}, REFUSED), ({"node": None}, REFUSED),
    ({"fn": b"f"}, REFUSED), ({"kind": 1.0}, REFUSED), ({"median_ns": "x"}, REFUSED), ({"beta": None}, REFUSED),
    ({"window_end_ns": math.inf}, REFUSED), ({"rank": math.nan}, REFUSED), ({"count": "many"}, REFUSED),
    ({"version": -1}, REFUSED), ({"version": 2**64}, REFUSED), ({"version": None}, REFUSED),
])
def test_summary_row_checks_as_the_field_by_field_path(change: dict, kept: bool) -> None:
    from eroica.sinks.clickhouse.shaping import _checked_summary_row, summary_row

    fields = dict(job="j", window_start_ns=10, window_end_ns=20, rank=3, node="n", fn="f", kind="kernel", count=4,
                  median_ns=1.5, p90_ns=2.0, p99_ns=3.0, total_ns=6.0, beta=0.25, slowdown_vs_peers=math.nan)
    version = change.pop("version", 99)
    fields.update(change)
    s = WindowSummary(**fields)  # type: ignore[arg-type]  (unchecked at construction, as a caller may build it)
    want = _outcome(_checked_summary_row, s, version)
    got = _outcome(summary_row, s, version)
    assert repr(got) == repr(want)  # repr: a NaN in the row compares equal to itself there
    assert (got[0] == "row") is kept, got


def test_batched() -> None:
    assert [list(b) for b in batched([1, 2, 3, 4, 5], 2)] == [[1, 2], [3, 4], [5]]
    assert list(batched([], 3)) == []


def test_ddl_is_in_the_shared_subset() -> None:
    ddl = "\n".join(ddl_statements(ClickHouseConfig(database="ev")))
    assert "ReplacingMergeTree(detected_at_ns)" in ddl and "ReplacingMergeTree(written_at_ns)" in ddl
    for word in ("Nullable", "Map(", "DateTime64", "TTL", "LowCardinality", "JSON"):
        assert word not in ddl
    assert ddl.count("IF NOT EXISTS") == 3
