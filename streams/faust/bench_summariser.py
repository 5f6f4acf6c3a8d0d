"""Benchmark: raw records per second through one summariser worker (and the detector behind it).

    python -m eroica.streams.faust.bench_summariser [--records 10000000] [--ranks 64] [--kafka HOST:PORT]

1. starts a tansu broker (unless ``--kafka``) and creates fresh topics;
2. pre-loads the raw topic with a synthetic lock-step job: ``--ranks`` ranks,
   100 function records per rank and step (data loader, 97 kernels, an
   all-reduce, the optimizer), ~2,000 records per rank per second of event
   time, rank 5's kernels 1.3x slower; frames of 1,000 records of one rank
   (lz4, as the replay sends them), then an end-of-stream marker per rank;
3. starts ``eroica worker summariser`` and ``eroica worker detector`` (fresh
   application ids) on the backlog, polls the summariser's ``/eroica/stats``
   and times it from the first record to the last digest;
4. prints records/s, peak RSS of both workers (VmHWM) and the delay from the
   summariser's last digest to the last verdict on the verdict topic.

Pre-loading isolates the worker from the producer: the number is what one
worker sustains on a backlog (one process, capped near one core by the GIL).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from eroica.models.columns import CAT, KIND_CODE, OP_CODE, SCHEMAS, Columns
from eroica.models.frames import EndOfStream, encode_end_of_stream, encode_frame, encode_job
from eroica.models.records import JobRecord

MS = 1_000_000
KERNELS = [f"sm90_xmma_gemm_{i}" for i in range(8)] + [f"elementwise_kernel_{i}" for i in range(6)] + \
    ["flash_fwd_kernel", "flash_bwd_kernel", "layer_norm_kernel", "softmax_kernel"]
PER_STEP = 100  # loader + 97 kernels + all-reduce + optimizer
STEPS_PER_FRAME = 10  # 1,000 records per frame


def _frame_arrays(job: str, ranks: int, per_node: int, steps: range, t0: np.ndarray, slow_rank: int,
                  rng: np.random.Generator) -> tuple[list[Columns], np.ndarray]:
    """One frame per rank for ``steps`` (lock-step: the all-reduce ends when the slowest rank arrives).

    Returns the frames and the start time of the next step.
    """
    k = PER_STEP - 3
    n_steps = len(steps)
    kern = 0.4 * MS * rng.uniform(0.97, 1.03, size=(ranks, n_steps, k))
    kern[slow_rank] *= 1.3
    load = 5 * MS * rng.uniform(0.95, 1.05, size=(ranks, n_steps))
    ts = np.empty((ranks, n_steps, PER_STEP), dtype=np.int64)
    dur = np.empty((ranks, n_steps, PER_STEP), dtype=np.int64)
    t = t0.copy()
    for s in range(n_steps):
        offsets = np.concatenate([np.zeros((ranks, 1)), np.cumsum(kern[:, s, :-1], axis=1)], axis=1)
        kstart = t[:, None] + load[:, s, None].astype(np.int64) + offsets.astype(np.int64)
        arrive = kstart[:, -1] + kern[:, s, -1].astype(np.int64)
        end = int(arrive.max()) + 2 * MS
        ts[:, s, 0], dur[:, s, 0] = t, load[:, s].astype(np.int64)
        ts[:, s, 1:k + 1], dur[:, s, 1:k + 1] = kstart, kern[:, s, :].astype(np.int64)
        ts[:, s, k + 1], dur[:, s, k + 1] = arrive, end - arrive
        ts[:, s, k + 2], dur[:, s, k + 2] = end, 1 * MS
        t = np.full(ranks, end + 2 * MS, dtype=np.int64)
    fn_vocab = ["DataLoader.__next__", *KERNELS, "ncclAllReduce", "optimizer.step"]
    fn_codes = np.concatenate([[0], 1 + (np.arange(k) % len(KERNELS)), [len(KERNELS) + 1, len(KERNELS) + 2]])
    kinds = np.tile(np.concatenate([[KIND_CODE["dataloader"]], np.full(k, KIND_CODE["kernel"]),
                                    [KIND_CODE["collective"], KIND_CODE["optimizer"]]]).astype(np.int8), n_steps)
    n = n_steps * PER_STEP
    coll = kinds == KIND_CODE["collective"]
    shared = {
        "step": np.repeat(np.asarray(steps, dtype=np.int64), PER_STEP),
        "fn": np.tile(fn_codes, n_steps).astype(np.int32), "kind": kinds,
        "bytes": np.where(coll, 1 << 28, -1).astype(np.int64),
        "op": np.where(coll, OP_CODE["all_reduce"], -1).astype(np.int8),
        "stream": np.where(kinds == KIND_CODE["kernel"], 7, -1).astype(np.int32),
    }
    zeros = np.zeros(n, np.int32)
    frames = []
    for r in range(ranks):
        arrays = {"job": zeros, "node": zeros, "rank": np.full(n, r, np.int32), "step": shared["step"],
                  "fn": shared["fn"], "kind": kinds, "ts_ns": ts[r].reshape(-1), "dur_ns": dur[r].reshape(-1),
                  "bytes": shared["bytes"], "op": shared["op"], "group": zeros, "stream": shared["stream"],
                  "in_flight": np.zeros(n, bool), "stack": zeros}
        vocab = {"job": [job], "node": [f"node-{r // per_node}"], "fn": fn_vocab, "group": ["dp"], "stack": [""]}
        assert list(arrays) == list(SCHEMAS["fn"]) and set(vocab) == {c for c, d in SCHEMAS["fn"].items() if d == CAT}
        frames.append(Columns("fn", arrays, vocab))
    return frames, t


def preload(config, job: str, records: int, ranks: int, per_node: int = 8, seed: int = 1) -> int:
    """Publish the synthetic job; returns the number of records sent."""
    from eroica.kafka.publisher import FramePublisher

    rng = np.random.default_rng(seed)
    steps_total = max(STEPS_PER_FRAME, records // (ranks * PER_STEP))
    t = np.full(ranks, 1_763_000_000_000_000_000, dtype=np.int64)
    sent = 0
    with FramePublisher.for_replay(config) as pub:
        pub.publish(config.raw_topic, encode_job(JobRecord(
            job=job, world_size=ranks, rank_nodes=[f"node-{r // per_node}" for r in range(ranks)])), key=job)
        seq = [0] * ranks
        for s0 in range(0, steps_total, STEPS_PER_FRAME):
            frames, t = _frame_arrays(job, ranks, per_node, range(s0, min(s0 + STEPS_PER_FRAME, steps_total)), t,
                                      5, rng)
            for r, cols in enumerate(frames):
                pub.publish(config.raw_topic, encode_frame(cols, {"seq": seq[r]}), key=f"{job}/{r}")
                seq[r] += 1
                sent += len(cols)
        for r in range(ranks):
            pub.publish(config.raw_topic, encode_end_of_stream(
                EndOfStream(job, r, "", 0, seq[r], {"job_keys": ranks})), key=f"{job}/{r}")
        if pub.flush(120):
            raise RuntimeError("pre-load not delivered")
    return sent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eroica.streams.faust.bench_summariser", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--kafka", default=None, help="use this broker instead of starting tansu")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = ap.parse_args(argv)

    from eroica.kafka.config import KafkaConfig
    from eroica.kafka.admin import create_topics
    from eroica.stack.tansu import TansuBroker

    from .process import WorkerProcess, worker_env

    work = Path(tempfile.mkdtemp(prefix="eroica-bench-"))
    broker = None
    if args.kafka is None:
        broker = TansuBroker(data_dir=work / "tansu").start()
    bootstrap = args.kafka or broker.bootstrap  # type: ignore[union-attr]
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    config = KafkaConfig(bootstrap=bootstrap, partitions=args.partitions).with_topic_prefix(prefix)
    create_topics(bootstrap, config.topics())
    job = "bench"
    procs: list[WorkerProcess] = []
    try:
        t0 = time.monotonic()
        n = preload(config, job, args.records, args.ranks)
        load_s = time.monotonic() - t0
        print(f"pre-loaded {n:,} records in {load_s:.1f} s", file=sys.stderr)
        common = dict(data_dir=work / "data", window_s=args.window, stats_interval_s=0, log_level="warn")
        summ = WorkerProcess("summariser", worker_env(config, app_id=f"{prefix}-sum", **common), work / "sum.log")
        det = WorkerProcess("detector", worker_env(config, app_id=f"{prefix}-det", **common), work / "det.log")
        procs = [summ, det]
        det.start()
        det.wait_ready()
        summ.start()
        first = done = None
        cpu0 = cpu1 = 0.0
        last: dict = {}
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            st = summ.stats(timeout_s=2.0) or {}
            now = time.monotonic()
            if first is None and st.get("records", 0) > 0:
                first = now
                cpu0 = summ.cpu_seconds() or 0.0
            if st.get("records", 0) >= n and st.get("held_messages", 1) == 0 and st.get("ends", 0) > 0 \
                    and st.get("ends", 0) >= len(st.get("partitions", [])):
                done = now
                last = st
                cpu1 = summ.cpu_seconds() or 0.0
                break
            if summ.proc is not None and summ.proc.poll() is not None:
                raise RuntimeError(f"summariser died:\n{summ.log_tail()}")
            time.sleep(0.05)
        if done is None or first is None:
            raise RuntimeError(f"summariser did not finish: {st}\n{summ.log_tail()}")
        # the detector's last verdict after the summariser's last digest
        verdict_wait = None
        while time.monotonic() < deadline:
            d = det.stats() or {}
            windows = last["digests"] / max(1, len(last["partitions"]))
            if d.get("pending_windows") == 0 and d.get("windows", 0) >= windows:
                verdict_wait = time.monotonic() - done
                break
            time.sleep(0.05)
        dstats = det.stats() or {}
        result = {
            "records": n, "ranks": args.ranks, "partitions": args.partitions, "window_s": args.window,
            "frames": last["frames"], "records_per_frame": round(n / max(1, last["frames"])),
            "seconds_first_record_to_last_digest": round(done - first, 2),
            "records_per_s": round(n / (done - first)),
            "summariser_cpu_s": round(cpu1 - cpu0, 2),
            "records_per_cpu_s": round(n / (cpu1 - cpu0)) if cpu1 > cpu0 else None,
            "seconds_first_to_last_frame": last.get("first_to_last_frame_s"),
            "summariser_peak_rss_mb": round(summ.peak_rss_mb() or 0, 1),
            "detector_peak_rss_mb": round(det.peak_rss_mb() or 0, 1),
            "digests": last["digests"], "late_records": last["late_records"],
            "detector_windows": dstats.get("windows"), "verdicts": dstats.get("verdicts"),
            "seconds_last_digest_to_windows_analysed": None if verdict_wait is None else round(verdict_wait, 2),
        }
        if args.json:
            print(json.dumps(result))
        else:
            for k, v in result.items():
                print(f"{k:40s} {v}")
        return 0
    finally:
        for p in procs:
            p.stop(timeout_s=15)
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    sys.exit(main())
