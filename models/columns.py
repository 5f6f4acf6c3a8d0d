"""Columnar batches of records: one numpy array per field.

Everything downstream of the reader (detection, Kafka frames, sinks) works on
these, never on per-record Python objects. Strings are dictionary-encoded
(``int32`` codes into a per-batch vocabulary) because the detector groups by
them and Kafka frames ship them once per frame instead of once per record.
Absent optional values are ``-1`` for integer columns and ``NaN`` for floats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Any, Sequence, cast

import numpy as np
from msgspec.structs import astuple

from .records import COLLECTIVE_OPS, FN_KINDS, FnRecord, GpuRecord, HostRecord, NicRecord

CAT = "cat"  # dictionary-encoded string column

# Per record type: field -> dtype ("cat" for strings). Order is the frame order.
SCHEMAS: dict[str, dict[str, str]] = {
    "fn": {
        "job": CAT, "node": CAT, "rank": "i4", "step": "i8", "fn": CAT, "kind": "i1",
        "ts_ns": "i8", "dur_ns": "i8", "bytes": "i8", "op": "i1", "group": CAT,
        "stream": "i4", "in_flight": "?", "stack": CAT,
    },
    "gpu": {
        "job": CAT, "node": CAT, "rank": "i4", "gpu": "i4", "ts_ns": "i8",
        **{f: "f8" for f in (
            "sm_util_pct", "mem_util_pct", "sm_clock_mhz", "max_sm_clock_mhz", "power_w",
            "power_limit_w", "temp_c", "throttle_reasons", "pcie_gen", "max_pcie_gen",
            "pcie_width", "max_pcie_width", "pcie_tx_Bps", "pcie_rx_Bps", "nvlink_tx_Bps",
            "nvlink_rx_Bps", "ecc_uncorrected", "xid", "mem_used_bytes", "mem_total_bytes")},
    },
    "nic": {
        "job": CAT, "node": CAT, "nic": CAT, "ts_ns": "i8", "port": "i4",
        **{f: "f8" for f in (
            "tx_Bps", "rx_Bps", "link_gbps", "link_up", "tx_discards", "rx_errors",
            "symbol_errors", "link_downed", "retransmits", "cnp_sent", "xmit_wait")},
    },
    "host": {
        "job": CAT, "node": CAT, "ts_ns": "i8",
        **{f: "f8" for f in ("cpu_util_pct", "load1", "iowait_pct", "mem_used_pct", "steal_pct")},
    },
}

KIND_CODE = {k: i for i, k in enumerate(FN_KINDS)}
OP_CODE = {k: i for i, k in enumerate(COLLECTIVE_OPS)}


@dataclass
class Columns:
    """A batch of records of one type as numpy columns plus string vocabularies."""

    type: str
    arrays: dict[str, np.ndarray]
    vocab: dict[str, list[str]] = field(default_factory=dict)

    def __len__(self) -> int:
        first = next(iter(self.arrays.values()), None)
        return 0 if first is None else len(first)

    def strings(self, name: str) -> np.ndarray:
        """Decode a dictionary-encoded column to an object array (for display/tests)."""
        return np.asarray(self.vocab[name], dtype=object)[self.arrays[name]] if len(self) else np.empty(0, object)

    def take(self, index: np.ndarray | slice) -> "Columns":
        """Rows selected by a boolean mask, an index array or a slice; vocabularies are shared."""
        return Columns(self.type, {k: v[index] for k, v in self.arrays.items()}, self.vocab)

    def code_of(self, name: str, value: str) -> int:
        """Code of a string in a column's vocabulary, -1 when absent."""
        try:
            return self.vocab[name].index(value)
        except ValueError:
            return -1


def empty(type_: str) -> Columns:
    schema = SCHEMAS[type_]
    return Columns(
        type_,
        {k: np.empty(0, dtype=("i4" if t == CAT else t)) for k, t in schema.items()},
        {k: [] for k, t in schema.items() if t == CAT},
    )


def _encode_strings(values: Sequence[str | None]) -> tuple[np.ndarray, list[str]]:
    """Dictionary-encode strings in order of first appearance; ``None`` becomes the empty string.

    ``dict.fromkeys`` finds the distinct values and ``map`` looks each one up,
    both in C: no Python bytecode per value.
    """
    table = dict.fromkeys(values)
    if len(table) == 1:  # one value (a batch of one job, a field nobody sent): every code is 0
        only = next(iter(table))
        return np.zeros(len(values), dtype=np.int32), ["" if only is None else only]
    if None in table:
        keys = list(table)
        at = keys.index(None)
        if "" in table and keys.index("") < at:
            del keys[at]
        else:
            keys[at] = ""
            if "" in table:
                del keys[keys.index("", at + 1)]
        vocab = keys
        codes = {k: i for i, k in enumerate(vocab)}
        codes[None] = codes[""]
    else:
        vocab = list(table)
        codes = {k: i for i, k in enumerate(vocab)}
    # every key left in vocab is a str (None was renamed "" above)
    return np.fromiter(map(codes.__getitem__, values), dtype=np.int32, count=len(values)), cast(list[str], vocab)


