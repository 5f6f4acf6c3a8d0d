"""Cut a columnar batch into Kafka frames of one key each (pure: no Kafka here).

A frame holds records of one ``(job, rank)`` (fn) or, for what a node's agent
samples, one ``(job, node)`` (gpu, nic, host). The Kafka key is ``job/rank``
or ``job/node``: one key's frames land on one partition in order, so a
consumer sees each producer's records in the order it produced them, and its
end-of-stream marker after them.

GPU samples are keyed by node (before 2026-11-27: by rank). The agent samples
a node's GPUs together, 2-3 records per GPU and flush, so keyed by rank they
were 38% of a live job's frames for 4.6% of its records (a 256-rank replay with
declared marks: 13,312 of 35,089 frames), and the summariser worker pays ~300
us per frame whatever it holds (``docs/capacity.md``). Nothing reads a GPU
sample's key but to choose its partition and stream: the detector merges every
partition's digest, so a rank's samples and its functions need not meet on
one partition. Frames of older agents, keyed by rank, are read as before.

Grouping is a stable numpy argsort on a combined integer key: no per-record
Python, and input order is kept within each key.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import Iterator

import numpy as np

from eroica.models.columns import CAT, SCHEMAS, Columns

DEFAULT_FRAME_RECORDS = 1000

# Record types whose frames are keyed by node instead of rank: what a node agent samples.
NODE_LEVEL = frozenset({"gpu", "nic", "host"})


@dataclass(frozen=True)
class FrameSlice:
    """One frame to send: its key, who it belongs to, and its records.

    ``rank`` is -1 for node-level frames, ``node`` is "" for rank-level ones
    (a rank-level frame may in principle mix nodes if a collector moved a rank).
    """

    key: str
    job: str
    rank: int
    node: str
    cols: Columns


def frame_key(job: str, rank: int = -1, node: str = "") -> str:
    """The Kafka key of a rank (``job/rank``) or, when ``rank`` < 0, of a node (``job/node``).

    Keys only choose partitions; consumers read job, rank and node from the
    frame itself, so a node named like a rank number is harmless.
    """
    return f"{job}/{rank}" if rank >= 0 else f"{job}/{node}"


def _groups(cols: Columns) -> Iterator[tuple[str, str, int, str, np.ndarray]]:
    """``(key, job, rank, node, row indices)`` per key, rows in input order."""
    n = len(cols)
    if n == 0:
        return
    job = cols.arrays["job"].astype(np.int64)
    node_level = cols.type in NODE_LEVEL
    second = (cols.arrays["node"] if node_level else cols.arrays["rank"]).astype(np.int64)
    combined = job * (int(second.max()) + 1) + second
    order = np.argsort(combined, kind="stable")
    sorted_keys = combined[order]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    ends = np.r_[starts[1:], n]
    jobs, nodes = cols.vocab["job"], cols.vocab["node"]
    for start, end in zip(starts.tolist(), ends.tolist()):
        first = int(order[start])
        job_name = jobs[int(cols.arrays["job"][first])]
        if node_level:
            rank, node = -1, nodes[int(cols.arrays["node"][first])]
        else:
            rank, node = int(cols.arrays["rank"][first]), ""
        yield frame_key(job_name, rank, node), job_name, rank, node, order[start:end]


def split_frames(cols: Columns, max_records: int = DEFAULT_FRAME_RECORDS) -> Iterator[FrameSlice]:
    """Frames of at most ``max_records`` records of one key, keys in sorted code order.

    Each key's last frame may be short: to cut full frames from a stream of
    batches, use :class:`FrameAccumulator`.
    """
    if max_records < 1:
        raise ValueError(f"max_records must be >= 1, got {max_records}")
    for key, job, rank, node, rows in _groups(cols):
        for lo in range(0, len(rows), max_records):
            yield FrameSlice(key, job, rank, node, cols.take(rows[lo:lo + max_records]))


def _time_cuts(ts: np.ndarray, size: int, span_ns: int) -> list[int]:
    """Frame boundaries over one key's records: at most ``size`` records and ``span_ns`` of event time each.

    Returns ``[0, b1, ..., bk]``: frames ``[b_i, b_i+1)``; records from ``bk`` on
    are an incomplete frame (fewer than ``size`` and within ``span_ns`` of its
    first record). Spans are measured on the running maximum of ``ts`` (input
    order is kept), one ``searchsorted`` per frame.
    """
    run = np.maximum.accumulate(ts) if len(ts) else ts
    cuts = [0]
    lo, n = 0, len(ts)
    while lo < n:
        hi = min(lo + size, int(np.searchsorted(run, run[lo] + span_ns, side="right")))
        if hi == n and hi - lo < size:
            break  # the tail: not yet full, not yet too long
        cuts.append(hi)
        lo = hi
    return cuts


# The accumulator's vocabularies grow with every distinct string it sees; past
# this many entries in a record type's columns it starts them afresh from what it holds.
VOCAB_RESET = 1 << 16


class _Held:
    """One record type's held rows: columns in the accumulator's codes, sorted by key, input order within a key."""

    __slots__ = ("arrays", "keys", "starts", "ends", "oldest")

    def __init__(self, arrays: dict[str, np.ndarray], keys: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 oldest: np.ndarray) -> None:
        self.arrays, self.keys, self.starts, self.ends, self.oldest = arrays, keys, starts, ends, oldest

    def __len__(self) -> int:
        return len(self.keys)


class FrameAccumulator:
    """Cuts full frames across batches, holding each key's remainder for the next batch.

    A reader batch of 64k records over 64 ranks gives ~1024 records per rank:
    cut alone, that is a frame of 1000 and one of 24, and consumers pay per
    message (streaming-notes.md: 100 records per message is ~5x slower to
    process than 1000). Holding at most ``max_records - 1`` records per key
    keeps memory bounded; :meth:`drain` emits the remainders at the end.

    ``max_lag_ns`` also bounds frames in *event time*: no frame spans more than
    ``max_lag_ns``, and once a key's oldest held record is more than
    ``max_lag_ns`` older than the newest record the accumulator has seen (any
    key, any type), it goes out as a short frame, as a live agent flushes on
    count or on time (every 250-500 ms).
    Without it, a sparse stream (2 GPU samples a second) would be held until
    1000 records or the end of the file, and reach a stream processor long
    after the windows it belongs to have closed (streams/faust summariser).

    Cost: strings are recoded once per batch against the accumulator's own
    growing vocabularies (a Python step per *distinct* string of the batch,
    not per record or per key), so a key's held rows and its new ones are
    plain integer arrays; each batch is merged with what is held by one
    stable sort per record type, and frames are slices of it. Python runs
    per frame emitted, never per key that merely waits. Frames carry the
    accumulator's vocabulary; :func:`~eroica.models.frames.encode_frame`
    ships only the entries each one uses, as it always did.
    """

    def __init__(self, max_records: int = DEFAULT_FRAME_RECORDS, max_lag_ns: int | None = None) -> None:
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        if max_lag_ns is not None and max_lag_ns < 0:
            raise ValueError(f"max_lag_ns must be >= 0, got {max_lag_ns}")
        self.max_records = max_records
        self.max_lag_ns = max_lag_ns
        self._held: dict[str, _Held] = {}
        self._codes: dict[str, dict[str, dict[str, int]]] = {}   # type -> column -> string -> code
        self._strings: dict[str, dict[str, list[str]]] = {}      # type -> column -> strings (append-only)
        self._snapshot: dict[str, dict[str, list[str]]] = {}     # what emitted frames share (never mutated)
        self._newest = -1

    @property
    def pending_records(self) -> int:
        return sum(len(h) for h in self._held.values())

    # -- vocabularies -------------------------------------------------------------------------

    def _recode(self, cols: Columns) -> dict[str, np.ndarray]:
        """The batch's columns with strings in the accumulator's codes (one step per distinct string)."""
        t = cols.type
        codes = self._codes.setdefault(t, {})
        strings = self._strings.setdefault(t, {})
        out = dict(cols.arrays)
        grew = False
        for name, dtype in SCHEMAS[t].items():
            if dtype != CAT:
                continue
            table = codes.setdefault(name, {})
            known = strings.setdefault(name, [])
            voc = cols.vocab.get(name, [])
            remap = np.fromiter(map(table.get, voc, repeat(-1)), dtype=np.int32, count=len(voc))
            missing = np.flatnonzero(remap < 0)
            if missing.size:
                grew = True
                for i in missing.tolist():
                    s = voc[i]
                    c = table.get(s)   # a batch vocabulary may repeat a string
                    if c is None:
                        c = table[s] = len(known)
                        known.append(s)
                    remap[i] = c
            out[name] = remap[cols.arrays[name]] if len(remap) else cols.arrays[name].astype(np.int32)
        if grew or t not in self._snapshot:
            self._snapshot[t] = {name: list(v) for name, v in strings.items()}
        return out

    def _rebase(self, t: str) -> None:
        """Start a type's vocabularies afresh from its held rows (they would otherwise grow without bound)."""
        held = self._held.get(t)
        strings = self._strings.get(t, {})
        codes: dict[str, dict[str, int]] = {}
        new_strings: dict[str, list[str]] = {}
        for name, known in strings.items():
            if held is not None and len(held):
                used, inverse = np.unique(held.arrays[name], return_inverse=True)
                held.arrays[name] = inverse.astype(np.int32, copy=False).reshape(-1)
                kept = [known[i] for i in used.tolist()]
            else:
                kept = []
            new_strings[name] = kept
            codes[name] = {s: i for i, s in enumerate(kept)}
        self._strings[t], self._codes[t] = new_strings, codes
        self._snapshot[t] = {name: list(v) for name, v in new_strings.items()}
        if held is not None and len(held):
            # keys hold job (and node) codes: recompute them in the new codes
            keys = self._keys(t, held.arrays)
            order = np.argsort(keys, kind="stable")
            arrays = {k: v[order] for k, v in held.arrays.items()}
            keys = keys[order]
            starts, ends = _segments(keys)
            oldest = np.minimum.reduceat(arrays["ts_ns"], starts) if len(starts) else np.empty(0, np.int64)
            self._held[t] = _Held(arrays, keys, starts, ends, oldest)

    @staticmethod
    def _keys(t: str, arrays: dict[str, np.ndarray]) -> np.ndarray:
        second = arrays["node"] if t in NODE_LEVEL else arrays["rank"]
        return (arrays["job"].astype(np.int64) << 32) | second.astype(np.int64)

    def _slice(self, t: str, arrays: dict[str, np.ndarray], lo: int, hi: int) -> FrameSlice:
        job = self._snapshot[t]["job"][int(arrays["job"][lo])]
        if t in NODE_LEVEL:
            rank, node = -1, self._snapshot[t]["node"][int(arrays["node"][lo])]
        else:
            rank, node = int(arrays["rank"][lo]), ""
        cols = Columns(t, {k: v[lo:hi] for k, v in arrays.items()}, self._snapshot[t])
        return FrameSlice(frame_key(job, rank, node), job, rank, node, cols)

    # -- cutting ----------------------------------------------------------------------------------

    def add(self, cols: Columns) -> Iterator[FrameSlice]:
        """Full frames completed by this batch; the rest waits for the next one."""
        return iter(self._add(cols))

    def _add(self, cols: Columns) -> list[FrameSlice]:
        out: list[FrameSlice] = []
        t = cols.type
        if len(cols) == 0:
            return out
        if sum(len(v) for v in self._strings.get(t, {}).values()) > VOCAB_RESET:
            self._rebase(t)
        arrays = self._recode(cols)
        keys = self._keys(t, arrays)
        held = self._held.pop(t, None)
        if held is not None and len(held):
            arrays = {k: np.concatenate((held.arrays[k], v)) for k, v in arrays.items()}
            keys = np.concatenate((held.keys, keys))
        order = np.argsort(keys, kind="stable")   # held rows stay before new ones of their key
        keys = keys[order]
        arrays = {k: v[order] for k, v in arrays.items()}
        starts, ends = _segments(keys)
        size, span = self.max_records, self.max_lag_ns
        counts = ends - starts
        ts = arrays["ts_ns"]
        if span is None:
            rest_from = ends - counts % size
            for i in np.flatnonzero(rest_from > starts).tolist():
                for lo in range(int(starts[i]), int(rest_from[i]), size):
                    out.append(self._slice(t, arrays, lo, lo + size))
        else:
            rest_from = starts.copy()
            first = ts[starts]
            latest = np.maximum.reduceat(ts, starts)
            # a key below the count with every record within the span of its first: nothing to cut
            for i in np.flatnonzero((counts >= size) | (latest - first > span)).tolist():
                lo0, hi0 = int(starts[i]), int(ends[i])
                cuts = _time_cuts(ts[lo0:hi0], size, span)
                for lo, hi in zip(cuts[:-1], cuts[1:]):
                    out.append(self._slice(t, arrays, lo0 + lo, lo0 + hi))
                rest_from[i] = lo0 + cuts[-1]
        keep = rest_from < ends
        if keep.any():
            lens = (ends - rest_from)[keep]
            rows = np.repeat(rest_from[keep] - np.cumsum(np.r_[0, lens[:-1]]), lens) + np.arange(int(lens.sum()))
            h_arrays = {k: v[rows] for k, v in arrays.items()}
            h_keys = keys[rows]
            h_starts = np.r_[0, np.cumsum(lens[:-1])].astype(np.intp)
            h_ends = h_starts + lens
            oldest = np.minimum.reduceat(h_arrays["ts_ns"], h_starts)
            self._held[t] = _Held(h_arrays, h_keys, h_starts, h_ends, oldest)
        if span is not None:
            self._newest = max(self._newest, int(cols.arrays["ts_ns"].max()))
            horizon = self._newest - span
            for ht in list(self._held):
                out.extend(self._expire(ht, horizon))
        return out

    def _expire(self, t: str, horizon: int) -> list[FrameSlice]:
        """Held remainders whose oldest record is older than ``horizon``, as short frames."""
        held = self._held[t]
        late = held.oldest < horizon
        if not late.any():
            return []
        out = [self._slice(t, held.arrays, int(held.starts[i]), int(held.ends[i])) for i in np.flatnonzero(late).tolist()]
        stay = ~late
        lens = (held.ends - held.starts)[stay]
        if lens.size == 0:
            del self._held[t]
            return out
        rows = np.repeat(held.starts[stay] - np.cumsum(np.r_[0, lens[:-1]]), lens) + np.arange(int(lens.sum()))
        h_starts = np.r_[0, np.cumsum(lens[:-1])].astype(np.intp)
        self._held[t] = _Held({k: v[rows] for k, v in held.arrays.items()}, held.keys[rows], h_starts,
                              h_starts + lens, held.oldest[stay])
        return out

    def drain(self) -> Iterator[FrameSlice]:
        """The held remainders, one short frame per key; the accumulator is empty afterwards."""
        held, self._held = self._held, {}
        for t, h in held.items():
            for lo, hi in zip(h.starts.tolist(), h.ends.tolist()):
                yield self._slice(t, h.arrays, lo, hi)


def _segments(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of each run of equal keys."""
    n = len(sorted_keys)
    if n == 0:
        return np.empty(0, np.intp), np.empty(0, np.intp)
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    return starts, np.r_[starts[1:], n]
