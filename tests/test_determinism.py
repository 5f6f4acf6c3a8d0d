"""Deterministic verdicts (issue 9, item 3): the same records give the same verdict ids.

In any order (within the assembler's lateness, or in any order at all with an
unbounded lateness), in any number of files, in reader batches of any size,
over any number of summariser partitions, with any frame size and any
interleaving of the partitions' messages: ``eroica analyze`` and the streaming
cores must name exactly the same verdict ids, and behind each id the same
(component, scope, node, rank, fn). Every tie the detector meets (two groups
equally slow, two findings equally confident...) must be broken by a stable
key, never by the order records or digests happened to arrive in.

The runs are simulated once per module; hypothesis draws the permutations,
splits and partitionings (few examples each, so the module stays well under
a minute). Everything goes through the public entry points: the reader
(``read_batches``), ``analyze`` with its ``lateness_ns``, and the faust pure
cores (``PartitionSummariser``, ``DetectorCore``) fed as ``replay`` would.
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eroica.models.columns import from_records
from eroica.models.frames import EndOfStream, encode_end_of_stream, encode_frame, encode_job
from eroica.models.reader import Batch, read_batches, read_merged
from eroica.models.records import FnRecord
from eroica.models.verdict import decode_verdict
from eroica.kafka.framing import FrameAccumulator, frame_key
from eroica.producers.replay import MAX_LAG_NS, _time_ordered
from eroica.producers.simulator import SimConfig, write_jsonl
from eroica.streams.detection import DEFAULT_WINDOW_S, analyze
from eroica.streams.detection.collectives import summarise_collectives
from eroica.streams.cores.detector_core import VERDICTS, DetectorCore
from eroica.streams.cores.summariser_core import SUMMARIES, JobClock, PartitionSummariser

W = int(DEFAULT_WINDOW_S * 1e9)
UNBOUNDED = 1 << 62  # a lateness no input reaches: every window waits for the end of the input

# Small runs (4 nodes x 4 GPUs unless said otherwise, ~40 s of event time: three windows).
SCENARIOS: dict[str, dict] = {
    "nic": dict(faults=["nic:node=node-2,nic=1"], seed=3),
    "gpu_throttle": dict(faults=["gpu_throttle:rank=6"], seed=1),
    "nvlink": dict(faults=["nvlink:rank=9"], seed=2),
    # every DP ring crosses a congested node: the rings tie, which one the verdict names
    # (its ``fn``) must not depend on the order the rings were seen in
    "congestion": dict(faults=["congestion:nodes=node-1+node-3"], seed=5),
    "pp2": dict(nodes=2, gpus=8, pp=2, faults=["pp_imbalance:stage=1"], seed=4),
    # every rank of a node slow alike: one node-scope finding out of four rank findings
    "dataloader": dict(faults=["dataloader:node=node-1"], seed=4),
    "two_faults": dict(faults=["gpu_throttle:rank=6", "nic:node=node-2,nic=1"], seed=21),
}
NAMES = sorted(SCENARIOS)

# hypothesis: few examples (each one analyses a whole run), no deadline (a shared CI box)
FEW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Key = tuple[str, str, str, int, str]


def _ids(verdicts: Iterable) -> dict[str, Key]:
    """verdict id -> what the id stands for (component, scope, node, rank, fn)."""
    return {v.verdict_id: (v.component, v.scope, v.node, v.rank, v.fn) for v in verdicts}


def _diff(want: dict[str, Key], got: dict[str, Key]) -> str:
    lines = [f"  only in {'reference' if k in want else 'this run'}: {k[:12]} {want.get(k) or got.get(k)}"
             for k in sorted(set(want) ^ set(got))]
    lines += [f"  same id, different finding: {k[:12]} {want[k]} vs {got[k]}"
              for k in sorted(set(want) & set(got)) if want[k] != got[k]]
    return "\n".join(lines)


def _same(want: dict[str, Key], got: dict[str, Key], what: str) -> None:
    assert got == want, f"{what}: verdicts differ from the reference\n{_diff(want, got)}"


@dataclass
class Run:
    """One simulated run: its file, its lines with what the permutations need, the reference ids."""

    name: str
    path: Path
    lines: list[bytes]
    ts: np.ndarray          # event time per line (job record: the run's first timestamp)
    type: list[str]
    owner: list[str]        # rank for fn / gpu records, node for nic / host ones, "job" for the job record
    reference: dict[str, Key]


class _Line(msgspec.Struct):
    type: str
    ts_ns: int = -1
    rank: int = -1
    node: str = ""


def _load(name: str, path: Path) -> Run:
    lines = [ln for ln in path.read_bytes().split(b"\n") if ln.strip()]
    dec = msgspec.json.Decoder(_Line)
    recs = [dec.decode(ln) for ln in lines]
    ts = np.array([r.ts_ns for r in recs], dtype=np.int64)
    ts[ts < 0] = ts[ts >= 0].min()
    owner = [f"rank {r.rank}" if r.rank >= 0 else (r.node or "job") for r in recs]
    ref = _ids(analyze(read_batches(path), W))
    return Run(name, path, lines, ts, [r.type for r in recs], owner, ref)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    base = tmp_path_factory.mktemp("determinism")
    out = {}
    for name, kw in SCENARIOS.items():
        cfg = SimConfig(**{"nodes": 4, "gpus": 4, "steps": 60, **kw}, job=f"det-{name}")
        path = base / f"{name}.jsonl"
        write_jsonl(cfg, path, truth_path=False)
        out[name] = _load(name, path)
    return out


def _write(path: Path, lines: Iterable[bytes]) -> Path:
    path.write_bytes(b"".join(ln + b"\n" for ln in lines))
    return path


def _batches(paths: Iterable[Path], batch_records: int) -> Iterator[Batch]:
    for p in paths:
        yield from read_batches(p, batch_records=batch_records)


def _scratch(run: Run, tag: str) -> Path:
    d = run.path.parent / f"{run.name}-{tag}"
    d.mkdir(exist_ok=True)
    return d


def test_the_scenarios_find_their_faults(runs: dict[str, Run]) -> None:
    """The comparisons below mean something only where there are verdicts to compare."""
    for run in runs.values():
        assert run.reference, f"{run.name}: no verdict"


# --- batch: shuffles, batch sizes, several files ------------------------------------------------

@FEW
@given(name=st.sampled_from(NAMES), seed=st.integers(0, 2**32 - 1),
       batch_records=st.sampled_from([300, 4096, 65536]))
def test_records_moved_by_less_than_the_lateness_give_the_same_ids(
        runs: dict[str, Run], name: str, seed: int, batch_records: int) -> None:
    """Any record may arrive up to (not quite) one window late: the default lateness absorbs it."""
    run = runs[name]
    rng = np.random.default_rng(seed)
    order = np.argsort(run.ts + rng.integers(0, int(0.98 * W), run.ts.size), kind="stable")
    path = _write(_scratch(run, "bounded") / "run.jsonl", (run.lines[i] for i in order))
    _same(run.reference, _ids(analyze(read_batches(path, batch_records=batch_records), W)),
          f"{name}, records moved < lateness (seed {seed}, batches of {batch_records})")


@FEW
@given(name=st.sampled_from(NAMES), seed=st.integers(0, 2**32 - 1))
def test_any_order_with_an_unbounded_lateness_gives_the_same_ids(
        runs: dict[str, Run], name: str, seed: int) -> None:
    run = runs[name]
    order = np.random.default_rng(seed).permutation(len(run.lines))
    path = _write(_scratch(run, "shuffled") / "run.jsonl", (run.lines[i] for i in order))
    _same(run.reference, _ids(analyze(read_batches(path, batch_records=8192), W, lateness_ns=UNBOUNDED)),
          f"{name}, fully shuffled (seed {seed})")


def _split(run: Run, how: str, files: int, seed: int) -> list[list[int]]:
    """Line indices per file, each file in the run's order."""
    if how == "rank":      # one file per rank, one per node for its NIC and host counters
        key = run.owner
    elif how == "type":    # functions, GPU, NIC and host samples, the job record: one file each
        key = run.type
    else:                  # every line to one of ``files`` files at random
        key = np.random.default_rng(seed).integers(0, files, len(run.lines)).tolist()
    parts: dict = defaultdict(list)
    for i, k in enumerate(key):
        parts[k].append(i)
    out = list(parts.values())
    random.Random(seed).shuffle(out)  # the files come in any order
    return out


