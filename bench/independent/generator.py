"""A lock-step training job, simulated from first principles, written as telemetry-v1 JSON Lines.

The model, in the order the physics happens:

* **Program.** Every step each rank runs the same program: ``DataLoader.__next__``, host Python
  (``Trainer.prepare_batch``), a host-to-device copy of the batch, forward kernels (GEMM, flash
  attention, element-wise) with a tensor-parallel all-reduce, the backward kernels and their
  all-reduce, the data-parallel gradient reduction (DDP all-reduce, or ZeRO reduce-scatter before
  and all-gather after the optimizer), ``optimizer.step``, the LR scheduler and metric logging
  (a tiny device-to-host copy: ``loss.item()``). With pipeline parallelism each step runs
  microbatches GPipe-style, with blocking send/recv between neighbouring stages.
* **Synchronisation.** A discrete-event engine advances every rank through its program; a
  collective (or a send/recv pair) completes when its *last* member has arrived plus the transfer
  time, and every member leaves at that instant. So the slow rank waits least. The transfer time
  is the ring algorithm's: ``2(n-1)/n * bytes / bw`` for all-reduce, ``(n-1)/n * bytes / bw`` for
  reduce-scatter / all-gather, ``bytes / bw`` for send/recv, plus per-step latencies, where ``bw``
  is that of the slowest hop of the ring (NVLink inside a node, the rank's RDMA rail
  ``mlx5_<gpu>`` across nodes, capped by each GPU's PCIe link since GPUDirect RDMA crosses it).
* **Counters.** Every byte a collective or copy moves is booked on the links it crosses, in the
  interval it moves (after the last arrival, not while members wait); NVML-style utilisation is
  the fraction of the sample interval in which a kernel (compute or NCCL) was resident. Counter
  samples integrate these timelines, so NIC and NVLink throughput follow the collective phases.
* **Faults** (``faults.py``) only change physical quantities (a clock, a link's bandwidth, a
  loader's production rate...); every symptom follows from the model above.

All randomness comes from ``numpy.random.default_rng(cfg.seed)`` and from the scenario seed in
:func:`make_config`, so one seed gives a byte-identical file.
"""

from __future__ import annotations

import json
import math
import zlib
from array import array
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .faults import NEEDS_PIPELINE, Fault, Layout, draw_fault

Rng = np.random.Generator

# ---- hardware constants (H100 SXM HGX node, 8x 400G RDMA rails) ------------------------------
NVLINK_BW = 360e9            # NCCL ring bus bandwidth over NVLink4 / NVSwitch, bytes/s
NIC_BW = 400e9 / 8 * 0.92    # one 400 Gb/s RDMA rail, achievable goodput, bytes/s
PCIE_BW = 52e9               # PCIe gen5 x16, achievable per direction, bytes/s
PAGEABLE_BW = 12e9           # device-to-pageable-host copies (checkpoint) are CPU-bound
ALPHA = {"nvlink": 3e-6, "shm": 12e-6, "rdma": 8e-6, "tcp": 60e-6}   # per ring step latency, s
MAX_SM_CLOCK = 1980
IDLE_SM_CLOCK = 345
POWER_LIMIT = 700.0
MEM_TOTAL = 85_899_345_920
HOST_CPUS = 224

SCALES: dict[str, tuple[int, int]] = {"tiny": (2, 8), "small": (4, 8), "medium": (8, 8)}

# ---- the job's functions ---------------------------------------------------------------------
_CUBLAS = "warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
GEMM_FWD = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_" + _CUBLAS
GEMM_BWD = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize256x128x64_" + _CUBLAS
FLASH_FWD = "flash_fwd_kernel"
FLASH_BWD = "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel"
ELEM_FWD = "at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>"
ELEM_BWD = "at::native::elementwise_kernel<128, 2, GeluBackwardCUDAKernelImpl>"
# (kernel class, name, share of the phase's compute)
FWD_KERNELS = (("gemm", GEMM_FWD, 0.62), ("attn", FLASH_FWD, 0.23), ("elementwise", ELEM_FWD, 0.15))
BWD_KERNELS = (("gemm", GEMM_BWD, 0.60), ("attn", FLASH_BWD, 0.27), ("elementwise", ELEM_BWD, 0.13))
KERNEL_NAMES = tuple(k[1] for k in FWD_KERNELS + BWD_KERNELS)
COMPUTE_STREAM = 7

_ROOT = "pretrain.py:<module>;pretrain.py:main;trainer.py:Trainer.fit;trainer.py:Trainer.train_step"
PY_PREP = ("Trainer.prepare_batch", _ROOT + ";trainer.py:Trainer.prepare_batch")
PY_SCHED = ("LRScheduler.step", _ROOT + ";torch/optim/lr_scheduler.py:LRScheduler.step")
PY_LOG = ("Trainer.log_metrics", _ROOT + ";trainer.py:Trainer.log_metrics")
PY_FWD = ("GPTModel.forward", _ROOT + ";torch/nn/modules/module.py:Module._call_impl;model.py:GPTModel.forward")
PY_BWD = ("Tensor.backward", _ROOT + ";torch/_tensor.py:Tensor.backward")
PY_CKPT = ("Checkpointer.save", "pretrain.py:<module>;pretrain.py:main;trainer.py:Trainer.fit;"
           "trainer.py:Trainer.maybe_save;checkpoint.py:Checkpointer.save")
LOADER_FN = "DataLoader.__next__"
OPT_FN = "optimizer.step"
H2D_FN = "Memcpy HtoD (Pinned -> Device)"
D2H_FN = "Memcpy DtoH (Device -> Pageable)"
PREFETCH = 4   # batches the loader may have ready ahead (num_workers * prefetch_factor)


@dataclass
class Nuisances:
    """Things every real cluster has that are not faults; drawn per seed."""

    clock_offset_s: tuple[float, ...]   # per node: NTP-grade offsets (up to +-30 ms) or PTP-grade
    sample_period_s: float               # counter sampling period, 1-2 s
    sample_jitter_s: float               # std dev of each tick's lateness
    gap_node: int                        # a node whose sampler stalls for a while (-1: none)
    gap_start_s: float
    gap_len_s: float
    no_nvlink_nodes: tuple[int, ...]     # nodes whose agent reports no NVLink counters
    no_host_node: int                    # a node that sends no host records (-1: none)
    compute_sigma: float                 # per-kernel lognormal duration noise
    checkpoint_steps: tuple[int, ...]    # steps after which every rank saves a checkpoint
    checkpoint_s: float
    warmup_steps: int                    # slow first steps (autotuning, allocator growth, compile)
    warmup_factor: float
    step_offset: int                     # a resumed job does not start at step 0
    eth_gbps: int                        # front-end NIC speed


