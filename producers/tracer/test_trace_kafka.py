"""``eroica trace --kafka``: every rank and the node agent publish frames straight to a real broker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("confluent_kafka")

from eroica.models.columns import concat, to_records  # noqa: E402
from eroica.models.frames import COLUMNS, END_OF_STREAM, decode_end_of_stream, decode_frame, frame_kind  # noqa: E402

PROG = """
import torch, torch.nn as nn
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))),
                                   batch_size=8)
for x, y in data:
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
print("trained")
"""


def test_trace_to_kafka(kafka_bootstrap: str, kafka_names, kafka_consume, tmp_path: Path) -> None:
    config = kafka_names.config(kafka_bootstrap, partitions=2)
    (tmp_path / "prog.py").write_text(PROG)
    env = {**os.environ, "EROICA_KAFKA_TOPIC_RAW": config.raw_topic,
           "EROICA_KAFKA_TOPIC_DEADLETTER": config.deadletter_topic, "EROICA_KAFKA_PARTITIONS": "2"}
    proc = subprocess.run([sys.executable, "-m", "eroica.cli.main", "trace", "--job", "kj", "--kafka", kafka_bootstrap,
                           "--interval", "0.2", "--", sys.executable, "prog.py"],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "trained\n"

    def done(msgs: list) -> bool:
        return sum(frame_kind(m.value()) == END_OF_STREAM for m in msgs) >= 2  # the rank's key and the node's

    msgs = kafka_consume(kafka_bootstrap, config.raw_topic, 2, done, timeout_s=30)
    assert done(msgs), f"only {len(msgs)} messages"
    eos = {decode_end_of_stream(m.value()).rank: decode_end_of_stream(m.value())
           for m in msgs if frame_kind(m.value()) == END_OF_STREAM}
    frames = [decode_frame(m.value())[0] for m in msgs if frame_kind(m.value()) == COLUMNS]
    by_type: dict[str, list] = {}
    for f in frames:
        by_type.setdefault(f.type, []).append(f)
    fns = to_records(concat(by_type["fn"]))
    assert {(r["fn"], r["kind"]) for r in fns} >= {("DataLoader.__next__", "dataloader"), ("SGD.step", "optimizer"),
                                                     ("Sequential.forward", "python"),
                                                     ("Sequential.backward", "python")}
    assert {r["job"] for r in fns} == {"kj"} and {r["step"] for r in fns} == set(range(8))
    assert eos[0].records == len(fns) and eos[0].job == "kj"
    assert "host" in by_type and eos[-1].records == sum(len(f) for t in ("host", "nic") for f in by_type.get(t, []))


def test_trace_edge_digests_to_kafka(kafka_bootstrap: str, kafka_names, kafka_consume, tmp_path: Path) -> None:
    """``eroica trace --kafka --edge-digests``: the rank and the node agent each publish their windows'
    digests, not records, keyed by job on the digests topic; each declares its own key and ends."""
    from eroica.streams.cores.digest_messages import DigestMsg, EndMsg, decode_message

    config = kafka_names.config(kafka_bootstrap, partitions=2)
    (tmp_path / "prog.py").write_text(PROG)
    env = {**os.environ, "EROICA_KAFKA_TOPIC_RAW": config.raw_topic, "EROICA_KAFKA_TOPIC_DIGESTS": config.digests_topic,
           "EROICA_KAFKA_TOPIC_DEADLETTER": config.deadletter_topic, "EROICA_KAFKA_PARTITIONS": "2",
           "EROICA_NODE": "n0"}
    proc = subprocess.run([sys.executable, "-m", "eroica.cli.main", "trace", "--job", "dj", "--kafka", kafka_bootstrap,
                           "--edge-digests", "--interval", "0.2", "--", sys.executable, "prog.py"],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "trained\n" and "digest mode off" not in proc.stderr

    def ends(msgs: list) -> list:
        return [m for m in (decode_message(x.value()) for x in msgs) if isinstance(m, EndMsg)]

    msgs = kafka_consume(kafka_bootstrap, config.digests_topic, 2, lambda ms: len(ends(ms)) >= 2, timeout_s=30)
    assert {m.source: m.keys for m in ends(msgs)} == {"edge/n0/rank-0": ["dj/0"], "edge/n0": ["dj/n0"]}
    assert {x.key() for x in msgs} == {b"dj"}  # keyed by job: one detector sees them all
    digests = [m for m in (decode_message(x.value()) for x in msgs) if isinstance(m, DigestMsg)]
    fns = {f for d in digests if d.source == "edge/n0/rank-0" for f in d.digest.fns.fn}
    assert fns >= {"DataLoader.__next__", "SGD.step", "Sequential.forward", "Sequential.backward"}
    assert any(d.digest.host for d in digests if d.source == "edge/n0")  # the agent's counters, digested
    assert sum(d.records for d in digests if d.source == "edge/n0/rank-0") > 0
    raw = kafka_consume(kafka_bootstrap, config.raw_topic, 2, lambda ms: False, timeout_s=2)
    assert raw == []  # nothing raw went out


def test_a_ddp_job_traced_in_digest_mode_names_its_slowed_rank(kafka_bootstrap: str, kafka_names, kafka_consume,
                                                                tmp_path: Path) -> None:
    """A real torch.distributed job (gloo, 4 ranks, DDP; one rank's loader 8 ms slower per batch) under
    ``eroica trace --kafka --edge-digests``: the 4 tracers and the agent send digests only, and the
    detector's core over them alone names the slowed rank (no summariser, no raw record)."""
    import random

    from eroica.streams.cores.detector_core import VERDICTS, DetectorCore
    from eroica.streams.cores.digest_messages import EndMsg, decode_message
    from eroica.models.verdict import decode_verdict

    slow = random.randrange(4)
    config = kafka_names.config(kafka_bootstrap, partitions=2)
    env = {**os.environ, "EROICA_KAFKA_TOPIC_RAW": config.raw_topic, "EROICA_KAFKA_TOPIC_DIGESTS": config.digests_topic,
           "EROICA_KAFKA_TOPIC_DEADLETTER": config.deadletter_topic, "EROICA_KAFKA_PARTITIONS": "2",
           "EROICA_WINDOW_S": "2", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "eroica.cli.main", "trace", "--job", "ddp", "--kafka", kafka_bootstrap,
                           "--edge-digests", "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "4", "-m", "eroica.producers.tracer.ddp_job", "--steps", "300",
                           "--slow-rank", str(slow), "--slow-data-ms", "8"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "digest mode off" not in proc.stderr

    def n_ends(msgs: list) -> int:
        return sum(isinstance(decode_message(m.value()), EndMsg) for m in msgs)

    msgs = kafka_consume(kafka_bootstrap, config.digests_topic, 2, lambda ms: n_ends(ms) >= 5, timeout_s=60)
    assert n_ends(msgs) == 5, f"{n_ends(msgs)} sources ended"  # 4 ranks and the node agent
    assert kafka_consume(kafka_bootstrap, config.raw_topic, 2, lambda ms: False, timeout_s=2) == []
    core = DetectorCore(grace_s=10.0, wall_ns=lambda: 0)
    sends = []
    for i, m in enumerate(msgs):  # the job's messages, in order per partition: all on one (keyed by job)
        sends += core.on_message(m.value(), i, partition=m.partition(), now=0.0).sends
    sends += core.due(now=1e6).sends  # the first window waits its grace without a job record
    assert core.stats.late_windows == 0 and core.stats.windows >= 5, core.stats
    verdicts = [decode_verdict(s.value) for s in sends if s.topic == VERDICTS]
    alarms = [v for v in verdicts if v.confidence >= 0.5 and v.scope in ("rank", "node")]
    why = f"slowed rank {slow}: " + repr([(v.window_start_ns // 10**9, v.scope, v.rank, v.component, v.confidence)
                                          for v in verdicts])
    assert any(v.rank == slow and v.component == "dataloader" for v in alarms), why
    others = [v for v in alarms if v.scope == "rank" and v.rank != slow]
    assert len(others) < sum(v.rank == slow for v in alarms), why