_KIND_OF = {k: i for i, k in enumerate(FN_KINDS)}
_OP_OF: dict[str | None, int] = {None: -1, **{k: i for i, k in enumerate(COLLECTIVE_OPS)}}
_GETTERS = {t: {name: attrgetter(name) for name in schema} for t, schema in SCHEMAS.items()}


def _as_table(records: Sequence[Any], names: Sequence[str]) -> np.ndarray | None:
    """Records as a 2-D object array (rows x schema fields), built in C; None unless they are Structs of one class."""
    cls = type(records[0])
    fields = getattr(cls, "__struct_fields__", None)
    if fields is None or set(map(type, records)) != {cls}:
        return None
    table = np.fromiter(chain.from_iterable(map(astuple, records)), dtype=object,
                        count=len(records) * len(fields)).reshape(len(records), len(fields))
    if tuple(fields[: len(names)]) != tuple(names):
        table = table[:, [fields.index(name) for name in names]]
    return table


def from_records(type_: str, records: Sequence[Any]) -> Columns:
    """Build columns from decoded structs of one type (the reader's hot path).

    The structs become one 2-D object array in C (``astuple`` + ``chain`` +
    ``np.fromiter``), and each column is converted by numpy's own casts:
    no Python bytecode per record. Strings are dictionary-encoded in C too
    (:func:`_encode_strings`).
    """
    if not records:
        return empty(type_)
    schema = SCHEMAS[type_]
    names = list(schema)
    try:
        table = _as_table(records, names)
    except (AttributeError, TypeError):  # not a msgspec Struct with every field
        table = None
    getters = _GETTERS[type_]
    arrays: dict[str, np.ndarray] = {}
    vocab: dict[str, list[str]] = {}
    n = len(records)
    for j, (name, dtype) in enumerate(schema.items()):
        col = table[:, j] if table is not None else np.fromiter(map(getters[name], records), dtype=object, count=n)
        if dtype == CAT:
            arrays[name], vocab[name] = _encode_strings(col.tolist())
        elif type_ == "fn" and name == "kind":
            arrays[name] = np.fromiter(map(_KIND_OF.__getitem__, col.tolist()), dtype="i1", count=n)
        elif type_ == "fn" and name == "op":
            arrays[name] = np.fromiter(map(_OP_OF.__getitem__, col.tolist()), dtype="i1", count=n)
        elif dtype == "?":
            arrays[name] = col.astype(bool)
        elif dtype == "f8":
            arrays[name] = col.astype(np.float64)  # None -> NaN
        else:
            absent = np.equal(col, None)  # type: ignore[call-overload]  # an object column: elementwise `is None`
            if absent.any():
                col = col.copy()
                col[absent] = -1
            arrays[name] = col.astype(dtype)
    return Columns(type_, arrays, vocab)


# The GPU side of a collective, as CUPTI / Nsight / Kineto-based collectors record it: NCCL's (and
# RCCL's, which keeps NCCL's kernel names) kernels are ``ncclKernel_<Op>_...`` / ``ncclDevKernel_<Op>_...``.
_COLLECTIVE_KERNEL = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_?([A-Za-z]*)", re.IGNORECASE)
_OP_OF_KERNEL = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
                 ("broadcast", "broadcast"), ("sendrecv", "send"), ("send", "send"), ("recv", "recv"))


def collective_kernels(fn: Columns) -> Columns:
    """``kernel`` records that are NCCL / RCCL collective kernels, read as ``collective``.

    The contract asks for kind ``collective``, but a collector built on the
    CUDA profiling interfaces sees every GPU kernel alike, and a collective's
    kernel then arrives as ``kernel``. Read as compute, a victim's kernel that
    spins waiting for the slow rank would look like slow GPU work on every
    victim. NCCL names all its kernels this way (no compute kernel does), so
    the name is a reliable sign; the op comes from the name when the record
    gives none (``SendRecv`` is point-to-point: ``send``). Vectorised over the
    vocabulary, not the records.
    """
    if not len(fn) or not fn.vocab.get("fn"):
        return fn
    k_kernel, k_coll = _KIND_OF["kernel"], _KIND_OF["collective"]
    is_coll = np.zeros(len(fn.vocab["fn"]), dtype=bool)
    op_of = np.full(len(fn.vocab["fn"]), -1, dtype="i1")
    for code, name in enumerate(fn.vocab["fn"]):
        m = _COLLECTIVE_KERNEL.match(name)
        if m is None:
            continue
        is_coll[code] = True
        word = m.group(1).lower()
        op_of[code] = next((_OP_OF[op] for prefix, op in _OP_OF_KERNEL if word.startswith(prefix)), -1)
    if not is_coll.any():
        return fn
    a = fn.arrays
    hit = np.take(is_coll, a["fn"])  # (a small table: take is about twice as fast as an index)
    hit &= a["kind"] == k_kernel
    if not hit.any():
        return fn
    arrays = dict(a)
    arrays["kind"] = np.where(hit, np.int8(k_coll), a["kind"]).astype("i1")
    arrays["op"] = np.where(hit & (a["op"] < 0), op_of[a["fn"]], a["op"]).astype("i1")
    return Columns(fn.type, arrays, fn.vocab)


