"""Framing: every record lands in exactly one frame of its own key, in input order, frames bounded."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from eroica.models.columns import empty, to_records
from eroica.models.reader import parse_lines
from eroica.kafka.config import KafkaConfig
from eroica.kafka.framing import FrameAccumulator, frame_key, split_frames


def _columns(lines: list[dict]):
    (batch,) = parse_lines(iter((i + 1, json.dumps(x).encode()) for i, x in enumerate(lines)))
    return batch.columns


def _fn(job: str, rank: int, ts: int, node: str = "n") -> dict:
    return {"type": "fn", "job": job, "node": node, "rank": rank, "step": 0, "fn": f"f{ts % 3}",
            "kind": "python", "ts_ns": ts, "dur_ns": 1}


def test_groups_by_job_and_rank_keeping_input_order() -> None:
    rng = np.random.default_rng(0)
    lines = [_fn(f"job{rng.integers(3)}", int(rng.integers(5)), ts) for ts in range(500)]
    cols = _columns(lines)["fn"]
    frames = list(split_frames(cols, max_records=40))
    seen = 0
    by_key: dict[str, list[int]] = {}
    for f in frames:
        recs = to_records(f.cols)
        assert 1 <= len(recs) <= 40
        assert {(r["job"], r["rank"]) for r in recs} == {(f.job, f.rank)}
        assert f.key == f"{f.job}/{f.rank}" and f.node == ""
        by_key.setdefault(f.key, []).extend(r["ts_ns"] for r in recs)
        seen += len(recs)
    assert seen == 500
    for key, ts in by_key.items():
        job, rank = key.split("/")
        assert ts == [x["ts_ns"] for x in lines if x["job"] == job and x["rank"] == int(rank)]
    # only the last frame of a key may be short
    for key in by_key:
        sizes = [len(f.cols) for f in frames if f.key == key]
        assert all(s == 40 for s in sizes[:-1])


def test_node_level_counters_are_keyed_by_node() -> None:
    lines = [{"type": "host", "job": "j", "node": f"node-{i % 3}", "ts_ns": i} for i in range(10)]
    lines += [{"type": "nic", "job": "j", "node": "node-1", "nic": f"mlx5_{i % 2}", "ts_ns": i} for i in range(6)]
    cols = _columns(lines)
    host = list(split_frames(cols["host"], 1000))
    assert sorted(f.key for f in host) == ["j/node-0", "j/node-1", "j/node-2"]
    assert all(f.rank == -1 and {r["node"] for r in to_records(f.cols)} == {f.node} for f in host)
    (nic,) = split_frames(cols["nic"], 1000)  # both NICs of one node share the node's frame
    assert nic.key == "j/node-1" and len(nic.cols) == 6


def test_gpu_samples_share_their_nodes_frames_and_exact_multiples() -> None:
    """A node agent samples its GPUs together: their records go out in the node's frames (one key per node),
    input order kept, each frame full."""
    lines = [{"type": "gpu", "job": "j", "node": n, "rank": r, "gpu": r % 2, "ts_ns": t}
             for t in range(6) for n, r in (("n1", 7), ("n0", 2), ("n1", 6))]
    frames = list(split_frames(_columns(lines)["gpu"], max_records=3))
    assert [(f.key, f.rank, f.node, len(f.cols)) for f in frames] == [
        ("j/n1", -1, "n1", 3), ("j/n1", -1, "n1", 3), ("j/n1", -1, "n1", 3), ("j/n1", -1, "n1", 3),
        ("j/n0", -1, "n0", 3), ("j/n0", -1, "n0", 3)]  # keys in code order (first seen), as for any type
    assert frames[0].cols.arrays["rank"].tolist() == [7, 6, 7]


def test_accumulator_cuts_full_frames_across_batches() -> None:
    rng = np.random.default_rng(1)
    lines = [_fn(f"job{rng.integers(2)}", int(rng.integers(4)), ts) for ts in range(1000)]
    for i, x in enumerate(lines):
        x["fn"] = f"fn-{i % 37}"  # vocabularies differ from batch to batch
    acc = FrameAccumulator(max_records=30)
    frames = []
    for lo in range(0, 1000, 70):  # batches of 70 records, never a multiple of 30 per key
        frames += list(acc.add(_columns(lines[lo:lo + 70])["fn"]))
        assert acc.pending_records < 30 * 8  # at most max - 1 per key held
    frames += list(acc.drain())
    assert acc.pending_records == 0 and list(acc.drain()) == []
    by_key: dict[str, list] = {}
    for f in frames:
        by_key.setdefault(f.key, []).append(f)
    for key, fs in by_key.items():
        assert all(len(f.cols) == 30 for f in fs[:-1]) and 1 <= len(fs[-1].cols) <= 30
        got = [r for f in fs for r in to_records(f.cols)]
        job, rank = key.split("/")
        assert got == [x for x in lines if x["job"] == job and x["rank"] == int(rank)]
    assert sum(len(f.cols) for f in frames) == 1000
    per_key = Counter(f"{x['job']}/{x['rank']}" for x in lines)
    assert len(frames) == sum(-(-n // 30) for n in per_key.values())  # as few frames as possible


def test_empty_and_bad_bound() -> None:
    assert list(split_frames(empty("fn"))) == []
    with pytest.raises(ValueError):
        list(split_frames(empty("fn"), 0))


def test_frame_key() -> None:
    assert frame_key("job-1", 17) == "job-1/17"
    assert frame_key("job-1", node="node-3") == "job-1/node-3"


def test_config_from_env_and_prefix() -> None:
    env = {"EROICA_KAFKA_BOOTSTRAP": "k:1", "EROICA_KAFKA_TOPIC_RAW": "raw", "EROICA_KAFKA_PARTITIONS": "3",
           "EROICA_KAFKA_LINGER_MS": ""}
    cfg = KafkaConfig.from_env(env, frame_records=50, bootstrap=None)
    assert (cfg.bootstrap, cfg.raw_topic, cfg.partitions, cfg.frame_records, cfg.linger_ms) == ("k:1", "raw", 3, 50, 20)
    assert KafkaConfig.from_env({}).bootstrap == "127.0.0.1:9092"
    assert KafkaConfig.from_env(env, bootstrap="other:2").bootstrap == "other:2"
    with pytest.raises(ValueError, match="EROICA_KAFKA_PARTITIONS='x' is not an integer"):
        KafkaConfig.from_env({"EROICA_KAFKA_PARTITIONS": "x"})
    with pytest.raises(ValueError, match="partitions must be >= 1"):
        KafkaConfig(partitions=0)
    pre = cfg.with_topic_prefix("t1")
    assert pre.raw_topic == "t1.raw" and pre.deadletter_topic == "t1.eroica.deadletter"
    assert set(pre.topics()) == {"t1.raw", "t1.eroica.ingest", "t1.eroica.deadletter", "t1.eroica.digests",
                                 "t1.eroica.verdicts", "t1.eroica.window-summaries"}


def _reference_frames(batches: list, size: int, lag: int | None) -> dict:
    """Frames per key cut by a plain per-key list of records (the accumulator's contract, without its arrays)."""
    held: dict = {}
    out: dict = {}
    newest = -1
    for cols in batches:
        recs = to_records(cols)
        keys = [(cols.type, frame_key(r["job"], r["rank"]) if cols.type == "fn" else frame_key(r["job"], node=r["node"]))
                for r in recs]
        for k in dict.fromkeys(keys):
            part = held.pop(k, []) + [r for r, kk in zip(recs, keys) if kk == k]
            run = []   # running maximum of event time over this batch's part of the key
            for r in part:
                run.append(max(run[-1], r["ts_ns"]) if run else r["ts_ns"])
            lo = 0
            while lo < len(part):
                hi = min(lo + size, len(part))
                if lag is not None:
                    hi = lo
                    while hi < min(lo + size, len(part)) and run[hi] <= run[lo] + lag:
                        hi += 1
                    if hi == len(part) and hi - lo < size:
                        break
                elif hi - lo < size:
                    break
                out.setdefault(k, []).append(part[lo:hi])
                lo = hi
            part = part[lo:]
            if part:
                held[k] = part
        if lag is not None and recs:
            newest = max(newest, max(r["ts_ns"] for r in recs))
            for k in [k for k, p in held.items() if min(r["ts_ns"] for r in p) < newest - lag]:
                out.setdefault(k, []).append(held.pop(k))
    for k, p in held.items():
        out.setdefault(k, []).append(p)
    return out


@pytest.mark.parametrize("size,lag,reset", [(30, None, None), (7, 40, None), (25, 0, None), (30, 100, 5)])
def test_accumulator_equals_per_key_reference(size: int, lag: int | None, reset: int | None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import eroica.kafka.framing as framing

    if reset is not None:
        monkeypatch.setattr(framing, "VOCAB_RESET", reset)   # vocabularies start afresh often
    rng = np.random.default_rng(3)
    lines = []
    for i in range(900):
        ts = i + int(rng.integers(0, 60))   # not quite in time order
        if i % 5 == 0:
            lines.append({"type": "host", "job": f"job{rng.integers(2)}", "node": f"n{rng.integers(3)}", "ts_ns": ts,
                          "load1": float(i)})
        else:
            x = _fn(f"job{rng.integers(3)}", int(rng.integers(6)), ts, node=f"n{rng.integers(3)}")
            x["fn"] = f"fn-{rng.integers(50)}"
            x["stack"] = f"s{rng.integers(i + 1)}"  # a vocabulary that keeps growing
            lines.append(x)
    batches = []
    for lo in range(0, 900, 65):
        batches += list(_columns(lines[lo:lo + 65]).values())
    acc = FrameAccumulator(max_records=size, max_lag_ns=lag)
    got: dict = {}
    for cols in batches:
        for f in acc.add(cols):
            got.setdefault((f.cols.type, f.key), []).append(to_records(f.cols))
    for f in acc.drain():
        got.setdefault((f.cols.type, f.key), []).append(to_records(f.cols))
    assert acc.pending_records == 0
    assert got == _reference_frames(batches, size, lag)
