"""Digest mode (edge digests): a node computes its windows' digests itself; the detector cannot tell.

Pure (no broker): each node's records go through its own
:class:`~eroica.streams.edge.EdgeDigester`; the per-node digests of a window,
merged, equal the central summariser's digest of the whole window, and the
streaming detector's core fed with every node's messages gives exactly the
verdict ids of ``eroica analyze`` on a realistic run with two faults. The
same through tansu and the whole stack: ``test_edge_digests_through_the_stack``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

from eroica.kafka.framing import frame_key
from eroica.models.digest import merge_digests
from eroica.models.reader import read_batches
from eroica.models.verdict import decode_verdict
from eroica.producers.simulator import SimConfig, write_jsonl
from eroica.streams.detection import analyze
from eroica.streams.detection.summarise import digest_window
from eroica.streams.detection.windows import WindowAssembler
from eroica.producers.replay import split_by_node
from eroica.streams.edge import EdgeDigester
from eroica.streams.cores.detector_core import VERDICTS, DetectorCore
from eroica.streams.cores.digest_messages import DigestMsg, decode_message

W = 30 * 10**9
FAULTS = ["gpu_throttle:rank=6", "nic:node=2,nic=1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("edge") / "run.jsonl"
    write_jsonl(SimConfig(nodes=4, gpus=4, seed=3, faults=FAULTS, profile="realistic", job="edge-job"), path,
                truth_path=False)
    return path


def _by_producer(cols) -> dict[str, object]:
    """What each live producer holds: a rank's tracer its ``fn`` records, a node's agent its counters."""
    if cols.type != "fn":
        return split_by_node(cols)
    ranks = cols.arrays["rank"]
    return {f"rank-{r}": cols.take(i) for r in np.unique(ranks).tolist() for i in [np.flatnonzero(ranks == r)]}


def _producer_keys(job: str, name: str) -> list[str]:
    """The one key each live producer declares: the tracer its rank's, the agent its node's (as in
    ``cli.trace_cmd`` / ``cli.agent_cmd``), whatever ranks its GPU samples name."""
    return [frame_key(job, int(name[5:]))] if name.startswith("rank-") else [frame_key(job, -1, name)]


def _edge_messages(path: Path, window_ns: int = W, split=split_by_node,
                   keys=None) -> tuple[list, dict[str, EdgeDigester]]:
    """Every producer's digests-topic messages (a node's, by default), interleaved batch by batch as live
    producers would send them."""
    nodes: dict[str, EdgeDigester] = {}
    out = []
    for batch in read_batches(path):
        for job in batch.jobs:
            out += EdgeDigester("edge/job-record", window_ns, window_ns, 2 * window_ns).job(job)
        per_node: dict[str, list] = {}
        for cols in batch.columns.values():
            for node, part in split(cols).items():
                per_node.setdefault(node, []).append(part)
        for node, parts in sorted(per_node.items()):
            dig = nodes.get(node) or nodes.setdefault(node, EdgeDigester(
                f"edge/{node}", window_ns, window_ns, 2 * window_ns, keys=keys("edge-job", node) if keys else None))
            out += dig.add(*parts)
    job_keys: dict[str, int] = {}
    for d in nodes.values():
        for job in d.jobs:
            job_keys[job] = job_keys.get(job, 0) + len(d.keys(job))
    for _node, d in sorted(nodes.items()):
        out += d.end(job_keys)
    return out, nodes


def _canonical(d) -> bytes:
    """A digest with its rows in a fixed order (merging concatenates in source order)."""
    def rows(r):
        fields = type(r).__struct_fields__
        cols = [getattr(r, f) for f in fields]
        return sorted(zip(*(c.tolist() if isinstance(c, np.ndarray) else c for c in cols)), key=repr) if len(r) else []

    def maps(m):
        return sorted((str(k), sorted(v.items()) if isinstance(v, dict) else v) for k, v in m.items())

    return msgspec.msgpack.encode([d.job, d.start_ns, d.end_ns, rows(d.ranks), rows(d.fns), rows(d.colls),
                                   rows(d.in_flight), maps(d.gpu), maps(d.gpu_index), maps(d.nic), maps(d.host)])


@pytest.mark.parametrize("split, keys, sources", [(split_by_node, None, 4), (_by_producer, _producer_keys, 4 + 16)],
                         ids=["node", "producer"])
def test_per_node_digests_merge_to_the_central_digest(run: Path, split, keys, sources: int) -> None:
    """Per node (``eroica replay --edge-digests``) and per producer (each rank's tracer, each node's agent:
    ``eroica trace --edge-digests``)."""
    asm = WindowAssembler(W, W)
    for batch in read_batches(run):
        for cols in batch.columns.values():
            asm.add(cols)
    central = {w.start_ns: digest_window(w) for w in asm.complete() + asm.flush()}
    assert asm.late_records == 0

    msgs, nodes = _edge_messages(run, split=split, keys=keys)
    assert len(nodes) == sources and all(d.stats.late_records == 0 for d in nodes.values())
    per_window: dict[int, list] = {}
    for m in msgs:
        msg = decode_message(m.value)
        if isinstance(msg, DigestMsg):
            per_window.setdefault(msg.start_ns, []).append(msg.digest)
    assert sorted(per_window) == sorted(central)
    assert {len(v) for v in per_window.values()} == {sources}  # one digest per producer and window
    for start, parts in per_window.items():
        assert _canonical(merge_digests(parts)) == _canonical(central[start]), start


@pytest.mark.parametrize("split, keys", [(split_by_node, None), (_by_producer, _producer_keys)], ids=["node", "producer"])
def test_detector_over_per_node_digests_gives_the_verdict_ids_of_analyze(run: Path, split, keys) -> None:
    expected = [v.verdict_id for v in analyze(read_batches(run), W)]
    components = {v.component for v in analyze(read_batches(run), W) if v.confidence >= 0.5}
    assert {"gpu", "nic"} <= components  # both faults found

    msgs, _nodes = _edge_messages(run, split=split, keys=keys)
    core = DetectorCore(grace_s=30.0, wall_ns=lambda: 0)
    got = []
    for i, m in enumerate(msgs):
        out = core.on_message(m.value, i, partition=0, now=0.0)  # no wall clock passes: completeness alone
        got += [decode_verdict(s.value).verdict_id for s in out.sends if s.topic == VERDICTS]
    assert core.stats.forced_windows == 0 and core.stats.late_windows == 0
    assert sorted(got) == sorted(expected) and len(got) == len(set(got))
    assert core.stats.windows > 0


def test_window_closes_only_after_the_slowest_stream_and_progress_without_data() -> None:
    from eroica.models.columns import from_records
    from eroica.models.records import FnRecord, GpuRecord

    d = EdgeDigester("edge/n0", W, W, 2 * W)
    t0 = 1_000 * W
    fn = lambda ts: from_records("fn", [FnRecord(job="j", node="n0", rank=0, step=1, fn="k", kind="kernel",  # noqa: E731
                                                  ts_ns=ts, dur_ns=1000)])
    gpu = lambda ts: from_records("gpu", [GpuRecord(job="j", node="n0", rank=0, gpu=0, ts_ns=ts)])  # noqa: E731
    # windows before the first records close empty: progress only, as a summariser partition sends it
    assert [m.kind for m in d.add(fn(t0), gpu(t0))] == ["progress"]
    # functions move 3 windows on, the GPU samples lag: the slowest stream holds window 1000 open
    assert [m.kind for m in d.add(fn(t0 + 3 * W))] == ["progress"]
    out = d.add(gpu(t0 + 2 * W + 1))
    assert [m.kind for m in out] == ["digest"]
    msg = decode_message(out[0].value)
    # the rank's functions and the node's GPU samples: two keys (GPU samples are keyed by node, kafka.framing)
    assert msg.start_ns == t0 and msg.keys == ["j/0", "j/n0"] and msg.records == 2 and msg.closed_through_ns == t0
    # the GPU samples catch up: windows 1002 (a sample) and 1003 (a function) close, 1001 held nothing
    out = d.add(gpu(t0 + 6 * W), fn(t0 + 6 * W))
    assert [decode_message(m.value).start_ns for m in out] == [t0 + 2 * W, t0 + 3 * W]
    assert decode_message(out[-1].value).closed_through_ns == t0 + 4 * W
    end = d.end({"j": 2})
    assert [m.kind for m in end][-1] == "end" and decode_message(end[-1].value).job_keys == 2
    assert d.stats.late_records == 0 and np.isfinite(d.stats.bytes)


def test_a_declaring_producer_closes_its_windows_after_the_declared_lateness_not_the_guessed() -> None:
    """The tracer and the agent declare their marks (``DigestKafkaSink.write(..., watermark_ns=)``): their
    windows close ``declared_lateness_ns`` after the declaration passes them, as the summariser closes a
    declaring stream's; the same records without declarations wait the guessed lateness (a window)."""
    from eroica.models.columns import from_records
    from eroica.models.records import FnRecord

    t0, s = 1_000 * W, 10**9
    fn = lambda ts: from_records("fn", [FnRecord(job="j", node="n0", rank=0, step=1, fn="k", kind="kernel",  # noqa: E731
                                                  ts_ns=ts, dur_ns=1000)])

    def closed(msgs: list) -> list[int]:
        """Window starts of the digests sent (progress messages of empty windows aside)."""
        return [decode_message(m.value).start_ns for m in msgs if m.kind == "digest"]

    declaring = EdgeDigester("edge/n0/rank-0", W, W, 2 * W, keys=["j/0"], declared_lateness_ns=5 * s)
    guessing = EdgeDigester("edge/n0/rank-0", W, W, 2 * W, keys=["j/0"])
    assert closed(declaring.add(fn(t0 + s), declared_ns=t0)) == [] and closed(guessing.add(fn(t0 + s))) == []
    # 4 s past the window's end: within the declared lateness, nothing closes
    assert closed(declaring.add(fn(t0 + W + 4 * s), declared_ns=t0 + W + 4 * s)) == []
    assert closed(declaring.add(fn(t0 + W + 6 * s), declared_ns=t0 + W + 6 * s)) == [t0]
    assert closed(guessing.add(fn(t0 + W + 6 * s))) == []  # a guess waits a whole window more
    assert closed(guessing.add(fn(t0 + 2 * W + s))) == [t0]
    # a declaration older than the stream's records holds the window: an open span began before them
    held = EdgeDigester("edge/n0/rank-0", W, W, 2 * W, keys=["j/0"], declared_lateness_ns=5 * s)
    assert closed(held.add(fn(t0 + s), declared_ns=t0)) == []
    assert closed(held.add(fn(t0 + W + 10 * s), declared_ns=t0 + W - s)) == []
    # declarations are ignored by a digester without declared_lateness_ns (replay's guessed marks)
    assert closed(EdgeDigester("e", W, W, 2 * W).add(fn(t0 + W + 10 * s), declared_ns=t0 + W + 10 * s)) == []