def concat(batches: Sequence[Columns]) -> Columns:
    """Concatenate batches of one type, merging their string vocabularies."""
    batches = [b for b in batches if len(b)]
    if not batches:
        raise ValueError("concat needs at least one non-empty batch")
    if len(batches) == 1:
        return batches[0]
    type_ = batches[0].type
    schema = SCHEMAS[type_]
    arrays: dict[str, np.ndarray] = {}
    vocab: dict[str, list[str]] = {}
    for name, dtype in schema.items():
        if dtype != CAT:
            arrays[name] = np.concatenate([b.arrays[name] for b in batches])
            continue
        if any(not b.vocab[name] for b in batches):  # codes without a vocabulary pass through as they are
            table: dict[str, int] = {}
            parts = []
            for b in batches:
                remap = np.fromiter((table.setdefault(s, len(table)) for s in b.vocab[name]),
                                    dtype=np.int32, count=len(b.vocab[name]))
                parts.append(remap[b.arrays[name]] if len(remap) else b.arrays[name])
            arrays[name] = np.concatenate(parts)
            vocab[name] = list(table)
            continue
        arrays[name], vocab[name] = _merged_codes(batches, name)
    return Columns(type_, arrays, vocab)


def _merged_codes(batches: Sequence[Columns], name: str) -> tuple[np.ndarray, list[str]]:
    """One categorical column of ``batches`` (each with a vocabulary) in their merged vocabulary, and that.

    The merged vocabulary numbers the strings in order of first appearance,
    batch by batch. Frames of one stream repeat one vocabulary (a rank's
    function names): each distinct one is mapped once into the merged table
    (a per-batch, per-string loop was most of a window's concat), and each
    batch's codes are written into their place in the output by one lookup
    in its vocabulary's code table, or one copy where that table is the
    identity (the first batch's, and any that repeats a prefix of the merged
    vocabulary in its order): one pass over the codes, where shifting them
    into one combined table first took four.
    """
    table: dict[str, int] = {}
    remap_of: dict[tuple[str, ...], np.ndarray | None] = {}  # None: the identity
    out = np.empty(sum(len(b) for b in batches), dtype=np.int32)
    at = 0
    for b in batches:
        voc = tuple(b.vocab[name])
        if voc in remap_of:
            remap = remap_of[voc]
        else:
            new = [s for s in dict.fromkeys(voc) if s not in table]  # first appearances, in order
            table.update(zip(new, range(len(table), len(table) + len(new))))
            remap = np.fromiter(map(table.__getitem__, voc), dtype=np.int32, count=len(voc))
            if bool((remap == np.arange(remap.size, dtype=np.int32)).all()):
                remap = None
            remap_of[voc] = remap
        codes = b.arrays[name]
        if remap is None:
            out[at:at + codes.size] = codes
        else:
            np.take(remap, codes, out=out[at:at + codes.size], mode="clip")  # valid codes: no bounds check
        at += codes.size
    return out, list(table)


def to_records(cols: Columns) -> list[dict[str, Any]]:
    """Back to contract dicts (absent optionals dropped); for writers and tests, not hot paths."""
    schema = SCHEMAS[cols.type]
    out: list[dict[str, Any]] = []
    decoded = {k: cols.strings(k) for k, t in schema.items() if t == CAT}
    for i in range(len(cols)):
        rec: dict[str, Any] = {"type": cols.type}
        for name, dtype in schema.items():
            if dtype == CAT:
                v = decoded[name][i]
                if v != "" or name in ("job", "node", "fn", "nic"):
                    rec[name] = v
                continue
            v = cols.arrays[name][i]
            if cols.type == "fn" and name == "kind":
                rec[name] = FN_KINDS[int(v)]
            elif cols.type == "fn" and name == "op":
                if v >= 0:
                    rec[name] = COLLECTIVE_OPS[int(v)]
            elif dtype == "?":
                if v:
                    rec[name] = True
            elif dtype == "f8":
                if not np.isnan(v):
                    rec[name] = _float_field(cols.type, name, float(v))
            elif v >= 0 or name in ("rank", "step", "ts_ns", "dur_ns", "gpu"):
                rec[name] = int(v)
        out.append(rec)
    return out


_INT_COUNTERS = {
    "throttle_reasons", "pcie_gen", "max_pcie_gen", "pcie_width", "max_pcie_width",
    "ecc_uncorrected", "xid", "mem_used_bytes", "mem_total_bytes", "tx_discards",
    "rx_errors", "symbol_errors", "link_downed", "retransmits", "cnp_sent", "xmit_wait",
}


def _float_field(type_: str, name: str, v: float) -> float | int | bool:
    if name == "link_up":
        return bool(v)
    if name in _INT_COUNTERS:
        return int(v)
    return v


RECORD_CLASSES = {"fn": FnRecord, "gpu": GpuRecord, "nic": NicRecord, "host": HostRecord}
