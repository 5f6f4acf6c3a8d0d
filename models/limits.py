"""Bounds every decoder checks *before* bytes reach msgspec, msgpack or json (poison-proof input).

msgspec (0.22) has no nesting-depth or size option: it recurses once per
nesting level, also while *skipping* an unknown field, and stops only at
Python's recursion limit with a ``RecursionError`` (not a ``DecodeError``), so
a 2 KB line of 1,000 ``[`` escaped every ``except msgspec.DecodeError`` and
crashed its consumer. The msgpack library stops at its own fixed stack of 1024.
So each decoder first calls :func:`check_json` or :func:`check_msgpack`, which
refuse a payload above a size bound or nested deeper than ``MAX_DEPTH`` with a
:class:`LimitError` whose text is the reason; then decodes; and turns *any*
other exception (``RecursionError``, ``MemoryError``, ``UnicodeDecodeError``,
``OverflowError``...) into its own error type with :func:`failure_reason`.

One decoder skips the msgpack pre-scan: ``frames.decode_frame``, the
summariser's hot path, where walking a frame's headers cost as much as
decoding it. msgpack's C unpacker is itself safe (its own stack refuses past
1,024 levels; lengths are bounded by the input), the frame's columns and
vocabularies are checked flat after decoding, and its free-form ``m`` is
bounded by :func:`value_depth`.

Both pre-scans are linear and cheap: the JSON one counts the bytes ``[`` and
``{`` (a line with no more openers than the bound cannot be deeper: the usual
case, one C pass) and only otherwise masks strings and takes a running sum of
brackets with numpy; the msgpack one walks the headers, skipping string, binary
and number payloads by their length. That walk is one Python step per value:
~25 ms per MiB of digests or window summaries, 60-70% of decoding either. So
once a process has checked enough msgpack to pay for loading it (or after
:func:`warm`), the same walk runs compiled (:func:`_depth_source`, numba, the
``fast`` extra; ~1 ms per MiB), with the same answers and the same errors.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Callable, cast

import numpy as np

from .jit import LazyKernels

# No Eroica message or contract record is nested more than ~6 levels (a verdict's
# evidence: dict of dict of list); 64 leaves room for collectors' extensions.
MAX_DEPTH = 64
# Messages on Eroica's own topics (frames, digests, summaries): far above any
# real one (a frame of 1000 records is ~100 KB, a 1,024-rank digest a few MB),
# far below what hurts a worker.
MAX_MESSAGE_BYTES = 64 << 20
# A verdict message or a patterns (window summaries) message.
MAX_VERDICT_BYTES = 16 << 20


class LimitError(ValueError):
    """A payload over a decoder's size or depth bound; ``str()`` is the reason."""


def failure_reason(exc: BaseException, what: str = "message") -> str:
    """One line naming any decode failure, for a dead letter (never raises)."""
    try:
        text = " ".join(str(exc).split())[:500]
    except Exception:  # pragma: no cover - a str() that fails
        text = ""
    if isinstance(exc, LimitError):
        return text
    if isinstance(exc, RecursionError):
        return f"undecodable {what}: nested too deeply (RecursionError: {text})"
    if isinstance(exc, MemoryError):
        return f"undecodable {what}: too large to decode (MemoryError)"
    if isinstance(exc, UnicodeDecodeError):
        return f"undecodable {what}: invalid UTF-8 ({text})"
    return f"undecodable {what}: {type(exc).__name__}: {text}"


def _size(data: bytes | bytearray | memoryview, max_bytes: int, what: str) -> None:
    if len(data) > max_bytes:
        raise LimitError(f"{what} of {len(data)} bytes is over the {max_bytes}-byte bound")


# ---------------------------------------------------------------------------------------------
# JSON

_OPEN = (ord("["), ord("{"))
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


_SPECIAL = np.zeros(256, dtype=bool)
_SPECIAL[[ord(c) for c in '"\\[]{}']] = True


