"""The wire form of columnar batches on Eroica's own Kafka topics.

The contract (telemetry-v1) is JSON Lines, but JSON costs ~100x more to parse
than the numpy work the detector does per record (streaming-notes.md), so our
internal topics carry *frames*: one message holds up to a few thousand records
of one rank as raw numpy buffers, and the consumer rebuilds its columns with
``np.frombuffer`` without copying or touching records one by one.

Every message starts with a 4-byte header, then a msgpack body::

    b"EF"  magic (Eroica Frame): rejects JSON or foreign bytes at once
    0x01   format version (FORMAT_VERSION): a reader refuses versions it does not know
    kind   b"C" columns, b"E" end-of-stream marker, b"J" job metadata

Columns body (msgpack map)::

    {"t": "fn",                      # record type, a key of columns.SCHEMAS
     "n": 1000,                      # number of records
     "c": [[name, dtype, buffer], ...],  # every schema column, in schema order;
                                     # dtype is numpy's string (e.g. "<i8"), so
                                     # byte order travels with the data
     "v": {name: [str, ...]},        # vocabulary of each dictionary-encoded column,
                                     # only the entries this frame uses
     "m": {...}}                     # metadata: "seq" (the key's frame count), "producer",
                                     # and optional "wm" (int ns): the producer's declared
                                     # watermark, "every record of this key and record type
                                     # older than wm has been sent" (the tracer from its open
                                     # spans, the agent from its sample times, replay
                                     # --declare-watermarks for time-ordered input); the
                                     # summariser then closes windows 5 s after the slowest
                                     # declaration instead of one lateness after guessed marks

End-of-stream body: ``{"job", "rank", "node", "records", "frames", "m"}`` (see
:class:`EndOfStream`). Job body: the contract's ``job`` record as a map.

Decoding bounds size and nesting first (``limits.py``), then validates structure,
dtypes, lengths, code ranges and the contract's time bounds, and raises
:class:`FrameError` with the reason, so a corrupt message is dead-lettered by
its consumer instead of crashing it. Decoded arrays are ``np.frombuffer`` views
of the column buffers msgpack hands back (one memcpy per column, no per-record
work); they are read-only: copy before writing into them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
import msgspec
import numpy as np

from .columns import CAT, SCHEMAS, Columns
from .limits import MAX_DEPTH, MAX_MESSAGE_BYTES, LimitError, check_msgpack, check_size, failure_reason, value_depth
from .records import MAX_DUR_NS, MAX_TS_NS, JobRecord

# What a stream whose producer declares its watermark (frame meta "wm") still needs: a stream not
# heard from yet on this partition (a rank's first flush: collectors flush every 0.25-0.5 s), a
# span that began between a collector's clock read and its snapshot of open spans (a thread
# preempted in between: a GIL switch is 5 ms), frames in a producer's queue (linger 5 ms, a
# loaded broker). 5 s is ten flush intervals: the guessed marks' allowance (one window, 30 s)
# exists for spans whose start time arrives when they end, which a declaration accounts for.
# Workers take EROICA_DECLARED_LATENESS_S (streams/faust/settings.py, this default).
DECLARED_LATENESS_NS = 5 * 10**9

MAGIC = b"EF"
FORMAT_VERSION = 1
HEADER_LEN = 4

COLUMNS = "columns"
END_OF_STREAM = "end_of_stream"
JOB = "job"
_KIND_BYTE = {COLUMNS: b"C", END_OF_STREAM: b"E", JOB: b"J"}
_BYTE_KIND = {v[0]: k for k, v in _KIND_BYTE.items()}

# numpy dtype each schema column must have on the wire (dictionary codes are int32).
_WIRE_DTYPES: dict[str, dict[str, np.dtype]] = {
    t: {name: np.dtype("i4" if d == CAT else d) for name, d in schema.items()}
    for t, schema in SCHEMAS.items()
}


class FrameError(ValueError):
    """A message that is not a valid frame: the text says what is wrong with it."""


@dataclass(frozen=True)
class EndOfStream:
    """Marker that one producer has sent everything for one key (a rank or a node).

    Consumers use it to know input is complete: tansu reports end offsets
    wrongly, so "caught up with the high watermark" cannot be trusted. It is
    sent on the same key as the data, hence the same partition, after it.
    ``rank`` is -1 for a node-level key (nic/host counters), ``node`` is ""
    for a rank-level key. ``records`` and ``frames`` count what this producer
    sent on the key, so a consumer can also check nothing was lost.
    """

    job: str
    rank: int = -1
    node: str = ""
    records: int = 0
    frames: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


def _pack_default(obj: Any) -> Any:
    """msgpack cannot pack numpy scalars (np.int64, np.bool_): unwrap them."""
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot pack {type(obj).__name__} into a frame")


def _pack(kind: str, body: dict[str, Any]) -> bytes:
    header = MAGIC + bytes((FORMAT_VERSION,)) + _KIND_BYTE[kind]
    packed: bytes = msgpack.packb(body, default=_pack_default, use_bin_type=True)  # msgpack is untyped: Any
    return header + packed


def frame_kind(data: bytes) -> str:
    """Kind of a message (COLUMNS, END_OF_STREAM or JOB) from its header alone."""
    if len(data) < HEADER_LEN or data[:2] != MAGIC:
        raise FrameError(f"not an Eroica frame: starts with {bytes(data[:8])!r}")
    if data[2] != FORMAT_VERSION:
        raise FrameError(f"unsupported frame format version {data[2]} (this reader knows {FORMAT_VERSION})")
    kind = _BYTE_KIND.get(data[3])
    if kind is None:
        raise FrameError(f"unknown frame kind byte {bytes(data[3:4])!r}")
    return kind


def _unpack(data: bytes, want: str, prescan: bool = True) -> dict[str, Any]:
    """The body of a ``want`` message; ``prescan=False`` checks the size only (the caller bounds the rest)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise FrameError(f"not an Eroica frame: a {type(data).__name__}, not bytes")
    kind = frame_kind(data)
    if kind != want:
        raise FrameError(f"expected a {want} frame, got {kind}")
    payload = memoryview(data)[HEADER_LEN:]
    try:
        if prescan:
            check_msgpack(payload, MAX_MESSAGE_BYTES, what=f"{want} frame")
        else:
            check_size(payload, MAX_MESSAGE_BYTES, what=f"{want} frame")
        body = msgpack.unpackb(payload, raw=False)
    except LimitError as exc:
        raise FrameError(f"corrupt {want} frame: {exc}") from None
    except Exception as exc:  # msgpack raises several unrelated types on garbage; MemoryError too
        raise FrameError(f"corrupt {want} frame: {failure_reason(exc, 'body')}") from None
    if not isinstance(body, dict):
        raise FrameError(f"corrupt {want} frame: body is {type(body).__name__}, not a map")
    return body