def _merged_by_time(paths: list[Path], batch_records: int) -> Iterator[Batch]:
    """Several inputs merged by time, as ``eroica analyze`` reads several files."""
    return read_merged(list(paths), batch_records=batch_records)


@FEW
@given(name=st.sampled_from(NAMES), how=st.sampled_from(["rank", "type", "random"]),
       files=st.integers(2, 6), seed=st.integers(0, 2**32 - 1))
def test_the_same_records_in_several_files_give_the_same_ids(
        runs: dict[str, Run], name: str, how: str, files: int, seed: int) -> None:
    """Split by rank, by record type or at random; read one after the other (so later files are
    behind the watermark: unbounded lateness) and side by side in time (default lateness)."""
    run = runs[name]
    d = _scratch(run, f"split-{how}-{seed}")
    paths = [_write(d / f"part{i}.jsonl", (run.lines[j] for j in idx))
             for i, idx in enumerate(_split(run, how, files, seed))]
    _same(run.reference, _ids(analyze(_batches(paths, 8192), W, lateness_ns=UNBOUNDED)),
          f"{name}, {len(paths)} files split by {how}, one after the other (seed {seed})")
    _same(run.reference, _ids(analyze(_merged_by_time(paths, 64), W)),
          f"{name}, {len(paths)} files split by {how}, merged by time (seed {seed})")


