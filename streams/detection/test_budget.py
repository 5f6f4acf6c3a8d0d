"""Issue 34: a job with 100,000 function names is folded to the budget, keeps its ranks' time, hurts no other job."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from eroica.models.digest import FnRows, WindowDigest
from eroica.models.reader import read_batches
from eroica.streams.detection import analyze, analyze_windows
from eroica.streams.detection.budget import MAX_FN_IDENTITIES, fold_fns, folded_name

W = 30 * 10**9


def _simulate(tmp_path: Path, args: str, name: str) -> Path:
    from click.testing import CliRunner

    from eroica.cli.main import cli

    out = tmp_path / name
    res = CliRunner().invoke(cli, ["simulate", *args.split(), "--start", "default", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def heavy_job(tmp_path: Path, names: int = 100_000, job: str = "heavy") -> Path:
    """A healthy 2x2 job whose every rank calls ``names / (ranks * steps)`` differently named metrics a step."""
    base = _simulate(tmp_path, f"--nodes 2 --gpus 2 --steps 40 --seed 5 --job {job}", f"{job}-base.jsonl")
    recs = [json.loads(line) for line in base.read_bytes().splitlines()]
    firsts: dict[tuple[int, int], dict] = {}
    for r in recs:
        if r["type"] == "fn" and r["kind"] == "python":
            firsts.setdefault((r["rank"], r["step"]), r)
    per = -(-names // len(firsts))
    out = list(recs)
    for i, ((rank, step), r) in enumerate(sorted(firsts.items())):
        for k in range(per):
            out.append({"type": "fn", "job": job, "node": r["node"], "rank": rank, "step": step,
                        "fn": f"metric_{i * per + k}", "kind": "python", "ts_ns": r["ts_ns"] + k * 10, "dur_ns": 5})
    out.sort(key=lambda r: r.get("ts_ns", 0))
    path = tmp_path / f"{job}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path


def _rows(n_fns: int, ranks: int = 4, seed: int = 0) -> FnRows:
    rng = np.random.default_rng(seed)
    rank = np.repeat(np.arange(ranks), n_fns)
    fn = [f"f{i}" for _ in range(ranks) for i in range(n_fns)]
    total = rng.uniform(1, 1000, rank.size)
    return FnRows(rank=rank, fn=fn, stack=[""] * rank.size, kind=np.zeros(rank.size, np.int64),
                  count=np.ones(rank.size, np.int64), total_ns=total, excl_ns=total / 2, median_ns=total,
                  p90_ns=total, p99_ns=total, per_step_ns=total, step=np.full(rank.size, -1),
                  steps=np.ones(rank.size, np.int64), low_ns=total)


def test_a_digest_within_the_budget_is_untouched() -> None:
    d = WindowDigest("j", 0, W, fns=_rows(MAX_FN_IDENTITIES))
    assert fold_fns(d) is d


def test_folding_keeps_each_ranks_time_and_the_costliest_functions() -> None:
    rows = _rows(10_000)
    d = WindowDigest("j", 0, W, fns=rows)
    f = fold_fns(d)
    names = set(f.fns.fn)
    assert len(names) <= MAX_FN_IDENTITIES and f.folded == 10_000 - (MAX_FN_IDENTITIES - 1)
    assert folded_name(0) in names
    for r in range(4):  # each rank's summed and exclusive time is kept
        for col in ("total_ns", "excl_ns", "per_step_ns"):
            assert np.isclose(getattr(f.fns, col)[f.fns.rank == r].sum(), getattr(rows, col)[rows.rank == r].sum())
    weight: dict[str, float] = {}
    for name, t in zip(rows.fn, rows.total_ns.tolist()):
        weight[name] = weight.get(name, 0.0) + t
    kept = sorted(weight, key=lambda k: -weight[k])[: MAX_FN_IDENTITIES - 1]
    assert names - {folded_name(0)} == set(kept)


def test_the_fold_does_not_depend_on_row_order() -> None:
    rows = _rows(6_000, seed=3)
    perm = np.random.default_rng(1).permutation(len(rows))
    shuffled = FnRows(**{f: (getattr(rows, f)[perm] if isinstance(getattr(rows, f), np.ndarray)
                             else [getattr(rows, f)[i] for i in perm.tolist()]) for f in FnRows.__struct_fields__})
    a, b = fold_fns(WindowDigest("j", 0, W, fns=rows)), fold_fns(WindowDigest("j", 0, W, fns=shuffled))
    key = lambda d: sorted(zip(d.fns.rank.tolist(), d.fns.fn, d.fns.total_ns.round(6).tolist()))  # noqa: E731
    assert key(a) == key(b)


def test_max_rows_bounds_a_digest_for_its_message() -> None:
    f = fold_fns(WindowDigest("j", 0, W, fns=_rows(3_000)), max_rows=2_000)
    assert len(f.fns) <= 2_000 and f.folded > 0


def test_a_heavy_job_beside_a_normal_one_is_bounded_and_changes_none_of_its_verdicts(tmp_path: Path) -> None:
    """The normal job's ids alone and beside the heavy one; the heavy job's windows bounded in time."""
    normal = _simulate(tmp_path, "--nodes 2 --gpus 4 --steps 40 --fault gpu_throttle:rank=5 --seed 1 --job normal",
                       "normal.jsonl")
    alone = sorted(v.verdict_id for v in analyze(read_batches(normal), W))
    assert alone
    heavy = heavy_job(tmp_path)
    both = tmp_path / "both.jsonl"
    lines = normal.read_bytes().splitlines() + heavy.read_bytes().splitlines()
    lines.sort(key=lambda ln: json.loads(ln).get("ts_ns", 0))
    both.write_bytes(b"\n".join(lines) + b"\n")
    from eroica.streams.detection.notes import FOLDED, JobNotes

    t0 = time.process_time()
    seen, folded = [], 0
    notes = JobNotes()
    for d, vs in analyze_windows(read_batches(both), W):
        notes.add(d, None)
        seen += [v.verdict_id for v in vs if v.job == "normal"]
        if d.job == "heavy":
            folded += d.folded
            assert len({(f, s) for f, s in zip(d.fns.fn, d.fns.stack)}) <= MAX_FN_IDENTITIES
    cpu = time.process_time() - t0
    assert sorted(seen) == alone
    assert folded >= 100_000 - 3 * MAX_FN_IDENTITIES  # counted: the names spread over its windows
    said = [n for n in notes.notes() if n.kind == FOLDED]
    assert [(n.job, n.folded) for n in said] == [("heavy", folded)] and "budget of 4096" in said[0].text
    print(f"heavy + normal job: {cpu:.1f} s of CPU for analyze_windows, {folded} functions folded")


@pytest.mark.parametrize("seed", [0])
def test_the_streaming_cores_fold_and_fit_the_message(tmp_path: Path, seed: int, monkeypatch) -> None:
    """A digest too large for its message is folded further by the summariser, and the detector bounds the merge."""
    from eroica.streams.cores import summariser_core
    from eroica.streams.cores.test_cores import _messages, _Pipeline

    heavy = heavy_job(tmp_path, names=20_000)
    monkeypatch.setattr(summariser_core, "DIGEST_BYTES", 150_000)  # ~4,096 rows of ~83 B: folds further
    pipe = _Pipeline(2)
    sent: list = []
    deliver = pipe.deliver
    pipe.deliver = lambda step, now: (sent.extend(s for s in step.sends if s.topic == "summaries"),  # type: ignore
                                      deliver(step, now))
    pipe.run(_messages(heavy, 2), seed)
    sums = list(pipe.sums.values())
    assert sum(ps.stats.folded_functions for ps in sums) > 0
    assert max(len(s.value) for s in sent) <= 150_000
    assert pipe.det.stats.windows > 0 and not pipe.deadletters


def test_a_jobs_state_is_folded_to_fit_its_message() -> None:
    """4,096 functions on each of 160 ranks, held as a waiting window: ~50 MB encoded, more than a state
    message takes (the reported detector died on a 22.9 MB changelog message). It is folded to fit."""
    from eroica.streams.cores.detector_core import STATE_BYTES, DetectorCore, JobState, encode_state
    from eroica.streams.detection.history import JobHistory

    big = WindowDigest("heavy", 0, W, fns=_rows(MAX_FN_IDENTITIES, ranks=160))
    st = JobState(job="heavy", history=JobHistory(job="heavy", pending=[big]))
    assert len(encode_state(st)) > STATE_BYTES
    core = DetectorCore(grace_s=1.0)
    core._fit_state(st)
    assert len(encode_state(st)) <= STATE_BYTES and core.stats.folded_functions > 0
    small = JobState(job="j", history=JobHistory(job="j", pending=[WindowDigest("j", 0, W, fns=_rows(50))]))
    before = encode_state(small)
    core._fit_state(small)
    assert encode_state(small) == before