def json_depth(data: bytes | bytearray | memoryview) -> int:
    """Deepest bracket nesting of a JSON text, brackets inside strings not counted.

    Exact on valid JSON; on invalid JSON it may be off only *after* the first
    error, where a parser stops anyway. Works on the positions of the few
    special bytes only (quotes, backslashes, brackets), all in numpy.
    """
    arr = np.frombuffer(data, dtype=np.uint8)
    pos = np.flatnonzero(_SPECIAL[arr])
    if pos.size == 0:
        return 0
    ch = arr[pos]
    bs_pos = pos[ch == _BACKSLASH]
    q_pos = pos[ch == _QUOTE]
    real = np.ones(q_pos.size, dtype=bool)
    if bs_pos.size and q_pos.size:
        # A quote is escaped when an odd run of backslashes ends right before it.
        new_run = np.ones(bs_pos.size, dtype=bool)
        new_run[1:] = np.diff(bs_pos) != 1
        run_start = bs_pos[np.flatnonzero(new_run)][np.cumsum(new_run) - 1]
        j = np.searchsorted(bs_pos, q_pos) - 1
        ok = j >= 0
        jj = np.where(ok, j, 0)
        touching = ok & (bs_pos[jj] == q_pos - 1)
        run = np.where(touching, q_pos - run_start[jj], 0)
        real = (run & 1) == 0
    is_quote = np.zeros(pos.size, dtype=bool)
    is_quote[ch == _QUOTE] = real
    inside = (np.cumsum(is_quote) & 1).astype(bool)  # an opening quote counts as inside, a closing one not
    outside = ~inside & ~is_quote
    step = np.where((ch == _OPEN[0]) | (ch == _OPEN[1]), 1, np.where((ch == ord("]")) | (ch == ord("}")), -1, 0))
    step = np.where(outside, step, 0)
    return int(np.cumsum(step).max(initial=0))


def check_json(data: bytes | bytearray | memoryview, max_bytes: int, max_depth: int = MAX_DEPTH,
               what: str = "message") -> None:
    """LimitError if ``data`` is over ``max_bytes`` or nested deeper than ``max_depth``."""
    _size(data, max_bytes, what)
    raw = bytes(data) if not isinstance(data, bytes) else data
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return  # cannot be deeper than it has openers: the usual case, two C passes
    depth = json_depth(raw)
    if depth > max_depth:
        raise LimitError(f"{what} nested {depth} levels deep, over the bound of {max_depth}")


# ---------------------------------------------------------------------------------------------
# msgpack

# Per first byte: (payload length or -1 for "read a length field", length-field bytes,
# container kind: 0 scalar, 1 array, 2 map). Built once.
def _table() -> list[tuple[int, int, int, int]]:
    t: list[tuple[int, int, int, int]] = []   # (fixed payload, length bytes, container, inline count)
    for b in range(256):
        if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):
            t.append((0, 0, 0, 0))
        elif 0x80 <= b <= 0x8F:
            t.append((0, 0, 2, b & 0x0F))
        elif 0x90 <= b <= 0x9F:
            t.append((0, 0, 1, b & 0x0F))
        elif 0xA0 <= b <= 0xBF:
            t.append((b & 0x1F, 0, 0, 0))
        elif b in (0xC4, 0xD9):
            t.append((0, 1, 0, 0))
        elif b in (0xC5, 0xDA):
            t.append((0, 2, 0, 0))
        elif b in (0xC6, 0xDB):
            t.append((0, 4, 0, 0))
        elif b == 0xC7:
            t.append((1, 1, 0, 0))   # ext 8: length, then type byte + data
        elif b == 0xC8:
            t.append((1, 2, 0, 0))
        elif b == 0xC9:
            t.append((1, 4, 0, 0))
        elif b == 0xCA:
            t.append((4, 0, 0, 0))
        elif b == 0xCB:
            t.append((8, 0, 0, 0))
        elif b in (0xCC, 0xD0):
            t.append((1, 0, 0, 0))
        elif b in (0xCD, 0xD1):
            t.append((2, 0, 0, 0))
        elif b in (0xCE, 0xD2):
            t.append((4, 0, 0, 0))
        elif b in (0xCF, 0xD3):
            t.append((8, 0, 0, 0))
        elif 0xD4 <= b <= 0xD8:
            t.append((1 + (1 << (b - 0xD4)), 0, 0, 0))  # fixext: type byte + 1/2/4/8/16
        elif b == 0xDC:
            t.append((0, 2, 1, 0))
        elif b == 0xDD:
            t.append((0, 4, 1, 0))
        elif b == 0xDE:
            t.append((0, 2, 2, 0))
        elif b == 0xDF:
            t.append((0, 4, 2, 0))
        else:  # 0xC1: never used
            t.append((-1, 0, 0, 0))
    return t


_MSGPACK = _table()
_RUN = 1 << 16
_F64 = b"\xcb" * _RUN
_FIXINT = bytes(range(0x80)) + bytes(range(0xE0, 0x100))


