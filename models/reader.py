"""Streaming reader of contract JSON Lines into columnar batches.

Memory stays bounded whatever the file size: the input is read in fixed-size
chunks, a line longer than ``max_line_bytes`` is skipped (and reported)
without ever being held whole, and records are handed on in batches of at most
``batch_records``. Invalid lines never stop the read: each comes back as an
:class:`Invalid` with its line number and a reason naming field, value and rule.
"""

from __future__ import annotations

import gzip
import io
import sys
import time
import zlib
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

import msgspec
import numpy as np

from . import fastjson
from .columns import Columns, from_records, to_records
from .eventtime import TimeBounds
from .limits import MAX_DEPTH, LimitError, check_json, failure_reason
from .records import FnRecord, GpuRecord, HostRecord, JobRecord, NicRecord, Record

GZIP_MAGIC = b"\x1f\x8b"
CHUNK_BYTES = 1 << 20
DEFAULT_MAX_LINE = 1 << 20
DEFAULT_BATCH = 65536
# Rejected lines are kept whole (for their dead letters): a batch is handed on once
# its rejects hold this many bytes, so input that is all long bad lines stays bounded.
MAX_INVALID_BYTES = 64 << 20

_decoder: msgspec.json.Decoder[Record] = msgspec.json.Decoder(Record)


@dataclass(frozen=True)
class Invalid:
    """One rejected input line: where it was, why, and what it held (the whole line).

    ``raw`` is empty only for a line over the reader's size bound, which is
    never held whole: ``source`` and ``line`` then point at it in its file.
    """

    source: str
    line: int
    reason: str
    raw: bytes

    def describe(self) -> str:
        where = f"{self.source}:{self.line}" if self.line > 0 else self.source  # 0: decoded in bulk, line unknown
        return f"{where}: {self.reason}"


@dataclass
class Batch:
    """Valid records of a chunk, one columnar batch per record type, plus the rejects."""

    columns: dict[str, Columns] = field(default_factory=dict)
    jobs: list[JobRecord] = field(default_factory=list)
    invalid: list[Invalid] = field(default_factory=list)

    @property
    def valid_count(self) -> int:
        return sum(len(c) for c in self.columns.values()) + len(self.jobs)


class LineRejected(msgspec.DecodeError):
    """A line refused before or around msgspec (size, depth, any decoder failure): the text is the reason."""


def decode_line(raw: bytes, max_line_bytes: int = DEFAULT_MAX_LINE) -> Record:
    """Decode and validate one JSON line, whatever the bytes: ``msgspec.DecodeError`` with the reason.

    Size and nesting are checked first (msgspec has no depth bound of its own
    and would raise ``RecursionError``); any other failure (``MemoryError``,
    ...) also becomes a :class:`LineRejected`, so no line can escape the
    caller's per-line error handling.
    """
    try:
        check_json(raw, max_line_bytes, what="line")
        return _decoder.decode(raw)
    except msgspec.DecodeError:
        raise
    except LimitError as exc:
        raise LineRejected(str(exc)) from None
    except Exception as exc:  # RecursionError, MemoryError, ...: a reason, never a crash
        raise LineRejected(failure_reason(exc, "line")) from None


def validate_line(raw: bytes) -> Record:
    """Decode and validate one JSON line; raises ``msgspec.DecodeError`` with the reason."""
    return decode_line(raw)


def reason_of(error: Exception, raw: bytes) -> str:
    """A precise, human reason: msgspec names the rule and the path (``$.field``)."""
    msg = str(error)
    if isinstance(error, (msgspec.ValidationError, LineRejected)) or "at `$" in msg:
        return msg
    return f"invalid JSON: {msg}"


def open_source(path: str | Path) -> tuple[BinaryIO, str]:
    """Open a path (``-`` for stdin), transparently gunzipping by magic number.

    Closing the returned stream closes the file it reads (never stdin).
    """
    if str(path) == "-":
        raw: BinaryIO = sys.stdin.buffer
        name = "<stdin>"
    else:
        raw = open(path, "rb")
        name = str(path)
    # typeshed's BufferedReader wants a RawIOBase; stdin's buffer or an open file reads alike
    buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw)  # type: ignore[type-var]
    if buffered.peek(2)[:2] == GZIP_MAGIC:
        gz = gzip.GzipFile(fileobj=buffered, mode="rb")
        if raw is not sys.stdin.buffer:
            # GzipFile never closes a fileobj it was given: hand it the file.
            gz.myfileobj = buffered  # type: ignore[assignment]  # typeshed says FileIO; GzipFile only closes it
        return gz, name  # type: ignore[return-value]  # a binary stream, though GzipFile is no typing.BinaryIO
    return buffered, name


