"""Typed decoding of contract JSON Lines straight into columns, for chunks it can prove valid.

Why: the reader's typed ``decode_lines`` path makes one Python object per
record (and one per string in it), and building columns from those objects
costs more than decoding them (``astuple``, object tables, hashing every
fresh string). This scanner (compiled with numba, when numba is installed)
reads a chunk's bytes once and writes numpy columns directly: numbers into
``int64`` / ``float64`` rows, strings as ids of the chunk's distinct values.
It reads the chunk where the reader read it (no copy, no line count first:
a sentinel byte ends it), strings eight bytes at a time, and keeps its
arrays from chunk to chunk (:class:`Scanner`).

It decodes only a strict subset of JSON, and answers for a whole chunk or
not at all: :meth:`Scanner.scan` returns None at the first byte it is not
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
import sys
from dataclasses import dataclass
from typing import Any, Callable, Union

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


def _slots(allowed: np.ndarray) -> tuple[np.ndarray, dict[str, int], dict[str, int], dict[str, int]]:
    """Each field's row in the scanner's output arrays (ints, floats or string ids).

    Integer and float fields of different kinds share rows: a line holding
    fields of two kinds is refused, so no accepted line writes two fields of
    one row, and the arrays are as tall as the widest kind, not as all four
    together (less memory to keep, fewer rows to touch). Strings keep a row
    each: a string row is also that field's vocabulary.
    """
    slot = np.zeros(len(_FIELDS), dtype=np.int64)
    ints: dict[str, int] = {}
    flts: dict[str, int] = {}
    strs: dict[str, int] = {}
    for i, (name, t, _hi, _null) in enumerate(_FIELDS):
        table = strs if t == T_STR else flts if t == T_FLT else ints if t != T_TAG else None
        if table is None:
            continue
        if t == T_STR:
            row = len(table)
        else:  # the lowest row no field of a kind of this one already holds
            taken = {table[o] for o in table if (allowed[:, i] & allowed[:, FIELD_INDEX[o]]).any()}
            row = min(set(range(len(table) + 1)) - taken)
        table[name] = slot[i] = row
    return slot, ints, flts, strs


_SLOT, INT_ROW, FLT_ROW, STR_ROW = _slots(ALLOWED)
N_INT_ROWS, N_FLT_ROWS, N_STR_ROWS = (max(t.values()) + 1 for t in (INT_ROW, FLT_ROW, STR_ROW))


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


# Bytes readable after any the scanner reads: it reads 8 at a time, and the last word
# read starts at most at the sentinel (so the chunk's arrays hold the sentinel and 7 more).
PAD = 8


def _key_table() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """An open-addressing table from a key's FNV-1a hash to its field, and the names' bytes to verify."""
    names = [f[0].encode() for f in _FIELDS]
    blob = np.frombuffer(b"".join(names) + bytes(PAD), dtype=np.uint8).copy()
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


def _enum_table() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The values of the three enums (tag, fn kind, op) in one blob; each type's first value and the next type's.

    One table, not one per enum: choosing among arrays at run time makes
    numba count references to them, two atomic operations per value.
    """
    enums = {T_TAG: KINDS, T_KIND: FN_KINDS, T_OP: COLLECTIVE_OPS}
    values = [v for t in sorted(enums) for v in enums[t]]
    blob = np.frombuffer("".join(values).encode() + bytes(PAD), dtype=np.uint8).copy()
    off = np.cumsum([0] + [len(v) for v in values]).astype(np.int64)
    first = np.zeros(max(enums) + 2, dtype=np.int64)  # value e of type t: entry first[t] + e
    for t in range(1, len(first)):
        first[t] = first[t - 1] + len(enums.get(t - 1, ()))
    return blob, off, first


KEY_TABLE, KEY_BLOB, KEY_OFF, FIELD_TYPE = _key_table()
FIELD_HI = np.array([f[2] for f in _FIELDS], dtype=np.uint64)
FIELD_NULL = np.array([f[3] for f in _FIELDS], dtype=np.bool_)
ENUM_BLOB, ENUM_OFF, ENUM_FIRST = _enum_table()
POW10 = np.array([10.0 ** i for i in range(23)], dtype=np.float64)  # each exact in a double


