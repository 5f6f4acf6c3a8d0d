"""The stream processors' pure cores, without Kafka: same verdicts as ``eroica analyze``, restarts, dead letters.

A small in-memory "Kafka" replays a file the way ``producers/replay.py``
does (frames per key, event-time ordered, end-of-stream markers), spreads the
keys over partitions, and interleaves the partitions at random.
"""

from __future__ import annotations

import json
import random
import time
import zlib
from collections import defaultdict
from pathlib import Path

import msgspec
import numpy as np
import pytest

from eroica.models.columns import from_records
from eroica.models.frames import EndOfStream, encode_end_of_stream, encode_frame, encode_job
from eroica.models.reader import read_batches
from eroica.models.records import FnRecord
from eroica.models.summary import WindowSummary
from eroica.models.verdict import decode_verdict
from eroica.kafka.framing import FrameAccumulator
from eroica.producers.replay import MAX_LAG_NS, _time_ordered
from eroica.streams.detection import analyze
from eroica.streams.detection.history import JobHistory
from eroica.streams.cores.detector_core import (
    PATTERNS,
    VERDICTS,
    DetectorCore,
    JobState,
    decode_state,
    encode_patterns_messages,
    encode_state,
)
from eroica.streams.cores.ingest import RAW, ingest_message
from eroica.streams.cores.digest_messages import DigestMsg, MessageError, decode_message, encode_message
from eroica.streams.faust.settings import WorkerSettings
from eroica.streams.cores.summariser_core import (DEADLETTER, RECOVERY_GRACE_S, SUMMARIES, InputDrain, JobClock,
                                                  PartitionSummariser)

W = 30 * 10**9


