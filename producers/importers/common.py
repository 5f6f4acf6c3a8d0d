"""Shared parts of the importers: strings within the contract's bounds, time-ordered output.

Every importer turns one source (a trace file, a table) at a time into
``(ts_ns, line)`` pairs; :class:`Spool` orders them and writes one JSON Lines
file sorted by time across all sources. Time order matters to ``eroica
analyze``: it closes a window once the input has moved a window past it, so
the records of a second rank written after the whole first rank would arrive
late and be dropped. One source stays in memory; with several, each sorted
run goes to a temporary file and the runs are merged (``heapq.merge``).
"""

from __future__ import annotations

import gzip
import hashlib
import heapq
import os
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable

MAX_STR = 256          # the contract's bound on every string
FRAME_MAX = 64         # one frame of a ``stack`` (so that a few fit in 256)
_HASH_CHARS = 8


class ImportFailed(Exception):
    """A source that cannot be imported (unreadable, not the expected format)."""


def clip(name: str, limit: int = MAX_STR) -> str:
    """``name`` within ``limit`` characters, keeping its head.

    A longer name keeps its first ``limit - 9`` characters and ends with ``~``
    and 8 hex digits of a hash of the whole name, so two long templated kernel
    names that share a head stay two functions.
    """
    if len(name) <= limit:
        return name
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=_HASH_CHARS // 2).hexdigest()
    return name[: limit - _HASH_CHARS - 1] + "~" + digest


def frame(name: str) -> str:
    """One stack frame: no ``;`` (the frame separator), at most FRAME_MAX characters."""
    name = name.replace(";", ",")
    return name if len(name) <= FRAME_MAX else name[: FRAME_MAX - 1] + "\u2026"


def join_stack(frames: list[str], limit: int = MAX_STR) -> str:
    """Frames (outermost first) joined by ``;`` within ``limit`` characters.

    Too deep a stack keeps its innermost frames, as the contract asks, and
    each dropped outer frame becomes a one-character ``…`` frame: the depth
    (frames counted by ``;``), which orders nested host spans on the critical
    path, stays right.
    """
    s = ";".join(frames)
    if len(s) <= limit:
        return s
    n = len(frames)
    kept = len(s)  # length of ";".join(frames[k:]) for the k being tried
    for k in range(1, n):
        kept -= len(frames[k - 1]) + 1
        if 2 * k + kept <= limit:
            return "\u2026;" * k + ";".join(frames[k:])
    return s[-limit:]


@dataclass
class ImportStats:
    """What an import wrote and what it left out, for the command's report."""

    sources: int = 0
    records: int = 0
    kinds: Counter = field(default_factory=Counter)
    ranks: set = field(default_factory=set)
    steps: set = field(default_factory=set)
    skipped: Counter = field(default_factory=Counter)   # reason -> events not imported
    warnings: list[str] = field(default_factory=list)
    inferred_steps: dict[str, int] = field(default_factory=dict)  # source -> steps inferred (no step markers)

    def count(self, kind: str, rank: int, step: int) -> None:
        self.records += 1
        self.kinds[kind] += 1
        self.ranks.add(rank)
        self.steps.add(step)

    def describe(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items()))
        ranks = sorted(self.ranks)
        rank_txt = (f"ranks {ranks[0]}..{ranks[-1]} ({len(ranks)})" if len(ranks) > 4
                    else "ranks " + ",".join(map(str, ranks))) if ranks else "no rank"
        out = f"{self.records} fn records ({kinds}); {rank_txt}; {len(self.steps)} steps"
        if self.skipped:
            out += "; not imported: " + ", ".join(f"{n} {r}" for r, n in sorted(self.skipped.items()))
        return out


def open_output(path: str | os.PathLike) -> tuple[BinaryIO, bool]:
    """``-`` = stdout, ``*.gz`` = gzip, else a plain file; returns (stream, must_close)."""
    if str(path) == "-":
        return sys.stdout.buffer, False
    if str(path).endswith(".gz"):
        return gzip.open(path, "wb", compresslevel=3), True  # type: ignore[return-value]
    return open(path, "wb", buffering=1 << 20), True


_PREFIX = 20  # zero-padded ts_ns prefix of a spooled line (int64 fits in 19 digits)


class Spool:
    """Sorted runs of ``(ts_ns, line)``, written out merged in time order.

    The first run stays in memory; from the second on, every run is sorted and
    spilled to a temporary file, so memory holds one source at a time.
    """

    def __init__(self, tmpdir: str | None = None) -> None:
        self._mem: list[tuple[int, bytes]] | None = None
        self._files: list[Path] = []
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._tmpdir = tmpdir

    def add(self, run: list[tuple[int, bytes]]) -> None:
        run.sort(key=lambda r: r[0])
        if self._mem is None and not self._files:
            self._mem = run
            return
        if self._mem is not None:
            self._spill(self._mem)
            self._mem = None
        self._spill(run)

    def _spill(self, run: list[tuple[int, bytes]]) -> None:
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="eroica-import-", dir=self._tmpdir)
        path = Path(self._tmp.name) / f"run-{len(self._files)}.txt"
        with open(path, "wb", buffering=1 << 20) as f:
            f.writelines(b"%020d%s\n" % (ts, line) for ts, line in run)
        self._files.append(path)

    def write(self, out: BinaryIO, head: Iterable[bytes] = ()) -> None:
        """``head`` lines first (job records: the detector needs them before the windows), then the runs."""
        for line in head:
            out.write(line + b"\n")
        if self._mem is not None:
            out.writelines(line + b"\n" for _, line in self._mem)
        elif self._files:
            files = [open(p, "rb", buffering=1 << 20) for p in self._files]
            try:
                out.writelines(line[_PREFIX:] for line in heapq.merge(*files))
            finally:
                for f in files:
                    f.close()
        out.flush()

    def close(self) -> None:
        self._mem = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "Spool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_spool(spool: Spool, output: str | os.PathLike, head: Iterable[bytes] = ()) -> None:
    """Write a spool's time-ordered records, after ``head``, to a path or ``-``."""
    out, close = open_output(output)
    try:
        spool.write(out, head)
    finally:
        if close:
            out.close()