def _compact(codes: np.ndarray, vocab: list[str]) -> tuple[np.ndarray, list[str]]:
    """Codes renumbered over only the vocabulary entries they use (unchanged if all are used).

    The entries kept stay in code order. A vocabulary no larger than a few
    times the codes is marked with ``np.bincount`` (linear, no sort): frames
    of 1000 records cut against a batch's or an accumulator's vocabulary.
    """
    n = len(codes)
    if n == 0:
        return codes, []
    size = len(vocab)
    counts = None
    if size <= 4 * n + 256 and codes.dtype.kind in "iu":
        try:
            counts = np.bincount(codes, minlength=size)
        except ValueError:  # a negative code: left to the general path below
            counts = None
    if counts is not None and len(counts) == size:
        if counts.all():
            return codes, vocab
        used = np.flatnonzero(counts)
        remap = np.zeros(size, dtype=np.int32)
        remap[used] = np.arange(len(used), dtype=np.int32)
        return remap[codes], [vocab[i] for i in used.tolist()]
    used, inverse = np.unique(codes, return_inverse=True)
    if len(used) == len(vocab):
        return codes, vocab
    return inverse.astype(np.int32, copy=False), [vocab[i] for i in used.tolist()]


def compact_vocab(cols: Columns) -> Columns:
    """The same records with each vocabulary cut to the entries they use.

    Frames are cut from reader batches whose vocabularies span every rank and
    function of 64k records; shipping (or merging) all of it with each frame
    of 1000 would dwarf the data. numpy does the work, Python only touches the
    entries kept.
    """
    arrays = dict(cols.arrays)
    vocab = dict(cols.vocab)
    for name, dtype in SCHEMAS[cols.type].items():
        if dtype == CAT:
            arrays[name], vocab[name] = _compact(cols.arrays[name], cols.vocab.get(name, []))
    return Columns(cols.type, arrays, vocab)