def _load8(buf: np.ndarray, i: int) -> np.uint64:
    """The 8 bytes of ``buf`` from ``i`` as one little-endian word (``PAD`` makes sure they exist).

    This is the interpreted scanner's; compiled, it is one unaligned load
    (:func:`_compiled_load8`).
    """
    return np.uint64(int.from_bytes(buf[i:i + 8].tobytes(), "little"))


# Eight bytes at once (SWAR): v - ONES & ~v & HIGH marks the bytes of v that are zero,
# exactly from the lowest up to the first one marked (a borrow can only mark bytes above
# it), which is all the scanner wants: where the first byte of interest is.
ONES = np.uint64(0x0101010101010101)
HIGH = ONES * np.uint64(0x80)
QUOTES = ONES * np.uint64(0x22)  # '"' in every byte
BACKSLASHES = ONES * np.uint64(0x5C)
SPACES = ONES * np.uint64(0x20)  # less than this: a control byte
BYTE_OF_BIT = np.uint64(0x0001020304050607)  # (1 << 8k) * this >> 56 == k: the byte a lowest marked bit is in


def _optional_fields() -> tuple[np.ndarray, np.ndarray]:
    """Each kind's optional fields (allowed, not required), whose absent value the scanner writes at a line's end."""
    fields = [np.flatnonzero(ALLOWED[k] & ~REQUIRED[k]) for k in range(len(KINDS))]
    off = np.cumsum([0] + [len(f) for f in fields]).astype(np.int64)
    return np.concatenate(fields).astype(np.int64), off


OPT_FIELD, OPT_OFF = _optional_fields()


def _string_classes() -> np.ndarray:
    """What each byte is inside a string: 0 plain ASCII, 1 the closing quote, 2 refused, 3 over 127 (UTF-8).

    Refused: a control byte, the sentinel among them, or a backslash (an
    escape). The scanner skips plain bytes eight at a time, and asks this
    table what the byte it stopped at is.
    """
    cls = np.zeros(256, dtype=np.uint8)
    cls[:32] = 2
    cls[92] = 2  # '\\'
    cls[34] = 1  # '"'
    cls[128:] = 3
    return cls


STR_CLASS = _string_classes()


def _min_line() -> int:
    """The fewest bytes of a line the scanner accepts: bounds how many lines a chunk holds, uncounted."""
    lengths = []
    for k, kind in enumerate(KINDS):
        least = {T_STR: 2, T_INT: 1, T_FLT: 1, T_BOOL: 4, T_TAG: 2 + len(kind),  # "", 0, 0, true, "fn"
                 T_KIND: 2 + min(map(len, FN_KINDS)), T_OP: 2 + min(map(len, COLLECTIVE_OPS))}
        need = [len(f[0]) + 3 + min(least[f[1]], 4 if f[3] else least[f[1]])  # "name": then the value (or null)
                for i, f in enumerate(_FIELDS) if REQUIRED[k, i]]
        lengths.append(2 + sum(need) + len(need) - 1)  # braces and commas
    return min(lengths)


MIN_LINE = _min_line()


def max_lines(size: int) -> int:
    """At most how many lines ``size`` bytes of accepted lines hold: each is ``MIN_LINE`` bytes and a newline."""
    return (size + 1) // (MIN_LINE + 1) + 1


