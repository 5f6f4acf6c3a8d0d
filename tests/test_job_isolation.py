"""Jobs are isolated (issue 34, item 3): a job's verdicts depend only on that job's records.

The same job, alone or beside any number of other jobs on the same file or the
same topics and partitions, must get exactly the same verdict ids, in batch
(the reader, ``analyze``) and through the streaming cores
(``PartitionSummariser`` per partition, one ``DetectorCore``), fed as
``eroica replay`` feeds them. The jobs here are chosen to collide wherever
state could be keyed by less than the job: they share node names
(``node-0``, ``node-1``), rank numbers, GPU and NIC names, and overlap in event
time (starts a few seconds apart, not window-aligned), so any state kept per
node, per rank, per window or per stream key without the job would mix them.

The interleavings are what a real stream allows: each job's records keep
their own order (its per-(rank or node, type) streams stay in time order, all
the contract promises), while the jobs are interleaved arbitrarily, in chunks
from one record up. Another job may also contribute only some record types
(the report: a healthy job's ``gpu`` or ``nic`` records alone beside a hang).

The runs are simulated once per module (2 nodes x 4 GPUs: the smallest job the
peer test analyses, whose hang, throttle and slow NIC are still named); hypothesis draws
the interleavings, subsets, batch sizes and partitionings, with few examples
each so the module stays under a minute on a 2-core machine.
"""

from __future__ import annotations

import random
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eroica.kafka.framing import FrameAccumulator
from eroica.models.frames import EndOfStream, encode_end_of_stream, encode_frame, encode_job
from eroica.models.reader import read_batches, read_merged
from eroica.models.verdict import Verdict, decode_verdict
from eroica.producers.replay import MAX_LAG_NS, _time_ordered
from eroica.producers.simulator import SimConfig, write_jsonl
from eroica.producers.simulator.config import DEFAULT_START_NS
from eroica.streams.cores.detector_core import VERDICTS, DetectorCore
from eroica.streams.cores.summariser_core import SUMMARIES, JobClock, PartitionSummariser
from eroica.streams.detection import DEFAULT_WINDOW_S, analyze

W = int(DEFAULT_WINDOW_S * 1e9)
S = 10**9

# Every job on the same 2 nodes' names (and NIC names). Three start a few seconds apart, off the window
# grid, so their windows, steps and samples overlap without lining up; the throttled job ran minutes
# earlier, so a job read after it in the stream (whole jobs one after the other are an interleaving
# too) is far behind it in event time: a watermark shared by jobs would make its records late.
# ``hang`` is the report's scenario; ``nic`` is found from NIC counters alone, on node-1's names.
JOBS: dict[str, dict[str, Any]] = {
    "hang": dict(faults=["hang:rank=5"], seed=3, start_ns=DEFAULT_START_NS),
    "healthy": dict(seed=4, start_ns=DEFAULT_START_NS + 7 * S),
    "nic": dict(faults=["nic:node=node-1"], seed=2, start_ns=DEFAULT_START_NS + 3_300_000_000),
    "throttle": dict(faults=["gpu_throttle:rank=2"], seed=1, steps=30, start_ns=DEFAULT_START_NS - 400 * S),
}
NAMES = sorted(JOBS)
HUNG_RANK = 5
TYPES = ("fn", "gpu", "nic", "host", "job")

# a chunk no job reaches: whole jobs one after the other, in a random order
WHOLE = 1 << 30

FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Key = tuple[str, str, str, int, str]


def _ids(verdicts: Iterable[Verdict], job: str) -> dict[str, Key]:
    """One job's verdicts: id -> what the id stands for (kind, component, node, rank, fn)."""
    return {v.verdict_id: (v.kind, v.component, v.node, v.rank, v.fn) for v in verdicts if v.job == job}


@dataclass
class Job:
    """One simulated job: its file, its lines (in the file's order) with their record types, its ids alone."""

    name: str
    path: Path
    lines: list[bytes]
    types: list[str]
    alone: dict[str, Key]

    # hypothesis prints the fixture with a failing example (by fields, for a dataclass): not every line
    def __repr__(self) -> str:
        return f"Job({self.name!r}, {len(self.lines)} lines)"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))