# --- streaming: partitions, frame sizes, interleavings -------------------------------------------

def _messages(run: Run, partitions: int, frame_records: int, batch_records: int,
              salt: str) -> dict[int, list[tuple[str, bytes, int]]]:
    """(key, value, batch number) per partition, as ``eroica replay`` would send the file.

    ``salt`` changes which keys share a partition (another partitioner, another key hash).
    """
    parts: dict[int, list] = defaultdict(list)

    def part(key: str) -> int:
        return zlib.crc32((salt + key).encode()) % partitions

    acc = FrameAccumulator(frame_records, max_lag_ns=MAX_LAG_NS)
    keys: dict[str, tuple[str, int, str]] = {}
    last: dict = {}
    bi = 0
    for bi, batch in enumerate(read_batches(run.path, batch_records=batch_records)):
        for job in batch.jobs:
            parts[part(job.job)].append((job.job, encode_job(job), bi))
        ready = [f for cols in batch.columns.values() for f in acc.add(cols)]
        for f in _time_ordered(ready, last):
            keys.setdefault(f.key, (f.job, f.rank, f.node))
            parts[part(f.key)].append((f.key, encode_frame(f.cols), bi))
    for f in _time_ordered(list(acc.drain()), last):
        keys.setdefault(f.key, (f.job, f.rank, f.node))
        parts[part(f.key)].append((f.key, encode_frame(f.cols), bi + 1))
    for k, (job, rank, node) in keys.items():
        assert k == frame_key(job, rank, node)
        parts[part(k)].append((k, encode_end_of_stream(EndOfStream(job, rank, node, 0, 0, {"job_keys": len(keys)})),
                               bi + 1))
    return parts


def _stream(run: Run, partitions: int, frame_records: int, batch_records: int, seed: int) -> dict[str, Key]:
    """The summariser of each partition and one detector, messages interleaved at random."""
    parts = _messages(run, partitions, frame_records, batch_records, salt=str(seed))
    clock = JobClock()
    sums = {p: PartitionSummariser(f"raw/{p}", W, W, 2 * W, hold_s=0.5, clock=clock) for p in parts}
    det = DetectorCore(grace_s=1e9)  # windows close on completeness only, never on a timeout
    verdicts = []

    def deliver(step, now: float) -> None:
        for s in step.sends:
            if s.topic == SUMMARIES:
                out = det.on_message(s.value, None, 0, now)
                verdicts.extend(decode_verdict(v.value) for v in out.sends if v.topic == VERDICTS)

    rng = random.Random(seed)
    cur = {p: 0 for p in parts}
    while live := [p for p in parts if cur[p] < len(parts[p])]:
        p = rng.choice(live)
        key, value, t = parts[p][cur[p]]
        deliver(sums[p].on_message(key.encode(), value, (p, cur[p]), float(t), offset=cur[p]), float(t))
        cur[p] += 1
        if rng.random() < 0.05:
            for ps in sums.values():
                deliver(ps.tick(float(t)), float(t))
    assert sum(ps.stats.late_records for ps in sums.values()) == 0
    assert det.pending_windows() == 0 and det.stats.late_windows == 0
    return _ids(verdicts)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(NAMES), partitions=st.sampled_from([1, 2, 5]),
       frame_records=st.sampled_from([50, 300, 1000, 4000]), batch_records=st.sampled_from([2048, 8192, 65536]),
       seed=st.integers(0, 2**32 - 1))
def test_streaming_cores_give_the_ids_of_analyze(runs: dict[str, Run], name: str, partitions: int,
                                                  frame_records: int, batch_records: int, seed: int) -> None:
    run = runs[name]
    _same(run.reference, _stream(run, partitions, frame_records, batch_records, seed),
          f"{name} streamed over {partitions} partition(s), frames of {frame_records}, "
          f"reader batches of {batch_records}, interleaving {seed}")


