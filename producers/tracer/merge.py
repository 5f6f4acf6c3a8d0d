"""Merge a traced job's per-process files into one contract file, in time order.

Each rank (and the node agent) wrote its own JSON Lines file; the detector's
window assembler wants the job's records in rough time order across ranks
(a window closes once the event time has moved a window past it). Each file
is almost ordered already (each write is sorted, a record is written when
its span ends), so a bounded reorder buffer per file (``REORDER`` lines)
finishes the job and a k-way heap merge interleaves the files; memory stays
bounded whatever the trace size. Lines are copied as they are, never
re-encoded.

A ``job`` record goes first, built from the ``*.meta.json`` files the ranks
left beside their records: ``world_size`` and, when every rank is known,
``rank_nodes``.
"""

from __future__ import annotations

import heapq
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import msgspec

from eroica.models.records import JobRecord, encode_record

REORDER = 50_000


class _Ts(msgspec.Struct, forbid_unknown_fields=False):
    ts_ns: int = 0


_ts_decoder = msgspec.json.Decoder(_Ts)


def _ts_of(line: bytes) -> int:
    try:
        return _ts_decoder.decode(line).ts_ns
    except (msgspec.DecodeError, msgspec.ValidationError):
        return 0  # the detector will reject and report it; it still goes through


def _ordered_lines(path: Path, reorder: int) -> Iterator[tuple[int, bytes]]:
    """``(ts_ns, line)`` of one file, sorted within a sliding buffer of ``reorder`` lines."""
    heap: list[tuple[int, int, bytes]] = []
    seq = 0
    with open(path, "rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            if not line.endswith(b"\n"):
                line += b"\n"
            heapq.heappush(heap, (_ts_of(line), seq, line))
            seq += 1
            if len(heap) > reorder:
                ts, _, out = heapq.heappop(heap)
                yield ts, out
    while heap:
        ts, _, out = heapq.heappop(heap)
        yield ts, out


@dataclass
class MergeResult:
    path: Path
    records: int = 0
    files: int = 0
    ranks: list[int] = field(default_factory=list)
    world_size: int = 0
    dropped: int = 0
    job: JobRecord | None = None


def job_record(metas: list[dict], job: str) -> JobRecord | None:
    """The job record the rank meta files support (None without any rank)."""
    final = [m for m in metas if m.get("job") == job]
    if not final:
        return None
    world = max(int(m.get("world_size") or 1) for m in final)
    nodes: dict[int, str] = {int(m["rank"]): str(m["node"]) for m in final if "rank" in m}
    rank_nodes = [nodes[r] for r in range(world)] if all(r in nodes for r in range(world)) else None
    ts = min((m.get("ts_ns") for m in final if m.get("ts_ns")), default=None)
    return JobRecord(job=job, world_size=world, rank_nodes=rank_nodes, ts_ns=ts)


def read_metas(folder: Path) -> list[dict]:
    out = []
    for p in sorted(folder.glob("*.meta.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            pass
    return out


def merge_parts(folder: str | Path, out: str | Path, job: str, reorder: int = REORDER) -> MergeResult:
    """Merge every ``*.jsonl`` of ``folder`` into ``out`` (written atomically), job record first."""
    folder, out = Path(folder), Path(out)
    files = sorted(folder.glob("*.jsonl"))
    metas = read_metas(folder)
    result = MergeResult(out, files=len(files))
    jr = job_record(metas, job)
    result.job = jr
    result.ranks = sorted({int(m["rank"]) for m in metas if m.get("job") == job and "rank" in m})
    result.world_size = jr.world_size if jr else 0
    result.dropped = sum(int(m.get("dropped") or 0) for m in metas)
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as fh:
        if jr is not None:
            fh.write(encode_record(jr) + b"\n")
        for _, line in heapq.merge(*(_ordered_lines(p, reorder) for p in files), key=lambda x: x[0]):
            fh.write(line)
            result.records += 1
    os.replace(tmp, out)
    return result
