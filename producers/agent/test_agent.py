"""The node agent: runs cleanly on this machine (no GPU, no InfiniBand), paces, publishes JSONL or frames."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eroica.models.frames import decode_end_of_stream, decode_frame, frame_kind
from eroica.models.reader import read_batches
from eroica.models.records import HostRecord, NicRecord
from eroica.producers.agent import NodeAgent
from eroica.producers.counters.gpu import GpuSampler
from eroica.producers.counters.sampler import NodeSampler
from eroica.producers.outputs import JsonlSink, KafkaSink


def _no_gpu() -> GpuSampler:
    return GpuSampler(nvml=None, quiet=True)


def test_agent_cli_runs_cleanly_here(tmp_path: Path) -> None:
    out = tmp_path / "node.jsonl"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "eroica.cli.main", "agent", "--job", "j", "--out", str(out),
                           "--interval", "0.25", "--duration", "2"], capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert "samples" in proc.stderr and "Traceback" not in proc.stderr
    if not GpuSampler(quiet=True).available:
        assert proc.stderr.count("no NVIDIA GPU: GPU counters off") == 1
    batches = list(read_batches(str(out)))
    assert not any(b.invalid for b in batches)
    host = [c for b in batches for t, c in b.columns.items() if t == "host"]
    n_host = sum(len(c) for c in host)
    assert 6 <= n_host <= 12  # 4 Hz for 2 s (+ the first and last sample)
    assert elapsed < 30


def test_agent_cli_needs_one_destination(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "eroica.cli.main", "agent", "--job", "j"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "exactly one of --kafka" in proc.stderr


def test_agent_samples_fake_node(tmp_path: Path) -> None:
    from eroica.producers.counters.test_host_nic import ib_port, net_iface, proc_tree

    proc_tree(tmp_path, (100, 0, 0, 900, 0, 0, 0, 0, 0, 0))
    ib_port(tmp_path, "mlx5_0", 1, xmit=0, rcv=0)
    net_iface(tmp_path, "eth0", tx=0, rx=0)
    out = tmp_path / "agent.jsonl"
    agent = NodeAgent(NodeSampler("j", "node-0", root=tmp_path, gpu=_no_gpu()), JsonlSink(out), interval_s=0.1)
    agent.run(duration_s=0.35)
    assert agent.samples >= 3 and agent.errors == 0
    n = sum(len(c) for b in read_batches(str(out)) for c in b.columns.values())
    assert n == agent.records == 3 * agent.samples  # 2 NIC ports + 1 host per sample


def test_agent_thread_stops_promptly() -> None:
    class Sink:
        closed = False
        records: list = []

        def write(self, recs):
            self.records.extend(recs)

        def close(self):
            self.closed = True

    sink = Sink()
    agent = NodeAgent(NodeSampler("j", "n", gpu=_no_gpu()), sink, interval_s=5.0).start()
    time.sleep(0.2)
    t0 = time.monotonic()
    agent.stop()
    assert time.monotonic() - t0 < 2.0 and sink.closed
    assert any(isinstance(r, HostRecord) for r in sink.records)


def test_a_failing_sample_does_not_end_the_agent() -> None:
    class Flaky(NodeSampler):
        n = 0

        def sample(self, ts_ns=None):
            self.n += 1
            if self.n == 1:
                raise OSError("counter file vanished")
            return super().sample(ts_ns)

    class Sink:
        def write(self, recs): pass
        def close(self): pass

    agent = NodeAgent(Flaky("j", "n", gpu=_no_gpu()), Sink(), interval_s=0.1)
    agent.run(duration_s=0.25)
    assert agent.errors == 1 and agent.samples >= 1


def test_interval_bounds() -> None:
    with pytest.raises(ValueError):
        NodeAgent(NodeSampler("j", "n", gpu=_no_gpu()), JsonlSink(os.devnull), interval_s=0.01)


class FakePublisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, str]] = []
        self.closed = False

    def publish(self, topic, value, key=None):
        self.sent.append((topic, value, key))
        return True

    def poll(self, timeout_s=0.0):
        return 0

    def close(self, timeout_s=30.0):
        self.closed = True
        from eroica.kafka.publisher import PublisherStats
        return PublisherStats()


def test_kafka_sink_frames_node_counters_and_ends_its_keys() -> None:
    pytest.importorskip("confluent_kafka")
    from eroica.kafka.config import KafkaConfig

    pub = FakePublisher()
    sink = KafkaSink("127.0.0.1:1", publisher=pub, config=KafkaConfig(bootstrap="127.0.0.1:1"), linger_s=0.0)
    recs = [NicRecord(job="j", node="n0", nic="mlx5_0", ts_ns=i, tx_Bps=1.0) for i in range(3)]
    recs += [HostRecord(job="j", node="n0", ts_ns=i, load1=0.5) for i in range(3)]
    sink.write(recs)
    sink.write([HostRecord(job="j", node="n0", ts_ns=9, load1=0.7)])  # linger 0: held records go out now
    sink.close()
    kinds = [frame_kind(v) for _, v, _ in pub.sent]
    assert kinds.count("end_of_stream") == 1 and kinds[-1] == "end_of_stream" and pub.closed
    frames = [decode_frame(v)[0] for _, v, _ in pub.sent if frame_kind(v) == "columns"]
    assert sum(len(c) for c in frames) == 7 and {c.type for c in frames} == {"host", "nic"}
    assert {k for _, _, k in pub.sent} == {"j/n0"} and all(t == "eroica.raw" for t, _, _ in pub.sent)
    eos = decode_end_of_stream(pub.sent[-1][1])
    assert (eos.job, eos.node, eos.rank, eos.records) == ("j", "n0", -1, 7)


def test_kafka_sink_declares_a_watermark_on_each_streams_last_frame() -> None:
    """With a watermark, everything held goes out, and only the last frame of each (key, type) says
    ``wm``: the earlier frames of a batch cut in several hold older records than the later ones."""
    pytest.importorskip("confluent_kafka")
    from eroica.kafka.config import KafkaConfig

    pub = FakePublisher()
    sink = KafkaSink("127.0.0.1:1", publisher=pub, config=KafkaConfig(bootstrap="127.0.0.1:1", frame_records=10),
                     linger_s=60.0)
    sink.write([HostRecord(job="j", node="n0", ts_ns=i, load1=0.5) for i in range(3)])
    assert pub.sent == []  # held (linger)
    recs = [NicRecord(job="j", node="n0", nic="mlx5_0", ts_ns=i, tx_Bps=1.0) for i in range(25)]
    recs += [HostRecord(job="j", node="n0", ts_ns=i, load1=0.5) for i in range(3, 6)]
    sink.write(recs, watermark_ns=26)
    frames = [decode_frame(v) for _, v, _ in pub.sent]
    assert sum(len(c) for c, _ in frames) == 31
    declared = [(c.type, int(c.arrays["ts_ns"].max())) for c, m in frames if m.get("wm") == 26]
    assert sorted(declared) == [("host", 5), ("nic", 24)]
    assert sum("wm" in m for _, m in frames) == 2


def test_agent_declares_each_samples_time() -> None:
    class Declaring:
        declares_watermarks = True

        def __init__(self) -> None:
            self.calls: list = []

        def write(self, records, watermark_ns=None) -> None:
            self.calls.append((len(records), watermark_ns, max((r.ts_ns for r in records), default=None)))

        def close(self) -> None:
            pass

    sink = Declaring()
    agent = NodeAgent(NodeSampler("j", "n", gpu=_no_gpu()), sink)
    agent.tick()
    agent.tick()
    assert len(sink.calls) == 2 and all(n > 0 and wm == newest for n, wm, newest in sink.calls)