class Block:
    """The complete lines of one chunk read: the number of the first, and the lines.

    ``joined`` is the lines as one buffer (joined by ``\n``) when none of them
    is over the size bound (``whole``), for the reader's whole-chunk fast
    paths; the list of lines (None for a line over the bound) is only cut
    from it when asked. A block of the reader's own buffer
    (:func:`_buffer_blocks`) holds its lines in ``data[:size]``, and only
    until the next block is read: the scanner reads them in place (and
    counts them, setting ``count``), so ``joined`` is copied out and ``count``
    counted only when a slower path asks for them.
    """

    __slots__ = ("first", "_count", "_joined", "newlines", "_lines", "data", "size")

    def __init__(self, first: int, count: int, joined: bytes | None, lines: list[bytes | None] | None = None,
                 newlines: np.ndarray | None = None, data: np.ndarray | None = None, size: int = -1) -> None:
        self.first, self._count, self._joined, self._lines, self.newlines = first, count, joined, lines, newlines
        self.data = data  # when set, with fastjson.PAD bytes of room after size (the scanner's sentinel and more)
        self.size = size if data is not None else -1 if joined is None else len(joined)

    @property
    def whole(self) -> bool:
        """Whether the lines are one buffer (no line over the bound)."""
        return self.size >= 0

    @property
    def joined(self) -> bytes | None:
        if self._joined is None and self.size >= 0:
            if self.data is None:
                raise RuntimeError("a block of the reader's buffer was read after the next block")
            self._joined = self.data[:self.size].tobytes()
        return self._joined

    @property
    def count(self) -> int:
        if self._count < 0:
            joined = self.joined
            assert joined is not None  # a block without `joined` is built with its lines, counted
            self._count = joined.count(b"\n") + 1
        return self._count

    @count.setter
    def count(self, value: int) -> None:
        self._count = value

    @property
    def lines(self) -> list[bytes | None]:
        if self._lines is None:
            joined = self.joined
            assert joined is not None  # a block is built with one or the other
            self._lines = list[bytes | None](joined.split(b"\n"))
        return self._lines

    def release(self) -> int:
        """Let go of the reader's buffer, about to be read into again (its count settled first); the count."""
        count = self.count
        self.data = None
        return count


def _has_long_line(body: bytes | bytearray, size: int, chunk_len: int, max_line_bytes: int) -> bool:
    """Whether a line of ``body[:size]`` (carry + the chunk up to its last newline) is over the bound.

    Every line but the first lies inside the chunk just read and is shorter
    than it, so when a chunk is no longer than the bound (the default: both
    1 MiB) only the first line, the one that carries the previous chunk's
    tail, needs measuring: a ``find``, not a pass over every byte.
    """
    if size <= max_line_bytes:
        return False
    if chunk_len <= max_line_bytes:
        first = body.find(b"\n", 0, size)
        return (first if first >= 0 else size) > max_line_bytes
    newlines = np.flatnonzero(np.frombuffer(body, dtype=np.uint8, count=size) == 0x0A)
    return int(np.diff(newlines, prepend=-1, append=size).max()) - 1 > max_line_bytes


def _reader(stream: BinaryIO) -> Callable[[memoryview], int]:
    """``readinto1`` of the stream, or the same done with ``read1`` (or ``read``) and a copy.

    ``*1``: whatever one underlying read gives, so a pipe's lines flow as they
    come and a truncated gzip gives up everything it decoded before the error
    (``read`` would block for, or drop, a chunk).
    """
    readinto = getattr(stream, "readinto1", None)
    if readinto is not None:
        return readinto  # type: ignore[no-any-return]
    read = getattr(stream, "read1", stream.read)

    def copy(into: memoryview) -> int:
        data = read(len(into)) or b""
        into[:len(data)] = data
        return len(data)
    return copy