def _simulate(tmp_path: Path, args: str, name: str = "run.jsonl") -> Path:
    from click.testing import CliRunner

    from eroica.cli.main import cli

    out = tmp_path / name
    res = CliRunner().invoke(cli, ["simulate", *args.split(), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _messages(path: Path, partitions: int, declare: bool = False) -> dict[int, list[tuple[str, bytes, int]]]:
    """(key, value, batch number) per partition, as replay would send them (batch number ~ wall clock);
    ``declare``: each frame carries its stream's watermark, as ``replay --declare-watermarks`` does."""
    parts: dict[int, list] = defaultdict(list)
    declared: dict[tuple[str, str], int] = {}

    def encode(f) -> bytes:
        if not declare:
            return encode_frame(f.cols)
        k = (f.key, f.cols.type)
        declared[k] = max(declared.get(k, 0), int(f.cols.arrays["ts_ns"].max()))
        return encode_frame(f.cols, {"wm": declared[k]})

    def part(key: str) -> int:
        return zlib.crc32(key.encode()) % partitions

    acc = FrameAccumulator(1000, max_lag_ns=MAX_LAG_NS)
    keys: dict[str, list] = {}
    last: dict = {}
    bi = 0
    for bi, batch in enumerate(read_batches(path, batch_records=8192)):
        for job in batch.jobs:
            parts[part(job.job)].append((job.job, encode_job(job), bi))
        ready = [f for cols in batch.columns.values() for f in acc.add(cols)]
        for f in _time_ordered(ready, last):
            keys.setdefault(f.key, [f.job, f.rank, f.node])
            parts[part(f.key)].append((f.key, encode(f), bi))
    for f in _time_ordered(list(acc.drain()), last):
        keys.setdefault(f.key, [f.job, f.rank, f.node])
        parts[part(f.key)].append((f.key, encode(f), bi + 1))
    for k, (job, rank, node) in keys.items():
        eos = EndOfStream(job, rank, node, 0, 0, {"job_keys": len(keys)})
        parts[part(k)].append((k, encode_end_of_stream(eos), bi + 1))
    return parts


class _Pipeline:
    """Summarisers (one per partition) and a detector wired in memory; tokens are (partition, index)."""

    def __init__(self, partitions: int, window_ns: int = W, grace_s: float = 1e9) -> None:
        self.window_ns = window_ns
        self.clock = JobClock()
        self.sums = {p: PartitionSummariser(f"raw/{p}", window_ns, window_ns, 2 * window_ns, hold_s=0.5,
                                            clock=self.clock) for p in range(partitions)}
        self.det = DetectorCore(grace_s)
        self.verdicts: list = []
        self.patterns: list = []
        self.deadletters: list = []
        self.acked: dict[int, set] = defaultdict(set)
        self.digest_msgs = 0

    def feed(self, p: int, key: str, value: bytes, token: int, now: float) -> None:
        # arrival: the wall clock, as the worker passes it (the event-time bound's reference)
        self.deliver(self.sums[p].on_message(key.encode(), value, (p, token), now, offset=token,
                                             arrival_ns=time.time_ns()), now)

    def deliver(self, step, now: float) -> None:
        for s in step.sends:
            if s.topic == SUMMARIES:
                self.digest_msgs += 1
                self.take(self.det.on_message(s.value, None, 0, now))
            elif s.topic == DEADLETTER:
                self.deadletters.append(msgspec.json.decode(s.value))
        for p, i in step.acks:
            self.acked[p].add(i)

    def take(self, out) -> None:
        for s in out.sends:
            if s.topic == VERDICTS:
                self.verdicts.append(decode_verdict(s.value))
            elif s.topic == PATTERNS:
                self.patterns.extend(msgspec.msgpack.decode(s.value, type=list[WindowSummary]))
            elif s.topic == DEADLETTER:
                self.deadletters.append(msgspec.json.decode(s.value))

    def run(self, parts: dict, seed: int, start: dict[int, int] | None = None,
            stop: dict[int, int] | None = None, paced_s: float | None = None) -> None:
        """Feed the partitions in a random interleaving; ``now`` is the file batch number, or with
        ``paced_s`` a clock advancing that much per message (a paced replay: no burst per batch)."""
        rng = random.Random(seed)
        n = 0
        cur = dict(start or {p: 0 for p in parts})
        end = stop or {p: len(m) for p, m in parts.items()}
        while True:
            live = [p for p in parts if cur[p] < end[p]]
            if not live:
                break
            p = rng.choice(live)
            key, value, t = parts[p][cur[p]]
            now = float(t) if paced_s is None else n * paced_s
            n += 1
            self.feed(p, key, value, cur[p], now)
            cur[p] += 1
            if rng.random() < 0.05:
                for q, ps in self.sums.items():
                    self.deliver(ps.tick(now), now)


def _reference(path: Path, window_ns: int = W) -> list[str]:
    return sorted(v.verdict_id for v in analyze(read_batches(path), window_ns))


SCENARIOS = [
    "--nodes 2 --gpus 4 --steps 20 --fault gpu_throttle:rank=5 --seed 1",
    "--nodes 4 --gpus 8 --steps 60 --fault nic:node=node-2 --seed 3",
    "--nodes 4 --gpus 8 --steps 60 --fault dataloader:node=node-1 --seed 4",
    "--nodes 4 --gpus 4 --steps 50 --fault hang:rank=3 --seed 4",
    "--nodes 2 --gpus 8 --pp 2 --steps 60 --fault pp_imbalance:stage=1 --seed 4",
]


@pytest.mark.parametrize("args", SCENARIOS)
def test_streaming_cores_give_the_verdicts_of_analyze(tmp_path: Path, args: str) -> None:
    path = _simulate(tmp_path, args)
    ref = _reference(path)
    assert ref, "the scenario should produce verdicts"
    for partitions, seed in ((8, 0), (3, 1)):
        pipe = _Pipeline(partitions)
        parts = _messages(path, partitions)
        pipe.run(parts, seed)
        assert sorted(v.verdict_id for v in pipe.verdicts) == ref
        assert sum(ps.stats.late_records for ps in pipe.sums.values()) == 0
        assert pipe.det.stats.late_windows == 0 and pipe.det.pending_windows() == 0
        # every message is acknowledged once everything closed
        assert all(pipe.acked[p] == set(range(len(m))) for p, m in parts.items())
        assert {r.job for r in pipe.patterns} == {v.job for v in pipe.verdicts}


@pytest.mark.parametrize("args", [SCENARIOS[0], SCENARIOS[2]])
def test_every_message_delivered_twice_gives_the_verdicts_of_analyze(tmp_path: Path, args: str) -> None:
    """An at-least-once producer re-sends: each message twice, the copy right after it
    (``streams/detection/repeats.py`` drops the copies as windows close)."""
    from prometheus_client import REGISTRY

    def dropped() -> float:  # the summariser's metric (eroica_records_dropped_total{reason="repeated"})
        return REGISTRY.get_sample_value("eroica_records_dropped_total",
                                         {"component": "summariser", "reason": "repeated"}) or 0.0

    path = _simulate(tmp_path, args)
    ref = _reference(path)
    pipe = _Pipeline(3)
    before = dropped()
    pipe.run({p: [m for m in msgs for _ in (0, 1)] for p, msgs in _messages(path, 3).items()}, 2)
    assert sorted(v.verdict_id for v in pipe.verdicts) == ref
    repeated = sum(ps.stats.repeated_records for ps in pipe.sums.values())
    records = sum(ps.stats.records for ps in pipe.sums.values())
    assert repeated == records // 2 and sum(ps.stats.late_records for ps in pipe.sums.values()) == 0
    assert dropped() - before == repeated


@pytest.mark.parametrize("args", [SCENARIOS[0], SCENARIOS[1], SCENARIOS[4]])
def test_declared_watermarks_give_the_verdicts_of_analyze(tmp_path: Path, args: str) -> None:
    """Frames that declare their streams' watermarks close windows without the lateness allowance;
    nothing is late and the verdicts are still exactly analyze's."""
    path = _simulate(tmp_path, args)
    for partitions, seed in ((8, 0), (3, 1)):
        pipe = _Pipeline(partitions)
        pipe.run(_messages(path, partitions, declare=True), seed, paced_s=0.05)
        assert sum(ps.stats.late_records for ps in pipe.sums.values()) == 0
        assert sorted(v.verdict_id for v in pipe.verdicts) == _reference(path)


def test_declared_watermarks_close_windows_earlier(tmp_path: Path) -> None:
    """Half-way through a 60-step input, more windows are out with declarations than without."""
    path = _simulate(tmp_path, SCENARIOS[1])
    half: dict[bool, int] = {}
    for declare in (False, True):
        parts = _messages(path, 3, declare=declare)
        pipe = _Pipeline(3)
        pipe.run(parts, 1, stop={p: len(m) // 2 for p, m in parts.items()}, paced_s=0.05)
        half[declare] = sum(ps.stats.digests for ps in pipe.sums.values())
    assert half[True] > half[False], half


def test_smaller_windows_match_analyze_with_the_same_window(tmp_path: Path) -> None:
    path = _simulate(tmp_path, SCENARIOS[1])
    pipe = _Pipeline(8, window_ns=10 * 10**9)
    pipe.run(_messages(path, 8), 2)
    assert sorted(v.verdict_id for v in pipe.verdicts) == _reference(path, 10 * 10**9)


@pytest.mark.parametrize("window_s", [5, 10])
def test_paced_replay_with_small_windows_loses_no_record(tmp_path: Path, window_s: int) -> None:
    """Frames of a sparse rank span ~30 s of event time; windows of 5 s must still get all their records."""
    path = _simulate(tmp_path, SCENARIOS[1])
    pipe = _Pipeline(8, window_ns=window_s * 10**9)
    pipe.run(_messages(path, 8), 3, paced_s=0.05)
    assert sum(ps.stats.late_records for ps in pipe.sums.values()) == 0
    assert sorted(v.verdict_id for v in pipe.verdicts) == _reference(path, window_s * 10**9)


def _fn_rows(digests) -> list[tuple]:
    """Every function row of some digests of one time window, in a canonical order."""
    return sorted((r, f, st, k, s, c, t, e, p) for d in digests for r, f, st, k, s, c, t, e, p in zip(
        d.fns.rank, d.fns.fn, d.fns.stack, d.fns.kind, d.fns.step, d.fns.count, d.fns.total_ns, d.fns.excl_ns,
        d.fns.per_step_ns))


def test_stream_digests_carry_spans_across_window_ends_as_batch_does(tmp_path: Path) -> None:
    """5 s windows on 0.85 s steps: every window's end cuts a step frame on every rank, whose own time
    past it goes to the next window (continuations). The partitions' digests of each window, side by
    side, are row for row the digest ``eroica analyze`` builds, and a frame is acknowledged only once the
    last window its spans reach is summarised (its token is what a restart re-reads from)."""
    from eroica.streams.detection import analyze_windows

    window_ns = 5 * 10**9
    path = _simulate(tmp_path, SCENARIOS[1])
    batch = {d.start_ns: _fn_rows([d]) for d, _ in analyze_windows(read_batches(path), window_ns)}
    pipe = _Pipeline(4, window_ns=window_ns)
    stream: dict[int, list] = defaultdict(list)
    deliver = pipe.deliver

    def keep(step, now: float) -> None:
        for s in step.sends:
            if s.topic == SUMMARIES:
                msg = decode_message(s.value)
                if isinstance(msg, DigestMsg):
                    stream[msg.start_ns].append(msg.digest)
        deliver(step, now)

    pipe.deliver = keep  # type: ignore[method-assign]
    pipe.run(_messages(path, 4), 7)
    assert sorted(stream) == sorted(batch)
    crossing = 0
    for start, rows in batch.items():
        assert _fn_rows(stream[start]) == rows, start
        crossing += sum(1 for r in rows if r[5] == 0)   # rows of continuations only (no call of their own)
    assert crossing or any(r[7] > 0 for rows in batch.values() for r in rows if r[1] == "train_step")


def test_a_window_of_continuations_alone_is_analysed_in_the_stream_as_in_batch(tmp_path: Path) -> None:
    """Every rank inside one 70 s step frame: the window [30 s, 60 s) holds continuations only. Its
    digest reports no record received (delivery accounting counts records), carries batch's rows,
    and the detector analyses it as batch does."""
    from eroica.streams.detection import analyze_windows

    lines = []
    for r in range(4):
        for step, (t0, dur) in enumerate(((0.0, 70.0), (70.0, 1.0), (71.0, 1.0), (72.0, 1.0), (73.0, 1.0))):
            rec = {"type": "fn", "job": "long", "node": "n0", "rank": r, "step": step, "fn": "train_step",
                   "kind": "python", "ts_ns": int((1000 + t0) * 1e9), "dur_ns": int(dur * 1e9)}
            lines += [json.dumps(rec), json.dumps({**rec, "fn": "gemm", "kind": "kernel", "dur_ns": int(0.5e9)})]
    path = tmp_path / "long.jsonl"
    path.write_text("\n".join(lines) + "\n")
    batch = {d.start_ns: _fn_rows([d]) for d, _ in analyze_windows(read_batches(path), W)}
    middle = 1020 * 10**9
    assert batch[middle] and all(row[5] == 0 for row in batch[middle])   # continuations only
    pipe = _Pipeline(1)
    sent: dict[int, list] = defaultdict(list)
    deliver = pipe.deliver

    def keep(step, now: float) -> None:
        for s in step.sends:
            if s.topic == SUMMARIES and isinstance(msg := decode_message(s.value), DigestMsg):
                sent[msg.start_ns].append(msg)
        deliver(step, now)

    pipe.deliver = keep  # type: ignore[method-assign]
    pipe.run(_messages(path, 1), 0)
    assert [m.records for m in sent[middle]] == [0]
    assert _fn_rows([m.digest for m in sent[middle]]) == batch[middle]
    assert sorted(v.verdict_id for v in pipe.verdicts) == _reference(path)
    assert pipe.det.stats.failed_windows == 0 and pipe.det.stats.windows == len(batch)


def test_a_restarted_summariser_rereading_from_the_commit_point_changes_nothing(tmp_path: Path) -> None:
    path = _simulate(tmp_path, SCENARIOS[1])
    ref = _reference(path, 10 * 10**9)
    parts = _messages(path, 4)
    pipe = _Pipeline(4, window_ns=10 * 10**9)
    half = {p: len(m) // 2 for p, m in parts.items()}
    pipe.run(parts, 5, stop=half)
    # crash: the summarisers lose their memory; each partition resumes at its first unacknowledged message
    commit = {p: min(set(range(len(m))) - pipe.acked[p], default=len(m)) for p, m in parts.items()}
    assert any(commit[p] > 0 for p in parts), "some windows should have closed before the crash"
    pipe.clock = JobClock()
    pipe.sums = {p: PartitionSummariser(f"raw/{p}", 10 * 10**9, 10 * 10**9, 20 * 10**9, hold_s=0.5,
                                        clock=pipe.clock) for p in parts}
    pipe.run(parts, 6, start=commit)
    ids = [v.verdict_id for v in pipe.verdicts]
    assert sorted(set(ids)) == ref and len(ids) == len(set(ids))
    assert pipe.det.stats.duplicate_digests + pipe.det.stats.late_windows > 0  # windows were sent again


def test_a_restarted_detector_resumes_from_its_state(tmp_path: Path) -> None:
    path = _simulate(tmp_path, SCENARIOS[1])
    ref = _reference(path, 10 * 10**9)
    parts = _messages(path, 4)
    pipe = _Pipeline(4, window_ns=10 * 10**9)
    # collect the summaries messages, then feed the detector up to a crash point and again from its state
    summaries: list[bytes] = []
    pipe.det.on_message = lambda value, *a, **k: (summaries.append(value), type(pipe.det).on_message(  # type: ignore
        pipe.det, value, len(summaries) - 1, 0, 0.0))[1]
    outs = []
    pipe.take = outs.append  # type: ignore
    pipe.run(parts, 7)
    det = DetectorCore(1e9)
    acked: set[int] = set()
    saved: dict[str, bytes] = {}
    verdicts = []
    # crash just after the first window's verdicts: some windows done, some digests still to read again
    # (where that falls in the message order depends on which partitions the keys hash to)
    first = next(i for i, o in enumerate(outs) if any(s.topic == VERDICTS for s in o.sends))
    crash = min(first + 2, len(summaries) - 1)
    for i, value in enumerate(summaries[:crash]):
        out = det.on_message(value, i, 0, 0.0)
        verdicts += [decode_verdict(s.value).verdict_id for s in out.sends if s.topic == VERDICTS]
        saved.update({st.job: encode_state(st) for st in out.persist})
        acked.update(out.acks)
    restart = min(set(range(len(summaries))) - acked)
    assert verdicts and saved and 0 < restart < crash  # some windows done, some digests to read again
    det2 = DetectorCore(1e9)
    for data in saved.values():
        det2.restore(decode_state(data))
    for i in range(restart, len(summaries)):
        out = det2.on_message(summaries[i], i, 0, 0.0)
        verdicts += [decode_verdict(s.value).verdict_id for s in out.sends if s.topic == VERDICTS]
    assert sorted(set(verdicts)) == ref


def test_grace_period_analyses_an_incomplete_window_and_late_digests_are_dropped(tmp_path: Path) -> None:
    path = _simulate(tmp_path, SCENARIOS[0])
    parts = _messages(path, 4)
    # keep partition 0 away: its ranks never report
    pipe = _Pipeline(4, grace_s=5.0)
    pipe.run({p: m for p, m in parts.items() if p != 0}, 1)
    assert not pipe.verdicts and pipe.det.pending_windows() > 0
    pipe.take(pipe.det.due(now=1.0))
    assert not pipe.verdicts
    pipe.take(pipe.det.due(now=1e6))
    assert pipe.det.pending_windows() == 0 and pipe.det.stats.forced_windows > 0
    # partition 0 finally reports: its digests are late, counted and dropped
    before = len(pipe.verdicts)
    pipe.run({0: parts[0]}, 2)
    assert pipe.det.stats.late_windows > 0 and len(pipe.verdicts) == before


def test_a_held_grace_waits_for_digests_an_outage_held_up(tmp_path: Path) -> None:
    """While the broker is away (and for the delivery timeout after), an incomplete window is not
    forced: the missing partition's digests then arrive in time and the verdicts are analyze's."""
    path = _simulate(tmp_path, SCENARIOS[0])
    parts = _messages(path, 4)
    pipe = _Pipeline(4, grace_s=5.0)
    pipe.det.hold_grace(float("inf"))                       # the probe saw the broker go
    pipe.run({p: m for p, m in parts.items() if p != 0}, 1)
    pipe.take(pipe.det.due(now=1e6))
    assert not pipe.verdicts and pipe.det.stats.forced_windows == 0
    pipe.det.hold_grace(2e6, replace=True)                  # back: the publishers' delivery timeout
    pipe.take(pipe.det.due(now=1.5e6))
    assert pipe.det.stats.forced_windows == 0
    pipe.run({0: parts[0]}, 2)
    assert sorted(v.verdict_id for v in pipe.verdicts) == _reference(path)
    assert pipe.det.stats.forced_windows == 0 and pipe.det.stats.late_windows == 0


def test_corrupt_frames_are_dead_lettered_and_the_partition_goes_on(tmp_path: Path) -> None:
    path = _simulate(tmp_path, SCENARIOS[0])
    parts = _messages(path, 2)
    for bad in (b"not a frame", b"EF\x01Cgarbage", b'{"type":"fn"}', b"EF\x09C"):
        parts[0].insert(1, ("sim-1/0", bad, 0))
    pipe = _Pipeline(2)
    pipe.run(parts, 3)
    assert sorted(v.verdict_id for v in pipe.verdicts) == _reference(path)
    assert len(pipe.deadletters) == 4
    reasons = " ".join(d["reason"] for d in pipe.deadletters)
    assert "not an Eroica frame" in reasons and "corrupt columns frame" in reasons
    assert "unsupported frame format version" in reasons
    # the one dead-letter form of a consumed message (kafka/deadletter.py): topic, partition, offset, key
    assert all(d["source"] == "raw" and d["partition"] == 0 and d["line"] == d["offset"] >= 0 and d["key"] == "sim-1/0"
               for d in pipe.deadletters)


def test_detector_dead_letters_foreign_messages() -> None:
    det = DetectorCore(1.0)
    out = det.on_message(b"\x93\x01\x02\x03", "tok", 3, 0.0, offset=7, source="s")
    assert out.acks == ["tok"] and len(out.sends) == 1 and out.sends[0].topic == "deadletter"
    doc = msgspec.json.decode(out.sends[0].value)
    assert (doc["source"], doc["partition"], doc["line"], doc["offset"]) == ("s", 3, 7, 7)
    assert "not a summaries message" in doc["reason"]
    with pytest.raises(MessageError):
        decode_message(b"")


def test_ingest_turns_lines_into_frames_and_dead_letters() -> None:
    lines = [
        b'{"type":"job","job":"j","world_size":2}',
        b'{"type":"fn","job":"j","node":"n","rank":0,"step":0,"fn":"f","kind":"kernel","ts_ns":1,"dur_ns":2}',
        b'{"type":"fn","job":"j","node":"n","rank":1,"step":0,"fn":"f","kind":"kernel","ts_ns":1,"dur_ns":-2}',
        b"{not json",
        b'{"type":"gpu","job":"j","node":"n","rank":1,"gpu":0,"ts_ns":5}',
        b"",
    ]
    sends, counts = ingest_message(b"\n".join(lines), "ingest/0@9")
    assert counts == {"lines": 5, "records": 2, "jobs": 1, "invalid": 2, "frames": 2}
    dead = [msgspec.json.decode(s.value) for s in sends if s.topic == DEADLETTER]
    assert [d["line"] for d in dead] == [3, 4] and all(d["source"] == "ingest/0@9" for d in dead)
    assert "dur_ns" in dead[0]["reason"] and "invalid JSON" in dead[1]["reason"]
    assert sorted(s.key for s in sends if s.topic == RAW) == [b"j", b"j/0", b"j/n"]  # the GPU sample: its node's


def test_messages_and_state_round_trip() -> None:
    from eroica.models.digest import WindowDigest

    d = DigestMsg(job="j", start_ns=0, end_ns=10, source="raw/1", keys=["j/0"], closed_through_ns=0,
                  records=5, digest=WindowDigest("j", 0, 10))
    assert decode_message(encode_message(d)) == d
    st = JobState(job="j", partition=2, history=JobHistory(job="j", windows=3, last_start_ns=5), done_through_ns=5)
    assert decode_state(encode_state(st)) == st


def test_frame_accumulator_bounds_event_time_lag() -> None:
    """Sparse streams are not held until 1000 records (or the end), nor cut into frames spanning minutes."""
    recs = [FnRecord(job="j", node="n", rank=r, step=0, fn="f", kind="kernel", ts_ns=t * 10**9, dur_ns=1)
            for t in range(100) for r in ((0, 1) if t % 10 == 0 else (0,))]
    cols = from_records("fn", recs)
    acc = FrameAccumulator(1000, max_lag_ns=5 * 10**9)
    out = []
    for lo in range(0, len(cols), 7):
        out += list(acc.add(cols.take(np.arange(lo, min(lo + 7, len(cols))))))
    out += list(acc.drain())
    assert sum(len(f.cols) for f in out) == len(cols)
    for f in out:
        ts = f.cols.arrays["ts_ns"]
        assert ts.max() - ts.min() <= 5 * 10**9


def test_settings_from_env() -> None:
    s = WorkerSettings.from_env({"EROICA_WINDOW_S": "10", "EROICA_WEB_PORT": "off", "EROICA_LOG_LEVEL": "WARNING",
                                 "EROICA_INGEST": "0", "EROICA_DATA_DIR": "/tmp/x"})
    assert (s.window_ns, s.lateness_ns, s.max_skew_ns, s.web_port, s.log_level, s.ingest) == \
        (10 * 10**9, 10 * 10**9, 20 * 10**9, None, "warn", False)
    assert s.app_id_for("detector") == "eroica-detector" and s.declared_lateness_ns == 5 * 10**9
    assert WorkerSettings.from_env({"EROICA_DECLARED_LATENESS_S": "2.5"}).declared_lateness_ns == 2_500_000_000
    with pytest.raises(ValueError, match="EROICA_IDLE_CLOSE_S"):
        WorkerSettings.from_env({"EROICA_IDLE_CLOSE_S": "soon"})
    with pytest.raises(ValueError, match="EROICA_WEB_PORT"):
        WorkerSettings.from_env({"EROICA_WEB_PORT": "99999"})


def _with_line(path: Path, at: int, record: dict, name: str) -> Path:
    import json

    lines = path.read_bytes().split(b"\n")
    lines.insert(at, json.dumps(record).encode())
    out = path.with_name(name)
    out.write_bytes(b"\n".join(lines))
    return out


@pytest.mark.parametrize("dur_ns", [7 * 10**18, "max"])
def test_an_extreme_duration_gives_the_same_verdicts_in_batch_and_stream(tmp_path: Path, dur_ns) -> None:
    """Issue 10: one contract-valid ``dur_ns`` of 7e18 made the stream (not the batch) blame two
    innocent ranks as ``python`` at 0.99. Now 7e18 is beyond the contract's bound (one week) and
    rejected with its reason, and a duration at the bound gives the same verdicts on both paths."""
    import json

    from eroica.models.records import MAX_DUR_NS

    path = _simulate(tmp_path, SCENARIOS[0])
    first = json.loads(path.read_bytes().split(b"\n")[50])
    assert first["type"] == "fn"
    rec = {**first, "rank": 3, "kind": "python", "fn": "train.step",
           "dur_ns": MAX_DUR_NS if dur_ns == "max" else dur_ns}
    odd = _with_line(path, 60, rec, "odd.jsonl")
    rejects = [i for b in read_batches(odd) for i in b.invalid]
    if dur_ns == "max":
        assert rejects == []
    else:
        assert len(rejects) == 1 and "$.dur_ns" in rejects[0].reason and "<= 604800000000000" in rejects[0].reason
        assert _reference(odd) == _reference(path)
    ref = _reference(odd)
    for partitions, seed in ((8, 0), (3, 1)):
        pipe = _Pipeline(partitions)
        pipe.run(_messages(odd, partitions), seed)
        assert sorted(v.verdict_id for v in pipe.verdicts) == ref
        assert not any(v.component == "python" and v.confidence >= 0.5 for v in pipe.verdicts
                       if dur_ns != "max")


def test_a_frame_beyond_the_contract_bounds_is_dead_lettered() -> None:
    """A producer that frames without validating (it skips the JSON reader) cannot overflow the summariser."""
    cols = from_records("fn", [FnRecord(job="j", node="n", rank=r, step=0, fn="f", kind="kernel",
                                        ts_ns=10**18, dur_ns=7 * 10**18 if r == 1 else 5) for r in range(3)])
    ps = PartitionSummariser("raw/0", W, W, 2 * W)
    step = ps.on_message(b"j/1", encode_frame(cols), "tok", 0.0, 9)
    assert step.acks == ["tok"] and [s.topic for s in step.sends] == [DEADLETTER]
    doc = msgspec.json.decode(step.sends[0].value)
    assert "dur_ns outside [0, 604800000000000]" in doc["reason"] and doc["line"] == 9


def test_idle_close_waits_while_the_broker_holds_input_back() -> None:
    """A job silent past the idle timeout closes as idle only once its partition is drained: the
    broker answers and every record up to its end offset was read. While the broker is away nothing
    is drained, and its return restarts every job's idle period (its records are still on the way)."""
    cols = from_records("fn", [FnRecord(job="j", node="n", rank=r, step=0, fn="f", kind="kernel",
                                        ts_ns=10**18 + r, dur_ns=5) for r in range(3)])
    clock = JobClock()
    ps = PartitionSummariser("raw/0", W, W, 2 * W, clock=clock)
    ps.on_message(b"j/1", encode_frame(cols), "tok", 0.0, 9)
    clock.saw("j", 0.0)
    drain = InputDrain(clock)
    assert not ps.idle_due(4.0, 5.0) and ps.idle_due(6.0, 5.0)
    assert drain.drained(None, {0: 10}, 6.0) == set()            # broker away: held up, not idle
    assert drain.drained({0: 10}, {0: 10}, 7.0) == set()         # back: a fresh idle period for "j"
    assert not ps.idle_due(11.0, 5.0) and ps.idle_due(12.5, 5.0)
    back = 7.0 + RECOVERY_GRACE_S                                 # publishers' time to resend
    assert drain.drained({0: 10}, {0: 10}, back - 0.1) == set()
    assert drain.drained({0: 12}, {0: 10}, back + 0.1) == set()  # two records not read yet
    assert drain.drained({0: 12}, {0: 12}, back + 0.2) == {0}
    assert ps.tick(back + 0.2, 5.0).sends and ps.stats.idle_closes == 1


def test_an_outage_seen_only_by_the_probe_still_holds_idle_closes() -> None:
    """A broker away for less than the idle timeout: nobody asked whether the input was drained
    meanwhile, only the periodic probe saw it. Once it answers, the publishers' backlog may take
    up to their delivery timeout to arrive, so nothing drains before that much broker uptime."""
    clock = JobClock()
    clock.saw("j", 0.0)
    drain = InputDrain(clock, recovery_grace_s=60.0)
    drain.observe(True, 1.0)
    drain.observe(False, 2.0)
    drain.observe(False, 3.0)                                     # one outage, however many probes
    drain.observe(True, 9.0)
    assert drain.outages == 1 and clock.seen["j"] == 9.0         # a fresh idle period
    assert drain.drained({0: 10}, {0: 10}, 9.0 + 59.0) == set()   # the publishers may still resend
    assert drain.drained({0: 10}, {0: 10}, 9.0 + 60.5) == {0}
    assert InputDrain(clock, recovery_grace_s=1.0).recovery_grace_s == RECOVERY_GRACE_S  # the floor


def test_window_summaries_of_a_large_job_go_out_in_bounded_messages() -> None:
    """A job window's rows grow with the job (~6.3 KB a rank): 8,000 rows in messages of at most
    64 KB, every row once and in order, and a job window small enough stays one message."""
    rows = [WindowSummary(job="j", window_start_ns=0, window_end_ns=W, rank=r // 4, node=f"node-{r // 32}",
                          fn=f"fn-{r % 4}" * (1 + r % 7), kind="kernel", count=r, median_ns=1.0, p90_ns=2.0,
                          p99_ns=3.0, total_ns=4.0, beta=0.1, slowdown_vs_peers=1.0) for r in range(8000)]
    msgs = encode_patterns_messages(rows, max_bytes=64_000)
    assert len(msgs) > 1 and all(len(m) <= 64_000 for m in msgs)
    back = [r for m in msgs for r in msgspec.msgpack.decode(m, type=list[WindowSummary])]
    assert back == rows
    assert len(encode_patterns_messages(rows[:10], max_bytes=64_000)) == 1