@dataclass
class Workload:
    """Per-step work of one rank, sized so a healthy step takes about ``step_time_s``."""

    compute_s: float           # forward + backward kernel time per step (all microbatches)
    fwd_share: float
    microbatches: int
    gap_frac: float            # kernel-launch gaps as a fraction of kernel time
    host_busy: float           # host dispatch time (Python + launches) per unit of kernel time: the CPU runs ahead
    tp_bytes: int              # per tensor-parallel all-reduce
    dp_bytes: int              # gradient bucket size reduced per step
    dp_mode: str               # "ddp" (all-reduce) or "zero" (reduce-scatter + all-gather)
    p2p_bytes: int             # activations per microbatch between pipeline stages
    h2d_bytes: int
    opt_s: float
    loader_s: float            # __next__ when the prefetch queue is ready
    loader_period_s: float     # healthy per-batch production time (faster than a step)
    prep_s: float
    sched_s: float
    log_s: float
    ckpt_bytes: int


@dataclass
class JobConfig:
    """One simulated job: layout, timing, seed, faults and nuisances."""

    nodes: int
    gpus_per_node: int
    dp: int
    tp: int
    pp: int
    step_time_s: float
    n_steps: int               # healthy steps in duration_s; the run stops at 1.6 x duration_s of job time
    seed: int
    faults: list[Fault]
    nuisances: Nuisances
    workload: Workload
    node_names: tuple[str, ...]
    job_id: str
    start_ns: int
    duration_s: float
    scenario: str = ""
    max_fn_records: int = 95_000

    def layout(self) -> Layout:
        return Layout(self.nodes, self.gpus_per_node, self.tp, self.dp, self.pp, self.node_names,
                      self.duration_s, self.step_time_s)


# ------------------------------------------------------------------------------------------------
# configuration


