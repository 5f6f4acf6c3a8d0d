"""The ``realistic`` fleet profile: nuisances a real fleet has and the default profile leaves out.

The default profile is the clean world the detector was written against: one
NIC per GPU, one GPU model, every counter present, perfectly synchronised
clocks, a 0.7 s step, no checkpoints. An evaluation on that world alone can be
tuned to. Under ``SimConfig(profile="realistic")`` the seed draws (from its own
RNG streams, ``[seed, 0xF1EE7, i]``, so the culprits a benchmark draws from the
same seed stay independent of them) a fleet with the nuisances below. None of
them is a fault: the ground truth is unchanged, a healthy run stays healthy,
and none persistently slows one rank, node or link more than its peers.

Record-level transforms of the engine's output (:class:`Fleet.transform`):

1. **NICs beyond the RDMA rails.** Every node also reports its front-end
   Ethernet port ``eth0`` (link 100 or 200 Gb/s, per seed or mixed per node;
   1-200 MB/s of bursty storage / logging / metrics traffic, unrelated to the
   collectives); on about half the nodes a management port ``eno1`` (BMC-side
   LAN, 1, 10 or 25 Gb/s, almost no traffic); ``lo`` (loopback: no link speed,
   tx = rx, 0.1-50 MB/s of local RPC); on some seeds ``docker0`` (a Linux
   bridge: link speed absent or a nominal 10 Gb/s, ~0 traffic); on some seeds
   ``bond0`` over ``eth0`` + ``eth1`` (link = the sum, traffic = the sum); on
   some seeds IPoIB ``ib0`` (same speed as a rail, 400 Gb/s, < 2 MB/s). Error
   counters on these ports stay near zero, but on some seeds one management
   port carries a few hundred ``rx_errors`` (a flaky BMC-side cable no one
   fixes because nothing depends on it); it must not be blamed.
3. **Counter fields missing.** Per node, each of these groups is absent with
   probability 0.12 (driver / firmware / agent version differences): NVLink
   throughput, PCIe throughput, ``throttle_reasons``, power; on the RDMA rails
   the vendor ``hw_counters`` (``retransmits``, ``cnp_sent``, ``xmit_wait``);
   ``link_gbps`` of ``eth0``; and on some seeds one node writes no ``host``
   record at all. Never dropped: a rail's ``link_gbps`` and the SM clock,
   without which a lowered link or a throttled GPU could not be told from its
   peers by any counter (truth would name a culprit no data can show).
4. **Clock offsets.** Every node's timestamps (all record types) are shifted by
   a constant in [-50, +50] ms: NTP-disciplined hosts in one data centre stay
   within tens of milliseconds of each other; PTP is not everywhere.
5. **Sampling gaps and counter resets.** About a third of the nodes lose all
   counter samples for 1-3 intervals of 4-12 s (at least two sample periods):
   an agent restart, a stalled NVML call, a full send buffer. On most seeds one
   node reloads its GPU and NIC drivers mid-run (30-70 % of the way): a 5-15 s
   gap, then every cumulative counter (``ecc_uncorrected``, the NIC error,
   retransmit, CNP and wait counters, on every port of the node) restarts
   from 0.

Engine hooks (they change timing, so counters and collectives follow):

2. **Two GPU models** on 40 % of seeds (with two nodes or more): half the
   nodes are H100 SXM5 80 GB (1980 MHz, 700 W, idle 85 W), the other half
   H100 NVL 94 GB (1785 MHz, 400 W, idle 60 W, 95830 MiB, 6 degC warmer: an
   air-cooled PCIe card). Clocks, power (same share of the model's range),
   temperature and memory size follow each model. Their compute speed differs
   by 0.5-2 % (the NVL's lower clock is mostly offset by its faster HBM at this
   kernel mix), far below a straggler's 10 %.
6. **Step times from 50 ms to 3 minutes.** The healthy step is drawn
   log-uniformly over [0.05, 180] s; every kernel, launch and payload of the
   model is scaled to reach it (calibrated on a short healthy run of the same
   layout); a pipelined job's step is at least 0.25 s per stage (no one
   pipelines a smaller model). The counter period follows:
   ``clip(step / 20, 0.5 s, 10 s)`` (a sample every 0.5 s is what agents
   manage; slower than 10 s hides minutes).
   The run lasts ``max(20 steps, 240 s)``: 20 steps for the step-level
   statistics, 240 s = 8 windows of 30 s for the detector's persistence. The
   tracer records fn records of one step in ``trace_every`` (a profiler
   schedule, as Kineto's ``wait / active``) so that a rank writes at most
   ~65 fn records per second (the ingest of a 10k-GPU job near 200 MB/s):
   a medium-scale run stays near 1.1 M records. In-flight records of a hang
   are always written (a flight-recorder dump).
7. **Checkpoints** every N steps (N from a 40-200 s interval, at least 3
   steps): ``checkpoint.save`` (kind ``io``) on every rank, 2-20 s, each rank
   writes its shard (+-10 %) and all leave at a barrier; GPUs idle.
8. **Evaluation** every M steps (a 60-240 s interval, at least 4 steps): 1-20
   forward-only batches (5-30 s), an ``eval.forward`` python region and the
   forward kernels and TP collectives, on every rank, between training steps.
9. **Warm-up**: the first 2-4 steps are 2-6x slower on every rank
   (compilation, autotuning, NCCL initialisation), kernels and host alike.
10. **Jittery MoE layers** on 35 % of seeds: the MLPs are expert GEMMs after a
    router; each rank's expert kernels take 0.7-1.3x their time, drawn anew
    each step (token-routing imbalance, persistent on no rank).
11. **Pipeline schedules** where pp > 1: GPipe, 1F1B or interleaved 1F1B
    (two model chunks per stage), a third of seeds each; microbatches pp or
    2*pp (2*pp only for steps >= 2 s: small models use few microbatches).
    1F1B sends are asynchronous (Megatron batches isend / irecv), GPipe's
    block as in the default profile.
12. **FSDP** on 30 % of seeds: per-block all-gather of the parameters in the
    forward and the backward, reduce-scatter of the gradients in the
    backward, over the DP group, instead of the end-of-step reduce-scatter and
    all-gather.

Record-level, how the collector writes what it saw (each drawn per seed, from
its own stream, so that the draws above stay as they were):

13. **Collector styles.** The contract makes these optional, and collectors
    other than ours differ in exactly these ways: no ``job`` record on 30 % of
    seeds (a collector that does not know the parallel layout: the stages
    must be read from the communicators); collectives written as the GPU
    kernels a CUPTI / Nsight / Kineto-based collector sees on 30 % of seeds
    (kind ``kernel``, NCCL's kernel name such as
    ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``, no ``op``; bytes and the
    communicator kept, as NCCL's profiler plugin gives them); no ``stack`` on
    30 % of seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from .program import MOE_EXPERT_KERNELS, Variant

if TYPE_CHECKING:
    from .config import Layout, SimConfig
    from .engine import Effects
    from .program import Program

RNG_TAG = 0xF1EE7  # the realistic profile's RNG streams: [seed, RNG_TAG, stream]
S_PLAN, S_NODES, S_RECORDS, S_STEPS, S_COLLECTOR = 0, 1, 2, 3, 4

STEP_RANGE_S = (0.05, 180.0)  # healthy step, drawn log-uniformly (a small fine-tune .. a huge model)
SAMPLE_RANGE_S = (0.5, 10.0)  # counter period bounds; period = step / SAMPLES_PER_STEP inside them
SAMPLES_PER_STEP = 20  # counter samples per step where the bounds allow: shapes within a step stay visible
MIN_STEPS = 20  # step-level statistics (medians, MAD) need a few tens of steps
MIN_RUN_S = 240.0  # 8 windows of the detector's default 30 s: persistence needs several
TRACE_RECORDS_PER_S = 65.0  # tracer budget, fn records per rank per second (see nuisance 6)
WARMUP_STEPS = (2, 4)  # inclusive
WARMUP_FACTOR = (2.0, 6.0)
CKPT_INTERVAL_S = (40.0, 200.0)  # short for a fleet (often 30-60 min), so that a 240 s run sees one or more
CKPT_MIN_EVERY = 3
CKPT_S = (2.0, 20.0)  # a sharded checkpoint to a parallel file system
CKPT_RANK_JITTER = 0.10  # shard write times differ by up to 10 %
EVAL_INTERVAL_S = (60.0, 240.0)
EVAL_MIN_EVERY = 4
EVAL_PHASE_S = (5.0, 30.0)
EVAL_MAX_BATCHES = 20  # bounds the records of a short-step eval
FWD_SHARE = 1.0 / 3.0  # forward ~ a third of a step (backward ~ twice the forward)
P_MOE, P_FSDP = 0.35, 0.30
MOE_JITTER = 0.30  # expert kernels 0.7-1.3x per rank and step
SCHEDULES = ("gpipe", "1f1b", "interleaved")
INTERLEAVED_CHUNKS = 2  # Megatron's virtual pipeline size in most configs
BIG_MB_STEP_S = 2.0  # microbatches 2*pp only at or above this step time
# Pipelining is for big models: below ~0.25 s of step per stage the bubble and the p2p latency would
# dominate and no one would pipeline. It also bounds the engine's work (a 50 ms, 4-stage interleaved
# step is ~100 vectorised ops every 50 ms of simulated time).
PP_MIN_STAGE_S = 0.25
P_TWO_MODELS = 0.40
MODEL_GAP = (0.005, 0.02)  # compute-speed difference of the two models
CLOCK_OFFSET_MS = 50.0
P_GAP_NODE = 0.33
GAPS_PER_NODE = (1, 3)
GAP_S = (4.0, 12.0)
GAP_MIN_PERIODS = 2
P_RESET = 0.70
RESET_AT = (0.3, 0.7)  # share of the planned run
RESET_GAP_S = (5.0, 15.0)  # a driver reload takes the node's agent off the air for this long
P_FIELD_GROUP = 0.12  # per node and field group: about half the nodes lack at least one of the six
P_HOST_MISSING = 0.40
P_MIXED_ETH, P_BOND, P_IB0, P_DOCKER, P_MGMT, P_NOISY_MGMT = 0.25, 0.30, 0.40, 0.50, 0.50, 0.40
RAIL_GBPS = 400.0  # the engine's NIC speed, for IPoIB ib0 on the same HCA

P_NO_JOB, P_NCCL_KERNELS, P_NO_STACK = 0.30, 0.30, 0.30  # nuisance 13: collector styles
NCCL_KERNEL = {  # the GPU kernel NCCL runs for each op (a barrier is a one-element all-reduce)
    "all_reduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "all_gather": "ncclDevKernel_AllGather_RING_LL",
    "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "broadcast": "ncclDevKernel_Broadcast_RING_LL",
    "send": "ncclDevKernel_SendRecv", "recv": "ncclDevKernel_SendRecv", "barrier": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
}

GPU_FIELD_GROUPS = {
    "nvlink": ("nvlink_tx_Bps", "nvlink_rx_Bps"),
    "pcie_traffic": ("pcie_tx_Bps", "pcie_rx_Bps"),
    "throttle_reasons": ("throttle_reasons",),
    "power": ("power_w", "power_limit_w"),
}
NIC_HW_COUNTERS = ("retransmits", "cnp_sent", "xmit_wait")
CUMULATIVE = {
    "gpu": ("ecc_uncorrected",),
    "nic": ("tx_discards", "rx_errors", "symbol_errors", "link_downed", "retransmits", "cnp_sent", "xmit_wait"),
}


@dataclass(frozen=True)
class GpuModel:
    """What NVML reports for a GPU model, and its board power when idle."""

    name: str
    max_clock_mhz: float
    power_limit_w: float
    idle_w: float
    mem_total_bytes: int
    temp_offset_c: float


H100_SXM = GpuModel("H100 SXM5 80GB", 1980.0, 700.0, 85.0, 85_520_809_984, 0.0)  # the engine's constants
H100_NVL = GpuModel("H100 NVL 94GB", 1785.0, 400.0, 60.0, 95_830 * (1 << 20), 6.0)


@dataclass(frozen=True)
class Plan:
    """What the seed draws before any layout is known: step time, run length, phases, structure."""

    seed: int
    step_s: float
    sample_s: float
    steps: int
    warmup: tuple[float, ...]
    ckpt_interval_s: float
    eval_interval_s: float
    eval_phase_s: float
    moe: bool
    fsdp: bool
    schedule: str
    mb_mult: int

    def step_for(self, pp: int) -> float:
        """The healthy step of a ``pp``-stage job: no shorter than PP_MIN_STAGE_S per stage."""
        return max(self.step_s, PP_MIN_STAGE_S * pp) if pp > 1 else self.step_s

    def sample_for(self, pp: int) -> float:
        return _sample_s(self.step_for(pp))

    def steps_for(self, pp: int) -> int:
        return _steps(self.step_for(pp))

    def microbatches(self, pp: int) -> int:
        """Microbatches per step of a pipelined job (a multiple of pp, as the interleaved schedule needs)."""
        return pp * self.mb_mult


def _sample_s(step_s: float) -> float:
    return float(min(SAMPLE_RANGE_S[1], max(SAMPLE_RANGE_S[0], step_s / SAMPLES_PER_STEP)))


def _steps(step_s: float) -> int:
    return max(MIN_STEPS, math.ceil(MIN_RUN_S / step_s))


@lru_cache(maxsize=1024)
def plan_for(seed: int) -> Plan:
    """The seed's plan; the draws come in a fixed order from their own stream."""
    rng = np.random.default_rng([seed, RNG_TAG, S_PLAN])
    lo, hi = STEP_RANGE_S
    step_s = float(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    sample_s, steps = _sample_s(step_s), _steps(step_s)
    n_warm = int(rng.integers(WARMUP_STEPS[0], WARMUP_STEPS[1] + 1))
    warm = tuple(sorted((float(x) for x in rng.uniform(*WARMUP_FACTOR, n_warm)), reverse=True))
    ckpt = float(rng.uniform(*CKPT_INTERVAL_S))
    ev = float(rng.uniform(*EVAL_INTERVAL_S))
    ev_phase = float(rng.uniform(*EVAL_PHASE_S))
    moe = bool(rng.random() < P_MOE)
    fsdp = bool(rng.random() < P_FSDP)
    schedule = SCHEDULES[int(rng.integers(len(SCHEDULES)))]
    mb_mult = 2 if (rng.random() < 0.5 and step_s >= BIG_MB_STEP_S) else 1
    return Plan(seed, step_s, sample_s, steps, warm, ckpt, ev, ev_phase, moe, fsdp, schedule, mb_mult)


def variant_for(cfg: "SimConfig") -> Variant:
    """The model structure a realistic run of ``cfg`` uses."""
    p = cfg.plan
    schedule, chunks = (p.schedule, 1) if cfg.pp > 1 else ("gpipe", 1)
    if schedule == "interleaved":
        if cfg.mb % cfg.pp == 0:
            chunks = INTERLEAVED_CHUNKS
        else:  # Megatron refuses interleaving when microbatches are not a multiple of pp
            schedule = "1f1b"
    return Variant(moe=p.moe, fsdp=p.fsdp, schedule=schedule, chunks=chunks)


@lru_cache(maxsize=128)
def nominal_step_ns(nodes: int, gpus: int, tp: int, pp: int, mb: int, variant: Variant) -> float:
    """Healthy step time of a layout and structure at model scale 1 (a 4-step probe run, no nuisance)."""
    from .config import SimConfig
    from .engine import Simulation

    cfg = SimConfig(nodes=nodes, gpus=gpus, steps=4, tp=tp, pp=pp, microbatches=mb if pp > 1 else None, seed=0)
    sim = Simulation(cfg, variant=variant)
    for _ in sim.steps(build=False):
        pass
    return float(np.median(sim.step_durs))


def trace_every(prog: "Program", step_s: float) -> int:
    """The tracer records one step in this many (nuisance 6): at most ``TRACE_RECORDS_PER_S`` a rank."""
    return max(1, math.ceil(prog.records_per_rank_step() / (TRACE_RECORDS_PER_S * step_s)))


class Fleet:
    """The nuisances of one realistic run: drawn from the seed and the layout, never from the faults."""

    def __init__(self, cfg: "SimConfig", L: "Layout", prog: "Program"):
        self.cfg, self.L = cfg, L
        p = self.plan = cfg.plan
        self.job = cfg.job_id
        self.t0 = int(cfg.start_ns)
        v = prog.variant
        step = self.step_s = p.step_for(cfg.pp)
        self.scale = step * 1e9 / nominal_step_ns(cfg.nodes, cfg.gpus, cfg.tp_size, cfg.pp, cfg.mb, v)
        self.trace_every = trace_every(prog, step)
        te = self.trace_every
        # checkpoints and evaluations after traced steps only, so their records are written
        self.ckpt_every = te * max(1, math.ceil(max(CKPT_MIN_EVERY, round(p.ckpt_interval_s / step)) / te))
        self.eval_every = te * max(1, math.ceil(max(EVAL_MIN_EVERY, round(p.eval_interval_s / step)) / te))
        if self.eval_every == self.ckpt_every:
            self.eval_every += te  # never both after the same step: two phases to tell apart
        self.eval_batches = int(min(EVAL_MAX_BATCHES, max(1, round(p.eval_phase_s / (FWD_SHARE * step)))))
        self.log_scale = min(1.0, self.scale)  # rank 0's logging is a fixed cost, at most a share of tiny steps
        self.sample_ns = cfg.sample_period_ms * 1e6
        self.checkpoints: list[dict[str, Any]] = []
        self._draw_nodes()
        self.step_rng = np.random.default_rng([cfg.seed, RNG_TAG, S_STEPS])
        self.rec_rng = np.random.default_rng([cfg.seed, RNG_TAG, S_RECORDS])
        style = np.random.default_rng([cfg.seed, RNG_TAG, S_COLLECTOR]).random(3)
        self.no_job, self.nccl_kernels, self.no_stack = (bool(style[0] < P_NO_JOB), bool(style[1] < P_NCCL_KERNELS),
                                                         bool(style[2] < P_NO_STACK))
        self.node_index = {n: i for i, n in enumerate(L.node_names)}
        self._last: dict[tuple, dict[str, int]] = {}
        self._port_cum: dict[tuple[int, str], dict[str, int]] = {}

    # -------------------------------------------------------------- draws
    def _draw_nodes(self) -> None:
        cfg, L = self.cfg, self.L
        N = L.nodes
        rng = np.random.default_rng([cfg.seed, RNG_TAG, S_NODES])
        dur_ns = cfg.steps * self.step_s * 1e9  # the run as configured (tests shorten it)
        P = self.sample_ns
        # 2: GPU models
        two = bool(rng.random() < P_TWO_MODELS) and N >= 2
        b_nodes = sorted(int(x) for x in rng.choice(N, N // 2, replace=False)) if two else []
        self.gap_speed = float(rng.uniform(*MODEL_GAP))
        self.node_model = [H100_NVL if n in b_nodes else H100_SXM for n in range(N)]
        # 4: clock offsets
        self.offset_ns = [int(round(x * 1e6)) for x in rng.uniform(-CLOCK_OFFSET_MS, CLOCK_OFFSET_MS, N)]
        # 1: ports beyond the rails
        eth = int(rng.choice([100, 200]))
        mixed = bool(rng.random() < P_MIXED_ETH)
        eth_node = [int(rng.choice([100, 200])) for _ in range(N)] if mixed else [eth] * N
        bond = bool(rng.random() < P_BOND)
        ib0 = bool(rng.random() < P_IB0)
        docker = bool(rng.random() < P_DOCKER)
        docker_link = 10.0 if rng.random() < 0.5 else None
        mgmt = [bool(x < P_MGMT) for x in rng.random(N)]
        mgmt_gbps = [float(rng.choice([1, 10, 25])) for _ in range(N)]
        noisy = bool(rng.random() < P_NOISY_MGMT) and any(mgmt)
        cand = [n for n in range(N) if mgmt[n]]
        self.noisy_mgmt = int(rng.choice(cand)) if noisy else None
        self.noisy_start = int(rng.integers(150, 450))
        self.ports: list[list[tuple[str, float | None]]] = []
        for n in range(N):
            ports: list[tuple[str, float | None]] = [("eth0", float(eth_node[n]))]
            if bond:
                ports += [("eth1", float(eth_node[n])), ("bond0", 2.0 * eth_node[n])]
            if mgmt[n]:
                ports.append(("eno1", mgmt_gbps[n]))
            ports.append(("lo", None))
            if docker:
                ports.append(("docker0", docker_link))
            if ib0:
                ports.append(("ib0", RAIL_GBPS))
            self.ports.append(ports)
        # 3: missing fields
        self.gpu_drop = [[g for g in GPU_FIELD_GROUPS if rng.random() < P_FIELD_GROUP] for _ in range(N)]
        self.hw_drop = [bool(x < P_FIELD_GROUP) for x in rng.random(N)]
        self.eth_link_drop = [bool(x < P_FIELD_GROUP) for x in rng.random(N)]
        host_missing = bool(rng.random() < P_HOST_MISSING)
        hm = int(rng.integers(N))
        self.host_missing = hm if host_missing else None
        # 5: gaps and a reset
        self.gaps: list[list[tuple[int, int]]] = [[] for _ in range(N)]
        gap_nodes = [n for n in range(N) if rng.random() < P_GAP_NODE] or [int(rng.integers(N))]
        for n in gap_nodes:
            for _ in range(int(rng.integers(GAPS_PER_NODE[0], GAPS_PER_NODE[1] + 1))):
                length = max(rng.uniform(*GAP_S) * 1e9, GAP_MIN_PERIODS * P)
                start = rng.uniform(0.0, dur_ns)
                self.gaps[n].append((self.t0 + int(start), self.t0 + int(start + length)))
        reset = bool(rng.random() < P_RESET)
        rn = int(rng.integers(N))
        at = self.t0 + int(rng.uniform(*RESET_AT) * dur_ns)
        rgap = int(max(rng.uniform(*RESET_GAP_S) * 1e9, GAP_MIN_PERIODS * P))
        self.reset: tuple[int, int] | None = (rn, at) if reset else None
        if reset:
            self.gaps[rn].append((at - rgap, at))
        for g in self.gaps:
            g.sort()
        self.eth_link_drop_nodes = {n for n in range(N) if self.eth_link_drop[n]}

    # -------------------------------------------------------- engine hooks
    def rank_speed(self) -> np.ndarray:
        """Kernel-duration multiplier per rank from its GPU model (1 on the faster model)."""
        return np.array([1.0 + self.gap_speed if self.node_model[n] is H100_NVL else 1.0
                         for n in self.L.node.tolist()])

    def gpu_arrays(self) -> dict[str, np.ndarray]:
        """Per-rank NVML constants of each rank's GPU model."""
        ms = [self.node_model[n] for n in self.L.node.tolist()]
        return {
            "max_clock": np.array([m.max_clock_mhz for m in ms]),
            "power_limit": np.array([m.power_limit_w for m in ms]),
            "idle": np.array([m.idle_w for m in ms]),
            "mem_total": np.array([m.mem_total_bytes for m in ms], dtype=np.int64),
            "temp_model": np.array([m.temp_offset_c for m in ms]),
            # the model's dynamic power range relative to the SXM's the engine's kernel powers assume
            "power_scale": np.array([(m.power_limit_w - m.idle_w) / (H100_SXM.power_limit_w - H100_SXM.idle_w)
                                     for m in ms]),
        }

    def step_effects(self, k: int, E: "Effects", W: int) -> None:
        """Warm-up (every rank alike) and MoE routing jitter (per rank, per step)."""
        if k < len(self.plan.warmup):
            f = self.plan.warmup[k]
            for c in ("gemm", "attn", "mem", "comm", "copy"):
                E.kfac[c] = E.kfac[c] * f
            E.host_fac = E.host_fac * f
        if self.plan.moe:
            for name in MOE_EXPERT_KERNELS:
                E.kfn_rank[name] = self.step_rng.uniform(1.0 - MOE_JITTER, 1.0 + MOE_JITTER, W)

    def traced(self, k: int) -> bool:
        return k % self.trace_every == 0

    def checkpoint_after(self, k: int) -> bool:
        return k > 0 and k % self.ckpt_every == 0 and k < self.cfg.steps - 1

    def eval_after(self, k: int) -> bool:
        return k > 0 and k % self.eval_every == 0 and k < self.cfg.steps - 1

    def checkpoint_ns(self, k: int, W: int) -> np.ndarray:
        """Each rank's shard-write time of the checkpoint after step ``k``."""
        base = float(self.step_rng.uniform(*CKPT_S))
        self.checkpoints.append({"after_step": k, "s": round(base, 3)})
        return base * 1e9 * self.step_rng.uniform(1.0 - CKPT_RANK_JITTER, 1.0, W)

    # ----------------------------------------------------- record transform
    def transform(self, recs: list[dict]) -> list[dict]:
        """Apply the record-level nuisances (1, 3, 4, 5, 13) to one step's records (engine time order)."""
        out: list[dict] = []
        idx = self.node_index
        for r in recs:
            t = r["type"]
            if t == "job":  # the engine adds the job record after this transform (and leaves it out on no_job)
                out.append(r)
                continue
            n = idx[r["node"]]
            if t == "fn":
                r["ts_ns"] += self.offset_ns[n]
                if self.no_stack:
                    r.pop("stack", None)
                if self.nccl_kernels and r["kind"] == "collective":
                    r["kind"], r["fn"] = "kernel", NCCL_KERNEL.get(r.pop("op", None) or "", "ncclDevKernel_Generic")
                out.append(r)
                continue
            batch = [r]
            if t == "nic" and r["nic"] == "mlx5_0":
                batch += self._extra_ports(n, r["node"], r["ts_ns"])
            for x in batch:
                ts = x["ts_ns"]
                self._reset(x, n, ts)
                if self._in_gap(n, ts) or (t == "host" and n == self.host_missing):
                    continue
                self._drop_fields(x, n)
                x["ts_ns"] = ts + self.offset_ns[n]
                out.append(x)
        return out

    def _in_gap(self, n: int, ts: int) -> bool:
        return any(a <= ts < b for a, b in self.gaps[n])

    def _reset(self, x: dict, n: int, ts: int) -> None:
        if self.reset is None or self.reset[0] != n:
            return
        t = x["type"]
        fields = CUMULATIVE.get(t)
        if not fields:
            return
        key = (t, x.get("gpu", x.get("nic")))
        if ts < self.reset[1]:
            self._last[key] = {f: x[f] for f in fields if f in x}
        else:
            base = self._last.get(key, {})
            for f in fields:
                if f in x:
                    x[f] = x[f] - base.get(f, 0)

    def _drop_fields(self, x: dict, n: int) -> None:
        t = x["type"]
        if t == "gpu":
            for g in self.gpu_drop[n]:
                for f in GPU_FIELD_GROUPS[g]:
                    x.pop(f, None)
        elif t == "nic":
            name = x["nic"]
            if name.startswith("mlx5_"):
                if self.hw_drop[n]:
                    for f in NIC_HW_COUNTERS:
                        x.pop(f, None)
            elif name == "eth0" and n in self.eth_link_drop_nodes:
                x.pop("link_gbps", None)

    def _extra_ports(self, n: int, node: str, ts: int) -> list[dict]:
        """One sample of the node's non-RDMA ports at ``ts`` (engine time)."""
        rng, P_s = self.rec_rng, self.sample_ns / 1e9
        out: list[dict] = []
        eth_bps: dict[str, tuple[float, float]] = {}
        for name, gbps in self.ports[n]:
            cum = self._port_cum.setdefault((n, name), {"tx_discards": 0, "rx_errors": 0, "link_downed": 0})
            if name in ("eth0", "eth1"):
                # bursty front-end traffic: a lognormal base of a few MB/s, bursts of 50-200 MB/s
                # (checkpoint staging, dataset prefetch, metrics), clipped to the stated 1-200 MB/s
                txrx = []
                for _ in range(2):
                    v = rng.lognormal(math.log(5e6), 0.8)
                    if rng.random() < 0.08:
                        v = rng.uniform(50e6, 200e6)
                    txrx.append(float(min(200e6, max(1e6, v))))
                tx, rx = txrx
                eth_bps[name] = (tx, rx)
                cum["rx_errors"] += int(rng.poisson(0.0005 * P_s))  # a stray CRC error every ~30 min
                cum["tx_discards"] += int(rng.poisson(0.002 * P_s))
            elif name == "bond0":
                tx = sum(v[0] for v in eth_bps.values())
                rx = sum(v[1] for v in eth_bps.values())
            elif name == "eno1":
                tx, rx = float(rng.uniform(1e3, 5e4)), float(rng.uniform(1e3, 5e4))
                if n == self.noisy_mgmt:
                    if cum["rx_errors"] == 0:
                        cum["rx_errors"] = self.noisy_start
                    cum["rx_errors"] += int(rng.poisson(0.02 * P_s))
            elif name == "lo":
                tx = rx = float(rng.uniform(1e5, 5e7))
            elif name == "docker0":
                tx, rx = float(rng.uniform(0.0, 1e3)), float(rng.uniform(0.0, 1e3))
            else:  # ib0
                tx, rx = float(rng.uniform(1e4, 2e6)), float(rng.uniform(1e4, 2e6))
            rec: dict[str, Any] = {"type": "nic", "job": self.job, "node": node, "nic": name, "ts_ns": ts}
            if name not in ("lo", "docker0", "bond0"):
                rec["port"] = 1
            rec["tx_Bps"] = round(tx)
            rec["rx_Bps"] = round(rx)
            if gbps is not None:
                rec["link_gbps"] = gbps
            rec["link_up"] = True
            if name != "lo":
                rec.update(cum)
            out.append(rec)
        return out

    # -------------------------------------------------------------- truth
    def describe(self) -> dict[str, Any]:
        """The drawn nuisances, for the truth file (what a reader of a failure needs to know)."""
        L, p = self.L, self.plan
        nn = L.node_names
        models: dict[str, list[str]] = {}
        for n, m in enumerate(self.node_model):
            models.setdefault(m.name, []).append(nn[n])
        return {
            "step_s_planned": round(self.step_s, 4),
            "model_scale": round(self.scale, 5),
            "sample_ms": round(self.sample_ns / 1e6, 3),
            "trace_every_steps": self.trace_every,
            "warmup_factors": [round(x, 3) for x in p.warmup],
            "checkpoint_every_steps": self.ckpt_every,
            "checkpoints": self.checkpoints,
            "eval_every_steps": self.eval_every,
            "eval_batches": self.eval_batches,
            "moe": p.moe,
            "fsdp": p.fsdp and self.cfg.dp > 1,
            "pipeline_schedule": variant_for(self.cfg).schedule if self.cfg.pp > 1 else None,
            "gpu_models": models,
            "model_speed_gap": round(self.gap_speed, 4) if len(models) > 1 else 0.0,
            "clock_offset_ns": {nn[n]: o for n, o in enumerate(self.offset_ns)},
            "extra_ports": {nn[n]: [name for name, _ in self.ports[n]] for n in range(L.nodes)},
            "noisy_mgmt_port": nn[self.noisy_mgmt] if self.noisy_mgmt is not None else None,
            "missing_fields": {nn[n]: self.gpu_drop[n] + (["nic_hw_counters"] if self.hw_drop[n] else [])
                               + (["eth0_link_gbps"] if self.eth_link_drop[n] else [])
                               for n in range(L.nodes)
                               if self.gpu_drop[n] or self.hw_drop[n] or self.eth_link_drop[n]},
            "host_records_missing": nn[self.host_missing] if self.host_missing is not None else None,
            "sampling_gaps_ns": {nn[n]: [list(g) for g in self.gaps[n]] for n in range(L.nodes) if self.gaps[n]},
            "counter_reset": ({"node": nn[self.reset[0]], "ts_ns": self.reset[1]} if self.reset else None),
            "collector": {"job_record": not self.no_job, "collectives_as_nccl_kernels": self.nccl_kernels,
                          "stacks": not self.no_stack},
        }


__all__ = ["Plan", "Fleet", "GpuModel", "H100_SXM", "H100_NVL", "plan_for", "variant_for", "nominal_step_ns",
           "RNG_TAG"]
