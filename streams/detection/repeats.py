"""Records delivered twice: one copy kept per window, before it is summarised.

Why: telemetry is delivered at least once. A node agent or tracer restarted
after a crash, a log shipper (Vector, Fluent Bit) resuming from its last
checkpoint, a replay started twice: each re-sends records already on the
topic. Kafka's idempotent producer removes only one producer session's own
retries. A function's copy doubles its rank's calls and totals and skews
its quantiles; the critical-path (exclusive) time alone is immune, since
copies overlap exactly. Measured on ``tests/test_repeated_records.py``'s
jobs before this module: the throttled GPU's node sending everything twice
lost 3 of the job's 6 verdicts on that GPU; on a healthy job of 11.5 s
steps, one node's records twice raised a ``workload`` verdict on an
innocent rank, and the whole job twice a ``gpu_memory`` one.

A record is a copy when its *identity* equals an earlier record's in the
same window (every copy lies in the window of its ``ts_ns``; one arriving
after its window closed is late and dropped as any late record is):

- ``fn``: rank, stream, function, its stack, start and duration, in-flight
  flag: one stream of one rank cannot start the same function at the same
  depth twice in the same clock tick and end it in the same one too; a
  re-sent span is that. (A function called by itself differs in stack; an
  in-flight report and the span's final record differ in duration.) Spans
  of zero duration are never copies: at a coarse clock (Kineto's
  microseconds) sibling calls in one tick are real and indistinguishable
  from a copy: the real traces in ``../shared/data/kineto`` hold 637 and
  145 such groups (``cudaPeekAtLastError`` twice in one microsecond), and
  no other repeated identity. They carry no time, so a copy of one costs
  only a call in the counts.
- ``gpu``: node, rank, GPU and sample time; ``nic``: node, NIC, port and
  sample time; ``host``: node and sample time. A device is sampled once
  per instant by one agent.

Cost: one 64-bit hash per record (a few vectorised passes; one compiled
pass for fn records once the summariser's kernels are loaded) and one sort
of the hashes, about 20 ms per 1.7 M records here, against ~0.2 s to
summarise them; only rows whose hash repeats are then compared field by
field, so a collision of hashes never drops a record.
"""

from __future__ import annotations

import numpy as np

from eroica.models.columns import CAT, SCHEMAS, Columns
# By its installed name, as fn_rows imports it (numba's cache records it).
from eroica.streams.detection.kernels import loaded

IDENTITY: dict[str, tuple[str, ...]] = {
    "fn": ("ts_ns", "dur_ns", "rank", "fn", "stream", "stack", "in_flight"),
    "gpu": ("ts_ns", "node", "rank", "gpu"),
    "nic": ("ts_ns", "node", "nic", "port"),
    "host": ("ts_ns", "node"),
}

# Odd 64-bit multipliers (golden-ratio and splitmix64 constants, as signed int64): each field is
# spread over every bit before the sum, so fields that differ by small amounts do not cancel out.
_MULTIPLIERS = (-7046029254386353131, -4658895280553007687, -7723592293110705685, 0x27D4EB2F165667C5,
                0x165667B19E3779F9, -8796714831421723037, 0x61C8864680B583EB)
_MULTIPLIER_ARRAY = np.array(_MULTIPLIERS, dtype=np.int64)
# The dtypes the compiled hash of fn records is compiled for (the schema's): others take numpy's.
_FN_DTYPES = {k: np.dtype("i4" if SCHEMAS["fn"][k] == CAT else SCHEMAS["fn"][k]) for k in IDENTITY["fn"]}


def _hashes(cols: Columns, fields: tuple[str, ...]) -> np.ndarray:
    """A 64-bit hash of each row's identity (wrapping integer arithmetic; equal identities, equal hashes).

    A window's fn records (most of its records) are hashed in one compiled
    pass once the summariser's kernels are loaded (:func:`.kernels._fn_hashes_source`), where numpy takes two
    passes per field; the other types, and columns of other dtypes, take numpy's.
    """
    arrays = cols.arrays
    ks = loaded()
    if ks is not None and fields == IDENTITY["fn"] and all(arrays[k].dtype == _FN_DTYPES[k] for k in fields):
        out = np.empty(len(cols), dtype=np.int64)
        ks.fn_hashes(*(arrays[k] for k in fields), _MULTIPLIER_ARRAY, out)
        return out
    h: np.ndarray = np.multiply(arrays[fields[0]], _MULTIPLIERS[0], dtype=np.int64)
    term = np.empty_like(h)
    for name, mult in zip(fields[1:], _MULTIPLIERS[1:]):
        np.multiply(arrays[name], mult, out=term, dtype=np.int64)
        h += term
    np.right_shift(h, 29, out=term)
    h ^= term
    return h


def first_copies(cols: Columns) -> np.ndarray | None:
    """Which rows to keep (the first of each identity, in input order), or None when no row repeats one.

    None is the common case and costs one hash and one sort; otherwise the
    rows whose hash repeats are sorted by their exact identity (then by
    position, so the first copy is the one kept).
    """
    n = len(cols)
    fields = IDENTITY[cols.type]
    if n < 2:
        return None
    h = _hashes(cols, fields)
    if cols.type == "fn":
        zero = np.flatnonzero(cols.arrays["dur_ns"] == 0)
        if zero.size:  # never copies (see the module's docstring): hashes of their own, no two equal
            h[zero] = zero
    s = np.sort(h)
    repeats = s[1:] == s[:-1]
    if not repeats.any():
        return None
    rows = np.flatnonzero(np.isin(h, s[1:][repeats]))
    keys = [cols.arrays[name][rows] for name in fields]
    order = np.lexsort((rows, *reversed(keys)))  # by identity (first field first), then position
    same = np.ones(rows.size - 1, dtype=bool)
    for k in keys:
        ks = k[order]
        same &= ks[1:] == ks[:-1]
    keep = np.ones(n, dtype=bool)
    keep[rows[order[1:][same]]] = False
    return keep


def without_copies(cols: Columns) -> tuple[Columns, int]:
    """``cols`` less every row that repeats an earlier row's identity, and how many were dropped."""
    keep = first_copies(cols)
    if keep is None:
        return cols, 0
    dropped = int(keep.size - np.count_nonzero(keep))
    return (cols.take(keep) if dropped else cols), dropped