class _Type(msgspec.Struct):
    type: str


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    base = tmp_path_factory.mktemp("isolation")
    out = {}
    dec = msgspec.json.Decoder(_Type)
    for name, kw in JOBS.items():
        path = base / f"{name}.jsonl"
        write_jsonl(SimConfig(nodes=2, gpus=4, job=f"iso-{name}", **kw), path, truth_path=False)
        lines = [ln for ln in path.read_bytes().split(b"\n") if ln.strip()]
        job = f"iso-{name}"
        out[name] = Job(job, path, lines, [dec.decode(ln).type for ln in lines], _ids(analyze(read_batches(path), W), job))
    return out


def test_the_jobs_alone_give_the_verdicts_the_comparisons_need(jobs: dict[str, Job]) -> None:
    """The comparisons mean something only where a job has verdicts to lose: the hang is named at its
    rank, the throttle found, and the healthy job (whose records the others share names with) has none."""
    hang = list(jobs["hang"].alone.values())
    assert [(k, r) for k, _c, _n, r, _f in hang] == [("hang", HUNG_RANK)]
    assert any(r == 2 for _k, _c, _n, r, _f in jobs["throttle"].alone.values())
    assert any((c, n) == ("nic", "node-1") for _k, c, n, _r, _f in jobs["nic"].alone.values())
    assert jobs["healthy"].alone == {}


# --- interleavings ---------------------------------------------------------------------------------

def _riffle(seqs: dict[str, list[Any]], rng: random.Random, max_chunk: int) -> list[Any]:
    """The sequences interleaved at random in chunks of 1..max_chunk items, each sequence in its own order."""
    cur = {k: 0 for k in seqs}
    out: list[Any] = []
    while live := [k for k in sorted(seqs) if cur[k] < len(seqs[k])]:
        k = rng.choice(live)
        n = rng.randint(1, max_chunk)
        out.extend(seqs[k][cur[k]:cur[k] + n])
        cur[k] += n
    return out


def _lines(job: Job, types: frozenset[str]) -> list[bytes]:
    return [ln for ln, t in zip(job.lines, job.types) if t in types]


jobs_st = st.lists(st.sampled_from(NAMES), min_size=1, max_size=len(NAMES), unique=True)
# what a job beside the compared ones contributes: the report's gpu or nic records alone, or everything
part_st = st.sampled_from([frozenset({"gpu"}), frozenset({"nic"}), frozenset({"gpu", "nic"}),
                           frozenset({"host", "job"}), frozenset(TYPES)])


# --- batch -----------------------------------------------------------------------------------------

@FEW
@given(whole=jobs_st, parts=st.fixed_dictionaries({n: part_st for n in NAMES}), seed=st.integers(0, 2**32 - 1),
       max_chunk=st.sampled_from([1, 40, 3000, WHOLE]), batch_records=st.sampled_from([500, 8192]),
       files=st.booleans())
