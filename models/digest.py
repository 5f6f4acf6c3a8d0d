"""The window digest: behaviour patterns of some ranks of one job in one window.

This is what the summariser sends to the detector (the paper's "patterns":
~3 GB of raw events per worker become ~30 KB). It holds durations, counts,
shares and counter levels, no raw event stream, so nodes need no clock
synchronisation. Digests of disjoint rank sets of the same window *merge* by
concatenation, which is how the streaming detector assembles a job window
from many summariser partitions, and how ``eroica analyze`` gets the very same
input to the very same detector.

Encoded with msgpack (maps keyed by ints are allowed there, NaN survives).
"""

from __future__ import annotations

from typing import Sequence, TypeVar

import msgspec

from .limits import MAX_MESSAGE_BYTES, LimitError, check_msgpack, failure_reason

DIGEST_VERSION = 2

# ``step`` of an aggregate row: it covers the window's *interior* steps of its rank.
INTERIOR = -1


class FnRows(msgspec.Struct):
    """A function's pattern on a rank, over whole steps.

    Two kinds of row, so that a job window can be assembled from several time
    windows out of whole training steps (steps longer than the window, or cut
    by its edges): an *interior* row (``step == INTERIOR``) aggregates the
    rank's steps that lie strictly between its first and last step in the
    window (complete by construction); an *edge* row holds one of the rank's
    first or last step in the window, which may continue in the neighbouring
    window and is summed with its other part by the detector
    (:mod:`eroica.streams.detection.steps`).
    """

    rank: list[int] = []
    fn: list[str] = []
    stack: list[str] = []
    kind: list[int] = []
    count: list[int] = []
    total_ns: list[float] = []
    excl_ns: list[float] = []      # critical-path (exclusive) time
    median_ns: list[float] = []
    p90_ns: list[float] = []
    p99_ns: list[float] = []
    per_step_ns: list[float] = []  # median over the row's steps of the per-step cost
    step: list[int] = []           # INTERIOR, or the edge step the row holds
    steps: list[int] = []          # steps the row covers in which the function ran (its weight)
    low_ns: list[float] = []       # the row's low (5%) quantile of the per-step cost: its best steady level


class RankRows(msgspec.Struct):
    """Per rank, like :class:`FnRows`: one interior row and one row per edge step."""

    rank: list[int] = []
    node: list[str] = []
    steps: list[int] = []
    step_time_ns: list[float] = []   # median step span of the row's steps
    step: list[int] = []             # INTERIOR, or the edge step
    start_ns: list[int] = []         # edge rows: first start / last end of the step's records (rank's clock)
    end_ns: list[int] = []


class CollRows(msgspec.Struct):
    """One row per (rank, communicator, step): summed collective time and bytes."""

    rank: list[int] = []
    group: list[str] = []
    step: list[int] = []
    dur_ns: list[int] = []
    bytes: list[float] = []
    calls: list[int] = []
    p2p: list[bool] = []   # point-to-point (send / recv): waiting for the peer, not a ring transfer
    op: list[int] = []     # collective op code of the calls (-1 unknown)


class InFlightRows(msgspec.Struct):
    """Functions still running when dumped (hang evidence)."""

    rank: list[int] = []
    fn: list[str] = []
    kind: list[int] = []
    ts_ns: list[int] = []
    dur_ns: list[int] = []
    # last finished function per rank: what a rank missing from a hang dump was doing
    last_rank: list[int] = []
    last_fn: list[str] = []
    last_kind: list[int] = []


class WindowDigest(msgspec.Struct):
    job: str
    start_ns: int
    end_ns: int
    ranks: RankRows = msgspec.field(default_factory=RankRows)
    fns: FnRows = msgspec.field(default_factory=FnRows)
    colls: CollRows = msgspec.field(default_factory=CollRows)
    in_flight: InFlightRows = msgspec.field(default_factory=InFlightRows)
    gpu: dict[int, dict[str, float]] = {}
    gpu_index: dict[int, int] = {}
    nic: dict[str, dict[str, float]] = {}   # "node/nic" -> metrics
    host: dict[str, dict[str, float]] = {}  # node -> metrics
    version: int = DIGEST_VERSION


_Rows = TypeVar("_Rows", bound=msgspec.Struct)


def concat_rows(parts: Sequence[_Rows]) -> _Rows:
    """Rows of the same kind side by side (ranks of partitions, or time windows of one job)."""
    cls = type(parts[0])
    out: dict[str, list[object]] = {}
    for f in cls.__struct_fields__:
        acc: list[object] = []
        for p in parts:
            acc += getattr(p, f)  # a copy of the pointers, not an iteration per element (3-10x faster)
        out[f] = acc
    return cls(**out)


def merge_digests(digests: Sequence[WindowDigest]) -> WindowDigest:
    """One digest for the union of the ranks (digests must share job and window)."""
    if not digests:
        raise ValueError("merge_digests needs at least one digest")
    d0 = digests[0]
    if len(digests) == 1:
        return d0
    for d in digests[1:]:
        if (d.job, d.start_ns, d.end_ns) != (d0.job, d0.start_ns, d0.end_ns):
            raise ValueError("digests of different job windows cannot merge")
    out = WindowDigest(d0.job, d0.start_ns, d0.end_ns)
    for name in ("ranks", "fns", "colls", "in_flight"):
        setattr(out, name, concat_rows([getattr(d, name) for d in digests]))
    for name in ("gpu", "gpu_index", "nic", "host"):
        merged: dict[int | str, object] = {}
        for d in digests:
            merged.update(getattr(d, name))
        setattr(out, name, merged)
    return out


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(WindowDigest)


def encode_digest(d: WindowDigest) -> bytes:
    return _encoder.encode(d)


def decode_digest(data: bytes) -> WindowDigest:
    """Raises ``msgspec.DecodeError`` (with the reason) on a corrupt, foreign, too large or too deep message."""
    try:
        check_msgpack(data, MAX_MESSAGE_BYTES, what="digest")
        d = _decoder.decode(data)
    except msgspec.DecodeError:
        raise
    except LimitError as exc:
        raise msgspec.DecodeError(str(exc)) from None
    except Exception as exc:  # RecursionError, MemoryError, a non-bytes value...: a reason, never a crash
        raise msgspec.DecodeError(failure_reason(exc, "digest")) from None
    if d.version != DIGEST_VERSION:
        raise msgspec.DecodeError(f"unknown digest version {d.version}")
    return d
