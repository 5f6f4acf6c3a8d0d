"""Issue 34: one record stamped far from its job's time cannot close, open or stretch the job's windows.

A host record stamped in 2100 made the summariser's watermark leap to it and
close every window of its job (3 of 10 verdicts stored); one stamped 1970
opened a window at the epoch that the job's first job window then grew to
cover (2 ids changed). Both are now rejected with a reason (eventtime.py),
in the stream (summariser, detector) as in batch (the reader), so the
verdict ids are those of the clean file on both paths.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from eroica.models.columns import from_records
from eroica.models.eventtime import FUTURE_SLACK_NS, PAST_SLACK_NS, TimeBounds
from eroica.models.frames import encode_frame
from eroica.models.reader import read_batches
from eroica.models.records import HostRecord, JobRecord

from .test_cores import SCENARIOS, _messages, _Pipeline, _reference, _simulate, _with_line

FUTURE_NS = 4_102_444_800 * 10**9  # 2100-01-01
PAST_NS = 1_000  # 1970


def _host(job: str, node: str, ts_ns: int) -> HostRecord:
    return HostRecord(job=job, node=node, ts_ns=ts_ns, cpu_util_pct=20.0, load1=1.0)


def test_bounds_reject_only_records_beyond_them() -> None:
    now = 1_800_000_000 * 10**9
    b = TimeBounds()
    b.job(JobRecord(job="j", world_size=2, ts_ns=now - 10**12))
    ts = [now, now + FUTURE_SLACK_NS, now + FUTURE_SLACK_NS + 1, now - 10**12 - PAST_SLACK_NS,
          now - 10**12 - PAST_SLACK_NS - 1]
    cols = from_records("host", [_host("j", "n", t) for t in ts])
    out = b.outside(cols, now)
    assert out is not None and out.rows.tolist() == [2, 4]
    assert "after its arrival" in out.reason and "before its job's start" in out.reason
    assert b.outside(cols.take(np.array([0, 1, 3])), now) is None
    # another job without a job record: only the arrival bounds it
    other = from_records("host", [_host("k", "n", 5)])
    assert b.outside(other, now) is None and b.outside(other, None) is None
    # a later job record (a restarted rank 0) does not move the start forward
    b.job(JobRecord(job="j", world_size=2, ts_ns=now))
    assert b.starts["j"] == now - 10**12


@pytest.mark.parametrize("ts_ns", [FUTURE_NS, PAST_NS], ids=["2100", "1970"])
@pytest.mark.parametrize("node", ["node-99", "node-1"], ids=["new-node", "existing-node"])
def test_a_record_far_outside_its_jobs_time_changes_no_verdict(tmp_path: Path, ts_ns: int, node: str) -> None:
    path = _simulate(tmp_path, SCENARIOS[0] + " --start default")
    ref = _reference(path)
    assert ref, "the scenario has verdicts to lose"
    job = json.loads(path.read_bytes().split(b"\n", 1)[0])["job"]
    rec = {"type": "host", "job": job, "node": node, "ts_ns": ts_ns, "cpu_util_pct": 20.0, "load1": 1.0}

    # batch: the reader rejects it with its reason; the verdicts are the clean file's
    odd = _with_line(path, 40, rec, "odd.jsonl")
    rejects = [i for b in read_batches(odd) for i in b.invalid]
    assert len(rejects) == 1 and ("after its arrival" in rejects[0].reason
                                  or "before its job's start" in rejects[0].reason)
    assert _reference(odd) == ref

    # stream: the same record as its own frame, first of its job after the job record, or mid-run
    frame = encode_frame(from_records("host", [_host(job, node, ts_ns)]))
    for partitions, seed, at in ((8, 0, 1), (3, 1, 200), (1, 2, 1)):
        parts = _messages(path, partitions)
        p = 0 if partitions == 1 else sorted(parts)[seed % len(parts)]
        _key, _value, t = parts[p][min(at, len(parts[p]) - 1)]
        parts[p].insert(min(at, len(parts[p])), (f"{job}/{node}", frame, t))
        pipe = _Pipeline(partitions)
        pipe.run(parts, seed)
        # the odd stream never sends an end-of-stream marker: its partition closes the job when it goes idle
        late = float(max(m[-1][2] for m in parts.values())) + 3600.0
        for ps in pipe.sums.values():
            pipe.deliver(ps.tick(late, idle_s=60.0), late)
        pipe.take(pipe.det.due(late))
        assert sorted(v.verdict_id for v in pipe.verdicts) == ref, (partitions, seed, at)
        # dead-lettered with its reason (a partition where its job had ended says so), or counted late
        reasons = [d["reason"] for d in pipe.deadletters]
        late = sum(ps.stats.late_records for ps in pipe.sums.values())
        assert (len(reasons) == 1 and late == 0 and any(r in reasons[0] for r in (
            "after its arrival", "before its job's start", "after its end-of-stream"))) \
            or (not reasons and late == 1), (reasons, late)


def test_a_frame_partly_out_of_time_keeps_its_other_records(tmp_path: Path) -> None:
    """The rows beyond the bound go to the dead letters as a frame of their own; the rest is summarised."""
    from eroica.streams.cores.summariser_core import DEADLETTER, PartitionSummariser

    now = 1_800_000_000 * 10**9
    cols = from_records("host", [_host("j", "n", now - 10**9), _host("j", "n", FUTURE_NS)])
    ps = PartitionSummariser("raw/0", 30 * 10**9, 30 * 10**9, 60 * 10**9)
    step = ps.on_message(b"j/n", encode_frame(cols), "tok", 0.0, 7, arrival_ns=now)
    letters = [s for s in step.sends if s.topic == DEADLETTER]
    assert len(letters) == 1 and ps.stats.out_of_time == 1 and ps.stats.records == 1
    assert "tok" not in step.acks  # held for the kept record's window
    assert ps.stats.corrupt == 0


def test_a_message_read_again_is_processed_but_counted_once() -> None:
    """Issue 34: the summariser counted 160,123 records for 145,442 sent (re-reads after a frozen broker)."""
    from eroica.streams.cores.summariser_core import PartitionSummariser

    now = 1_800_000_000 * 10**9
    frames = [encode_frame(from_records("host", [_host("j", "n", now + i * 10**9)])) for i in range(3)]
    ps = PartitionSummariser("raw/0", 30 * 10**9, 30 * 10**9, 60 * 10**9)
    for off in (0, 1, 2, 1, 2):  # 1 and 2 delivered again
        ps.on_message(b"j/n", frames[off], off, 0.0, off, arrival_ns=now)
    assert (ps.stats.frames, ps.stats.records) == (3, 3)
    # a partition handed to a new owner: the re-read from the commit point is not counted again
    again = PartitionSummariser("raw/0", 30 * 10**9, 30 * 10**9, 60 * 10**9, counted_to=ps.counted_to)
    for off in (1, 2):
        again.on_message(b"j/n", frames[off], off, 0.0, off, arrival_ns=now)
    assert again.stats.records == 0