FAST_ENV = {"EROICA_SINK_SESSION_TIMEOUT_MS": "2000", "EROICA_SINK_FLUSH_MS": "100"}


def _eroica(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EROICA_CLICKHOUSE", "EROICA_KAFKA"))}
    return subprocess.run([sys.executable, "-m", "eroica.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**env, **FAST_ENV})


def test_edge_digests_through_the_stack(tmp_path: Path, run: Path) -> None:
    """``eroica replay --edge-digests`` into ``eroica up`` on tansu stores ``eroica analyze``'s verdict ids."""
    pytest.importorskip("chdb")
    from sink_helpers import stop_stack, wait_for

    batch = _eroica("analyze", str(run), "--format", "json")
    assert batch.returncode == 0, batch.stderr
    expected = {v["verdict_id"] for v in json.loads(batch.stdout)}
    data = tmp_path / "stack"
    log = open(tmp_path / "up.log", "wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EROICA_CLICKHOUSE", "EROICA_KAFKA"))}
    up = subprocess.Popen([sys.executable, "-m", "eroica.cli", "up", "--data-dir", str(data), "--stop-timeout", "5"],
                          stdout=log, stderr=subprocess.STDOUT, env={**env, **FAST_ENV}, start_new_session=True)
    try:
        def running() -> bool:
            if up.poll() is not None:
                raise AssertionError((tmp_path / "up.log").read_text()[-3000:])
            return "stack up" in (tmp_path / "up.log").read_text()

        wait_for(running, 120, "eroica up", interval_s=0.25)
        bootstrap = json.loads((data / "stack.json").read_text())["kafka"]["bootstrap"]
        rep = _eroica("replay", "--kafka", bootstrap, "--edge-digests", str(run))
        assert rep.returncode == 0, rep.stderr
        assert "digest mode" in rep.stderr and "0 raw records" not in rep.stderr
        input_end = time.monotonic()

        def stored() -> set[str]:
            r = _eroica("verdicts", "--data-dir", str(data), "--job", "edge-job", "--limit", "10000",
                        "--format", "json")
            return {v["verdict_id"] for v in json.loads(r.stdout)} if r.returncode == 0 else set()

        got = wait_for(lambda: (s := stored()) >= expected and s, 60, "the batch verdict ids in ClickHouse",
                       interval_s=1.0)
        print(f"\nedge digests == batch on tansu: {len(expected)} verdicts, {time.monotonic() - input_end:.1f} s "
              "after the input ended")
        time.sleep(3)
        assert stored() == expected == got
    finally:
        stop_stack(up)
        log.close()


def test_node_agent_digest_sink_publishes_digests_of_its_node_only() -> None:
    """``eroica agent --edge-digests``: the sink hands the samples to the digester and publishes its messages."""
    from eroica.kafka.config import KafkaConfig
    from eroica.kafka.framing import frame_key
    from eroica.models.records import HostRecord
    from eroica.producers.outputs import DigestKafkaSink
    from eroica.streams.cores.digest_messages import EndMsg

    class Pub:
        def __init__(self) -> None:
            self.sent: list[tuple[str, bytes, bytes]] = []

        def publish(self, topic, value, key=None, **kw):
            self.sent.append((topic, key, value))
            return True

        def poll(self, timeout_s=0.0):
            return 0

        def close(self, timeout_s=0.0):
            from eroica.kafka.publisher import PublisherStats
            return PublisherStats()

    pub = Pub()
    config = KafkaConfig(bootstrap="unused:9092")
    digester = EdgeDigester("edge/n0", W, W, 2 * W, keys=[frame_key("j", -1, "n0")])
    sink = DigestKafkaSink("unused:9092", digester, publisher=pub, config=config)
    t0 = 1_000 * W
    for i in range(8 * 60):  # 2 Hz for 4 minutes
        sink.write([HostRecord(job="j", node="n0", ts_ns=t0 + i * 500_000_000, cpu_util_pct=50.0)])
    sink.close()
    msgs = [decode_message(v) for _t, _k, v in pub.sent]
    assert {t for t, _k, _v in pub.sent} == {config.digests_topic} and {k for _t, k, _v in pub.sent} == {b"j"}
    digests = [m for m in msgs if isinstance(m, DigestMsg)]
    assert [d.start_ns for d in digests] == [t0 + k * W for k in range(8)]
    assert all(m.keys == ["j/n0"] for m in msgs) and isinstance(msgs[-1], EndMsg)
    assert sum(d.records for d in digests) == 480 and digests[0].digest.host["n0"]