def msgpack_depth(data: bytes | bytearray | memoryview, max_depth: int = MAX_DEPTH, what: str = "message") -> int:
    """Deepest container nesting of one msgpack object; LimitError as soon as it passes ``max_depth``.

    Only headers are visited (payloads are skipped by length), so the cost is
    one step per value, never per byte. Truncated input or trailing bytes are
    left for the decoder to report; the 0xC1 byte is refused here.
    """
    kernel = _depth_kernel(len(data))
    if kernel is not None:
        status, value = kernel(np.frombuffer(data, dtype=np.uint8), max_depth, *_TABLE_COLUMNS,
                               np.empty(max_depth + 2, dtype=np.int64))
        if status == _TOO_DEEP:
            raise LimitError(f"{what} nested more than {max_depth} levels deep, over the bound")
        if status == _BYTE_C1:
            raise LimitError(f"{what} is not msgpack: byte 0xc1 at offset {value}")
        return int(value)
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    n = len(buf)
    table = _MSGPACK
    pos = 0
    stack: list[int] = []   # values still to read in each open container
    deepest = 0
    remaining = 1           # values still to read at the current level
    while pos < n:
        if remaining == 0:
            if not stack:
                break       # one whole object read: trailing bytes are the decoder's to refuse
            remaining = stack.pop()
            continue
        b = buf[pos]
        fixed, lbytes, kind, count = table[b]
        if fixed < 0:
            raise LimitError(f"{what} is not msgpack: byte 0xc1 at offset {pos}")
        pos += 1
        remaining -= 1
        if lbytes:
            length = int.from_bytes(buf[pos:pos + lbytes], "big")
            pos += lbytes
        else:
            length = count
        if kind:
            items = length * 2 if kind == 2 else length
            if kind == 1 and items and pos < n:
                # Fast paths for the arrays digests are made of: all float64, or all one-byte ints.
                first = buf[pos]
                skip = 0
                if items <= _RUN:
                    if first == 0xCB and buf[pos:pos + 9 * items:9] == _F64[:items]:
                        skip = 9 * items
                    elif (first < 0x80 or first >= 0xE0) and not bytes(buf[pos:pos + items]).translate(None, _FIXINT):
                        skip = items
                if skip:
                    pos += skip
                    if len(stack) + 1 > deepest:
                        deepest = len(stack) + 1
                        if deepest > max_depth:
                            raise LimitError(f"{what} nested more than {max_depth} levels deep, over the bound")
                    continue
            if items:
                stack.append(remaining)
                remaining = items
                if len(stack) > deepest:
                    deepest = len(stack)
                    if deepest > max_depth:
                        raise LimitError(f"{what} nested more than {max_depth} levels deep, over the bound")
        else:
            pos += fixed + (length if lbytes else 0)
    return deepest


# -- the walk, compiled -------------------------------------------------------------------------

# The header table as four columns (payload length or -1, length-field bytes, container kind, inline count).
_TABLE_COLUMNS = tuple(np.array(col, dtype=np.int64) for col in zip(*_MSGPACK))
_DONE, _TOO_DEEP, _BYTE_C1 = 0, 1, 2


def _depth_source(buf: np.ndarray, max_depth: int, fixed: np.ndarray, lbytes: np.ndarray, kind: np.ndarray,
                  count: np.ndarray, stack: np.ndarray) -> tuple[int, int]:
    """:func:`msgpack_depth`'s walk as a plain loop, for numba: ``(_DONE, deepest)``, ``(_TOO_DEEP, 0)`` as
    soon as the nesting passes ``max_depth``, or ``(_BYTE_C1, offset)``. ``stack`` holds ``max_depth + 2``.

    The interpreted walk's fast paths (arrays of float64 or one-byte ints skipped in one comparison) only
    save Python steps: each reaches the depth, and the error, that the step-by-step walk here reaches.
    A length field cut short by the end of the input reads the bytes there are, as ``int.from_bytes`` does.
    """
    n = buf.shape[0]
    pos = 0
    top = 0            # open containers
    deepest = 0
    remaining = 1      # values still to read at the current level
    while pos < n:
        if remaining == 0:
            if top == 0:
                break  # one whole object read: trailing bytes are the decoder's to refuse
            top -= 1
            remaining = stack[top]
            continue
        b = buf[pos]
        f = fixed[b]
        if f < 0:
            return _BYTE_C1, pos
        pos += 1
        remaining -= 1
        lb = lbytes[b]
        if lb:
            length = 0
            for i in range(pos, min(pos + lb, n)):
                length = (length << 8) | int(buf[i])  # an int, not a uint8 (that would wrap interpreted)
            pos += lb
        else:
            length = count[b]
        k = kind[b]
        if k:
            items = length * 2 if k == 2 else length
            if items:
                stack[top] = remaining
                top += 1
                remaining = items
                if top > deepest:
                    deepest = top
                    if deepest > max_depth:
                        return _TOO_DEEP, 0
        else:
            pos += f + (length if lb else 0)
    return _DONE, deepest


