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

from typing import Any, ClassVar, Sequence, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from .limits import MAX_MESSAGE_BYTES, LimitError, check_msgpack, failure_reason

DIGEST_VERSION = 2

# ``step`` of an aggregate row: it covers the window's *interior* steps of its rank.
INTERIOR = -1


# A numeric column of a row set: a numpy array in memory, a msgpack array of numbers on the wire.
Column = npt.NDArray[Any]

_I8, _F8, _B = np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.bool_)
_KINDS = {_I8: "iu", _F8: "iuf", _B: "b"}  # the numbers a column of each dtype accepts (msgspec's own rules)


def _ints() -> Column:
    return np.zeros(0, dtype=np.int64)


def _floats() -> Column:
    return np.zeros(0, dtype=np.float64)


def _bools() -> Column:
    return np.zeros(0, dtype=np.bool_)


class _Rows(msgspec.Struct):
    """Rows as columns: strings as lists, numbers as numpy arrays of one dtype each (``DTYPES``).

    Why arrays: the summariser computes every number with numpy and the
    detector compares them with numpy. Held as Python lists, a 1,024-rank
    window's ~250k rows were ~3 M Python numbers: built one by one
    (``tolist``), converted back one by one (``np.asarray``), picked one by
    one when split into steps, a third of batch ``analyze``'s detection
    time. The wire form is unchanged (msgpack arrays of numbers:
    :data:`enc_hook` / :data:`dec_hook`), so the bytes of a digest are the
    same; rows built from lists (tests, importers) are converted once, here.
    """

    DTYPES: ClassVar[dict[str, np.dtype[Any]]] = {}

    def __post_init__(self) -> None:
        for name, dtype in self.DTYPES.items():
            v = getattr(self, name)
            if type(v) is not np.ndarray or v.dtype != dtype or v.ndim != 1:
                setattr(self, name, _column(v, dtype, name))

    def __len__(self) -> int:
        """The number of rows (every column has one value per row)."""
        first = self.__struct_fields__[0]
        return len(getattr(self, first))

    def __eq__(self, other: object) -> bool:
        """Equal values, column by column (NaN equal to NaN, as in their encoding); not numpy's elementwise ``==``."""
        if type(other) is not type(self):
            return NotImplemented
        for f in self.__struct_fields__:
            a, b = getattr(self, f), getattr(other, f)
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                a, b = np.asarray(a), np.asarray(b)
                if a.shape != b.shape or not np.array_equal(a, b, equal_nan=a.dtype.kind == "f" and b.dtype.kind == "f"):
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value


