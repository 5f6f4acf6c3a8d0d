"""Records delivered twice change no verdict (``streams/detection/repeats.py``).

At-least-once producers re-send: a restarted agent or tracer, a log shipper
resuming from its checkpoint, a replay run twice. Here a node's records (or
every record of the job) are written twice, each copy right after its
original, as a re-send inside the window lands; the verdict ids must be
those of the job sent once. Before copies were dropped, the throttled GPU's
node sent twice lost 3 of its 6 verdicts, and one node of the healthy
long-step job sent twice raised verdicts on innocent ranks. Real traces,
whose coarse clock makes sibling calls look alike, lose no record.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from eroica.models.columns import Columns, from_records
from eroica.models.reader import read_batches
from eroica.models.records import FnRecord
from eroica.producers.importers.kineto import import_kineto
from eroica.producers.simulator import SimConfig, write_jsonl
from eroica.streams.detection import DEFAULT_WINDOW_S, analyze
from eroica.streams.detection import repeats
from eroica.streams.detection.repeats import first_copies, without_copies
from eroica.streams.detection.windows import WindowAssembler

W = int(DEFAULT_WINDOW_S * 1e9)
JOBS = {
    # 16 ranks, steps of about 1 s, a throttled GPU (rank 6, node-1) and a slow NIC (node-2)
    "faults": SimConfig(nodes=4, gpus=4, steps=110, seed=31, job="twice", faults=["gpu_throttle:rank=6",
                                                                                 "nic:node=2,nic=1"]),
    # a healthy realistic job of 8 ranks whose steps take about 11.5 s
    "long": SimConfig(nodes=2, gpus=4, seed=7003, profile="realistic", job="twice-long"),
}


@pytest.fixture(scope="module", params=sorted(JOBS))
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    path = tmp_path_factory.mktemp("twice") / f"{request.param}.jsonl"
    write_jsonl(JOBS[request.param], path, truth_path=False)
    return path, path.read_bytes().splitlines(keepends=True)


def _verdict_ids(path: Path) -> list[str]:
    return sorted(v.verdict_id for v in analyze(read_batches(path), W))


@pytest.mark.parametrize("node", [None, "node-0", "node-1", "node-2"])
def test_records_sent_twice_give_the_verdicts_of_records_sent_once(job: tuple[Path, list[bytes]], tmp_path: Path,
                                                                  node: str | None) -> None:
    path, lines = job
    out = []
    for line in lines:
        out.append(line)
        r = msgspec.json.decode(line)
        if r.get("type") != "job" and (node is None or r.get("node") == node):
            out.append(line)
    twice = tmp_path / "twice.jsonl"
    twice.write_bytes(b"".join(out))
    assert _verdict_ids(twice) == _verdict_ids(path)


def _fn(rows: list[dict]) -> Columns:
    base = dict(job="j", node="n", rank=0, step=1, fn="f", kind="kernel", stream=7)
    return from_records("fn", [FnRecord(**{**base, **r}) for r in rows])


def test_the_first_copy_is_kept_and_only_exact_copies_go() -> None:
    cols = _fn([
        dict(ts_ns=100, dur_ns=10),
        dict(ts_ns=100, dur_ns=10, stream=8),           # another stream: a different span
        dict(ts_ns=100, dur_ns=10, stack="f;f"),        # the same function called by itself
        dict(ts_ns=100, dur_ns=11),                     # another duration
        dict(ts_ns=100, dur_ns=10),                     # a copy of row 0
        dict(ts_ns=200, dur_ns=0), dict(ts_ns=200, dur_ns=0),  # two calls in one clock tick: both kept
        dict(ts_ns=100, dur_ns=10, rank=1),             # another rank
        dict(ts_ns=100, dur_ns=10),                     # a second copy of row 0
    ])
    kept, dropped = without_copies(cols)
    assert dropped == 2
    assert first_copies(cols).tolist() == [True, True, True, True, False, True, True, True, False]
    assert len(kept) == 7 and kept.arrays["ts_ns"].tolist() == [100, 100, 100, 100, 200, 200, 100]


def test_equal_hashes_alone_drop_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # every row hashed alike: only the field-by-field comparison may decide
    monkeypatch.setattr(repeats, "_hashes", lambda cols, fields: np.zeros(len(cols), dtype=np.int64))
    cols = _fn([dict(ts_ns=t, dur_ns=5) for t in (3, 1, 2, 1)])
    assert first_copies(cols).tolist() == [True, True, True, False]
    assert first_copies(_fn([dict(ts_ns=t, dur_ns=5) for t in (3, 1, 2)])).tolist() == [True, True, True]


def test_the_assembler_counts_the_copies_it_drops() -> None:
    asm = WindowAssembler(W)
    once = _fn([dict(ts_ns=W + i, dur_ns=3) for i in range(5)])
    asm.add(once)
    asm.add(once.take(np.array([1, 3])))
    (w,) = asm.flush()
    assert len(w.get("fn")) == 5 and asm.repeated_records == 2


@pytest.mark.parametrize("name", ["control", "test", "sampled_rank-0", "sampled_rank-1"])
def test_real_traces_lose_no_record(name: str, tmp_path: Path, shared_dir: Path) -> None:
    out = tmp_path / "t.jsonl"
    import_kineto([shared_dir / "data" / "kineto" / f"{name}.json.gz"], out)
    asm = WindowAssembler(W)
    n = 0
    for batch in read_batches(out):
        for cols in batch.columns.values():
            asm.add(cols)
            n += len(cols)
    windows = asm.flush()
    assert n > 4000 and asm.repeated_records == 0
    assert sum(w.records for w in windows) == n


def test_the_compiled_hash_drops_what_numpy_s_drops() -> None:
    """Copies found with the summariser's kernels loaded (fn records hashed in one compiled pass) are those found
    without them."""
    from eroica.streams.detection import kernels

    rng = np.random.default_rng(5)
    rows = [dict(ts_ns=int(rng.integers(0, 50)), dur_ns=int(rng.integers(0, 3)), rank=int(rng.integers(0, 3)),
                 stream=int(rng.integers(0, 2))) for _ in range(300)]
    cols = _fn(rows)
    kernels.use_kernels("numpy")
    try:
        want = first_copies(cols)
        kernels.use_kernels("python")
        assert kernels.loaded() is not None
        with np.errstate(over="ignore"):  # interpreted, numpy's scalars warn where the hash wraps
            got = first_copies(cols)
    finally:
        kernels.use_kernels(None)
    assert want is not None and got is not None and not want.all() and np.array_equal(got, want)


def test_a_batch_splits_into_its_windows_in_record_order() -> None:
    """The assembler's split: each (job, window) piece holds that window's records in record order, the pieces
    in (job, window) order, whether the records come in time order (slices) or not (a counting sort)."""
    from eroica.streams.detection.windows import split

    rng = np.random.default_rng(6)
    for trial in range(30):
        n = int(rng.integers(1, 200))
        ts = rng.integers(0, 4 * W, n)
        if trial % 2:
            ts.sort()
        jobs = ["a", "b", "c"][: 1 + trial % 3]
        rows = [FnRecord(job=str(rng.choice(jobs)), node="n", rank=i, step=1, fn="f", kind="kernel", ts_ns=int(t),
                         dur_ns=1) for i, t in enumerate(ts)]
        cols = from_records("fn", rows)
        pieces = split(cols, W)
        want: dict[tuple[str, int], list[int]] = {}
        for r in rows:
            want.setdefault((r.job, r.ts_ns // W), []).append(r.rank)
        code = {j: i for i, j in enumerate(cols.vocab["job"])}
        assert list(pieces) == sorted(want, key=lambda k: (code[k[0]], k[1]))
        assert {k: p.arrays["rank"].tolist() for k, p in pieces.items()} == want