# Loading the compiled walk costs ~0.7 CPU-s and ~110 MB of resident memory once in a process that has not
# imported numba (~6 ms where the summariser's kernels already did), and saves ~25 ms per MiB checked (a
# 1,024-rank bench job: 20 MiB of digests 0.53-0.61 -> 0.022 CPU-s, 12 MiB of summaries 0.29-0.32 -> 0.011;
# 2026-11-29). A process loads it once it has checked this many bytes, twice what pays the load back (a
# detector or sink of a large job soon does; a CLI reading a few messages never), or at :func:`warm`.
KERNEL_AFTER_BYTES = int(os.environ.get("EROICA_MSGPACK_KERNEL_AFTER", 64 << 20))


def _depth_kernel(nbytes: int) -> Callable[..., tuple[int, int]] | None:
    """The compiled walk to check ``nbytes`` more bytes with (loading it once enough have been), or None."""
    return _walk.worth_it(nbytes, KERNEL_AFTER_BYTES)


def _smoke(kernel: Callable[..., Any]) -> bool:
    """The kernel's answers on three tiny inputs: a nested map, one too deep, a 0xC1 byte."""
    def run(data: bytes, max_depth: int) -> tuple[int, int]:
        status, value = kernel(np.frombuffer(data, dtype=np.uint8), max_depth, *_TABLE_COLUMNS,
                               np.empty(max_depth + 2, dtype=np.int64))
        return int(status), int(value)
    nested = b"\x81\xa1a\x92\x01\x91\xcb" + bytes(8)  # {"a": [1, [0.0]]}
    return (run(nested, 8) == (_DONE, 3) and run(nested, 2) == (_TOO_DEEP, 0)
            and run(b"\x92\x01\xc1", 8) == (_BYTE_C1, 2))


def warm() -> bool:
    """Load the compiled walk now (compiling it into numba's cache the first time); False without numba.

    For a long-running consumer's start or an image build, so no message pays for it later.
    """
    return _walk.get() is not None


def use_kernel(kind: str | None) -> None:
    """For tests: ``"numba"`` (compiled), ``"python"`` (the same source, interpreted), ``"none"`` (the
    interpreted walk with its fast paths), or None (back to loading it once enough bytes were checked)."""
    _walk.use(kind, off="none")


def _compile(jit: Callable[[Callable[..., object]], Callable[..., object]]) -> Callable[..., tuple[int, int]]:
    return cast(Callable[..., tuple[int, int]], jit(_depth_source))


_walk: LazyKernels[Callable[..., tuple[int, int]]] = LazyKernels("EROICA_MSGPACK_KERNEL", _compile, _smoke,
                                                                 _depth_source)


def value_depth(value: object, max_depth: int = MAX_DEPTH, what: str = "message") -> int:
    """Deepest nesting of dicts and lists in a decoded value; LimitError past ``max_depth``.

    For what msgpack has already decoded safely (its C unpacker keeps its own
    stack and refuses past 1,024 levels with a StackError; lengths are bounded by
    the input), before a free-form part of it goes where Python recursion could
    meet it. Iterative, so the check itself cannot overflow.
    """
    deepest = 0
    todo: list[tuple[object, int]] = [(value, 1)]
    while todo:
        v, d = todo.pop()
        items: Iterable[object]
        if isinstance(v, dict):
            items = v.values()
        elif isinstance(v, (list, tuple)):
            items = v
        else:
            continue
        if d > deepest:
            deepest = d
            if deepest > max_depth:
                raise LimitError(f"{what} nested more than {max_depth} levels deep, over the bound")
        todo.extend((x, d + 1) for x in items)
    return deepest


def check_size(data: bytes | bytearray | memoryview, max_bytes: int = MAX_MESSAGE_BYTES,
               what: str = "message") -> None:
    """LimitError if ``data`` is over ``max_bytes``."""
    _size(data, max_bytes, what)


def check_msgpack(data: bytes | bytearray | memoryview, max_bytes: int = MAX_MESSAGE_BYTES,
                  max_depth: int = MAX_DEPTH, what: str = "message") -> None:
    """LimitError if ``data`` is over ``max_bytes`` or nested deeper than ``max_depth``."""
    _size(data, max_bytes, what)
    msgpack_depth(data, max_depth, what)