def _scan_source(buf: np.ndarray, n: int,  # noqa: C901 - one flat state machine, on purpose
                 key_table: np.ndarray, key_blob: np.ndarray, key_off: np.ndarray, ftype: np.ndarray,
                 fslot: np.ndarray, fhi: np.ndarray, fnull: np.ndarray, allowed: np.ndarray, required: np.ndarray,
                 opt_field: np.ndarray, opt_off: np.ndarray, sclass: np.ndarray,
                 enum_blob: np.ndarray, enum_off: np.ndarray, enum_first: np.ndarray, pow10: np.ndarray,
                 kinds: np.ndarray, ivals: np.ndarray, fvals: np.ndarray, svals: np.ndarray,
                 span_lo: np.ndarray, span_hi: np.ndarray, span_at: np.ndarray, n_spans: np.ndarray,
                 htab: np.ndarray) -> int:
    """Scan the lines of ``buf[:n]`` into the output arrays: how many there are when all are accepted, else -1.

    ``buf[n]`` must be 0, a sentinel: no byte the scanner accepts anywhere,
    so every loop stops on it without also comparing its position with
    ``n`` (a read stops at the first byte that does not match, and the
    sentinel matches nothing, so no read ever goes past it). The only place
    the end is legal is after a line's ``}`` and spaces. ``buf`` holds
    ``PAD`` bytes from ``n`` on: strings are read a word at a time.

    Nothing is filled in before: a line writes each field it has, ``null``
    as the field's absent value, and at its end the absent value of each
    optional field of its kind it lacks (other rows of that line are never
    read). The arrays are kept from chunk to chunk: the hash slots the last
    chunk's strings took (``span_at``) are emptied first.

    Written for numba (plain loops over arrays), run as Python only by tests
    that want to step through it.
    """
    def at(i: int) -> Any:  # a byte of buf: i is never negative, as unsigned numba skips wrapping it around
        return buf[np.uintp(i)]

    def same(a: np.ndarray, i: int, b: np.ndarray, j: int, length: int) -> bool:  # a[i:i+length] == b[j:...]
        q = 0
        while q < length:  # a word at a time; a word that differs stops it, so reads stay in PAD
            x = _load8(a, i + q) ^ _load8(b, j + q)
            if length - q < 8:
                x &= (np.uint64(1) << np.uint64(8 * (length - q))) - np.uint64(1)
            if x != 0:
                return False
            q += 8
        return True

    def plain_to(i: int) -> int:  # the first byte from i on that is not plain in a string: a word at a time
        while True:
            x = _load8(buf, i)
            xq = x ^ QUOTES
            xb = x ^ BACKSLASHES
            m = (((xq - ONES) & ~xq) | ((xb - ONES) & ~xb) | ((x - SPACES) & ~x) | x) & HIGH
            if m != 0:  # '"', '\\', a control byte (the sentinel too) or one over 127: sclass of it is not 0
                return i + int((((m & (~m + np.uint64(1))) >> np.uint64(7)) * BYTE_OF_BIT) >> np.uint64(56))
            i += 8

    n_fields = ftype.shape[0]
    cap = kinds.shape[0]
    tmask = htab.shape[1] - 1
    for s in range(svals.shape[0]):
        for sid in range(n_spans[s]):
            htab[s, span_at[s, sid]] = -1
        n_spans[s] = 0
    # Collectors write their fields in one order: the field that followed each one last
    # time is tried first (one compare of its name instead of hashing the key).
    after = np.full(n_fields + 1, -1, dtype=np.int64)
    # The value each string field had last: tried before its hash table (runs of one node, job, fn).
    last_lo = np.zeros(svals.shape[0], dtype=np.int64)
    last_len = np.full(svals.shape[0], -1, dtype=np.int64)
    last_id = np.zeros(svals.shape[0], dtype=np.int64)
    pos = 0
    line = 0
    while True:
        if line >= cap:  # never, with arrays of max_lines(n): the bound is what keeps writes inside them
            return -1
        # -- one line: '{' key ':' value (',' key ':' value)* '}' with optional spaces
        seen = np.uint64(0)
        prev = n_fields
        kind = -1
        while at(pos) == 32:
            pos += 1
        if at(pos) != 123:  # '{'
            return -1
        pos += 1
        while at(pos) == 32:
            pos += 1
        if at(pos) == 125:  # '{}': no type
            return -1
        while True:
            # key
            if at(pos) != 34:
                return -1
            pos += 1
            field = -1
            guess = int(after[prev])
            if guess >= 0:
                base = int(key_off[guess])
                klen = int(key_off[guess + 1]) - base
                if same(key_blob, base, buf, pos, klen) and at(pos + klen) == 34:
                    field = guess
                    pos += klen + 1
            if field < 0:
                k0 = pos
                h = np.uint64(0xCBF29CE484222325)
                while True:
                    c = at(pos)
                    if c == 34:
                        break
                    if c < 32 or c >= 128 or c == 92:
                        return -1
                    h = (h ^ np.uint64(c)) * np.uint64(0x100000001B3)
                    pos += 1
                klen = pos - k0
                pos += 1
                j = np.int64(h & np.uint64(key_table.shape[0] - 1))
                while key_table[j] >= 0:
                    cand = key_table[j]
                    if key_off[cand + 1] - key_off[cand] == klen and same(key_blob, key_off[cand], buf, k0, klen):
                        field = cand
                        break
                    j = (j + 1) & (key_table.shape[0] - 1)
                if field < 0:  # a field no flat kind has
                    return -1
                after[prev] = field
            prev = field
            bit = np.uint64(1) << np.uint64(field)
            if seen & bit:  # a field given twice
                return -1
            seen |= bit
            while at(pos) == 32:
                pos += 1
            if at(pos) != 58:  # ':'
                return -1
            pos += 1
            while at(pos) == 32:
                pos += 1
            c = at(pos)
            t = ftype[field]
            slot = fslot[field]
            if c == 110:  # null
                if not fnull[field] or at(pos + 1) != 117 or at(pos + 2) != 108 or at(pos + 3) != 108:
                    return -1
                pos += 4
                if t == T_STR:
                    svals[slot, line] = -1
                elif t == T_FLT:
                    fvals[slot, line] = np.nan
                else:
                    ivals[slot, line] = -1
            elif t == T_STR or t == T_TAG or t == T_KIND or t == T_OP:
                if c != 34:
                    return -1
                pos += 1
                s0 = pos
                high = False  # a byte over 127: UTF-8, whose continuation bytes are no characters
                while True:
                    pos = plain_to(pos)
                    k = sclass[at(pos)]
                    if k == 1:  # '"': never inside a multi-byte sequence (those bytes are >= 0x80)
                        break
                    if k == 2:
                        return -1
                    high = True
                    pos += 1
                slen = pos - s0
                pos += 1
                if t == T_STR:
                    if slen > 256:
                        if not high:
                            return -1
                        cont = 0
                        for q in range(s0, s0 + slen):
                            if (at(q) & 0xC0) == 0x80:
                                cont += 1
                        if slen - cont > 256:
                            return -1
                    sid = -1
                    if last_len[slot] == slen and same(buf, last_lo[slot], buf, s0, slen):
                        sid = last_id[slot]
                    if sid < 0:
                        # the chunk's distinct values of this field: ids in order of first appearance
                        hs = np.uint64(0xCBF29CE484222325)
                        for q in range(s0, s0 + slen):
                            hs = (hs ^ np.uint64(at(q))) * np.uint64(0x100000001B3)
                        j = np.int64(hs & np.uint64(tmask))
                        while htab[slot, j] >= 0:
                            cand = htab[slot, j]
                            lo = span_lo[slot, cand]
                            if span_hi[slot, cand] - lo == slen and same(buf, lo, buf, s0, slen):
                                sid = cand
                                break
                            j = (j + 1) & tmask
                        if sid < 0:
                            sid = n_spans[slot]
                            n_spans[slot] = sid + 1
                            span_lo[slot, sid] = s0
                            span_hi[slot, sid] = s0 + slen
                            span_at[slot, sid] = j
                            htab[slot, j] = sid
                        last_lo[slot] = s0
                        last_len[slot] = slen
                        last_id[slot] = sid
                    svals[slot, line] = sid
                else:
                    code = -1
                    for e in range(enum_first[t], enum_first[t + 1]):
                        if enum_off[e + 1] - enum_off[e] == slen and same(enum_blob, int(enum_off[e]), buf, s0, slen):
                            code = e - int(enum_first[t])
                            break
                    if code < 0:
                        return -1
                    if t == T_TAG:
                        kind = code
                    else:
                        ivals[slot, line] = code
            elif t == T_INT:
                if c < 48 or c > 57:
                    return -1
                if c == 48 and 48 <= at(pos + 1) <= 57:  # a leading zero
                    return -1
                v = np.uint64(0)
                d0 = pos
                while 48 <= at(pos) <= 57:
                    v = v * np.uint64(10) + np.uint64(at(pos) - 48)
                    pos += 1
                    if pos - d0 > 19:
                        return -1
                if v > fhi[field]:
                    return -1
                ivals[slot, line] = np.int64(v)
            elif t == T_FLT:
                neg = False
                if c == 45:  # '-'
                    neg = True
                    pos += 1
                    c = at(pos)
                if c < 48 or c > 57:
                    return -1
                if c == 48 and 48 <= at(pos + 1) <= 57:
                    return -1
                w = np.uint64(0)
                digits = 0
                exp10 = 0
                while 48 <= at(pos) <= 57:
                    if w > 0 or at(pos) != 48:
                        digits += 1
                    w = w * np.uint64(10) + np.uint64(at(pos) - 48)
                    pos += 1
                    if digits > 17:
                        return -1
                if at(pos) == 46:  # '.'
                    pos += 1
                    if at(pos) < 48 or at(pos) > 57:
                        return -1
                    while 48 <= at(pos) <= 57:
                        if w > 0 or at(pos) != 48:
                            digits += 1
                        w = w * np.uint64(10) + np.uint64(at(pos) - 48)
                        exp10 -= 1
                        pos += 1
                        if digits > 17 or exp10 < -400:
                            return -1
                if at(pos) == 101 or at(pos) == 69:  # 'e' / 'E'
                    pos += 1
                    eneg = False
                    if at(pos) == 43 or at(pos) == 45:
                        eneg = at(pos) == 45
                        pos += 1
                    if at(pos) < 48 or at(pos) > 57:
                        return -1
                    e = 0
                    while 48 <= at(pos) <= 57:
                        e = e * 10 + int(at(pos)) - 48
                        pos += 1
                        if e > 1000:
                            return -1
                    exp10 += -e if eneg else e
                if w >= np.uint64(1 << 53) or (w == 0 and neg):
                    return -1
                if 0 <= exp10 <= 22:
                    x = np.float64(w) * pow10[exp10]
                elif -22 <= exp10 < 0:
                    x = np.float64(w) / pow10[-exp10]
                else:
                    return -1
                fvals[slot, line] = -x if neg else x
            elif t == T_BOOL:
                if c == 116 and at(pos + 1) == 114 and at(pos + 2) == 117 and at(pos + 3) == 101:
                    ivals[slot, line] = 1
                    pos += 4
                elif c == 102 and at(pos + 1) == 97 and at(pos + 2) == 108 and at(pos + 3) == 115 \
                        and at(pos + 4) == 101:
                    ivals[slot, line] = 0
                    pos += 5
                else:
                    return -1
            else:
                return -1
            # after a value: spaces, then ',' (another key) or '}' (the end)
            while at(pos) == 32:
                pos += 1
            c = at(pos)
            if c == 44:  # ','
                pos += 1
                while at(pos) == 32:
                    pos += 1
                continue
            if c == 125:  # '}'
                pos += 1
                break
            return -1
        while at(pos) == 32:
            pos += 1
        end = pos >= n
        if not end:
            if at(pos) != 10:
                return -1
            pos += 1
        if kind < 0:
            return -1
        if (seen & ~allowed[kind]) != 0 or (required[kind] & ~seen) != 0:
            return -1  # a field of another kind (unknown to this one), or a required one missing
        for i in range(opt_off[kind], opt_off[kind + 1]):  # absent optional fields: their absent value
            f = opt_field[i]
            if (seen & (np.uint64(1) << np.uint64(f))) == 0:
                t = ftype[f]
                if t == T_STR:
                    svals[fslot[f], line] = -1
                elif t == T_FLT:
                    fvals[fslot[f], line] = np.nan
                else:
                    ivals[fslot[f], line] = -1
        kinds[line] = kind
        line += 1
        if end:
            return line