def test_batch_verdicts_of_a_job_do_not_depend_on_the_other_jobs(
        jobs: dict[str, Job], whole: list[str], parts: dict[str, frozenset[str]], seed: int, max_chunk: int,
        batch_records: int, files: bool, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The ``whole`` jobs with all their records and every other job with some of its record types,
    interleaved in one file (or one file per job, merged by time as ``eroica analyze`` reads
    several): each whole job gets exactly its ids alone."""
    rng = random.Random(seed)
    seqs = {n: _lines(jobs[n], frozenset(TYPES) if n in whole else parts[n]) for n in NAMES}
    d = tmp_path_factory.mktemp("batch")
    if files:
        paths = []
        for n, ls in seqs.items():
            if ls:
                paths.append(d / f"{n}.jsonl")
                paths[-1].write_bytes(b"".join(ln + b"\n" for ln in ls))
        rng.shuffle(paths)
        verdicts = list(analyze(read_merged(list(paths), batch_records=batch_records), W))
    else:
        path = d / "mixed.jsonl"
        path.write_bytes(b"".join(ln + b"\n" for ln in _riffle(seqs, rng, max_chunk)))
        verdicts = list(analyze(read_batches(path, batch_records=batch_records), W))
    for n in whole:
        assert _ids(verdicts, jobs[n].name) == jobs[n].alone, (
            f"{n} beside {({m: sorted(parts[m]) for m in NAMES if m not in whole})} and {whole}, "
            f"{'one file per job' if files else f'chunks of up to {max_chunk}'}, batches of {batch_records}")


# --- streaming -------------------------------------------------------------------------------------

Msg = tuple[str, bytes]


def _messages(job: Job, types: frozenset[str], partitions: int, salt: str) -> dict[int, list[Msg]]:
    """(key, value) per partition of one job's records of ``types``, as ``eroica replay`` sends them:
    frames per key in event-time order, job records keyed by the job, an end-of-stream marker per key
    that counts the job's own keys (``job_keys``, per job as replay counts them)."""
    parts: dict[int, list[Msg]] = defaultdict(list)

    def part(key: str) -> int:
        return zlib.crc32((salt + key).encode()) % partitions

    acc = FrameAccumulator(1000, max_lag_ns=MAX_LAG_NS)
    keys: dict[str, tuple[str, int, str]] = {}
    last: dict[tuple[str, str], int] = {}
    for batch in read_batches(job.path, batch_records=4096):
        if "job" in types:
            for rec in batch.jobs:
                parts[part(rec.job)].append((rec.job, encode_job(rec)))
        ready = [f for cols in batch.columns.values() if cols.type in types for f in acc.add(cols)]
        for f in _time_ordered(ready, last):
            keys.setdefault(f.key, (f.job, f.rank, f.node))
            parts[part(f.key)].append((f.key, encode_frame(f.cols)))
    for f in _time_ordered(list(acc.drain()), last):
        keys.setdefault(f.key, (f.job, f.rank, f.node))
        parts[part(f.key)].append((f.key, encode_frame(f.cols)))
    for k, (job_id, rank, node) in keys.items():
        eos = EndOfStream(job_id, rank, node, 0, 0, {"job_keys": len(keys)})
        parts[part(k)].append((k, encode_end_of_stream(eos)))
    return parts


def _stream(parts: dict[int, list[Msg]], partitions: int, seed: int) -> list[Verdict]:
    """Every partition's summariser and one detector, the partitions' messages interleaved at random.

    The wall clock advances 10 ms a message (a paced replay), so the summariser's hold (0.5 s) lets
    frames of other jobs and types in between; the detector never times a window out (its grace is
    unbounded), so every window is analysed complete, as in batch.
    """
    clock = JobClock()
    sums = {p: PartitionSummariser(f"raw/{p}", W, W, 2 * W, hold_s=0.5, clock=clock) for p in range(partitions)}
    det = DetectorCore(grace_s=1e9)
    verdicts: list[Verdict] = []

    def deliver(step: Any, now: float) -> None:
        for s in step.sends:
            if s.topic == SUMMARIES:
                out = det.on_message(s.value, None, 0, now)
                verdicts.extend(decode_verdict(v.value) for v in out.sends if v.topic == VERDICTS)

    rng = random.Random(seed)
    cur = {p: 0 for p in parts}
    n = 0
    while live := [p for p in sorted(parts) if cur[p] < len(parts[p])]:
        p = rng.choice(live)
        key, value = parts[p][cur[p]]
        now = n * 0.01
        deliver(sums[p].on_message(key.encode(), value, (p, cur[p]), now, offset=cur[p]), now)
        cur[p] += 1
        n += 1
        if rng.random() < 0.05:
            for ps in sums.values():
                deliver(ps.tick(now), now)
    for ps in sums.values():  # the holds still running at the end of the input
        deliver(ps.tick(n * 0.01 + 1.0), n * 0.01 + 1.0)
    assert sum(ps.stats.late_records for ps in sums.values()) == 0
    assert det.pending_windows() == 0 and det.stats.late_windows == 0
    return verdicts


def _mixed(jobs: dict[str, Job], types: dict[str, frozenset[str]], partitions: int, seed: int,
           max_chunk: int) -> dict[int, list[Msg]]:
    """The jobs' messages on the same partitions: per partition, each job's messages in its own
    order, the jobs interleaved at random (producers of different jobs are independent)."""
    rng = random.Random(seed)
    per_job = {n: _messages(jobs[n], types[n], partitions, salt=str(seed)) for n in types}
    return {p: _riffle({n: m.get(p, []) for n, m in per_job.items()}, rng, max_chunk) for p in range(partitions)}


def test_stream_verdicts_of_each_job_alone_are_those_of_analyze(jobs: dict[str, Job]) -> None:
    """The streaming reference the property below holds each job to: alone, its batch ids."""
    for n in NAMES:
        parts = _mixed(jobs, {n: frozenset(TYPES)}, 3, 0, 40)
        assert _ids(_stream(parts, 3, 0), jobs[n].name) == jobs[n].alone, n


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(whole=jobs_st, parts=st.fixed_dictionaries({n: part_st for n in NAMES}),
       partitions=st.sampled_from([1, 3, 8]), seed=st.integers(0, 2**32 - 1),
       max_chunk=st.sampled_from([1, 40, WHOLE]))
def test_stream_verdicts_of_a_job_do_not_depend_on_the_other_jobs(
        jobs: dict[str, Job], whole: list[str], parts: dict[str, frozenset[str]], partitions: int, seed: int,
        max_chunk: int) -> None:
    """Jobs on the same topics and partitions (one partition: every key of every job together):
    each whole job gets exactly its ids alone, the partial ones contributing what they were drawn."""
    types = {n: frozenset(TYPES) if n in whole else parts[n] for n in NAMES}
    verdicts = _stream(_mixed(jobs, types, partitions, seed, max_chunk), partitions, seed)
    for n in whole:
        assert _ids(verdicts, jobs[n].name) == jobs[n].alone, (
            f"{n} beside {({m: sorted(parts[m]) for m in NAMES if m not in whole})} and {whole}, "
            f"{partitions} partition(s), chunks of up to {max_chunk}, interleaving {seed}")


# --- the report's scenario -------------------------------------------------------------------------

def _hang_verdicts(verdicts: list[Verdict], job: str) -> list[tuple[str, int, str, float]]:
    return [(v.kind, v.rank, v.node, v.confidence) for v in verdicts if v.job == job]


@pytest.mark.parametrize("beside", [frozenset({"gpu"}), frozenset({"nic"}), frozenset(TYPES)],
                         ids=["gpu", "nic", "all"])
def test_a_hang_beside_a_healthy_job_names_the_hung_rank(jobs: dict[str, Job], beside: frozenset[str],
                                                         tmp_path: Path) -> None:
    """The report: a hang named at 0.95 alone, with a healthy job's gpu or nic records (or all of
    them) in the same file, in time order, and on the same partitions. Both paths name rank 5 on
    node-1, at the confidence it has alone; the healthy job gets no verdict."""
    hang, healthy = jobs["hang"], jobs["healthy"]
    want = [("hang", HUNG_RANK, "node-1", 0.95)]
    assert _hang_verdicts(list(analyze(read_batches(hang.path), W)), hang.name) == want

    # one file, the two jobs' records in event-time order (a stable sort: each job's own order kept)
    seqs = [(ln, t) for ln, t in zip(hang.lines, hang.types)] + \
           [(ln, t) for ln, t in zip(healthy.lines, healthy.types) if t in beside]
    by_time = sorted(seqs, key=lambda lt: msgspec.json.decode(lt[0]).get("ts_ns", 0))
    path = tmp_path / "two-jobs.jsonl"
    path.write_bytes(b"".join(ln + b"\n" for ln, _t in by_time))
    batch = list(analyze(read_batches(path), W))
    assert _hang_verdicts(batch, hang.name) == want
    assert _hang_verdicts(batch, healthy.name) == []
    assert _ids(batch, hang.name) == hang.alone

    for partitions, seed in ((1, 0), (3, 1)):
        stream = _stream(_mixed(jobs, {"hang": frozenset(TYPES), "healthy": beside}, partitions, seed, 40),
                         partitions, seed)
        assert _hang_verdicts(stream, hang.name) == want, f"{partitions} partition(s)"
        assert _hang_verdicts(stream, healthy.name) == []
        assert _ids(stream, hang.name) == hang.alone
