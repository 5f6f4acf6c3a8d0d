"""Typed decoding of contract JSON Lines straight into columns, for chunks it can prove valid.

Why: the reader's typed ``decode_lines`` path makes one Python object per
record (and one per string in it), and building columns from those objects
costs more than decoding them (``astuple``, object tables, hashing every
fresh string). This scanner (compiled with numba, when numba is installed)
reads a chunk's bytes once and writes numpy columns directly: numbers into
``int64`` / ``float64`` rows, strings as ids of the chunk's distinct values.

It decodes only a strict subset of JSON, and answers for a whole chunk or
not at all: :func:`scan_chunk` returns None at the first byte it is not
certain about, and the reader then decodes that chunk exactly as before
(msgspec, line by line where needed, with a reason per rejected line). A
chunk is accepted only when every line is a flat object of ``fn``, ``gpu``,
``nic`` or ``host`` kind with

- no backslash escape, no control byte, spaces as the only whitespace,
  bytes over 127 only inside string values (each distinct value is then
  decoded as strict UTF-8, as msgspec decodes it), no empty line;
- only fields of its own kind (no unknown field: msgspec would skip it, and
  skipping arbitrary JSON is not worth proving here), none twice, every
  required field present, ``null`` only where the struct allows ``None``;
- strings of at most 256 characters (bytes that do not continue a UTF-8
  sequence), the ``kind`` / ``op`` enum values, ``true`` / ``false`` for
  booleans;
- integers as plain digits (no sign, no fraction or exponent, no leading
  zero, at most 19 digits) within the field's bounds;
- floats whose decimal mantissa is below 2**53 and whose power of ten is
  within +-22 (Clinger's fast path: one exact multiplication or division of
  two exactly representable doubles, so correctly rounded, as msgspec's
  parser is), a negative zero excepted.

Everything else (a ``job`` record, an unknown field, an escape, invalid
UTF-8, a huge number, any invalid line) sends the chunk back to the msgspec path, so
which lines are accepted, their values and every rejection reason are
exactly those of the msgspec structs (``tests/test_fastjson.py`` checks this
differentially, on valid and corrupted input).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Union

import numpy as np

from .columns import CAT, SCHEMAS, Columns
from .records import (COLLECTIVE_OPS, FN_KINDS, INT32_MAX, INT64_MAX, MAX_DUR_NS, MAX_TS_NS, FnRecord, GpuRecord,
                      HostRecord, NicRecord)

KINDS = ("fn", "gpu", "nic", "host")
MAX_STR = 256

# Field value types the scanner knows.
T_STR, T_INT, T_FLT, T_BOOL, T_TAG, T_KIND, T_OP = range(7)

_Field = tuple[str, int, int, bool]  # name, value type, upper bound (ints), nullable

# Every field of the four flat record kinds, by name: one type and bound per name
# (a name shared by kinds has the same type in each: checked by _check_fields).
_FIELDS: list[_Field] = [
    ("type", T_TAG, 0, False),
    ("job", T_STR, 0, False), ("node", T_STR, 0, False),
    ("rank", T_INT, INT32_MAX, False), ("step", T_INT, INT64_MAX, False),
    ("fn", T_STR, 0, False), ("kind", T_KIND, 0, False),
    ("ts_ns", T_INT, MAX_TS_NS, False), ("dur_ns", T_INT, MAX_DUR_NS, False),
    ("bytes", T_INT, INT64_MAX, True), ("op", T_OP, 0, True), ("group", T_STR, 0, True),
    ("stream", T_INT, INT32_MAX, True), ("in_flight", T_BOOL, 0, False), ("stack", T_STR, 0, True),
    ("gpu", T_INT, INT32_MAX, False),
    *[(f, T_FLT, 0, True) for f in ("sm_util_pct", "mem_util_pct", "sm_clock_mhz", "max_sm_clock_mhz", "power_w",
                                   "power_limit_w", "temp_c", "pcie_tx_Bps", "pcie_rx_Bps", "nvlink_tx_Bps",
                                   "nvlink_rx_Bps")],
    *[(f, T_INT, INT64_MAX, True) for f in ("throttle_reasons", "pcie_gen", "max_pcie_gen", "pcie_width",
                                           "max_pcie_width", "ecc_uncorrected", "xid", "mem_used_bytes",
                                           "mem_total_bytes")],
    ("nic", T_STR, 0, False), ("port", T_INT, INT32_MAX, True),
    *[(f, T_FLT, 0, True) for f in ("tx_Bps", "rx_Bps", "link_gbps")],
    ("link_up", T_BOOL, 0, True),
    *[(f, T_INT, INT64_MAX, True) for f in ("tx_discards", "rx_errors", "symbol_errors", "link_downed",
                                           "retransmits", "cnp_sent", "xmit_wait")],
    *[(f, T_FLT, 0, True) for f in ("cpu_util_pct", "load1", "iowait_pct", "mem_used_pct", "steal_pct")],
]
FIELD_INDEX = {f[0]: i for i, f in enumerate(_FIELDS)}
_CLASSES = {"fn": FnRecord, "gpu": GpuRecord, "nic": NicRecord, "host": HostRecord}


def _slots() -> tuple[np.ndarray, dict[str, int], dict[str, int], dict[str, int]]:
    """Each field's row in the scanner's output arrays (ints, floats or string ids)."""
    slot = np.zeros(len(_FIELDS), dtype=np.int64)
    ints: dict[str, int] = {}
    flts: dict[str, int] = {}
    strs: dict[str, int] = {}
    for i, (name, t, _hi, _null) in enumerate(_FIELDS):
        table = strs if t == T_STR else flts if t == T_FLT else ints if t != T_TAG else None
        if table is not None:
            table[name] = len(table)
            slot[i] = table[name]
    return slot, ints, flts, strs


_SLOT, INT_ROW, FLT_ROW, STR_ROW = _slots()


def _check_fields() -> tuple[np.ndarray, np.ndarray]:
    """Which fields each kind allows and requires, read from the structs themselves (so they cannot drift)."""
    allowed = np.zeros((len(KINDS), len(_FIELDS)), dtype=np.bool_)
    required = np.zeros((len(KINDS), len(_FIELDS)), dtype=np.bool_)
    for k, kind in enumerate(KINDS):
        cls = _CLASSES[kind]
        names = cls.__struct_fields__
        n_required = len(names) - len(cls.__struct_defaults__)  # defaults belong to the last fields
        allowed[k, FIELD_INDEX["type"]] = required[k, FIELD_INDEX["type"]] = True
        for j, name in enumerate(names):
            i = FIELD_INDEX[name]  # KeyError here: a struct field the scanner does not know
            allowed[k, i] = True
            required[k, i] = j < n_required
    return allowed, required


ALLOWED, REQUIRED = _check_fields()
assert len(_FIELDS) <= 64  # the scanner keeps a line's fields as bits of one uint64


def drift() -> list[str]:
    """Where the scanner's field table disagrees with the structs' rules (empty: it agrees).

    The structs are the contract: a bound, type or default changed in
    ``records.py`` and not here would let the scanner accept what msgspec
    refuses. So the table is checked against ``msgspec.inspect`` at import,
    and any disagreement turns the scanner off (the reader is then the msgspec
    reader); ``tests/test_fastjson.py`` fails on it.
    """
    import msgspec.inspect as mi

    out: list[str] = []
    enums: dict[int, tuple[str, ...]] = {T_KIND: FN_KINDS, T_OP: COLLECTIVE_OPS}
    for kind, cls in _CLASSES.items():
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        for f in info.fields:
            name, t, hi, nullable = _FIELDS[FIELD_INDEX[f.name]]
            typ = f.type
            is_null = isinstance(typ, mi.UnionType) and len(typ.types) == 2 and isinstance(typ.types[1], mi.NoneType)
            if is_null:
                assert isinstance(typ, mi.UnionType)
                typ = typ.types[0]
            ok = is_null == nullable and (f.required or f.default == (None if nullable else False))
            if t == T_INT:
                ok = ok and isinstance(typ, mi.IntType) and (typ.ge, typ.le, typ.gt, typ.lt, typ.multiple_of) == (
                    0, hi, None, None, None)
            elif t == T_FLT:
                ok = ok and isinstance(typ, mi.FloatType) and (typ.ge, typ.le, typ.gt, typ.lt, typ.multiple_of) == (
                    None, None, None, None, None)
            elif t == T_STR:
                ok = ok and isinstance(typ, mi.StrType) and (typ.min_length, typ.max_length, typ.pattern) == (
                    None, MAX_STR, None)
            elif t == T_BOOL:
                ok = ok and isinstance(typ, mi.BoolType)
            elif t in enums:
                ok = ok and isinstance(typ, mi.LiteralType) and set(typ.values) == set(enums[t])
            else:
                ok = False
            if not ok:
                out.append(f"{kind}.{f.name}: {f.type!r} (required={f.required}, default={f.default!r})")
        if info.forbid_unknown_fields or cls.__struct_config__.tag_field != "type":
            out.append(f"{kind}: unknown fields or tag changed")
    return out


_DRIFT = drift()


def _mask(rows: np.ndarray) -> np.ndarray:
    return np.array([sum(1 << i for i in np.flatnonzero(r)) for r in rows], dtype=np.uint64)


ALLOWED_MASK, REQUIRED_MASK = _mask(ALLOWED), _mask(REQUIRED)


def _key_table() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """An open-addressing table from a key's FNV-1a hash to its field, and the names' bytes to verify."""
    names = [f[0].encode() for f in _FIELDS]
    blob = np.frombuffer(b"".join(names), dtype=np.uint8).copy()
    off = np.cumsum([0] + [len(n) for n in names]).astype(np.int64)
    size = 256
    table = np.full(size, -1, dtype=np.int64)
    for i, n in enumerate(names):
        h = _fnv(n)
        j = h & (size - 1)
        while table[j] >= 0:
            j = (j + 1) & (size - 1)
        table[j] = i
    types = np.array([f[1] for f in _FIELDS], dtype=np.int64)
    return table, blob, off, types


def _fnv(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _enum_table(values: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    blob = np.frombuffer("".join(values).encode(), dtype=np.uint8).copy()
    off = np.cumsum([0] + [len(v) for v in values]).astype(np.int64)
    return blob, off


KEY_TABLE, KEY_BLOB, KEY_OFF, FIELD_TYPE = _key_table()
FIELD_HI = np.array([f[2] for f in _FIELDS], dtype=np.uint64)
FIELD_NULL = np.array([f[3] for f in _FIELDS], dtype=np.bool_)
TAG_BLOB, TAG_OFF = _enum_table(KINDS)
KIND_BLOB, KIND_OFF = _enum_table(FN_KINDS)
OP_BLOB, OP_OFF = _enum_table(COLLECTIVE_OPS)
POW10 = np.array([10.0 ** i for i in range(23)], dtype=np.float64)  # each exact in a double


def _scan_source(buf: np.ndarray, n_lines: int,  # noqa: C901 - one flat state machine, on purpose
                 key_table: np.ndarray, key_blob: np.ndarray, key_off: np.ndarray, ftype: np.ndarray,
                 fslot: np.ndarray, fhi: np.ndarray, fnull: np.ndarray, allowed: np.ndarray, required: np.ndarray,
                 tag_blob: np.ndarray, tag_off: np.ndarray, kind_blob: np.ndarray, kind_off: np.ndarray,
                 op_blob: np.ndarray, op_off: np.ndarray, pow10: np.ndarray,
                 kinds: np.ndarray, ivals: np.ndarray, fvals: np.ndarray, svals: np.ndarray,
                 span_lo: np.ndarray, span_hi: np.ndarray, n_spans: np.ndarray, htab: np.ndarray) -> int:
    """Scan every line of ``buf`` into the output arrays; -1 when all are accepted, else the line that is not.

    Written for numba (plain loops over arrays), run as Python only by tests
    that want to step through it.
    """
    n = buf.shape[0]
    n_fields = ftype.shape[0]
    tmask = htab.shape[1] - 1
    # Collectors write their fields in one order: the field that followed each one last
    # time is tried first (one compare of its name instead of hashing the key).
    after = np.full(n_fields + 1, -1, dtype=np.int64)
    # The value each string field had last: tried before its hash table (runs of one node, job, fn).
    last_lo = np.zeros(svals.shape[0], dtype=np.int64)
    last_len = np.full(svals.shape[0], -1, dtype=np.int64)
    last_id = np.zeros(svals.shape[0], dtype=np.int64)
    pos = 0
    line = 0
    while line < n_lines:
        # -- one line: '{' key ':' value (',' key ':' value)* '}' with optional spaces
        seen = np.uint64(0)
        prev = n_fields
        kind = -1
        while pos < n and buf[pos] == 32:
            pos += 1
        if pos >= n or buf[pos] != 123:  # '{'
            return line
        pos += 1
        while pos < n and buf[pos] == 32:
            pos += 1
        if pos < n and buf[pos] == 125:  # '{}': no type
            return line
        while True:
            # key
            if pos >= n or buf[pos] != 34:
                return line
            pos += 1
            field = -1
            guess = int(after[prev])
            if guess >= 0:
                base = key_off[guess]
                klen = int(key_off[guess + 1] - base)
                if pos + klen < n and buf[pos + klen] == 34:
                    same = True
                    for q in range(klen):
                        if key_blob[base + q] != buf[pos + q]:
                            same = False
                            break
                    if same:
                        field = guess
                        pos += klen + 1
            if field < 0:
                k0 = pos
                h = np.uint64(0xCBF29CE484222325)
                while pos < n:
                    c = buf[pos]
                    if c == 34:
                        break
                    if c < 32 or c >= 128 or c == 92:
                        return line
                    h = (h ^ np.uint64(c)) * np.uint64(0x100000001B3)
                    pos += 1
                if pos >= n:
                    return line
                klen = pos - k0
                pos += 1
                j = np.int64(h & np.uint64(key_table.shape[0] - 1))
                while key_table[j] >= 0:
                    cand = key_table[j]
                    if key_off[cand + 1] - key_off[cand] == klen:
                        same = True
                        base = key_off[cand]
                        for q in range(klen):
                            if key_blob[base + q] != buf[k0 + q]:
                                same = False
                                break
                        if same:
                            field = cand
                            break
                    j = (j + 1) & (key_table.shape[0] - 1)
                if field < 0:  # a field no flat kind has
                    return line
                after[prev] = field
            prev = field
            bit = np.uint64(1) << np.uint64(field)
            if seen & bit:  # a field given twice
                return line
            seen |= bit
            while pos < n and buf[pos] == 32:
                pos += 1
            if pos >= n or buf[pos] != 58:  # ':'
                return line
            pos += 1
            while pos < n and buf[pos] == 32:
                pos += 1
            if pos >= n:
                return line
            c = buf[pos]
            t = ftype[field]
            slot = fslot[field]
            if c == 110:  # null
                if not fnull[field] or pos + 4 > n or buf[pos + 1] != 117 or buf[pos + 2] != 108 \
                        or buf[pos + 3] != 108:
                    return line
                pos += 4
            elif t == T_STR or t == T_TAG or t == T_KIND or t == T_OP:
                if c != 34:
                    return line
                pos += 1
                s0 = pos
                cont = 0  # UTF-8 continuation bytes: the string has slen - cont characters
                while pos < n:
                    c = buf[pos]
                    if c == 34:  # never inside a multi-byte sequence (those bytes are >= 0x80)
                        break
                    if c < 32 or c == 92:
                        return line
                    if c >= 128 and (c & 0xC0) == 0x80:
                        cont += 1
                    pos += 1
                if pos >= n:
                    return line
                slen = pos - s0
                pos += 1
                if t == T_STR:
                    if slen - cont > 256:
                        return line
                    sid = -1
                    if last_len[slot] == slen:
                        lo = last_lo[slot]
                        same = True
                        for q in range(slen):
                            if buf[lo + q] != buf[s0 + q]:
                                same = False
                                break
                        if same:
                            sid = last_id[slot]
                    if sid < 0:
                        # the chunk's distinct values of this field: ids in order of first appearance
                        hs = np.uint64(0xCBF29CE484222325)
                        for q in range(slen):
                            hs = (hs ^ np.uint64(buf[s0 + q])) * np.uint64(0x100000001B3)
                        j = np.int64(hs & np.uint64(tmask))
                        while htab[slot, j] >= 0:
                            cand = htab[slot, j]
                            lo = span_lo[slot, cand]
                            if span_hi[slot, cand] - lo == slen:
                                same = True
                                for q in range(slen):
                                    if buf[lo + q] != buf[s0 + q]:
                                        same = False
                                        break
                                if same:
                                    sid = cand
                                    break
                            j = (j + 1) & tmask
                        if sid < 0:
                            sid = n_spans[slot]
                            n_spans[slot] = sid + 1
                            span_lo[slot, sid] = s0
                            span_hi[slot, sid] = s0 + slen
                            htab[slot, j] = sid
                        last_lo[slot] = s0
                        last_len[slot] = slen
                        last_id[slot] = sid
                    svals[slot, line] = sid
                else:
                    if t == T_TAG:
                        blob, off = tag_blob, tag_off
                    elif t == T_KIND:
                        blob, off = kind_blob, kind_off
                    else:
                        blob, off = op_blob, op_off
                    code = -1
                    for e in range(off.shape[0] - 1):
                        if off[e + 1] - off[e] == slen:
                            same = True
                            for q in range(slen):
                                if blob[off[e] + q] != buf[s0 + q]:
                                    same = False
                                    break
                            if same:
                                code = e
                                break
                    if code < 0:
                        return line
                    if t == T_TAG:
                        kind = code
                    else:
                        ivals[slot, line] = code
            elif t == T_INT:
                if c < 48 or c > 57:
                    return line
                if c == 48 and pos + 1 < n and 48 <= buf[pos + 1] <= 57:  # a leading zero
                    return line
                v = np.uint64(0)
                d0 = pos
                while pos < n and 48 <= buf[pos] <= 57:
                    v = v * np.uint64(10) + np.uint64(buf[pos] - 48)
                    pos += 1
                    if pos - d0 > 19:
                        return line
                if v > fhi[field]:
                    return line
                ivals[slot, line] = np.int64(v)
            elif t == T_FLT:
                neg = False
                if c == 45:  # '-'
                    neg = True
                    pos += 1
                    if pos >= n:
                        return line
                    c = buf[pos]
                if c < 48 or c > 57:
                    return line
                if c == 48 and pos + 1 < n and 48 <= buf[pos + 1] <= 57:
                    return line
                w = np.uint64(0)
                digits = 0
                exp10 = 0
                while pos < n and 48 <= buf[pos] <= 57:
                    if w > 0 or buf[pos] != 48:
                        digits += 1
                    w = w * np.uint64(10) + np.uint64(buf[pos] - 48)
                    pos += 1
                    if digits > 17:
                        return line
                if pos < n and buf[pos] == 46:  # '.'
                    pos += 1
                    if pos >= n or buf[pos] < 48 or buf[pos] > 57:
                        return line
                    while pos < n and 48 <= buf[pos] <= 57:
                        if w > 0 or buf[pos] != 48:
                            digits += 1
                        w = w * np.uint64(10) + np.uint64(buf[pos] - 48)
                        exp10 -= 1
                        pos += 1
                        if digits > 17 or exp10 < -400:
                            return line
                if pos < n and (buf[pos] == 101 or buf[pos] == 69):  # 'e' / 'E'
                    pos += 1
                    eneg = False
                    if pos < n and (buf[pos] == 43 or buf[pos] == 45):
                        eneg = buf[pos] == 45
                        pos += 1
                    if pos >= n or buf[pos] < 48 or buf[pos] > 57:
                        return line
                    e = 0
                    while pos < n and 48 <= buf[pos] <= 57:
                        e = e * 10 + int(buf[pos]) - 48
                        pos += 1
                        if e > 1000:
                            return line
                    exp10 += -e if eneg else e
                if w >= np.uint64(1 << 53) or (w == 0 and neg):
                    return line
                if 0 <= exp10 <= 22:
                    x = np.float64(w) * pow10[exp10]
                elif -22 <= exp10 < 0:
                    x = np.float64(w) / pow10[-exp10]
                else:
                    return line
                fvals[slot, line] = -x if neg else x
            elif t == T_BOOL:
                if c == 116 and pos + 4 <= n and buf[pos + 1] == 114 and buf[pos + 2] == 117 and buf[pos + 3] == 101:
                    ivals[slot, line] = 1
                    pos += 4
                elif c == 102 and pos + 5 <= n and buf[pos + 1] == 97 and buf[pos + 2] == 108 \
                        and buf[pos + 3] == 115 and buf[pos + 4] == 101:
                    ivals[slot, line] = 0
                    pos += 5
                else:
                    return line
            else:
                return line
            # after a value: spaces, then ',' (another key) or '}' (the end)
            while pos < n and buf[pos] == 32:
                pos += 1
            if pos >= n:
                return line
            c = buf[pos]
            pos += 1
            if c == 44:  # ','
                while pos < n and buf[pos] == 32:
                    pos += 1
                continue
            if c == 125:  # '}'
                break
            return line
        while pos < n and buf[pos] == 32:
            pos += 1
        if pos < n:
            if buf[pos] != 10:
                return line
            pos += 1
        elif line != n_lines - 1:
            return line
        if kind < 0:
            return line
        if (seen & ~allowed[kind]) != 0 or (required[kind] & ~seen) != 0:
            return line  # a field of another kind (unknown to this one), or a required one missing
        kinds[line] = kind
        line += 1
    if pos != n:
        return line
    return -1


def _renumber_source(ids: np.ndarray, size: int, codes: np.ndarray, order: np.ndarray) -> int:
    """Codes of ``ids`` in order of first appearance (one pass); fills ``order`` and returns how many."""
    lut = np.full(size, -1, dtype=np.int32)
    m = 0
    for i in range(ids.shape[0]):
        g = ids[i]
        c = lut[g]
        if c < 0:
            c = m
            lut[g] = m
            order[m] = g
            m += 1
        codes[i] = c
    return m


_kernels: tuple[Callable[..., int], Callable[..., int]] | None = None
_failed = False


def kernels() -> tuple[Callable[..., int], Callable[..., int]] | None:
    """The compiled scanner and renumberer, or None when numba is not installed (or ``EROICA_FASTJSON=0``).

    Imported and compiled on first use only: numba's import and loading its
    cached machine code cost ~0.5 CPU-s once per process (the very first
    compile, with an empty cache, ~5 s), so the reader asks for them only
    when its input is large enough to pay that back (:func:`worth_it`).
    """
    global _kernels, _failed
    if _kernels is not None or _failed:
        return _kernels
    if os.environ.get("EROICA_FASTJSON", "1") == "0" or _DRIFT:
        _failed = True
        return None
    try:
        import numba  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        _failed = True
        return None
    jit = numba.njit(cache=True, nogil=True, boundscheck=False)
    _kernels = (jit(_scan_source), jit(_renumber_source))
    return _kernels


def use_kernels(kind: str | None) -> None:
    """For tests: ``"numba"`` (compiled), ``"python"`` (the same source, interpreted: slow, small inputs
    only, runs without numba), or None (back to loading them on demand)."""
    global _kernels, _failed
    _kernels, _failed = None, False
    if kind == "python":
        def scan(*args: np.ndarray | int) -> int:
            with np.errstate(over="ignore"):  # the hashes wrap around, as they do compiled
                return _scan_source(*args)  # type: ignore[arg-type]
        _kernels = (scan, _renumber_source)
    elif kind == "numba" and kernels() is None:
        raise RuntimeError("numba is not installed")


# The scanner saves ~5.5 ms per MiB over msgspec + columns and costs ~0.5 s to load:
# it is loaded once a read has passed this many bytes (never for small files).
FAST_AFTER_BYTES = int(os.environ.get("EROICA_FASTJSON_AFTER", 64 << 20))


def loaded() -> bool:
    """Whether the compiled kernels are already in this process (then using them costs nothing more)."""
    return _kernels is not None


def worth_it(bytes_read: int) -> bool:
    """Whether to use (and if need be load) the scanner after ``bytes_read`` bytes of one input."""
    if _kernels is not None:
        return True
    if _failed or bytes_read < FAST_AFTER_BYTES:
        return False
    return kernels() is not None


@dataclass
class ChunkColumns:
    """One chunk's records as columns of each kind, before they are cut into batches.

    ``rows[k]`` are the line numbers (within the chunk) of kind ``KINDS[k]``,
    ``arrays[k]`` that kind's columns with :func:`columns.from_records`'
    dtypes and absent values, except strings: ids into ``vocab[field]``, the
    chunk's distinct strings of that field with ``""`` appended last, so that
    id -1 (absent) reads as ``""``, the way the columns encode ``None``.
    """

    n_lines: int
    rows: dict[int, np.ndarray]
    arrays: dict[int, dict[str, np.ndarray]]
    vocab: dict[str, list[str]]

    def __len__(self) -> int:
        return self.n_lines


def scan_chunk(joined: bytes, n_lines: int) -> ChunkColumns | None:
    """The lines of one chunk (joined by ``\\n``, no trailing newline) as columns, or None unless all are certain."""
    ks = kernels()
    if ks is None:
        return None
    scan = ks[0]
    buf = np.frombuffer(joined, dtype=np.uint8)
    n_str = len(STR_ROW)
    kinds = np.empty(n_lines, dtype=np.int8)
    ivals = np.full((len(INT_ROW), n_lines), -1, dtype=np.int64)
    fvals = np.full((len(FLT_ROW), n_lines), np.nan, dtype=np.float64)
    svals = np.full((n_str, n_lines), -1, dtype=np.int32)
    span_lo = np.empty((n_str, n_lines), dtype=np.int64)
    span_hi = np.empty((n_str, n_lines), dtype=np.int64)
    n_spans = np.zeros(n_str, dtype=np.int64)
    size = 1 << max(4, int(2 * n_lines - 1).bit_length())
    htab = np.full((n_str, size), -1, dtype=np.int64)
    bad = scan(buf, n_lines, KEY_TABLE, KEY_BLOB, KEY_OFF, FIELD_TYPE, _SLOT, FIELD_HI, FIELD_NULL, ALLOWED_MASK,
               REQUIRED_MASK, TAG_BLOB, TAG_OFF, KIND_BLOB, KIND_OFF, OP_BLOB, OP_OFF, POW10,
               kinds, ivals, fvals, svals, span_lo, span_hi, n_spans, htab)
    if bad >= 0:
        return None
    vocab = {}
    for name, row in STR_ROW.items():
        m = int(n_spans[row])
        lo, hi = span_lo[row, :m].tolist(), span_hi[row, :m].tolist()
        try:  # every string value is one of these: strict UTF-8 here is the check msgspec makes
            vocab[name] = [joined[a:b].decode("utf-8") for a, b in zip(lo, hi)] + [""]
        except UnicodeDecodeError:
            return None
    first = int(kinds[0]) if n_lines else 0
    if n_lines and not (kinds != first).any():
        rows = {first: np.arange(n_lines)}
        sels: dict[int, slice | np.ndarray] = {first: slice(0, n_lines)}
    else:
        rows = {k: idx for k in range(len(KINDS)) if (idx := np.flatnonzero(kinds == k)).size}
        sels = dict(rows)
    arrays = {k: _kind_arrays(ivals, fvals, svals, KINDS[k], sel) for k, sel in sels.items()}
    return ChunkColumns(n_lines, rows, arrays, vocab)


def _kind_arrays(ivals: np.ndarray, fvals: np.ndarray, svals: np.ndarray, type_: str,
                 sel: slice | np.ndarray) -> dict[str, np.ndarray]:
    """One kind's columns from the scanner's rows, with the dtypes and absent values of ``from_records``."""
    out: dict[str, np.ndarray] = {}
    for name, dtype in SCHEMAS[type_].items():
        if dtype == CAT:
            out[name] = svals[STR_ROW[name], sel].copy()  # a copy: the scanner's rows are let go
        elif name in FLT_ROW:
            out[name] = fvals[FLT_ROW[name], sel].copy()
        else:
            v = ivals[INT_ROW[name], sel]
            if dtype == "?":
                out[name] = v == 1
            elif dtype == "f8":  # an integer counter (or link_up) in a float column: absent -> NaN
                f = v.astype(np.float64)
                f[v < 0] = np.nan
                out[name] = f
            else:
                out[name] = v.astype(dtype)
    return out


def first_appearance(ids: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Renumber ``ids`` (0..size-1) in order of first appearance: (codes as int32, the ids in that order)."""
    codes = np.empty(ids.shape[0], dtype=np.int32)
    order = np.empty(min(size, ids.shape[0]), dtype=np.int64)
    ks = kernels()
    if ks is not None:
        m = ks[1](ids, size, codes, order)
    else:  # only tests get here: chunk columns come from the compiled scanner
        m = _renumber_source(ids, size, codes, order)
    return codes, order[:m]