def _column(values: Any, dtype: np.dtype[Any], name: str) -> Column:
    """``values`` as a 1-D array of ``dtype``; a TypeError naming the column for anything but such numbers."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise TypeError(f"column {name!r}: expected a list of numbers")
    if arr.size == 0:
        return np.zeros(0, dtype=dtype)
    if arr.dtype.kind not in _KINDS[dtype]:
        raise TypeError(f"column {name!r}: expected {dtype} values, got {arr.dtype}")
    if arr.dtype.kind == "u" and dtype == _I8 and int(arr.max()) > np.iinfo(np.int64).max:
        raise TypeError(f"column {name!r}: a value beyond int64")
    return arr.astype(dtype, copy=False)


class FnRows(_Rows):
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

    DTYPES: ClassVar[dict[str, np.dtype[Any]]] = {
        "rank": _I8, "kind": _I8, "count": _I8, "total_ns": _F8, "excl_ns": _F8, "median_ns": _F8, "p90_ns": _F8,
        "p99_ns": _F8, "per_step_ns": _F8, "step": _I8, "steps": _I8, "low_ns": _F8,
        "high_ns": _F8}

    rank: Column = msgspec.field(default_factory=_ints)
    fn: list[str] = []
    stack: list[str] = []
    kind: Column = msgspec.field(default_factory=_ints)
    count: Column = msgspec.field(default_factory=_ints)
    total_ns: Column = msgspec.field(default_factory=_floats)
    excl_ns: Column = msgspec.field(default_factory=_floats)      # critical-path (exclusive) time
    median_ns: Column = msgspec.field(default_factory=_floats)
    p90_ns: Column = msgspec.field(default_factory=_floats)
    p99_ns: Column = msgspec.field(default_factory=_floats)
    per_step_ns: Column = msgspec.field(default_factory=_floats)  # median over the row's steps of the per-step cost
    step: Column = msgspec.field(default_factory=_ints)           # INTERIOR, or the edge step the row holds
    steps: Column = msgspec.field(default_factory=_ints)          # steps the row covers in which the function ran
    low_ns: Column = msgspec.field(default_factory=_floats)       # the low (5%) quantile of the per-step cost
    high_ns: Column = msgspec.field(default_factory=_floats)      # the high (95%) quantile of the per-step cost

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.high_ns) != len(self.per_step_ns):
            # a digest of an older summariser (none sent): the median stands in, which shows no shift
            self.high_ns = self.per_step_ns.copy()


class RankRows(_Rows):
    """Per rank, like :class:`FnRows`: one interior row and one row per edge step."""

    DTYPES: ClassVar[dict[str, np.dtype[Any]]] = {
        "rank": _I8, "steps": _I8, "step_time_ns": _F8, "step": _I8, "start_ns": _I8, "end_ns": _I8}

    rank: Column = msgspec.field(default_factory=_ints)
    node: list[str] = []
    steps: Column = msgspec.field(default_factory=_ints)
    step_time_ns: Column = msgspec.field(default_factory=_floats)  # median step span of the row's steps
    step: Column = msgspec.field(default_factory=_ints)            # INTERIOR, or the edge step
    start_ns: Column = msgspec.field(default_factory=_ints)        # edge rows: first start / last end of the
    end_ns: Column = msgspec.field(default_factory=_ints)          # step's records (rank's clock)


class CollRows(_Rows):
    """One row per (rank, communicator, step): summed collective time and bytes."""

    DTYPES: ClassVar[dict[str, np.dtype[Any]]] = {
        "rank": _I8, "step": _I8, "dur_ns": _I8, "bytes": _F8, "calls": _I8, "p2p": _B, "op": _I8}

    rank: Column = msgspec.field(default_factory=_ints)
    group: list[str] = []
    step: Column = msgspec.field(default_factory=_ints)
    dur_ns: Column = msgspec.field(default_factory=_ints)
    bytes: Column = msgspec.field(default_factory=_floats)
    calls: Column = msgspec.field(default_factory=_ints)
    p2p: Column = msgspec.field(default_factory=_bools)  # point-to-point (send / recv): waiting for the peer
    op: Column = msgspec.field(default_factory=_ints)    # collective op code of the calls (-1 unknown)


class InFlightRows(_Rows):
    """Functions still running when dumped (hang evidence)."""

    DTYPES: ClassVar[dict[str, np.dtype[Any]]] = {
        "rank": _I8, "kind": _I8, "ts_ns": _I8, "dur_ns": _I8, "last_rank": _I8, "last_kind": _I8}

    rank: Column = msgspec.field(default_factory=_ints)
    fn: list[str] = []
    kind: Column = msgspec.field(default_factory=_ints)
    ts_ns: Column = msgspec.field(default_factory=_ints)
    dur_ns: Column = msgspec.field(default_factory=_ints)
    # last finished function per rank: what a rank missing from a hang dump was doing
    last_rank: Column = msgspec.field(default_factory=_ints)
    last_fn: list[str] = []
    last_kind: Column = msgspec.field(default_factory=_ints)


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
    folded: int = 0  # functions folded beyond the job's budget (streams/detection/budget.py)


_R = TypeVar("_R", bound=_Rows)


def concat_rows(parts: Sequence[_R]) -> _R:
    """Rows of the same kind side by side (ranks of partitions, or time windows of one job)."""
    cls = type(parts[0])
    out: dict[str, object] = {}
    for f in cls.__struct_fields__:
        if f in cls.DTYPES:
            out[f] = np.concatenate([getattr(p, f) for p in parts])
            continue
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
    out.folded = sum(d.folded for d in digests)  # per partition: an upper bound of the distinct functions folded
    return out


def enc_hook(obj: Any) -> Any:
    """msgpack encoding of a row set's numeric column: the array of its numbers (the wire form of lists)."""
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def dec_hook(type_: type, obj: Any) -> Any:
    """A numeric column from its msgpack array; the rows' ``__post_init__`` (:func:`_column`) checks its values
    and sets its dtype, as for rows built from lists."""
    if type_ is np.ndarray or getattr(type_, "__origin__", None) is np.ndarray:  # Column, npt.NDArray[Any]
        if not isinstance(obj, list):
            raise TypeError(f"expected an array of numbers, got {type(obj).__name__}")
        return np.asarray(obj)
    raise NotImplementedError(f"cannot decode {type_}")


def encoder() -> msgspec.msgpack.Encoder:
    """A msgpack encoder for anything holding digests (their columns as arrays of numbers)."""
    return msgspec.msgpack.Encoder(enc_hook=enc_hook)


def decoder(type_: Any) -> msgspec.msgpack.Decoder[Any]:
    """A msgpack decoder of ``type_``, for anything holding digests (their columns into arrays)."""
    return msgspec.msgpack.Decoder(type_, dec_hook=dec_hook)


_encoder = encoder()
_decoder: msgspec.msgpack.Decoder[WindowDigest] = msgspec.msgpack.Decoder(WindowDigest, dec_hook=dec_hook)


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
