"""Pure conversions between Eroica records and table rows (no I/O).

Kept apart from the client so the row layout can be tested without a database
and so both backends insert exactly the same tuples. Values are checked here
(ranges of the column types) because a bad value should fail before a batch is
half sent, with a message that names the record, not a server stack trace.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import msgspec
from eroica.models.summary import WindowSummary
from eroica.models.verdict import Verdict

from .schema import SUMMARY_NAMES, VERDICT_NAMES

__all__ = [
    "WindowSummary", "verdict_row", "verdict_rows", "verdict_columns", "verdicts_from_rows",
    "dedupe_verdicts", "summary_row", "summary_rows", "summaries_from_rows", "batched",
]

_U64_MAX = 2**64 - 1
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_evidence_decoder = msgspec.json.Decoder(dict[str, Any])


def _u64(value: object, what: str) -> int:
    v = int(value)  # type: ignore[call-overload]
    if not 0 <= v <= _U64_MAX:
        raise ValueError(f"{what}={value!r} is outside UInt64 (times are ns since the epoch, >= 0)")
    return v


def _i32(value: object, what: str) -> int:
    v = int(value)  # type: ignore[call-overload]
    if not _I32_MIN <= v <= _I32_MAX:
        raise ValueError(f"{what}={value!r} is outside Int32")
    return v


def _str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a str, got {type(value).__name__}")
    return value


# -- verdicts -----------------------------------------------------------------
def verdict_row(v: Verdict) -> tuple:
    """One verdict as a tuple in ``VERDICT_NAMES`` order; evidence becomes sorted-key JSON."""
    where = f"verdict {v.verdict_id!r}"
    return (
        _str(v.verdict_id, f"{where}: verdict_id"),
        _str(v.job, f"{where}: job"),
        _u64(v.window_start_ns, f"{where}: window_start_ns"),
        _u64(v.window_end_ns, f"{where}: window_end_ns"),
        _u64(v.detected_at_ns, f"{where}: detected_at_ns"),
        _str(v.kind, f"{where}: kind"),
        _str(v.component, f"{where}: component"),
        _str(v.scope, f"{where}: scope"),
        _str(v.node, f"{where}: node"),
        _i32(v.rank, f"{where}: rank"),
        _i32(v.gpu, f"{where}: gpu"),
        _str(v.fn, f"{where}: fn"),
        float(v.slowdown),
        float(v.score),
        float(v.confidence),
        [_i32(p, f"{where}: peers") for p in v.peers],
        [_i32(p, f"{where}: victims") for p in v.victims],
        msgspec.json.encode(v.evidence, order="sorted").decode(),
        _str(v.summary, f"{where}: summary"),
        _str(v.incident_id, f"{where}: incident_id"),
        _opt_float(v.job_slowdown),
        _opt_float(v.cost),
        _opt_float(v.gpu_hours_lost_per_hour),
    )


def _opt_float(value: float | None) -> float:
    """An optional verdict number as a Float64 cell: NaN stands for null (no Nullable on 18.16)."""
    return math.nan if value is None else float(value)


def verdict_rows(verdicts: Iterable[Verdict]) -> list[tuple]:
    return [verdict_row(v) for v in verdicts]


def verdict_columns(verdicts: Iterable[Verdict]) -> list[list]:
    """Columnar form (one list per column, ``VERDICT_NAMES`` order)."""
    rows = verdict_rows(verdicts)
    return [list(col) for col in zip(*rows, strict=True)] if rows else [[] for _ in VERDICT_NAMES]


def _verdict_from_mapping(rec: dict[str, Any]) -> Verdict:
    rec = dict(rec)
    ev = rec.get("evidence", "{}")
    rec["evidence"] = _evidence_decoder.decode(ev) if isinstance(ev, (str, bytes)) else ev
    rec["peers"] = [int(p) for p in rec.get("peers", ())]
    rec["victims"] = [int(p) for p in rec.get("victims", ())]
    for name in ("job_slowdown", "cost", "gpu_hours_lost_per_hour"):  # NaN (or a JSON null) is "none"
        x = rec.get(name)
        rec[name] = None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)
    # convert() checks kind/component/scope against the contract's vocabulary.
    return msgspec.convert(rec, Verdict)


def dedupe_verdicts(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """One verdict per ``verdict_id``: the latest detection wins; first-seen order kept.

    The query already reads FINAL; this makes the result right even for a
    backend or a query path that does not collapse duplicates.
    """
    best: dict[str, Verdict] = {}
    for v in verdicts:
        old = best.get(v.verdict_id)
        if old is None or v.detected_at_ns > old.detected_at_ns:
            best[v.verdict_id] = v
    return list(best.values())


def verdicts_from_rows(names: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[Verdict]:
    """Rows (with their column names) back to Verdicts, deduplicated by verdict_id."""
    wanted = [n for n in VERDICT_NAMES if n in names]
    missing = set(VERDICT_NAMES) - set(wanted) - {"incident_id", "job_slowdown", "cost", "gpu_hours_lost_per_hour"}
    if missing:
        raise ValueError(f"verdict rows lack columns {sorted(missing)}")
    idx = {n: names.index(n) for n in wanted}
    return dedupe_verdicts(_verdict_from_mapping({n: row[i] for n, i in idx.items()}) for row in rows)


# -- summaries ----------------------------------------------------------------
def summary_row(s: WindowSummary, written_at_ns: int) -> tuple:
    """One summary as a tuple in ``SUMMARY_NAMES`` order (``written_at_ns`` is the version).

    The checks of :func:`_checked_summary_row`, without building the text that names the row unless
    one fails (that f-string per row was half the cost of shaping a 1,024-rank job's summaries).
    """
    job, node, fn, kind = s.job, s.node, s.fn, s.kind
    try:
        start, end, rank, count = int(s.window_start_ns), int(s.window_end_ns), int(s.rank), int(s.count)
        version = int(written_at_ns)
    except (TypeError, ValueError, OverflowError):
        return _checked_summary_row(s, written_at_ns)  # raises, naming the field
    if not (isinstance(job, str) and isinstance(node, str) and isinstance(fn, str) and isinstance(kind, str)
            and 0 <= start <= _U64_MAX and 0 <= end <= _U64_MAX and 0 <= count <= _U64_MAX
            and 0 <= version <= _U64_MAX and _I32_MIN <= rank <= _I32_MAX):
        return _checked_summary_row(s, written_at_ns)  # raises, naming the field
    return (job, start, end, rank, node, fn, kind, count, float(s.median_ns), float(s.p90_ns), float(s.p99_ns),
            float(s.total_ns), float(s.beta), float(s.slowdown_vs_peers), version)


def _checked_summary_row(s: WindowSummary, written_at_ns: int) -> tuple:
    """:func:`summary_row` field by field, each check naming the row and field it refuses."""
    where = f"summary {s.job!r} rank {s.rank} fn {s.fn!r}"
    return (
        _str(s.job, f"{where}: job"),
        _u64(s.window_start_ns, f"{where}: window_start_ns"),
        _u64(s.window_end_ns, f"{where}: window_end_ns"),
        _i32(s.rank, f"{where}: rank"),
        _str(s.node, f"{where}: node"),
        _str(s.fn, f"{where}: fn"),
        _str(s.kind, f"{where}: kind"),
        _u64(s.count, f"{where}: count"),
        float(s.median_ns),
        float(s.p90_ns),
        float(s.p99_ns),
        float(s.total_ns),
        float(s.beta),
        float(s.slowdown_vs_peers),
        _u64(written_at_ns, "written_at_ns"),
    )


def summary_rows(summaries: Iterable[WindowSummary], written_at_ns: int) -> list[tuple]:
    return [summary_row(s, written_at_ns) for s in summaries]


def summaries_from_rows(names: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[WindowSummary]:
    fields = [n for n in SUMMARY_NAMES if n != "written_at_ns"]
    idx = {n: names.index(n) for n in fields}
    out = []
    for row in rows:
        rec = {n: row[i] for n, i in idx.items()}
        for n in ("median_ns", "p90_ns", "p99_ns", "total_ns", "beta", "slowdown_vs_peers"):
            rec[n] = float(rec[n]) if rec[n] is not None else math.nan
        out.append(msgspec.convert(rec, WindowSummary))
    return out


# -- batching -----------------------------------------------------------------
T = TypeVar("T")


def batched(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """Consecutive slices of at most ``size`` items (one INSERT each)."""
    if size < 1:
        raise ValueError("batch size must be >= 1")
    for i in range(0, len(items), size):
        yield items[i : i + size]