def _buffer_blocks(stream: BinaryIO, max_line_bytes: int = DEFAULT_MAX_LINE) -> Iterator[Block]:
    """The blocks of :func:`iter_blocks`, each held in one buffer kept for the whole read.

    Why: each chunk is read straight into the buffer behind the previous
    chunk's unfinished line, so no byte is copied on the way (``carry +
    chunk[:cut]`` copied each one twice) and no chunk-sized object is
    allocated per chunk. The price: a block's ``data`` is only valid until
    the next block is asked for (then it is released: its count settled, its
    buffer let go), which the reader's own loop (:func:`parse_blocks`) honours.
    """
    chunk_bytes = CHUNK_BYTES
    buf = bytearray(2 * chunk_bytes + fastjson.PAD)  # an unfinished line, a chunk, and the scanner's PAD
    view, arr = memoryview(buf), np.frombuffer(buf, dtype=np.uint8)
    readinto = _reader(stream)
    filled = 0  # the buffer's first bytes: the previous chunks' unfinished last line (none while skipping)
    skipping = False  # inside a line over the bound: dropped up to its end
    lineno = 0
    while True:
        if filled + chunk_bytes + fastjson.PAD > len(buf):  # an unfinished line longer than a chunk: grow
            buf = bytearray(max(2 * len(buf), filled + chunk_bytes + fastjson.PAD))
            buf[:filled] = view[:filled]
            view, arr = memoryview(buf), np.frombuffer(buf, dtype=np.uint8)
        got = readinto(view[filled:filled + chunk_bytes])
        if not got:
            break
        end = filled + got
        cut = buf.rfind(b"\n", filled, end)
        if cut < 0:  # no line ends in this chunk
            if skipping or end > max_line_bytes:
                skipping, filled = True, 0
            else:
                filled = end
            continue
        if skipping:
            parts: list[bytes | None] = [None]  # the rest of the line being skipped
            parts += [p if len(p) <= max_line_bytes else None for p in bytes(view[:cut]).split(b"\n")[1:]]
            block = Block(lineno + 1, len(parts), None, parts)
            skipping = False
        elif _has_long_line(buf, cut, got, max_line_bytes):
            lines = [p if len(p) <= max_line_bytes else None for p in bytes(view[:cut]).split(b"\n")]
            block = Block(lineno + 1, len(lines), None, lines)
        else:
            block = Block(lineno + 1, -1, None, data=arr, size=cut)
        yield block
        lineno += block.release()
        tail = end - cut - 1
        if tail > max_line_bytes:
            skipping, filled = True, 0
        else:
            arr[:tail] = arr[cut + 1:end]  # numpy copies overlapping ranges correctly
            filled = tail
    if skipping:
        yield Block(lineno + 1, 1, None, [None])
    elif filled:
        yield Block(lineno + 1, 1, None, None, np.empty(0, dtype=np.intp), data=arr, size=filled)


def iter_blocks(stream: BinaryIO, max_line_bytes: int = DEFAULT_MAX_LINE) -> Iterator[Block]:
    """The lines of each chunk read, as one :class:`Block` each (the same lines as :func:`iter_lines`).

    Each block owns its bytes (``joined``), so blocks may be kept; the reader
    itself reads :func:`_buffer_blocks`, in place.
    """
    for block in _buffer_blocks(stream, max_line_bytes):
        block.joined  # noqa: B018 - copied out of the buffer now, before it is read into again
        block.release()
        yield block


def iter_lines(stream: BinaryIO, max_line_bytes: int = DEFAULT_MAX_LINE) -> Iterator[tuple[int, bytes | None]]:
    """Yield ``(line_number, line)``; ``line`` is None for a line over the size bound."""
    for block in iter_blocks(stream, max_line_bytes):
        yield from enumerate(block.lines, block.first)