@pytest.mark.parametrize("name", ["congestion", "two_faults"])
def test_one_to_five_partitions_give_the_same_ids(runs: dict[str, Run], name: str) -> None:
    """The runs with ties between communicators, through 1, 2 and 5 partitions for certain."""
    run = runs[name]
    for partitions, frame_records, seed in ((1, 1000, 0), (2, 300, 1), (5, 100, 2)):
        _same(run.reference, _stream(run, partitions, frame_records, 8192, seed),
              f"{name} over {partitions} partition(s)")


# --- the ties themselves ----------------------------------------------------------------------------

def test_communicators_without_a_name_are_named_alike_in_any_record_order() -> None:
    """Unnamed collectives of a step take the op of the step's earliest call, not of the first record."""
    recs = [FnRecord(job="j", node="n", rank=r, step=0, fn=fn, kind="collective", op=op, ts_ns=ts, dur_ns=5,
                     bytes=8)
            for r in (0, 1)
            for fn, op, ts in (("ncclAllReduce", "all_reduce", 100), ("ncclBroadcast", "broadcast", 200))]
    names = set()
    for order in (recs, recs[::-1], recs[1::2] + recs[0::2]):
        rows = summarise_collectives(from_records("fn", order))
        names.add(tuple(sorted(zip(rows.rank, rows.group))))
    assert names == {((0, "*all_reduce"), (1, "*all_reduce"))}


