"""``eroica bench edge``: raw mode against digest mode (edge digests), bytes on Kafka and per-core rates.

One simulated job (with faults, so the detector has work) is published both
ways through the real producer code with a counting publisher in place of the
broker (``producers/replay.py``: :func:`replay` frames it as ``eroica replay``
does; :func:`replay_digests` digests it per node as ``eroica replay
--edge-digests`` does), then every message goes through the real stream
cores, pure and in this process:

- raw mode: the summariser of one raw partition
  (:class:`~eroica.streams.cores.summariser_core.PartitionSummariser`) over every
  frame, then the detector (:class:`~eroica.streams.cores.detector_core.DetectorCore`)
  over the summaries it sends;
- digest mode: each node's :class:`~eroica.streams.edge.EdgeDigester` over its
  records (the node-side cost), then the same detector over the nodes' messages.

It prints bytes on Kafka per rank per step (message value + key, before and
after lz4, the producers' default codec), records or digests per CPU-second of
each stage, the ranks one core carries at the run's step time, and whether
both modes give the same verdict ids (they must).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eroica.kafka.config import KafkaConfig
from eroica.kafka.publisher import PublisherStats
from eroica.models.reader import read_batches
from eroica.models.verdict import decode_verdict
from eroica.producers.replay import replay, replay_digests, split_by_node
from eroica.producers.simulator import SimConfig, write_jsonl
from eroica.streams.cores.detector_core import VERDICTS, DetectorCore
from eroica.streams.cores.digest_messages import DigestMsg, decode_message
from eroica.streams.faust.settings import WorkerSettings
from eroica.streams.cores.summariser_core import SUMMARIES, PartitionSummariser

from .throughput import measure

GPUS_PER_NODE = 8
MIN_CPU_S = 1.0


class _Capture:
    """A publisher that keeps what it is given (the broker's part is not measured here)."""

    counts_records = False

    def __init__(self) -> None:
        self.stats = PublisherStats()
        self.sent: list[tuple[str, bytes, bytes]] = []

    def publish(self, topic: str, value: bytes, key: str | bytes | None = None, **_kw: Any) -> bool:
        k = key.encode() if isinstance(key, str) else (key or b"")
        self.sent.append((topic, k, value))
        self.stats.produced += 1
        self.stats.delivered += 1
        return True

    def poll(self, timeout_s: float = 0.0) -> int:
        return 0

    def flush(self, timeout_s: float = 0.0) -> int:
        return 0

    def close(self, timeout_s: float = 0.0) -> PublisherStats:
        return self.stats


def _lz4_bytes(sent: list[tuple[str, bytes, bytes]], batch_bytes: int = 64 * 1024) -> int:
    """Bytes after lz4, compressing each key's messages in producer-sized batches (linger batches per partition)."""
    try:
        import lz4.frame
    except ImportError:
        return -1
    per_key: dict[bytes, list[bytes]] = {}
    for _t, k, v in sent:
        per_key.setdefault(k, []).append(v)
    total = 0
    for k, values in per_key.items():
        buf: list[bytes] = []
        size = 0
        for v in values:
            buf.append(v)
            size += len(v)
            if size >= batch_bytes:
                total += len(lz4.frame.compress(b"".join(buf))) + len(k) * len(buf)
                buf, size = [], 0
        if buf:
            total += len(lz4.frame.compress(b"".join(buf))) + len(k) * len(buf)
    return total


@dataclass
class EdgeBenchConfig:
    nodes: int = 8
    gpus: int = GPUS_PER_NODE
    steps: int | None = None
    profile: str = "realistic"
    seed: int = 1
    faults: list[str] = field(default_factory=lambda: ["gpu_throttle:rank=6", "nic:node=2,nic=1"])
    window_s: float = 30.0
    work_dir: Path | None = None


def _detect(messages: list[bytes], grace_s: float) -> tuple[list[str], DetectorCore]:
    core = DetectorCore(grace_s=grace_s, wall_ns=lambda: 0)
    got: list[str] = []
    for i, value in enumerate(messages):
        out = core.on_message(value, i, partition=0, now=0.0)
        got += [decode_verdict(s.value).verdict_id for s in out.sends if s.topic == VERDICTS]
    return got, core


def detector_bookkeeping(nodes: int, gpus: int = GPUS_PER_NODE, window_s: float = 30.0) -> dict[str, float]:
    """The detector's per-message completeness check with one source per node (digest mode's shape).

    Every message recomputes the job's expected and covered keys over all its
    sources (``DetectorCore._complete``): O(keys) per message, so a window of
    a job with N node sources costs O(N * keys). Measured with digests
    of no record (the detector skips them as empty): bookkeeping alone.
    """
    from eroica.models.records import JobRecord
    from eroica.models.digest import WindowDigest
    from eroica.streams.cores.digest_messages import JobMsg, encode_message

    job = "bk"
    w = int(window_s * 1e9)
    ranks = nodes * gpus
    msgs = [encode_message(JobMsg(job=job, record=JobRecord(job=job, world_size=ranks)))]
    for k in range(2):  # two windows: the first one's messages carry the keys in, the second is steady state
        for n in range(nodes):
            keys = [f"{job}/{n * gpus + g}" for g in range(gpus)] + [f"{job}/node-{n}"]
            start = (1000 + k) * w
            msgs.append(encode_message(DigestMsg(job=job, start_ns=start, end_ns=start + w, source=f"edge/node-{n}",
                                                 keys=keys, closed_through_ns=start, records=0,
                                                 digest=WindowDigest(job, start, start + w))))

    def feed() -> int:
        core = DetectorCore(grace_s=30.0, wall_ns=lambda: 0)
        for i, v in enumerate(msgs):
            core.on_message(v, i, partition=0, now=0.0)
        return len(msgs)

    n, u = measure(feed, min_cpu_s=0.3)
    return {"nodes": nodes, "ranks": ranks, "messages": n, "cpu_s": u.cpu_s,
            "cpu_s_per_window": u.cpu_s / 2, "us_per_message": 1e6 * u.cpu_s / n}


def run(cfg: EdgeBenchConfig) -> dict[str, Any]:
    work = Path(cfg.work_dir or tempfile.mkdtemp(prefix="eroica-bench-edge-"))
    work.mkdir(parents=True, exist_ok=True)
    ws = WorkerSettings(window_s=cfg.window_s)
    sim = SimConfig(nodes=cfg.nodes, gpus=cfg.gpus, steps=cfg.steps, faults=list(cfg.faults), seed=cfg.seed,
                    profile=cfg.profile, job=f"edge-{cfg.nodes * cfg.gpus}r")
    path = work / "run.jsonl"
    truth = write_jsonl(sim, path, truth_path=False)
    ranks = cfg.nodes * cfg.gpus
    steps = int(sim.steps or 0)
    batches = list(read_batches(path))
    records = sum(b.valid_count for b in batches)
    t_lo = min(int(c.arrays["ts_ns"].min()) for b in batches for c in b.columns.values() if len(c))
    t_hi = max(int(c.arrays["ts_ns"].max()) for b in batches for c in b.columns.values() if len(c))
    run_s = (t_hi - t_lo) / 1e9
    step_s = run_s / max(steps, 1)
    config = KafkaConfig(bootstrap="unused:9092")

    # -- raw mode: what `eroica replay` publishes, the summariser, the detector --------------------
    raw_pub = _Capture()
    raw_result = replay([path], config, publisher=raw_pub, create=False)  # type: ignore[arg-type]
    frames = [(k, v) for t, k, v in raw_pub.sent if t == config.raw_topic]

    def summarise() -> list[bytes]:
        ps = PartitionSummariser("raw/0", ws.window_ns, ws.lateness_ns, ws.max_skew_ns, hold_s=0.0)
        out: list[bytes] = []
        now = 0.0
        for i, (k, v) in enumerate(frames):
            now += 1e-4
            out += [s.value for s in ps.on_message(k, v, i, now, offset=i).sends if s.topic == SUMMARIES]
        out += [s.value for s in ps.tick(now + 1e6, idle_s=1.0).sends if s.topic == SUMMARIES]
        return out

    raw_summaries, u_sum = measure(summarise, min_cpu_s=MIN_CPU_S)
    (raw_ids, raw_core), u_raw_det = measure(lambda: _detect(raw_summaries, ws.detect_grace_s), min_cpu_s=MIN_CPU_S)

    # -- digest mode: what `eroica replay --edge-digests` publishes, the nodes' cost, the detector ---
    edge_pub = _Capture()

    edge_result = replay_digests([path], config, ws.edge_digester, publisher=edge_pub, create=False)  # type: ignore[arg-type]
    edge_msgs = [v for t, _k, v in edge_pub.sent if t == config.digests_topic]
    per_node: dict[str, list] = {}
    for b in batches:
        for cols in b.columns.values():
            for node, part in split_by_node(cols).items():
                per_node.setdefault(node, []).append([part])

    def digest_nodes() -> int:
        n = 0
        for node, parts in per_node.items():
            d = ws.edge_digester(f"edge/{node}")
            for p in parts:
                n += len(d.add(*p))
            n += len(d.end())
        return n

    _n, u_edge = measure(digest_nodes, min_cpu_s=MIN_CPU_S)
    (edge_ids, edge_core), u_edge_det = measure(lambda: _detect(edge_msgs, ws.detect_grace_s), min_cpu_s=MIN_CPU_S)

    raw_digests = [decode_message(v) for v in raw_summaries]
    raw_digest_msgs = sum(isinstance(m, DigestMsg) for m in raw_digests)
    edge_digest_msgs = sum(isinstance(decode_message(v), DigestMsg) for v in edge_msgs)
    windows = max(raw_core.stats.windows + raw_core.stats.empty_windows, 1)
    time_windows = len({m.start_ns for m in raw_digests if isinstance(m, DigestMsg)})
    rank_steps = ranks * steps
    raw_bytes = raw_result.message_bytes
    edge_bytes = edge_result.message_bytes
    rps = records / ranks / run_s  # raw records per rank per second

    def per_core(rate_records: float) -> float:
        return rate_records / rps

    bookkeeping = [detector_bookkeeping(n, cfg.gpus, cfg.window_s) for n in (64, 256, 1024)]
    result = {
        "detector_bookkeeping": bookkeeping,
        "config": {"nodes": cfg.nodes, "gpus": cfg.gpus, "ranks": ranks, "steps": steps, "profile": cfg.profile,
                   "seed": cfg.seed, "faults": list(cfg.faults), "window_s": cfg.window_s},
        "input": {"records": records, "run_s": round(run_s, 3), "step_s": round(step_s, 4),
                  "records_per_rank_per_step": records / rank_steps, "records_per_rank_per_s": rps,
                  "time_windows": time_windows, "truth_records": truth.get("records")},
        "raw": {
            "messages": raw_result.messages, "bytes": raw_bytes, "bytes_lz4": _lz4_bytes(raw_pub.sent),
            "bytes_per_rank_per_step": raw_bytes / rank_steps,
            "bytes_lz4_per_rank_per_step": _lz4_bytes(raw_pub.sent) / rank_steps,
            "summariser_cpu_s": u_sum.cpu_s, "summariser_records_per_cpu_s": records / u_sum.cpu_s,
            "summariser_ranks_per_core": per_core(records / u_sum.cpu_s),
            "summaries_messages": len(raw_summaries), "digests": raw_digest_msgs,
            "summaries_bytes": sum(len(v) for v in raw_summaries),
            "detector_cpu_s": u_raw_det.cpu_s, "detector_digests_per_cpu_s": raw_digest_msgs / u_raw_det.cpu_s,
            "detector_records_per_cpu_s": records / u_raw_det.cpu_s,
            "detector_ranks_per_core": per_core(records / u_raw_det.cpu_s),
            "verdicts": len(raw_ids), "job_windows": windows, "pattern_rows": raw_core.stats.pattern_rows,
        },
        "digest": {
            "messages": edge_result.messages, "bytes": edge_bytes, "bytes_lz4": _lz4_bytes(edge_pub.sent),
            "bytes_per_rank_per_step": edge_bytes / rank_steps,
            "bytes_lz4_per_rank_per_step": _lz4_bytes(edge_pub.sent) / rank_steps,
            "digests": edge_digest_msgs, "late_records": edge_result.late_records,
            "edge_cpu_s": u_edge.cpu_s, "edge_records_per_cpu_s": records / u_edge.cpu_s,
            "edge_cpu_share_of_node": (records / cfg.nodes / run_s) / (records / u_edge.cpu_s),
            "detector_cpu_s": u_edge_det.cpu_s, "detector_digests_per_cpu_s": edge_digest_msgs / u_edge_det.cpu_s,
            "detector_records_per_cpu_s": records / u_edge_det.cpu_s,
            "detector_ranks_per_core": per_core(records / u_edge_det.cpu_s),
            "verdicts": len(edge_ids),
        },
        "same_verdict_ids": sorted(raw_ids) == sorted(edge_ids),
        "verdict_ids": sorted(raw_ids),
        "machine": {"cpus": os.cpu_count(), "load1": os.getloadavg()[0],
                    "when": time.strftime("%Y-%m-%d %H:%M", time.gmtime())},
    }
    return result


def format_report(r: dict[str, Any]) -> str:
    c, i, raw, dg = r["config"], r["input"], r["raw"], r["digest"]
    lines = [
        f"{c['ranks']} ranks ({c['nodes']} x {c['gpus']}), {c['steps']} steps of {i['step_s']:.3f} s, profile "
        f"{c['profile']}, faults {', '.join(c['faults']) or 'none'}, window {c['window_s']:g} s; "
        f"{i['records']:,} records ({i['records_per_rank_per_step']:.1f} per rank per step)",
        "",
        f"{'':34}{'raw mode':>16}{'digest mode':>16}",
        f"{'messages on Kafka':34}{raw['messages']:>16,}{dg['messages']:>16,}",
        f"{'bytes on Kafka':34}{raw['bytes']:>16,}{dg['bytes']:>16,}",
        f"{'bytes per rank per step':34}{raw['bytes_per_rank_per_step']:>16,.1f}{dg['bytes_per_rank_per_step']:>16,.1f}",
        f"{'  after lz4':34}{raw['bytes_lz4_per_rank_per_step']:>16,.1f}"
        f"{dg['bytes_lz4_per_rank_per_step']:>16,.1f}",
        f"{'summariser records / CPU-s':34}{raw['summariser_records_per_cpu_s']:>16,.0f}{'(on the nodes)':>16}",
        f"{'edge digester records / CPU-s':34}{'-':>16}{dg['edge_records_per_cpu_s']:>16,.0f}",
        f"{'detector digests / CPU-s':34}{raw['detector_digests_per_cpu_s']:>16,.1f}"
        f"{dg['detector_digests_per_cpu_s']:>16,.1f}",
        f"{'detector records / CPU-s':34}{raw['detector_records_per_cpu_s']:>16,.0f}"
        f"{dg['detector_records_per_cpu_s']:>16,.0f}",
        f"{'ranks per summariser core':34}{raw['summariser_ranks_per_core']:>16,.0f}{'no summariser':>16}",
        f"{'ranks per detector core':34}{raw['detector_ranks_per_core']:>16,.0f}{dg['detector_ranks_per_core']:>16,.0f}",
        f"{'verdicts':34}{raw['verdicts']:>16}{dg['verdicts']:>16}",
        "",
        f"same verdict ids in both modes: {'yes' if r['same_verdict_ids'] else 'NO'}; "
        f"edge digesting costs {100 * dg['edge_cpu_share_of_node']:.3f}% of one core per node; "
        f"digests per window: raw {raw['digests'] // max(i['time_windows'], 1)} (one per summariser partition), "
        f"digest mode {dg['digests'] // max(i['time_windows'], 1)} (one per node)",
        "",
        "detector bookkeeping with one source per node (empty digests: completeness only):",
        *(f"  {b['nodes']:>5} nodes ({b['ranks']:>6} ranks): {b['us_per_message']:8.1f} us per message, "
          f"{b['cpu_s_per_window']:.3f} CPU-s per window" for b in r["detector_bookkeeping"]),
    ]
    return "\n".join(lines)


def to_json(r: dict[str, Any]) -> bytes:
    return json.dumps(r, indent=2).encode() + b"\n"