def _renumber_source(raw: np.ndarray, ends: np.ndarray, luts: np.ndarray, lut_at: np.ndarray, lut_len: np.ndarray,
                     size: int, codes: np.ndarray, order: np.ndarray) -> int:
    """Batch-wide codes of pieces' string ids, in order of first appearance (one pass, no array in between).

    Piece ``p`` is ``raw[ends[p-1]:ends[p]]``, ids into its vocabulary, which
    ``luts[lut_at[p]:][:lut_len[p]]`` maps to batch-wide ids (0..size-1); -1
    (absent) is its last entry, ``""``. Fills ``order`` (the batch-wide ids
    in order of first appearance) and returns how many.
    """
    seen = np.full(size, -1, dtype=np.int32)
    m = 0
    i = 0
    for p in range(ends.shape[0]):
        base = lut_at[p]
        last = base + lut_len[p] - 1
        while i < ends[p]:
            r = raw[i]
            g = luts[base + r] if r >= 0 else luts[last]
            c = seen[g]
            if c < 0:
                c = m
                seen[g] = m
                order[m] = g
                m += 1
            codes[i] = c
            i += 1
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
    _compiled_load8(numba)
    jit = numba.njit(cache=True, nogil=True, boundscheck=False)
    _kernels = (jit(_scan_source), jit(_renumber_source))
    return _kernels