def read_batches(
    path: str | Path,
    batch_records: int = DEFAULT_BATCH,
    max_line_bytes: int = DEFAULT_MAX_LINE,
    now_ns: int | None = None,
    bounds: TimeBounds | None = None,
) -> Iterator[Batch]:
    """Read one file or stdin into :class:`Batch` objects of bounded size.

    Records outside the event-time bounds (:mod:`.eventtime`; ``now_ns``, the
    arrival, defaults to the wall clock when the read starts) come back as
    invalid, as a stream's summariser dead-letters them. ``bounds`` is shared
    by inputs read side by side (one job record bounds every file of its job).
    """
    now = time.time_ns() if now_ns is None else now_ns
    stream, name = open_source(path)
    failure: list[Invalid] = []

    def blocks() -> Iterator[Block]:
        # A read error (truncated or corrupt gzip, I/O error) ends the input
        # here, inside the block iterator, so that parse_blocks still flushes
        # the records read before it instead of dropping its pending batch.
        lineno = 0
        try:
            for block in _buffer_blocks(stream, max_line_bytes):
                yield block
                lineno = block.first + block.count - 1  # once parsed: the scanner counted its lines
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
            failure.append(Invalid(name, lineno + 1, f"unreadable input: {exc}", b""))

    try:
        size = 0  # a plain file's size tells the scanner up front whether loading it will pay
        if stream is not sys.stdin.buffer and not isinstance(stream, gzip.GzipFile):
            try:
                size = Path(path).stat().st_size
            except OSError:
                pass
        yield from bounded(parse_blocks(blocks(), name, batch_records, max_line_bytes, expected_bytes=size),
                           name, now, TimeBounds() if bounds is None else bounds)
        if failure:
            yield Batch(invalid=failure)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def bounded(batches: Iterator[Batch], source: str, now_ns: int | None, bounds: TimeBounds) -> Iterator[Batch]:
    """``batches`` with every record outside the event-time bounds moved to the batch's rejects.

    The columns were decoded in bulk, so a reject's line number is unknown (0)
    and its ``raw`` is the record written back as contract JSON: enough for
    its dead letter and for the reason shown.
    """
    for batch in batches:
        for job in batch.jobs:
            bounds.job(job)
        for tag, cols in list(batch.columns.items()):
            out = bounds.outside(cols, now_ns)
            if out is None:
                continue
            keep = np.ones(len(cols), dtype=bool)
            keep[out.rows] = False
            if keep.any():
                batch.columns[tag] = cols.take(keep)
            else:
                del batch.columns[tag]
            batch.invalid.extend(Invalid(source, 0, out.reason, msgspec.json.encode(rec))
                                 for rec in to_records(cols.take(out.rows)))
        yield batch


def parse_lines(
    lines: Iterator[tuple[int, bytes | None]],
    source: str = "<input>",
    batch_records: int = DEFAULT_BATCH,
    max_line_bytes: int = DEFAULT_MAX_LINE,
    line_limit: int | None = None,
) -> Iterator[Batch]:
    """Validate numbered lines into batches; shared by files, stdin and Kafka ingest.

    ``max_line_bytes`` names the bound in the reason of a line given as None
    (:func:`iter_lines` already cut it); ``line_limit`` rejects longer lines
    given whole (Kafka ingest), with the line kept for its dead letter.

    A batch holds at most ``batch_records`` lines, valid and invalid together,
    and its rejects (kept whole) at most about ``MAX_INVALID_BYTES``, so memory
    stays bounded even on input that is all rejects. Every line is decoded on
    its own (:func:`decode_line`): a bad one never takes its neighbours with it.
    """
    by_type: dict[str, list[Record]] = {"fn": [], "gpu": [], "nic": [], "host": []}
    jobs: list[JobRecord] = []
    invalid: list[Invalid] = []
    invalid_bytes = 0
    pending = 0
    for lineno, raw in lines:
        if raw is None:
            invalid.append(Invalid(source, lineno, f"line longer than {max_line_bytes} bytes", b""))
        elif not raw.strip():
            continue
        else:
            try:
                rec = decode_line(raw, line_limit if line_limit is not None else len(raw))
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                invalid.append(Invalid(source, lineno, reason_of(exc, raw), bytes(raw)))
                invalid_bytes += len(raw)
            else:
                if type(rec) is JobRecord:
                    jobs.append(rec)
                else:
                    by_type[str(rec.__struct_config__.tag)].append(rec)
                pending += 1
        if pending + len(invalid) >= batch_records or invalid_bytes >= MAX_INVALID_BYTES:
            yield _flush(by_type, jobs, invalid)
            by_type = {k: [] for k in by_type}
            jobs, invalid, pending, invalid_bytes = [], [], 0, 0
    if pending or invalid:
        yield _flush(by_type, jobs, invalid)


def _flush(by_type: dict[str, list[Record]], jobs: list[JobRecord], invalid: list[Invalid]) -> Batch:
    cols = {t: from_records(t, recs) for t, recs in by_type.items() if recs}
    return Batch(cols, jobs, invalid)


_TAG_OF = {FnRecord: "fn", GpuRecord: "gpu", NicRecord: "nic", HostRecord: "host"}