def _layouts(nodes: int, gpn: int, need_pp: bool) -> list[tuple[int, int]]:
    """(tp, pp) pairs with tp inside a node, stages on whole nodes, and a real data-parallel ring."""
    out = []
    for tp in (8, 4, 2):
        for pp in (1, 2, 4):
            if tp > gpn or gpn % tp or nodes % pp or (need_pp and pp == 1):
                continue
            dp = nodes * gpn // (tp * pp)
            if dp >= 2:
                out.append((tp, pp))
    crossing = [(tp, pp) for tp, pp in out if nodes // pp >= 2]
    return crossing or out


def make_config(scale: str, seed: int, scenario: str = "healthy", duration_s: float | None = None,
                max_fn_records: int = 95_000) -> JobConfig:
    """Draw a job (layout, speed, nuisances) and the scenario's faults from ``seed``.

    The scenario name is mixed into the seed so that each scenario of one seed is a different
    job, as it would be on a real cluster.
    """
    nodes, gpn = SCALES[scale]
    rng = np.random.default_rng([seed, zlib.crc32(scenario.encode())])
    names = [] if scenario.startswith("healthy") else [scenario]
    need_pp = scenario == "healthy_pp" or any(n in NEEDS_PIPELINE for n in names)
    options = _layouts(nodes, gpn, need_pp)
    weights = np.array([{8: 3.0, 4: 2.0, 2: 1.0}[tp] * {1: 3.0, 2: 2.0, 4: 1.0}[pp] for tp, pp in options])
    tp, pp = options[int(rng.choice(len(options), p=weights / weights.sum()))]
    dp = nodes * gpn // (tp * pp)
    lo = 1.5 if pp > 1 else 0.3
    step = float(math.exp(rng.uniform(math.log(lo), math.log(8.0))))
    if duration_s is None:
        duration_s = float(rng.uniform(150, 240)) if scale != "tiny" else float(rng.uniform(12, 20))
    first = int(rng.integers(1, 200))
    picks = sorted(int(x) for x in rng.choice(np.arange(first, first + 3 * nodes), size=nodes, replace=False))
    node_names = tuple(f"gpu-node-{n:03d}" for n in picks)
    job_id = f"pretrain-{int(rng.integers(1, 99)):02d}b-{int(rng.integers(0, 16**6)):06x}"
    start_ns = int(1.7e18) + int(rng.integers(0, int(3e16)))
    wl = _workload(rng, step, nodes, gpn, tp, dp, pp)
    nz = _nuisances(rng, nodes, step, duration_s)
    n_steps = max(6, int(math.ceil(duration_s / step)))
    layout = Layout(nodes, gpn, tp, dp, pp, node_names, duration_s, step)
    faults = [draw_fault(n, rng, layout, KERNEL_NAMES) for n in names]
    return JobConfig(nodes=nodes, gpus_per_node=gpn, dp=dp, tp=tp, pp=pp, step_time_s=step, n_steps=n_steps,
                     seed=int(rng.integers(0, 2**31)), faults=faults, nuisances=nz, workload=wl, node_names=node_names,
                     job_id=job_id, start_ns=start_ns, duration_s=duration_s, scenario=scenario,
                     max_fn_records=max_fn_records)


def _workload(rng: Rng, step: float, nodes: int, gpn: int, tp: int, dp: int, pp: int) -> Workload:
    """Size each piece of a step so a healthy step lasts ``step`` seconds."""
    m = 1 if pp == 1 else (4 if pp == 2 else 8)
    loader_s = float(rng.uniform(0.3e-3, 2e-3))
    prep_s, sched_s, log_s = (float(rng.uniform(0.5e-3, 1.5e-3)), float(rng.uniform(0.1e-3, 0.3e-3)),
                              float(rng.uniform(0.3e-3, 1.0e-3)))
    h2d = int(math.exp(rng.uniform(math.log(1 << 20), math.log(256 << 20))))
    dp_mode = "zero" if rng.random() < 0.4 else "ddp"
    # gradient bytes: a share of the step at rail speed, within what fits in a GPU
    dp_share = float(rng.uniform(0.06, 0.14))
    dp_bytes = int(min(4 << 30, max(128 << 20, dp_share * step * NIC_BW / (2 * (dp - 1) / dp))))
    dp_bytes = dp_bytes // (1 << 20) * (1 << 20)
    t_dp = 2 * (dp - 1) / dp * dp_bytes / NIC_BW
    t_tp = 0.0
    tp_bytes = 0
    if tp > 1:
        # Megatron TP: two activation all-reduces per layer per pass, not overlapped with compute; for
        # large hidden sizes that is 8-20% of a step. One record stands for one pass's coalesced
        # all-reduces (all layers of one microbatch), hence sizes of GB.
        tp_share = float(rng.uniform(0.08, 0.2))
        n_inst = 2 * m
        tp_bytes = int(min(24 << 30, tp_share * step * NVLINK_BW / (2 * (tp - 1) / tp) / n_inst)) // (1 << 20) * (1 << 20)
        tp_bytes = max(tp_bytes, 1 << 20)
        t_tp = n_inst * 2 * (tp - 1) / tp * tp_bytes / NVLINK_BW
    p2p = int(rng.choice([16, 32, 64, 128])) << 20 if pp > 1 else 0
    t_p2p = 2 * m * p2p / NIC_BW if pp > 1 else 0.0
    opt_s = float(rng.uniform(0.02, 0.05)) * step
    gap = float(rng.uniform(0.008, 0.02))
    host = loader_s + prep_s + sched_s + log_s + h2d / PCIE_BW
    rest = max(0.2 * step, step - host - t_dp - t_tp - t_p2p - opt_s)
    bubble = (m + pp - 1) / m
    compute = rest / ((1 + gap) * bubble)
    return Workload(compute_s=compute, fwd_share=float(rng.uniform(0.31, 0.36)), microbatches=m, gap_frac=gap,
                    host_busy=float(rng.uniform(0.35, 0.6)),
                    tp_bytes=tp_bytes, dp_bytes=dp_bytes, dp_mode=dp_mode, p2p_bytes=p2p, h2d_bytes=h2d, opt_s=opt_s,
                    loader_s=loader_s, loader_period_s=float(rng.uniform(0.15, 0.5)) * step, prep_s=prep_s,
                    sched_s=sched_s, log_s=log_s, ckpt_bytes=int(rng.uniform(1, 6) * (1 << 30)))


def _nuisances(rng: Rng, nodes: int, step: float, duration: float) -> Nuisances:
    if rng.random() < 0.7:
        offs = tuple(float(x) for x in rng.uniform(-0.030, 0.030, nodes))
    else:
        offs = tuple(float(x) for x in rng.uniform(-0.0005, 0.0005, nodes))
    period = float(rng.uniform(1.0, 2.0))
    jitter = float(rng.uniform(0.02, 0.12) * period) if rng.random() < 0.6 else 0.004
    gap_node, gap_start, gap_len = -1, 0.0, 0.0
    if rng.random() < 0.5:
        gap_node, gap_start, gap_len = (int(rng.integers(nodes)), float(rng.uniform(0.2, 0.7) * duration),
                                        float(rng.uniform(5, 25)))
    no_nv: tuple[int, ...] = ()
    if rng.random() < 0.3:
        no_nv = tuple(sorted(int(x) for x in rng.choice(nodes, size=int(rng.integers(1, 3)), replace=False)))
    no_host = int(rng.integers(nodes)) if rng.random() < 0.3 else -1
    n_steps = max(6, int(math.ceil(duration / step)))
    ckpt: tuple[int, ...] = ()
    if rng.random() < 0.5 and n_steps > 10:
        ckpt = (int(rng.uniform(0.2, 0.8) * n_steps),)
    warm = int(rng.integers(1, 4))
    return Nuisances(clock_offset_s=offs, sample_period_s=period, sample_jitter_s=jitter, gap_node=gap_node,
                     gap_start_s=gap_start, gap_len_s=gap_len, no_nvlink_nodes=no_nv, no_host_node=no_host,
                     compute_sigma=float(rng.uniform(0.01, 0.03)), checkpoint_steps=ckpt,
                     checkpoint_s=float(rng.uniform(3, 12)), warmup_steps=warm, warmup_factor=float(rng.uniform(2, 5)),
                     step_offset=0 if rng.random() < 0.5 else int(rng.integers(1000, 50000)),
                     eth_gbps=int(rng.choice([100, 200])))


# ------------------------------------------------------------------------------------------------
# activity timelines (what the counters integrate)


class _Track:
    """Intervals with a constant rate each; integrates exactly over any [a, b] in O(log n).

    The integral of one interval up to x is ``rate * (clip(x, t0, t1) - t0)``, which splits into
    a prefix sum over intervals started before x minus one over intervals ended before x.
    """

    __slots__ = ("t0", "t1", "rate", "_ready")

    def __init__(self) -> None:
        self.t0, self.t1, self.rate = array("d"), array("d"), array("d")
        self._ready: tuple[np.ndarray, ...] | None = None

    def add(self, t0: float, t1: float, amount: float) -> None:
        """Book ``amount`` (bytes, or seconds for busy time) spread evenly over [t0, t1]."""
        if t1 <= t0:
            return
        self.t0.append(t0)
        self.t1.append(t1)
        self.rate.append(amount / (t1 - t0))

    def _prep(self) -> tuple[np.ndarray, ...]:
        if self._ready is None:
            t0, t1, r = (np.frombuffer(a, dtype=np.float64) if len(a) else np.zeros(0) for a in (self.t0, self.t1, self.rate))
            o0, o1 = np.argsort(t0, kind="stable"), np.argsort(t1, kind="stable")
            s0, s1 = t0[o0], t1[o1]
            c0r, c0rt = np.concatenate([[0.0], np.cumsum(r[o0])]), np.concatenate([[0.0], np.cumsum(r[o0] * s0)])
            c1r, c1rt = np.concatenate([[0.0], np.cumsum(r[o1])]), np.concatenate([[0.0], np.cumsum(r[o1] * s1)])
            self._ready = (s0, c0r, c0rt, s1, c1r, c1rt)
        return self._ready

    def cumulative(self, x: np.ndarray) -> np.ndarray:
        s0, c0r, c0rt, s1, c1r, c1rt = self._prep()
        i0 = np.searchsorted(s0, x, side="right")
        i1 = np.searchsorted(s1, x, side="right")
        out: np.ndarray = (c0r[i0] * x - c0rt[i0]) - (c1r[i1] * x - c1rt[i1])
        return out

    def integral(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.maximum(0.0, self.cumulative(b) - self.cumulative(a))
        return out


@dataclass
class _Loader:
    ready: float = 0.0
    calls: deque[float] = field(default_factory=lambda: deque(maxlen=PREFETCH))


# op tuples (kept as tuples: millions of them on the fast paths)
# ("d",)                                   DataLoader.__next__ (duration decided when it runs)
# ("h", fn, stack, dur)                    host Python
# ("p", fn, stack, dur)                    host Python dispatching the GPU work that follows (no time advance)
# ("g", dur)                               launch gap (GPU idle, no record)
# ("k", fn, kclass, dur)                   compute kernel
# ("o", dur)                               optimizer.step
# ("m", fn, dur, nbytes, "h2d"|"d2h")      memcpy
# ("c", key, fn, op, group, nbytes, members)   collective / p2p (members[0] sends for p2p)
Op = tuple[Any, ...]


class _Sim:
    """Runs the job step by step and collects records and activity."""

    def __init__(self, cfg: JobConfig) -> None:
        self.cfg = cfg
        self.L = cfg.layout()
        self.wl = cfg.workload
        self.nz = cfg.nuisances
        self.rng = np.random.default_rng(cfg.seed)
        w = self.L.world
        self.t = [0.0] * w                      # set in run()
        self.static = np.ones(w)
        self.off_ns = [int(round(o * 1e9)) for o in self.nz.clock_offset_s]
        self.lines: list[tuple[int, int, str]] = []
        self.fn_count = 0
        self.tracks: dict[tuple[Any, ...], _Track] = {}
        self.loaders = [_Loader() for _ in range(w)]
        self.hops: dict[str, list[tuple[int, int]]] = {}
        self.inited: set[str] = set()
        self.intra = "nvlink"
        self.tcp_bw = 0.0
        for f in cfg.faults:
            if f.intra_transport():
                self.intra = "shm"
            g = f.tcp_gbps()
            if g:
                self.tcp_bw = g * 1e9 / 8
        if self.tcp_bw:
            # every data-parallel ring leaving a node shares its one front-end port
            flows = [0] * self.L.nodes
            for r in range(w):
                if self.L.dp_of(r) == 0:
                    ms = self.L.dp_group(r)
                    for a, b in zip(ms, ms[1:] + ms[:1]):
                        if self.L.node_of(a) != self.L.node_of(b):
                            flows[self.L.node_of(a)] += 1
            self.tcp_bw = min(self.tcp_bw, 0.92 * self.nz.eth_gbps * 1e9 / 8 / max(1, max(flows)))
        self.shm_bw = float(self.rng.uniform(12e9, 22e9))
        self.hang: tuple[int, float] | None = None
        for f in cfg.faults:
            h = f.hang()
            if h is not None:
                self.hang = h
        self.hung = False
        self.dump_t = 0.0
        self.hang_op: tuple[str, float] = ("", 0.0)
        self.hang_start = 0.0
        self.blocked_op: dict[int, Op] = {}
        self.ckpt_spans: list[tuple[int, float, float]] = []
        self.step_starts: list[float] = []
        self.traced_steps = 0

    # ---- bookkeeping ---------------------------------------------------------------------------
    def track(self, *key: Any) -> _Track:
        tr = self.tracks.get(key)
        if tr is None:
            tr = self.tracks[key] = _Track()
        return tr

    def emit(self, rec: dict[str, Any], t: float, node: int) -> None:
        ts = self.cfg.start_ns + int(round(t * 1e9)) + self.off_ns[node]
        rec["ts_ns"] = ts
        self.lines.append((ts, len(self.lines), json.dumps(rec, separators=(",", ":"))))

    def fn_record(self, r: int, step: int, fn: str, kind: str, t0: float, t1: float, **extra: Any) -> None:
        node = self.L.node_of(r)
        ns0 = int(round(t0 * 1e9))
        rec: dict[str, Any] = {"type": "fn", "job": self.cfg.job_id, "node": self.L.node_names[node], "rank": r,
                               "step": step + self.nz.step_offset, "fn": fn, "kind": kind, "ts_ns": 0,
                               "dur_ns": int(round(t1 * 1e9)) - ns0}
        rec.update(extra)
        ts = self.cfg.start_ns + ns0 + self.off_ns[node]
        rec["ts_ns"] = ts
        self.lines.append((ts, len(self.lines), json.dumps(rec, separators=(",", ":"))))
        self.fn_count += 1

    # ---- program of one rank for one step -------------------------------------------------------
    def program(self, r: int, step: int, t: float, noise: np.ndarray) -> list[Op]:
        L, wl, faults = self.L, self.wl, self.cfg.faults
        node, stage = L.node_of(r), L.stage_of(r)
        d, ti = L.dp_of(r), L.tp_of(r)
        hf = 1.0
        for f in faults:
            hf *= f.host_factor(node, t)
        warm = 1.0
        if step < self.nz.warmup_steps:
            warm = self.nz.warmup_factor ** ((self.nz.warmup_steps - step) / self.nz.warmup_steps)
        ni = 0

        def nz() -> float:
            nonlocal ni
            ni += 1
            return float(noise[ni - 1])

        pause = 0.0
        for f in faults:
            pause += f.python_pause(r, step, t, self.rng)
        pause_at = int(self.rng.integers(3)) if pause else -1
        py = [(PY_PREP, wl.prep_s), (PY_SCHED, wl.sched_s), (PY_LOG, wl.log_s)]
        pyd = [base * hf * nz() + (pause if i == pause_at else 0.0) for i, (_, base) in enumerate(py)]
        pf = 1.0
        for f in faults:
            pf = min(pf, f.pcie_factor(r, t))
        ops: list[Op] = [("d",), ("h", PY_PREP[0], PY_PREP[1], pyd[0]),
                         ("m", H2D_FN, wl.h2d_bytes / (PCIE_BW * pf) * nz() + 8e-6, wl.h2d_bytes, "h2d")]
        m = wl.microbatches
        fwd = wl.compute_s * wl.fwd_share / m
        bwd = wl.compute_s * (1 - wl.fwd_share) / m
        scale = float(self.static[r]) * warm
        tpg = f"tp:{L.node_names[node]}:{L.gpu_of(L.tp_group(r)[0])}"
        tp_members = tuple(L.tp_group(r))

        # The host thread dispatches kernels ahead of the GPU; only when contention makes dispatch
        # slower than execution (host_busy * hf > 1) does the GPU starve, by the excess.
        starve = max(0.0, wl.host_busy * hf - 1.0)

        def kernels(table: tuple[tuple[str, str, float], ...], total: float, py: tuple[str, str]) -> None:
            # the Python call that enqueues this pass: it returns once the last kernel is queued, so it
            # overlaps the GPU work while the host is ahead and covers the GPU's idle gaps when it is not
            at = len(ops)
            gpu = 0.0
            for kclass, fn, share in table:
                base = total * share
                kf = 1.0
                for f in faults:
                    kf *= f.kernel_factor(r, kclass, fn, t)
                ops.append(("g", base * (wl.gap_frac * hf + starve)))
                ops.append(("k", fn, kclass, base * scale * kf * nz()))
                gpu += ops[-2][1] + ops[-1][3]
            ops.insert(at, ("p", py[0], py[1], min(wl.host_busy * hf * total * nz(), gpu)))

        def p2p(direction: str, src_stage: int, mb: int) -> None:
            a, b = L.rank_of(src_stage, d, ti), L.rank_of(src_stage + (1 if direction == "f" else -1), d, ti)
            lo = min(src_stage, src_stage + (1 if direction == "f" else -1))
            group = f"pp:dp{d}:tp{ti}:{lo}-{lo + 1}"
            op = "send" if a == r else "recv"
            ops.append(("c", ("p", direction, group, step, mb), "ncclSend" if op == "send" else "ncclRecv", op, group,
                        wl.p2p_bytes, (a, b)))

        for mb in range(m):
            if stage > 0:
                p2p("f", stage - 1, mb)
            kernels(FWD_KERNELS, fwd, PY_FWD)
            if L.tp > 1:
                ops.append(("c", ("tf", tpg, step, mb), "ncclAllReduce", "all_reduce", tpg, wl.tp_bytes, tp_members))
            if stage < L.pp - 1:
                p2p("f", stage, mb)
        for mb in reversed(range(m)):
            if stage < L.pp - 1:
                p2p("b", stage + 1, mb)
            kernels(BWD_KERNELS, bwd, PY_BWD)
            if L.tp > 1:
                ops.append(("c", ("tb", tpg, step, mb), "ncclAllReduce", "all_reduce", tpg, wl.tp_bytes, tp_members))
            if stage > 0:
                p2p("b", stage, mb)
        dpg = f"dp:stage{stage}:tp{ti}"
        dp_members = tuple(L.dp_group(r))
        of = 1.0
        for f in faults:
            of *= f.kernel_factor(r, "optimizer", OPT_FN, t)
        opt = ("o", wl.opt_s * scale * of * nz())
        if wl.dp_mode == "ddp":
            ops.append(("c", ("dp", dpg, step, 0), "ncclAllReduce", "all_reduce", dpg, wl.dp_bytes, dp_members))
            ops.append(opt)
        else:
            ops.append(("c", ("dp", dpg, step, 0), "ncclReduceScatter", "reduce_scatter", dpg, wl.dp_bytes, dp_members))
            ops.append(opt)
            ops.append(("c", ("dp", dpg, step, 1), "ncclAllGather", "all_gather", dpg, wl.dp_bytes, dp_members))
        ops.append(("h", PY_SCHED[0], PY_SCHED[1], pyd[1]))
        ops.append(("m", D2H_FN, 9e-6 * nz(), 8, "d2h"))
        ops.append(("h", PY_LOG[0], PY_LOG[1], pyd[2]))
        if step in self.nz.checkpoint_steps:
            io = 1.0
            for f in faults:
                io = max(io, f.io_factor(node, t))
            ops.append(("m", D2H_FN, wl.ckpt_bytes / min(PAGEABLE_BW, PCIE_BW * pf) * nz(), wl.ckpt_bytes, "d2h"))
            ops.append(("h", PY_CKPT[0], PY_CKPT[1], self.nz.checkpoint_s * io * float(self.rng.lognormal(0, 0.05))))
            ops.append(("c", ("ckpt", step), "torch.distributed.barrier", "barrier", "world", 8,
                        tuple(range(L.world))))
        return ops

    # ---- engine ---------------------------------------------------------------------------------
    def run(self) -> None:
        cfg, L = self.cfg, self.L
        w = L.world
        per_step = max(len([o for o in self.program(r, 1, 0.0, np.ones(256)) if o[0] != "g"]) for r in (0, w - 1))
        est = per_step * w * cfg.n_steps
        active = 2
        period = 1 if est <= cfg.max_fn_records else int(math.ceil(est / cfg.max_fn_records * active))
        self.rng = np.random.default_rng(cfg.seed)   # the probe above must not shift the stream
        self.t = [float(x) for x in self.rng.uniform(0.0, 0.4, w)]   # process start skew
        self.static = self.rng.lognormal(0.0, 0.004, w)                # silicon / cooling spread
        k = 40 + 16 * self.wl.microbatches
        step = 0
        limit = cfg.n_steps if self.hang is None else cfg.n_steps * 4
        while step < limit:
            t_hi = max(self.t)
            traced = step % period < active
            if self.hang is not None and t_hi + 3 * cfg.step_time_s >= self.hang[1]:
                traced = True   # the flight recorder's ring buffer: the last steps before a hang
            noise = self.rng.lognormal(0.0, self.nz.compute_sigma, size=(w, k))
            progs = [self.program(r, step, self.t[r], noise[r]) for r in range(w)]
            self.step_starts.append(min(self.t))
            self.traced_steps += traced
            self.run_step(step, progs, traced)
            if self.hung:
                break
            step += 1
            if self.hang is None and min(self.t) >= cfg.duration_s * 1.6:
                break   # the observation covers a span of time: a slowed job gets through fewer steps

    def run_step(self, step: int, progs: list[list[Op]], traced: bool) -> None:
        """Advance every rank through its program; a rank at a collective waits for the others."""
        w = self.L.world
        pc = [0] * w
        pend: dict[tuple[Any, ...], list[tuple[int, float]]] = {}
        self.blocked_op = {}
        ready = list(range(w - 1, -1, -1))
        dead: set[int] = set()
        while ready:
            r = ready.pop()
            t = self.t[r]
            prog = progs[r]
            i = pc[r]
            while i < len(prog):
                op = prog[i]
                if op[0] == "c":
                    arrived = pend.setdefault(op[1], [])
                    arrived.append((r, t))
                    if len(arrived) < len(op[6]):
                        self.blocked_op[r] = op
                        break
                    del pend[op[1]]
                    end = self.resolve(op, arrived, step, traced)
                    for m, _ in arrived:
                        self.t[m] = end
                        if m != r:
                            pc[m] += 1
                            ready.append(m)
                    t = end
                    i += 1
                    continue
                nt = self.local(r, op, t, step, traced)
                if nt is None:
                    dead.add(r)
                    break
                t = nt
                i += 1
            pc[r] = i
            self.t[r] = t
        if dead or pend:
            self.stall(step, pend, dead)

    def stall(self, step: int, pend: dict[tuple[Any, ...], list[tuple[int, float]]], dead: set[int]) -> None:
        """The hang: dump every blocked rank's collective as in flight at the watchdog's dump time."""
        assert self.hang is not None, "deadlock without a hang fault: the program is inconsistent"
        self.hung = True
        self.dump_t = self.hang_start + float(self.rng.uniform(60, 100))
        for r in sorted(dead):
            fn, t0 = self.hang_op
            self.fn_record(r, step, fn, "kernel", t0, self.dump_t, stream=COMPUTE_STREAM, in_flight=True)
            self.track("busy_k", r).add(t0, self.dump_t, self.dump_t - t0)
        for key in sorted(pend, key=repr):
            for r, a in pend[key]:
                op = self.blocked_op[r]
                self.collective_record(r, step, op, a, self.dump_t, in_flight=True)
                self.track("busy_c", r).add(a, self.dump_t, self.dump_t - a)

    def local(self, r: int, op: Op, t: float, step: int, traced: bool) -> float | None:
        code = op[0]
        if code == "g":
            return t + float(op[1])
        if code == "k":
            if self.hang is not None and not self.hung and r == self.hang[0] and t >= self.hang[1]:
                self.hang_op = (op[1], t)
                self.hang_start = t
                return None
            end = t + float(op[3])
            self.track("busy_k", r).add(t, end, op[3])
            if traced:
                self.fn_record(r, step, op[1], "kernel", t, end, stream=COMPUTE_STREAM)
            return end
        if code == "d":
            return self.loader(r, step, t, traced)
        if code == "p":
            if traced:
                self.fn_record(r, step, op[1], "python", t, t + float(op[3]), stack=op[2])
            return t
        if code == "h":
            end = t + float(op[3])
            if traced:
                self.fn_record(r, step, op[1], "python", t, end, stack=op[2])
            if op[1] == PY_CKPT[0]:
                # serialise + write the shard to the shared filesystem (front-end network)
                self.ckpt_spans.append((self.L.node_of(r), t, end))
                w0 = t + 0.08 * op[3]
                self.track("eth_tx", self.L.node_of(r)).add(w0, end, float(self.wl.ckpt_bytes))
                if traced:
                    self.fn_record(r, step, "torch.serialization.save", "io", w0, end - 0.01 * op[3],
                                   stack=op[2] + ";torch/serialization.py:save")
            return end
        if code == "o":
            end = t + float(op[1])
            self.track("busy_k", r).add(t, end, op[1])
            if traced:
                self.fn_record(r, step, OPT_FN, "optimizer", t, end, stream=COMPUTE_STREAM)
            return end
        if code == "m":
            end = t + float(op[2])
            self.track("pcie_rx" if op[4] == "h2d" else "pcie_tx", r).add(t, end, float(op[3]))
            if traced:
                self.fn_record(r, step, op[1], "memcpy", t, end, bytes=op[3], stream=COMPUTE_STREAM)
            return end
        raise ValueError(code)

    def loader(self, r: int, step: int, t: float, traced: bool) -> float:
        """Prefetching loader: a batch is ready ``period`` after the previous one, and production
        pauses while ``PREFETCH`` batches wait; ``__next__`` blocks until the batch is ready."""
        node = self.L.node_of(r)
        period = self.wl.loader_period_s * float(self.rng.lognormal(0, 0.1))
        for f in self.cfg.faults:
            p = f.loader_period(r, node, t, self.rng)
            if p is not None:
                period = max(period, p)
        st = self.loaders[r]
        if step == 0:
            st.ready = t + float(self.rng.uniform(0.5, 2.0))   # worker processes start up
        else:
            room = st.calls[0] if len(st.calls) == PREFETCH else 0.0
            st.ready = max(st.ready, room) + period
        st.calls.append(t)
        hf = 1.0
        for f in self.cfg.faults:
            hf *= f.host_factor(node, t)
        dur = self.wl.loader_s * hf * float(self.rng.lognormal(0, 0.2)) + max(0.0, st.ready - t)
        if traced:
            self.fn_record(r, step, LOADER_FN, "dataloader", t, t + dur,
                           stack="pretrain.py:<module>;pretrain.py:main;trainer.py:Trainer.fit;"
                                 "torch/utils/data/dataloader.py:DataLoader.__next__")
        return t + dur

    # ---- collectives ------------------------------------------------------------------------------
    def ring(self, group: str, members: tuple[int, ...]) -> list[tuple[int, int]]:
        hops = self.hops.get(group)
        if hops is None:
            ms = sorted(members)
            hops = self.hops[group] = [(ms[i], ms[(i + 1) % len(ms)]) for i in range(len(ms))] if len(ms) > 1 else []
        return hops

    def hop(self, s: int, d: int, t: float) -> tuple[float, float, str]:
        """(bandwidth, stall, medium) of one ring hop from rank s to rank d at time t."""
        L = self.L
        ns, nd = L.node_of(s), L.node_of(d)
        faults = self.cfg.faults
        if ns == nd:
            if self.intra == "shm":
                return self.shm_bw, 0.0, "shm"
            f = 1.0
            for x in faults:
                f = min(f, x.nvlink_factor(s, t), x.nvlink_factor(d, t))
            return NVLINK_BW * f, 0.0, "nvlink"
        if self.tcp_bw:
            return self.tcp_bw, 0.0, "tcp"
        f, stall = 1.0, 0.0
        for x in faults:
            for node, rank in ((ns, s), (nd, d)):
                bf, st = x.nic_effect(node, L.gpu_of(rank), t, self.rng)
                f, stall = min(f, bf), max(stall, st)
            f = min(f, x.pcie_factor(s, t) * PCIE_BW * 0.9 / NIC_BW, x.pcie_factor(d, t) * PCIE_BW * 0.9 / NIC_BW)
        return NIC_BW * f, stall, "rdma"

    def resolve(self, op: Op, arrived: list[tuple[int, float]], step: int, traced: bool) -> float:
        """Everyone leaves when the last member has arrived plus the ring transfer time."""
        _, key, fn, cop, group, nbytes, members = op
        t_last = max(a for _, a in arrived)
        n = len(members)
        if cop in ("send", "recv"):
            hops = [(members[0], members[1])]
            factor, nsteps = 1.0, 1
        else:
            hops = self.ring(group, members)
            if cop == "all_reduce":
                factor, nsteps = 2 * (n - 1) / n, 2 * (n - 1)
            elif cop == "barrier":
                factor, nsteps = 0.0, n - 1
            else:
                factor, nsteps = (n - 1) / n, n - 1
        bw, stall, alpha = math.inf, 0.0, 0.0
        media: list[str] = []
        for s, d in hops:
            b, st, medium = self.hop(s, d, t_last)
            bw, stall, alpha = min(bw, b), max(stall, st), max(alpha, ALPHA[medium])
            media.append(medium)
        hop_bytes = factor * nbytes
        xfer = (hop_bytes / bw if hops else 0.0) * float(self.rng.lognormal(0, 0.02)) + nsteps * alpha
        if group not in self.inited:
            self.inited.add(group)
            stall += float(self.rng.uniform(0.2, 1.0))   # communicator setup on first use
        t0 = t_last + stall
        end = t0 + xfer
        if hop_bytes:
            for (s, d), medium in zip(hops, media):
                if cop in ("send", "recv"):
                    self.book(s, d, medium, t0, end, hop_bytes)
                else:   # NCCL runs its ring channels both ways round: each link carries both directions
                    self.book(s, d, medium, t0, end, hop_bytes / 2)
                    self.book(d, s, medium, t0, end, hop_bytes / 2)
        for r, a in arrived:
            self.track("busy_c", r).add(a, end, end - a)
            if traced:
                self.collective_record(r, step, op, a, end)
        return end

    def collective_record(self, r: int, step: int, op: Op, t0: float, t1: float, **extra: Any) -> None:
        _c, _key, fn, cop, group, nbytes, members = op
        if cop in ("send", "recv"):
            cop, fn = ("send", "ncclSend") if r == members[0] else ("recv", "ncclRecv")
        self.fn_record(r, step, fn, "collective", t0, t1, bytes=int(nbytes), op=cop, group=group, **extra)

    def book(self, s: int, d: int, medium: str, t0: float, t1: float, nbytes: float) -> None:
        L = self.L
        if medium == "nvlink":
            self.track("nvl_tx", s).add(t0, t1, nbytes)
            self.track("nvl_rx", d).add(t0, t1, nbytes)
            return
        self.track("pcie_tx", s).add(t0, t1, nbytes)
        self.track("pcie_rx", d).add(t0, t1, nbytes)
        if medium == "rdma":
            self.track("nic_tx", L.node_of(s), L.gpu_of(s)).add(t0, t1, nbytes)
            self.track("nic_rx", L.node_of(d), L.gpu_of(d)).add(t0, t1, nbytes)
        elif medium == "tcp":
            self.track("eth_tx", L.node_of(s)).add(t0, t1, nbytes)
            self.track("eth_rx", L.node_of(d)).add(t0, t1, nbytes)



    # ---- counters ---------------------------------------------------------------------------------
    def rate(self, key: tuple[Any, ...], a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Mean rate of one timeline over each [a, b] (bytes/s, or busy fraction)."""
        tr = self.tracks.get(key)
        if tr is None:
            return np.zeros(len(a))
        out: np.ndarray = tr.integral(a, b) / (b - a)
        return out

    def ticks(self, node: int, t_end: float) -> np.ndarray:
        """One node agent's sampling instants: a period, lateness jitter, maybe a stall."""
        nz = self.nz
        p = nz.sample_period_s
        base = np.arange(float(self.rng.uniform(0, p)), t_end, p)
        tk = base + np.abs(self.rng.normal(0, nz.sample_jitter_s, len(base)))
        tk = np.maximum.accumulate(tk)
        if node == nz.gap_node:
            tk = tk[(tk < nz.gap_start_s) | (tk > nz.gap_start_s + nz.gap_len_s)]
        return tk[tk < t_end]

    def counters(self) -> None:
        L, nz, rng = self.L, self.nz, self.rng
        t_end = (self.dump_t if self.hung else max(self.t)) + 1.0
        eth_rx_base = float(rng.uniform(5e6, 2e8))
        for node in range(L.nodes):
            tk = self.ticks(node, t_end)
            if len(tk) == 0:
                continue
            a = np.concatenate([[tk[0] - nz.sample_period_s], tk[:-1]])
            name = L.node_names[node]
            for r in L.ranks_on(node):
                self.gpu_samples(r, node, name, tk + 0.002 * L.gpu_of(r), a + 0.002 * L.gpu_of(r))
            self.nic_samples(node, name, tk, a, eth_rx_base)
            if node != nz.no_host_node:
                self.host_samples(node, name, tk)

    def gpu_samples(self, r: int, node: int, name: str, b: np.ndarray, a: np.ndarray) -> None:
        rng, faults = self.rng, self.cfg.faults
        uk = np.clip(self.rate(("busy_k", r), a, b), 0, 1)
        uc = np.clip(self.rate(("busy_c", r), a, b), 0, 1 - uk)
        ptx, prx = self.rate(("pcie_tx", r), a, b), self.rate(("pcie_rx", r), a, b)
        ntx, nrx = self.rate(("nvl_tx", r), a, b), self.rate(("nvl_rx", r), a, b)
        hot = float(rng.uniform(0, 6))
        mem = float(rng.uniform(0.72, 0.92)) * MEM_TOTAL
        nvlink = node not in self.nz.no_nvlink_nodes
        for j in range(len(b)):
            util = float(uk[j] + uc[j])
            power = 72 + uk[j] * 620 + uc[j] * 110 + float(rng.normal(0, 18))
            bits = 0
            if util < 0.05:
                clock, bits, gen = IDLE_SM_CLOCK, 0x1, 1      # idle: clocks drop, ASPM lowers the link
            else:
                gen = 5
                clock = int(MAX_SM_CLOCK - 15 * int(rng.integers(0, 2)))
                if power >= POWER_LIMIT * 0.985:
                    power = float(rng.uniform(0.985, 1.0)) * POWER_LIMIT
                    bits |= 0x4
                    clock = int(round(MAX_SM_CLOCK * rng.uniform(0.88, 0.97) / 15) * 15)
            s: dict[str, Any] = {
                "type": "gpu", "job": self.cfg.job_id, "node": name, "rank": r, "gpu": self.L.gpu_of(r), "ts_ns": 0,
                "sm_util_pct": int(round(100 * util)), "mem_util_pct": int(round(100 * (uk[j] * 0.45 + uc[j] * 0.08))),
                "sm_clock_mhz": clock, "max_sm_clock_mhz": MAX_SM_CLOCK, "power_w": round(float(max(60.0, power)), 1),
                "power_limit_w": POWER_LIMIT, "temp_c": int(round(31 + 0.052 * max(60.0, power) + hot + rng.normal(0, 1))),
                "throttle_reasons": bits, "pcie_gen": gen, "max_pcie_gen": 5, "pcie_width": 16, "max_pcie_width": 16,
                "pcie_tx_Bps": int(ptx[j] + rng.uniform(2e6, 6e6)), "pcie_rx_Bps": int(prx[j] + rng.uniform(2e6, 6e6)),
            }
            if nvlink:
                s["nvlink_tx_Bps"] = int(ntx[j] + rng.uniform(0, 2e5))
                s["nvlink_rx_Bps"] = int(nrx[j] + rng.uniform(0, 2e5))
            s.update({"ecc_uncorrected": 0, "xid": 0, "mem_used_bytes": int(mem + rng.normal(0, 2e8)),
                      "mem_total_bytes": MEM_TOTAL})
            t = float(b[j])
            for f in faults:
                f.gpu_sample(r, t, s, rng)
            self.emit(s, t, node)

    def nic_samples(self, node: int, name: str, b: np.ndarray, a: np.ndarray, eth_rx_base: float) -> None:
        rng, faults = self.rng, self.cfg.faults
        dt = b - a
        gpn = self.L.gpus_per_node
        ports = [f"mlx5_{i}" for i in range(gpn)] + ["eth0", "lo"]
        cnp_base = float(rng.uniform(0, 30))
        for port in ports:
            if port.startswith("mlx5_"):
                rail = int(port[5:])
                tx, rx = self.rate(("nic_tx", node, rail), a, b), self.rate(("nic_rx", node, rail), a, b)
                cum = {"tx_discards": float(rng.integers(0, 3)), "rx_errors": float(rng.integers(0, 3)),
                       "symbol_errors": float(rng.integers(0, 40)), "link_downed": float(rng.integers(0, 2)),
                       "retransmits": float(rng.integers(0, 500)), "cnp_sent": float(rng.integers(0, 2_000_000)),
                       "xmit_wait": float(rng.integers(0, 5_000_000_000))}
            elif port == "eth0":
                tx, rx = self.rate(("eth_tx", node), a, b), self.rate(("eth_rx", node), a, b)
                cum = {"tx_discards": 0.0, "rx_errors": float(rng.integers(0, 5)), "link_downed": 0.0}
            else:
                tx = rx = np.zeros(len(b))
                cum = {}
            for j in range(len(b)):
                s: dict[str, Any] = {"type": "nic", "job": self.cfg.job_id, "node": name, "nic": port, "ts_ns": 0}
                t = float(b[j])
                rates = {k: 0.0 for k in cum}
                if port.startswith("mlx5_"):
                    s.update({"port": 1, "link_gbps": 400, "link_up": True,
                              "tx_Bps": int(tx[j] + rng.uniform(2e4, 2e5)), "rx_Bps": int(rx[j] + rng.uniform(2e4, 2e5))})
                    busy = min(1.0, float(tx[j] + rx[j]) / (2 * NIC_BW))
                    rates.update({"symbol_errors": 1e-4, "retransmits": 0.01, "cnp_sent": cnp_base * busy,
                                  "xmit_wait": 2e5 * busy})
                elif port == "eth0":
                    s.update({"port": 1, "link_gbps": self.nz.eth_gbps, "link_up": True,
                              "tx_Bps": int(tx[j] + rng.uniform(2e6, 2e7)),
                              "rx_Bps": int(rx[j] + eth_rx_base * rng.uniform(0.7, 1.3))})
                else:
                    lo = int(rng.uniform(1e5, 5e6))
                    s.update({"link_up": True, "tx_Bps": lo, "rx_Bps": lo})
                for f in faults:
                    f.nic_sample(node, port, t, s, rates)
                for k in cum:
                    cum[k] += float(rng.poisson(rates[k] * dt[j])) if rates[k] > 0 else 0.0
                    s[k] = int(cum[k])
                self.emit(s, t, node)

    def host_samples(self, node: int, name: str, b: np.ndarray) -> None:
        rng, faults = self.rng, self.cfg.faults
        cpu, load = float(rng.uniform(12, 30)), float(rng.uniform(15, 40))
        memp, steal = float(rng.uniform(25, 55)), (float(rng.uniform(0, 0.5)) if rng.random() < 0.3 else 0.0)
        spans = [(t0, t1) for n, t0, t1 in self.ckpt_spans if n == node]
        for j in range(len(b)):
            t = float(b[j])
            ck = any(t0 <= t <= t1 + 1.0 for t0, t1 in spans)
            s: dict[str, Any] = {
                "type": "host", "job": self.cfg.job_id, "node": name, "ts_ns": 0,
                "cpu_util_pct": round(float(np.clip(cpu + rng.normal(0, 2) + (12 if ck else 0), 0, 100)), 1),
                "load1": round(float(max(0.0, load + rng.normal(0, 2))), 2),
                "iowait_pct": round(float(rng.uniform(8, 25) if ck else abs(rng.normal(0.4, 0.3))), 1),
                "mem_used_pct": round(memp + float(rng.normal(0, 0.3)), 1),
                "steal_pct": round(steal * float(rng.uniform(0.5, 1.5)), 2),
            }
            for f in faults:
                f.host_sample(node, t, s, rng)
            self.emit(s, t, node)


# ------------------------------------------------------------------------------------------------


def write_jsonl(cfg: JobConfig, path: str | Path) -> dict[str, Any]:
    """Simulate ``cfg``, write its telemetry-v1 records to ``path`` (time-ordered) and return the truth."""
    sim = _Sim(cfg)
    sim.run()
    sim.counters()
    L = sim.L
    job = {"type": "job", "job": cfg.job_id, "ts_ns": cfg.start_ns, "world_size": L.world,
           "rank_nodes": [L.node_names[L.node_of(r)] for r in range(L.world)],
           "rank_stages": [L.stage_of(r) for r in range(L.world)], "rank_dp": [L.dp_of(r) for r in range(L.world)],
           "dp": L.dp, "tp": L.tp, "pp": L.pp}
    sim.lines.sort(key=lambda x: (x[0], x[1]))
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps(job, separators=(",", ":")) + "\n")
        for _, _, line in sim.lines:
            out.write(line)
            out.write("\n")
    faults = [f.truth(L) for f in cfg.faults]
    return {
        "faults": faults, "healthy": not faults, "layout": {"rank_nodes": job["rank_nodes"]},
        "records": len(sim.lines) + 1,
        "scenario": cfg.scenario, "job": cfg.job_id, "seed": cfg.seed,
        "config": {"nodes": cfg.nodes, "gpus_per_node": cfg.gpus_per_node, "tp": L.tp, "dp": L.dp, "pp": L.pp,
                   "step_time_s": round(cfg.step_time_s, 4), "n_steps": cfg.n_steps,
                   "steps_run": len(sim.step_starts), "traced_steps": sim.traced_steps,
                   "job_seconds": round((sim.dump_t if sim.hung else max(sim.t)), 2),
                   "dp_mode": cfg.workload.dp_mode, "microbatches": cfg.workload.microbatches},
        "nuisances": asdict(cfg.nuisances),
    }