def _span(rows: np.ndarray, lo: int, hi: int) -> slice | None:
    """Where a kind's rows among lines ``lo``..``hi``-1 are in its columns (rows are sorted)."""
    a, b = (int(x) for x in np.searchsorted(rows, (lo, hi)))
    return None if a == b else slice(a, b)


Part = Union[Columns, tuple[ChunkColumns, int, int]]


def merge(type_: str, parts: list[Part]) -> Columns | None:
    """One kind's columns of a batch from its parts in input order: decoded structs' columns and chunk rows.

    The result is what :func:`columns.from_records` gives for the same records
    in the same order: string codes in order of first appearance over the
    whole batch, ``None`` read as ``""``. Each part's strings are mapped to
    batch-wide ids through its (small) vocabulary, then renumbered in one pass.
    """
    kind = KINDS.index(type_)
    pieces: list[tuple[dict[str, np.ndarray], dict[str, list[str]]]] = []
    for part in parts:
        if isinstance(part, Columns):
            if len(part):
                pieces.append((part.arrays, part.vocab))
            continue
        chunk, lo, hi = part
        rows = chunk.rows.get(kind)
        span = None if rows is None else _span(rows, lo, hi)
        if span is not None:
            pieces.append(({k: v[span] for k, v in chunk.arrays[kind].items()}, chunk.vocab))
    if not pieces:
        return None
    arrays: dict[str, np.ndarray] = {}
    vocab: dict[str, list[str]] = {}
    for name, dtype in SCHEMAS[type_].items():
        if dtype != CAT:
            arrays[name] = np.concatenate([p[0][name] for p in pieces]) if len(pieces) > 1 else pieces[0][0][name]
            continue
        ids: dict[str, int] = {}
        luts: dict[int, np.ndarray] = {}  # a chunk's vocabulary is shared by its kinds and parts: map it once
        parts_g = []
        for arrs, vocs in pieces:
            voc = vocs[name]
            lut = luts.get(id(voc))
            if lut is None:
                for s in voc:
                    if s not in ids:
                        ids[s] = len(ids)
                lut = luts[id(voc)] = np.fromiter(map(ids.__getitem__, voc), dtype=np.int32, count=len(voc))
            parts_g.append(lut[arrs[name]])
        g = np.concatenate(parts_g) if len(parts_g) > 1 else parts_g[0]
        arrays[name], order = first_appearance(g, len(ids))
        keys = list(ids)
        vocab[name] = [keys[i] for i in order.tolist()]
    return Columns(type_, arrays, vocab)


def warm() -> bool:
    """Load both kernels now (compiling them into numba's cache the first time, ~5 CPU-s).

    For an image build or a long-running worker's start, so that no read pays
    for it later; False when numba is not installed.
    """
    if kernels() is None:
        return False
    line = b'{"type":"host","job":"j","node":"n","ts_ns":1}'
    chunk = scan_chunk(line, 1)
    return chunk is not None and merge("host", [(chunk, 0, 1)]) is not None