def encode_frame(cols: Columns, meta: dict[str, Any] | None = None) -> bytes:
    """One columns frame: every schema column as a raw buffer, vocabularies compacted."""
    wire = _WIRE_DTYPES.get(cols.type)
    if wire is None:
        raise ValueError(f"unknown record type {cols.type!r}")
    n = len(cols)
    columns = []
    vocab = {}
    for name, dtype in wire.items():
        arr = cols.arrays.get(name)
        if arr is None:
            raise ValueError(f"{cols.type} batch lacks column {name!r}")
        if len(arr) != n:
            raise ValueError(f"column {name!r} has {len(arr)} values, expected {n}")
        if SCHEMAS[cols.type][name] == CAT:
            arr, vocab[name] = _compact(arr, cols.vocab.get(name, []))
        arr = np.ascontiguousarray(arr, dtype=dtype)
        columns.append([name, arr.dtype.str, arr.data.cast("B")])
    return _pack(COLUMNS, {"t": cols.type, "n": n, "c": columns, "v": vocab, "m": meta or {}})


# Column layouts already validated once: (type, ((name, dtype string), ...)) -> what to read where.
# A stream's frames repeat one layout, so the per-column checks of names and dtypes run once per
# layout, not per frame; a frame whose layout is not here takes the full check (bounded: 256).
_LAYOUT_OF: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[tuple[int, str, np.dtype, np.dtype], ...]] = {}