def _flush_mixed(records: list[Record], invalid: list[Invalid]) -> Batch:
    """A batch from decoded records of every kind, in input order (each type's order kept)."""
    # one list per record class: by_class[JobRecord] holds only JobRecords, hence Any
    by_class: dict[type, list[Any]] = {c: [] for c in (FnRecord, GpuRecord, NicRecord, HostRecord, JobRecord)}
    appends = {c: v.append for c, v in by_class.items()}
    for rec in records:
        appends[type(rec)](rec)
    cols = {tag: from_records(tag, by_class[c]) for c, tag in _TAG_OF.items() if by_class[c]}
    return Batch(cols, by_class[JobRecord], invalid)


def decode_block(block: Block) -> list[Record] | None:
    """Every line of a block decoded at once, or None unless each line is one valid record.

    The whole-chunk fast path of the reader: one ``decode_lines`` call (typed
    decoding in C, no Python per line). It only answers when the result is
    certainly what :func:`decode_line` would give line by line: every line
    starts with ``{`` and ends with ``}`` (so no value can span a newline: a raw
    newline inside a string is invalid JSON, and ``}`` then ``{`` is never valid
    inside a value), the decoder gives as many records as there are lines (so
    no line holds two values), and no line has more brackets than the nesting
    bound (checked per line only when the block holds more than one per line
    and the bound). Otherwise (None) the caller decodes line by line, with a
    reason for each rejected line.
    """
    joined = block.joined
    if not joined or joined[0] != 0x7B or joined[-1] != 0x7D:
        return None
    arr = np.frombuffer(joined, dtype=np.uint8)
    nl = block.newlines if block.newlines is not None else np.flatnonzero(arr == 0x0A)
    n_lines = block.count
    if nl.size != n_lines - 1:
        return None
    if nl.size and not (bool((arr[nl - 1] == 0x7D).all()) and bool((arr[nl + 1] == 0x7B).all())):
        return None
    # "[" | 0x20 == "{": one pass counts both openers
    if int(np.count_nonzero((arr | 0x20) == 0x7B)) - n_lines >= MAX_DEPTH:
        # a block with `joined` has no line over the bound, so no None among its lines
        if max(line.count(b"{") + line.count(b"[") for line in block.lines) > MAX_DEPTH:  # type: ignore[union-attr]
            return None
    try:
        records = _decoder.decode_lines(joined)
    except Exception:  # any failure: the line-by-line path names it
        return None
    return records if len(records) == n_lines else None


def parse_blocks(
    blocks: Iterator[Block],
    source: str = "<input>",
    batch_records: int = DEFAULT_BATCH,
    max_line_bytes: int = DEFAULT_MAX_LINE,
    expected_bytes: int = 0,
) -> Iterator[Batch]:
    """:func:`parse_lines` over :func:`iter_blocks`: the same batches, a block at once where it can.

    Three ways for a block, the first that can answer: the compiled scanner
    (:class:`fastjson.Scanner`, straight to columns, no Python object per
    record; used once the input is large enough to pay for loading it), one
    typed ``decode_lines`` call (:func:`decode_block`), or line by line
    exactly as :func:`parse_lines` does (same reasons, same dead letters).
    The first two only answer for a block whose every line is one valid
    record, so all three give the same batches (same boundaries, records,
    columns, rejects).
    """
    parts: list[list[Record] | tuple[fastjson.ChunkColumns, int, int]] = []
    scanner: fastjson.Scanner | None = None  # its arrays, kept from block to block
    records: list[Record] = []  # the last part, while it is a list of decoded records
    pending = 0  # records in parts (rejects are counted from `invalid`)
    invalid: list[Invalid] = []
    invalid_bytes = 0
    seen_bytes = 0

    def take(items: list[Record]) -> None:
        nonlocal records, pending
        if not parts or records is not parts[-1]:
            records = []
            parts.append(records)
        records.extend(items)
        pending += len(items)

    def flush() -> Batch:
        nonlocal parts, records, pending, invalid, invalid_bytes
        batch = _flush_parts(parts, invalid)
        parts, records, pending, invalid, invalid_bytes = [], [], 0, [], 0
        return batch

    for block in blocks:
        if block.whole:
            seen_bytes += block.size + 1
            chunk = None
            if fastjson.worth_it(max(seen_bytes, expected_bytes)):
                scanner = scanner or fastjson.Scanner()
                chunk = _scan(scanner, block)
            if chunk is not None:
                lo, n = 0, len(chunk)
                while lo < n:
                    hi = min(n, lo + max(1, batch_records - pending - len(invalid)))
                    parts.append((chunk, lo, hi))
                    pending += hi - lo
                    lo = hi
                    if pending + len(invalid) >= batch_records:
                        yield flush()
                continue
        decoded = decode_block(block) if block.whole else None
        if decoded is not None:
            while decoded:
                room = max(1, batch_records - pending - len(invalid))
                if room >= len(decoded):
                    take(decoded)
                    decoded = []
                else:
                    take(decoded[:room])
                    decoded = decoded[room:]
                if pending + len(invalid) >= batch_records:
                    yield flush()
            continue
        for lineno, raw in enumerate(block.lines, block.first):
            if raw is None:
                invalid.append(Invalid(source, lineno, f"line longer than {max_line_bytes} bytes", b""))
            elif not raw.strip():
                continue
            else:
                try:
                    rec = decode_line(raw, len(raw))
                except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                    invalid.append(Invalid(source, lineno, reason_of(exc, raw), bytes(raw)))
                    invalid_bytes += len(raw)
                else:
                    if parts and records is parts[-1]:
                        records.append(rec)
                        pending += 1
                    else:
                        take([rec])
            if pending + len(invalid) >= batch_records or invalid_bytes >= MAX_INVALID_BYTES:
                yield flush()
    if pending or invalid:
        yield flush()