_load8_compiled = False


def _compiled_load8(numba: Any) -> None:
    """Teach numba :func:`_load8`: one unaligned 8-byte load (byte-swapped where words are big-endian)."""
    global _load8_compiled
    if _load8_compiled:
        return
    from llvmlite import ir  # type: ignore[import-untyped,import-not-found,unused-ignore]

    def load(typingctx: Any, arr: Any, idx: Any) -> Any:
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(64).as_pointer())
            word = builder.load(ptr, align=1)
            return word if sys.byteorder == "little" else builder.bswap(word)
        return numba.types.uint64(arr, idx), codegen

    unaligned_load = numba.extending.intrinsic(load)

    def impl(buf: Any, i: Any) -> Any:
        def body(buf: Any, i: Any) -> Any:  # numba wants the very same parameters, annotations too
            return unaligned_load(buf, i)
        return body

    numba.extending.overload(_load8)(impl)

    _load8_compiled = True


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


class Scanner:
    """The scanner's arrays, kept from chunk to chunk of one read: no allocation, nor any fill, per chunk.

    Why: allocating every output row for every line of a chunk, filled with
    absent values, cost the reader about a seventh of the scan itself. The
    kernel writes each value of a line's own kind (absent ones included), so
    stale rows from an earlier chunk are never read; the columns are copied
    out (:func:`_kind_arrays`) before the next chunk reuses the arrays. Sized
    by :func:`max_lines` of the chunk, so that no line count is needed first.
    """

    def __init__(self) -> None:
        self.cap = 0
        self._alloc(0)

    def _alloc(self, cap: int) -> None:
        self.cap = cap
        self.kinds = np.empty(cap, dtype=np.int8)
        self.ivals = np.empty((N_INT_ROWS, cap), dtype=np.int64)
        self.fvals = np.empty((N_FLT_ROWS, cap), dtype=np.float64)
        self.svals = np.empty((N_STR_ROWS, cap), dtype=np.int32)
        self.span_lo = np.empty((N_STR_ROWS, cap), dtype=np.int64)
        self.span_hi = np.empty((N_STR_ROWS, cap), dtype=np.int64)
        self.span_at = np.empty((N_STR_ROWS, cap), dtype=np.int64)
        self.n_spans = np.zeros(N_STR_ROWS, dtype=np.int64)
        # open addressing: at most half full, so a probe for an absent value ends soon
        self.htab = np.full((N_STR_ROWS, 1 << max(4, (2 * cap - 1).bit_length())), -1, dtype=np.int64)

    def scan(self, data: np.ndarray, size: int) -> ChunkColumns | None:
        """The lines in ``data[:size]`` (joined by ``\\n``, no trailing newline) as columns, or None unless all are
        certain. ``data`` must hold ``PAD`` bytes more: ``data[size]`` is overwritten with the sentinel."""
        ks = kernels()
        if ks is None:
            return None
        if data.shape[0] < size + PAD or data.dtype != np.uint8:
            raise ValueError("the scanner reads a chunk's bytes with PAD more after them")
        need = max_lines(size)
        if need > self.cap:
            self._alloc(max(need, self.cap + self.cap // 4))  # chunks vary by a line or so: grow with room
        data[size] = 0
        n_lines = ks[0](data, size, KEY_TABLE, KEY_BLOB, KEY_OFF, FIELD_TYPE, _SLOT, FIELD_HI, FIELD_NULL,
                        ALLOWED_MASK, REQUIRED_MASK, OPT_FIELD, OPT_OFF, STR_CLASS, ENUM_BLOB, ENUM_OFF, ENUM_FIRST,
                        POW10, self.kinds, self.ivals, self.fvals, self.svals,
                        self.span_lo, self.span_hi, self.span_at, self.n_spans, self.htab)
        if n_lines < 0:
            return None
        vocab = self._vocab(data.data)
        if vocab is None:
            return None
        kinds = self.kinds[:n_lines]
        first = int(kinds[0])
        if not (kinds != first).any():
            rows = {first: np.arange(n_lines)}
            sels: dict[int, slice | np.ndarray] = {first: slice(0, n_lines)}
        else:
            rows = {k: idx for k in range(len(KINDS)) if (idx := np.flatnonzero(kinds == k)).size}
            sels = dict(rows)
        arrays = {k: _kind_arrays(self.ivals, self.fvals, self.svals, KINDS[k], sel) for k, sel in sels.items()}
        return ChunkColumns(n_lines, rows, arrays, vocab)

    def _vocab(self, data: memoryview) -> dict[str, list[str]] | None:
        """Each string field's distinct values, ``""`` appended; None if one is not UTF-8."""
        vocab = {}
        for name, row in STR_ROW.items():
            m = int(self.n_spans[row])
            lo, hi = self.span_lo[row, :m].tolist(), self.span_hi[row, :m].tolist()
            try:  # every string value is one of these: strict UTF-8 here is the check msgspec makes
                vocab[name] = [str(data[a:b], "utf-8") for a, b in zip(lo, hi)] + [""]
            except UnicodeDecodeError:
                return None
        return vocab


def scan_chunk(joined: bytes) -> ChunkColumns | None:
    """The lines of one chunk (joined by ``\\n``, no trailing newline) as columns, or None unless all are certain.

    A one-off (a copy of the bytes, fresh arrays): the reader scans its own
    buffer with a :class:`Scanner` it keeps.
    """
    return Scanner().scan(padded(joined), len(joined))


def padded(joined: bytes) -> np.ndarray:
    """The bytes in an array with room after them for the scanner's sentinel and the rest of its last word."""
    data = np.empty(len(joined) + PAD, dtype=np.uint8)
    data[:len(joined)] = np.frombuffer(joined, dtype=np.uint8)
    return data


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


def first_appearance(raws: list[np.ndarray], vocabs: list[list[str]]) -> tuple[np.ndarray, list[str]]:
    """One string column of a batch from its pieces: each piece's ids into its own vocabulary (-1: its last entry).

    Returns the codes (int32) in order of first appearance over the batch and
    the vocabulary in that order. Pieces share vocabularies (a chunk's, by
    all its parts): each distinct one is mapped to batch-wide ids once.
    """
    ids: dict[str, int] = {}
    at: dict[int, int] = {}  # id(vocabulary) -> where its map starts in luts
    luts: list[np.ndarray] = []
    lut_at, lut_len, ends = [], [], []
    n_luts = n = 0
    for raw, voc in zip(raws, vocabs):
        start = at.get(id(voc))
        if start is None:
            start = at[id(voc)] = n_luts
            for s in voc:
                if s not in ids:
                    ids[s] = len(ids)
            luts.append(np.fromiter(map(ids.__getitem__, voc), dtype=np.int32, count=len(voc)))
            n_luts += len(voc)
        lut_at.append(start)
        lut_len.append(len(voc))
        n += len(raw)
        ends.append(n)
    raw = np.concatenate(raws) if len(raws) > 1 else raws[0]
    codes = np.empty(n, dtype=np.int32)
    order = np.empty(min(len(ids), n), dtype=np.int64)
    ks = kernels()
    renumber = ks[1] if ks is not None else _renumber_source  # None: only tests (chunks come from the scanner)
    m = renumber(raw, np.array(ends, dtype=np.int64), np.concatenate(luts), np.array(lut_at, dtype=np.int64),
                 np.array(lut_len, dtype=np.int64), len(ids), codes, order)
    keys = list(ids)
    return codes, [keys[i] for i in order[:m].tolist()]


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
    batch-wide ids through its (small) vocabulary and renumbered in one pass
    (:func:`first_appearance`).
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
        arrays[name], vocab[name] = first_appearance([p[0][name] for p in pieces], [p[1][name] for p in pieces])
    return Columns(type_, arrays, vocab)


def warm() -> bool:
    """Load both kernels now (compiling them into numba's cache the first time, ~5 CPU-s).

    For an image build or a long-running worker's start, so that no read pays
    for it later; False when numba is not installed.
    """
    if kernels() is None:
        return False
    line = b'{"type":"host","job":"j","node":"n","ts_ns":1}'
    chunk = scan_chunk(line)
    return chunk is not None and merge("host", [(chunk, 0, 1)]) is not None