def _layout_key(type_: str, columns: list[Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A frame's column layout: its type and each entry's (name, dtype string), in order."""
    return type_, tuple([(e[0], e[1]) for e in columns])


def _columns_of_known_layout(type_: str, n: int, columns: list[Any]) -> dict[str, np.ndarray] | None:
    """The arrays of a frame whose column layout was validated before; None to take the full check."""
    for e in columns:
        if type(e) is not list or len(e) != 3 or type(e[2]) is not bytes:
            return None
    try:
        plan = _LAYOUT_OF.get(_layout_key(type_, columns))
    except TypeError:  # an unhashable name or dtype: the full check says what is wrong
        return None
    if plan is None:
        return None
    arrays: dict[str, np.ndarray] = {}
    for index, name, dt, want in plan:
        buf = columns[index][2]
        if len(buf) != n * dt.itemsize:
            return None
        arr = np.frombuffer(buf, dtype=dt)
        arrays[name] = arr if dt.isnative else arr.astype(want)
    return arrays


def _columns(type_: str, n: int, columns: list[Any], wire: dict[str, np.dtype]) -> dict[str, np.ndarray]:
    """Every column checked: an entry of [name, dtype, bytes] each, known dtypes, lengths, none missing."""
    arrays: dict[str, np.ndarray] = {}
    plan = []
    for index, entry in enumerate(columns):
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                and isinstance(entry[1], str) and isinstance(entry[2], bytes)):
            raise FrameError("corrupt columns frame: a column entry is not [name, dtype, bytes]")
        name, dstr, buf = entry
        want = wire.get(name)
        if want is None:
            continue  # a column from a newer writer: ignored, as the contract ignores unknown fields
        try:
            dt = np.dtype(dstr[:8])
        except (TypeError, ValueError):
            raise FrameError(f"corrupt columns frame: column {name!r} has bad dtype {dstr!r}") from None
        if dt.kind != want.kind or dt.itemsize != want.itemsize:
            raise FrameError(f"corrupt columns frame: column {name!r} is {dt.str}, expected {want.str}")
        if len(buf) != n * dt.itemsize:
            raise FrameError(f"corrupt columns frame: column {name!r} holds {len(buf)} bytes, "
                             f"expected {n} x {dt.itemsize}")
        arr = np.frombuffer(buf, dtype=dt)
        arrays[name] = arr if dt.isnative else arr.astype(want)
        plan.append((index, name, dt, want))
    missing = [k for k in wire if k not in arrays]
    if missing:
        raise FrameError(f"corrupt columns frame: missing columns {missing}")
    if len(_LAYOUT_OF) < 256:
        _LAYOUT_OF[_layout_key(type_, columns)] = tuple(plan)
    return arrays


def decode_frame(data: bytes) -> tuple[Columns, dict[str, Any]]:
    """Columns and metadata of a columns frame; arrays are zero-copy, read-only views.

    The hot path of the summariser: no pre-scan of the body's nesting (walking
    a frame's headers, vocabularies included, cost as much as decoding it).
    msgpack's own unpacker is safe on any nesting (its stack, not Python's,
    refuses past 1,024 levels), and every part kept is checked for its shape
    below: the columns and vocabularies are flat by that check, and ``m``, the
    one free-form part handed on, is bounded by :func:`value_depth`.
    """
    body = _unpack(data, COLUMNS, prescan=False)
    try:
        type_, n, columns, vocab, meta = body["t"], body["n"], body["c"], body["v"], body["m"]
    except KeyError as exc:
        raise FrameError(f"corrupt columns frame: missing field {exc}") from None
    wire = _WIRE_DTYPES.get(type_) if isinstance(type_, str) else None
    if wire is None:
        raise FrameError(f"corrupt columns frame: unknown record type {type_!r}")
    if not isinstance(n, int) or n < 0 or not isinstance(columns, list) or not isinstance(vocab, dict) \
            or not isinstance(meta, dict):
        raise FrameError("corrupt columns frame: malformed n, c, v or m field")
    try:
        value_depth(meta, MAX_DEPTH - 1, what="its m field")
    except LimitError as exc:
        raise FrameError(f"corrupt columns frame: {exc}") from None
    arrays = _columns_of_known_layout(type_, n, columns)
    if arrays is None:
        arrays = _columns(type_, n, columns, wire)
    vocabs: dict[str, list[str]] = {}
    for name, d in SCHEMAS[type_].items():
        if d != CAT:
            continue
        voc = vocab.get(name, [])
        if not isinstance(voc, list) or not all(type(s) is str for s in voc):
            raise FrameError(f"corrupt columns frame: vocabulary of {name!r} is not a list of strings")
        codes = arrays[name]
        # one reduction for both bounds: a negative int32 code is above any vocabulary as uint32
        if n and int(codes.view(np.uint32).max()) >= len(voc):
            raise FrameError(f"corrupt columns frame: codes of {name!r} outside its vocabulary of {len(voc)}")
        vocabs[name] = voc
    if n:
        # The contract's bounds hold on the wire too (records.py): a frame written by a
        # producer that skipped validation must not overflow the summariser's int64 work.
        for name, hi in (("ts_ns", MAX_TS_NS), ("dur_ns", MAX_DUR_NS)):
            col = arrays.get(name)
            if col is not None and int(col.view(np.uint64).max()) > hi:  # negatives: huge as uint64
                raise FrameError(f"corrupt columns frame: {name} outside [0, {hi}]")
    ordered = {k: arrays[k] for k in wire}
    return Columns(type_, ordered, vocabs), meta


def encode_end_of_stream(eos: EndOfStream) -> bytes:
    """An end-of-stream marker message."""
    return _pack(END_OF_STREAM, {"job": eos.job, "rank": int(eos.rank), "node": eos.node,
                                 "records": int(eos.records), "frames": int(eos.frames), "m": eos.meta})


def decode_end_of_stream(data: bytes) -> EndOfStream:
    body = _unpack(data, END_OF_STREAM)
    try:
        eos = EndOfStream(body["job"], body["rank"], body["node"], body["records"], body["frames"], body["m"])
    except (KeyError, TypeError) as exc:
        raise FrameError(f"corrupt end_of_stream frame: {exc}") from None
    if not (isinstance(eos.job, str) and isinstance(eos.node, str) and isinstance(eos.rank, int)
            and isinstance(eos.records, int) and isinstance(eos.frames, int) and isinstance(eos.meta, dict)):
        raise FrameError("corrupt end_of_stream frame: a field has the wrong type")
    return eos


def encode_job(job: JobRecord) -> bytes:
    """A job metadata message: job records are few and small, so they travel alone."""
    return _pack(JOB, msgspec.to_builtins(job))


def decode_job(data: bytes) -> JobRecord:
    """The job record of a job message, validated by the contract's own struct."""
    body = _unpack(data, JOB)
    try:
        return msgspec.convert(body, JobRecord)
    except msgspec.ValidationError as exc:
        raise FrameError(f"corrupt job frame: {exc}") from None
    except Exception as exc:  # never more than a reason: see limits.py
        raise FrameError(f"corrupt job frame: {failure_reason(exc, 'job record')}") from None