def _scan(scanner: fastjson.Scanner, block: Block) -> fastjson.ChunkColumns | None:
    """A whole block's lines through the scanner: in place in the reader's buffer, else from a copy."""
    if block.data is not None:
        chunk = scanner.scan(block.data, block.size)
    else:
        joined = block.joined
        assert joined is not None  # whole
        chunk = scanner.scan(fastjson.padded(joined), len(joined))
    if chunk is not None:
        block.count = len(chunk)
    return chunk


def _flush_parts(parts: list[list[Record] | tuple[fastjson.ChunkColumns, int, int]],
                 invalid: list[Invalid]) -> Batch:
    """A batch from its parts in input order: decoded records and rows of scanned chunks."""
    if all(isinstance(p, list) for p in parts):  # no scanned chunk: exactly the decoded records' path
        lists: list[list[Record]] = parts  # type: ignore[assignment]  # every part is a list here
        return _flush_mixed(lists[0] if len(lists) == 1 else list(chain.from_iterable(lists)), invalid)
    per_tag: dict[str, list[fastjson.Part]] = {tag: [] for tag in _TAG_OF.values()}
    jobs: list[JobRecord] = []
    for part in parts:
        if isinstance(part, list):
            decoded = _flush_mixed(part, [])
            jobs += decoded.jobs
            for tag, part_cols in decoded.columns.items():
                per_tag[tag].append(part_cols)
        else:
            for tag in per_tag:
                per_tag[tag].append(part)
    cols: dict[str, Columns] = {}
    for tag, tag_parts in per_tag.items():
        merged = fastjson.merge(tag, tag_parts)
        if merged is not None:
            cols[tag] = merged
    return Batch(cols, jobs, invalid)


def read_merged(paths: list[str | Path], batch_records: int = DEFAULT_BATCH) -> Iterator[Batch]:
    """Several inputs read side by side, the batch with the oldest record first (a k-way merge).

    Files that cover the same time (one per rank or per node, as collectors
    write them) must not be read one after the other: the window assembler
    would see the second file's records as late once the first had moved the
    event-time watermark past them. Merged by time, each input only needs to be
    in time order within itself (to within the assembler's lateness).
    """
    import heapq

    def first_ts(b: Batch) -> int:
        return min((int(c.arrays["ts_ns"].min()) for c in b.columns.values() if len(c)), default=-1)

    now, bounds = time.time_ns(), TimeBounds()
    its = [read_batches(p, batch_records=batch_records, now_ns=now, bounds=bounds) for p in paths]
    heap: list[tuple[int, int, Batch]] = []
    for i, it in enumerate(its):
        b = next(it, None)
        if b is not None:
            heap.append((first_ts(b), i, b))
    heapq.heapify(heap)
    while heap:
        _, i, b = heapq.heappop(heap)
        yield b
        nxt = next(its[i], None)
        if nxt is not None:
            heapq.heappush(heap, (first_ts(nxt), i, nxt))