@pytest.fixture(scope="module")
def two_regressions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two kernels regress by the same factor: two software findings with the same (capped) confidence."""
    path = tmp_path_factory.mktemp("determinism-ties") / "two-regressions.jsonl"
    write_jsonl(SimConfig(nodes=4, gpus=4, steps=120, seed=11, job="det-two-regressions", faults=[
        "kernel_regression:fn=flash_fwd_kernel,start=40,factor=2",
        "kernel_regression:fn=flash_bwd_kernel,start=40,factor=2"]), path, truth_path=False)
    return path


def test_equally_confident_findings_of_one_culprit_give_the_same_ids(two_regressions: Path) -> None:
    """Both regressions reach the capped confidence: which function the verdict names is a tie.

    Reversed, the records meet the functions in the other order; streamed, each
    partition's digest lists its own ranks' functions first.
    """
    want = _ids(analyze(read_batches(two_regressions), W))
    assert {k[0] for k in want.values()} == {"software"}
    lines = [ln for ln in two_regressions.read_bytes().split(b"\n") if ln.strip()]
    rev = _write(two_regressions.with_name("reversed.jsonl"), reversed(lines))
    _same(want, _ids(analyze(read_batches(rev), W, lateness_ns=UNBOUNDED)), "two regressions, reversed")
    run = _load("two-regressions", two_regressions)
    _same(want, _stream(run, 3, 300, 8192, 0), "two regressions over 3 partitions")


# Hangs, by hand: four ranks, five healthy 1 s steps, then ranks 1-3 wait in an all-reduce
# for 19 s while rank 0 is stuck elsewhere. Timestamps on a microsecond clock (as Kineto's)
# make equal instants ordinary.
_S = 10**9
_T0 = 1_763_000_000 * _S


def _hang_records(rank0_dumped: bool) -> list[dict]:
    out: list[dict] = [{"type": "job", "job": "tie", "world_size": 4, "rank_nodes": ["n0", "n0", "n1", "n1"]}]
    for r in range(4):
        node = "n0" if r < 2 else "n1"
        for s in range(5):
            t = _T0 + s * _S
            base = dict(type="fn", job="tie", node=node, rank=r, step=s)
            out += [
                {**base, "fn": "train_step", "kind": "python", "ts_ns": t, "dur_ns": _S},
                # the GPU busy from the step's start: the host holds only the optimizer's 10%
                {**base, "fn": "gemm", "kind": "kernel", "ts_ns": t, "dur_ns": 6 * _S // 10},
                {**base, "fn": "allreduce", "kind": "collective", "op": "all_reduce", "group": "world",
                 "ts_ns": t + 6 * _S // 10, "dur_ns": 3 * _S // 10, "bytes": 1 << 20},
                # ends with its enclosing step frame, at the same instant
                {**base, "fn": "optimizer.step", "kind": "optimizer", "ts_ns": t + 9 * _S // 10, "dur_ns": _S // 10},
            ]
        base = dict(type="fn", job="tie", node=node, rank=r, step=5, in_flight=True)
        if r > 0:
            out.append({**base, "fn": "allreduce", "kind": "collective", "op": "all_reduce", "group": "world",
                        "ts_ns": _T0 + 5 * _S + 6 * _S // 10, "dur_ns": 19 * _S})
        elif rank0_dumped:  # stuck in two frames that started at the same instant
            out += [{**base, "fn": "train_step", "kind": "python", "ts_ns": _T0 + 5 * _S, "dur_ns": 20 * _S},
                    {**base, "fn": "DataLoader.__next__", "kind": "dataloader", "ts_ns": _T0 + 5 * _S,
                     "dur_ns": 20 * _S}]
    return out


def _hang_ids(tmp_path: Path, records: list[dict]) -> dict[str, Key]:
    path = _write(tmp_path / "hang.jsonl", (msgspec.json.encode(r) for r in records))
    return _ids(analyze(read_batches(path), W, lateness_ns=UNBOUNDED))


def test_a_rank_missing_from_a_hang_dump_is_named_alike_in_any_order(tmp_path: Path) -> None:
    recs = _hang_records(rank0_dumped=False)
    want = _hang_ids(tmp_path, recs)
    assert [k[:4] for k in want.values()] == [("python", "rank", "n0", 0)]
    _same(want, _hang_ids(tmp_path, recs[:1] + recs[:0:-1]), "hang records reversed")


def test_two_equally_long_stuck_functions_are_named_alike_in_any_order(tmp_path: Path) -> None:
    recs = _hang_records(rank0_dumped=True)
    want = _hang_ids(tmp_path, recs)
    assert [k[1:4] for k in want.values()] == [("rank", "n0", 0)]
    _same(want, _hang_ids(tmp_path, recs[:1] + recs[:0:-1]), "hang records reversed")


def test_every_split_covers_each_line_once() -> None:
    """Guard for the helper above: a split loses or repeats no line."""
    run = Run("x", Path("x"), [b"a"] * 10, np.arange(10), ["fn"] * 10, [f"rank {i % 3}" for i in range(10)], {})
    for how in ("rank", "type", "random"):
        idx = sorted(itertools.chain.from_iterable(_split(run, how, 3, 7)))
        assert idx == list(range(10))


# --- a realistic fleet: long steps that span windows, nuisances, two faults ---------------------------

@pytest.fixture(scope="module")
def realistic_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Seed 6 of the realistic profile draws ~10 s steps: job windows span several time
    windows, so steps cut by window edges are carried and summed in both paths. Its
    collector writes collectives as NCCL kernels (nuisance 13)."""
    path = tmp_path_factory.mktemp("determinism-realistic") / "realistic.jsonl"
    cfg = SimConfig(nodes=4, gpus=4, profile="realistic", seed=6, job="det-realistic",
                    faults=["gpu_throttle:rank=6", "nic:node=node-2,nic=1"])
    write_jsonl(cfg, path, truth_path=False)
    return _load("realistic", path)


def test_realistic_multi_fault_run_streams_to_the_ids_of_analyze(realistic_run: Run) -> None:
    run = realistic_run
    found = {(k[0], k[2], k[3]) for k in run.reference.values()}
    assert ("gpu", "node-1", 6) in found and ("nic", "node-2", -1) in found, found
    for partitions, frame_records, seed in ((1, 1000, 0), (3, 300, 1), (5, 100, 2)):
        _same(run.reference, _stream(run, partitions, frame_records, 8192, seed),
              f"realistic over {partitions} partition(s)")


def test_without_a_job_record_the_stages_read_from_communicators_stream_to_the_ids_of_analyze(
        tmp_path: Path) -> None:
    """Seed 8's collector writes no job record and no stacks: the pipeline stages come from the
    communicators, in every partition split alike."""
    path = tmp_path / "nojob.jsonl"
    cfg = SimConfig(nodes=4, gpus=4, pp=2, profile="realistic", seed=8, job="det-nojob",
                    faults=["pp_imbalance:stage=1,factor=1.5"])
    write_jsonl(cfg, path, truth_path=False)
    assert b'"type":"job"' not in path.read_bytes()
    run = _load("nojob", path)
    assert any(k[0] == "workload" for k in run.reference.values()), run.reference
    for partitions, frame_records, seed in ((1, 1000, 0), (4, 200, 3)):
        _same(run.reference, _stream(run, partitions, frame_records, 8192, seed), f"no job record, {partitions} partition(s)")
