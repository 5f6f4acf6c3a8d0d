"""Fault catalogue for the independent generator: physical causes, their effects, their ground truth.

Each fault is a small object with *hooks*: the generator asks every active fault how it changes
one physical quantity (a kernel's speed on one rank, one link's bandwidth, one NIC port's error
counters...) and derives everything observable from those quantities. A fault therefore never
writes a symptom directly into a record: a throttled GPU lowers its clock and the generator
slows that rank's kernels, so its peers wait in the next collective because the collective model
makes them wait, not because the fault says so. That keeps the symptoms consistent with each
other the way they are on a real cluster.

Parameters (which rank or node, magnitude, onset) are drawn from the scenario's random generator,
so a seed fixes them. ``truth()`` gives the entry that ``eroica.bench.scoring`` expects.

Nothing here is taken from the project's own simulator or detector: the effects come from how
the hardware and software behave (NVML clock-event reasons, NCCL ring algorithm, RoCE
congestion control, PyTorch DataLoader prefetching, CPython's generational GC).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

Rng = np.random.Generator

# NVML clock-event ("throttle") reason bits (nvmlClocksEventReason*).
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80

# Kernel classes: how a kernel's duration scales with SM clock (compute-bound ones scale fully,
# memory-bound ones barely, since HBM bandwidth does not follow the SM clock).
COMPUTE_BOUND = ("gemm", "attn")
MEMORY_BOUND = ("elementwise",)


@dataclass(frozen=True)
class Layout:
    """Where each rank lives and which parallel groups it belongs to.

    Megatron-style order: tensor-parallel index fastest, then data-parallel, then pipeline stage,
    so a tensor-parallel group sits inside one node (NVLink) and a pipeline stage is a block of
    whole nodes; data-parallel rings cross nodes over the RDMA rails.
    """

    nodes: int
    gpus_per_node: int
    tp: int
    dp: int
    pp: int
    node_names: tuple[str, ...]
    duration_s: float
    step_time_s: float

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def gpu_of(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def tp_of(self, rank: int) -> int:
        return rank % self.tp

    def dp_of(self, rank: int) -> int:
        return (rank // self.tp) % self.dp

    def stage_of(self, rank: int) -> int:
        return rank // (self.tp * self.dp)

    def rank_of(self, stage: int, dp: int, tp: int) -> int:
        return tp + self.tp * (dp + self.dp * stage)

    def ranks_on(self, node: int) -> list[int]:
        return list(range(node * self.gpus_per_node, (node + 1) * self.gpus_per_node))

    def tp_group(self, rank: int) -> list[int]:
        s, d = self.stage_of(rank), self.dp_of(rank)
        return [self.rank_of(s, d, t) for t in range(self.tp)]

    def dp_group(self, rank: int) -> list[int]:
        s, t = self.stage_of(rank), self.tp_of(rank)
        return [self.rank_of(s, d, t) for d in range(self.dp)]

    def stage_ranks(self, stage: int) -> list[int]:
        n = self.tp * self.dp
        return list(range(stage * n, (stage + 1) * n))


def _onset(rng: Rng, layout: Layout, p_start: float = 0.5) -> float:
    """Either present from the start or appearing between 30% and 60% of the run."""
    return 0.0 if rng.random() < p_start else float(rng.uniform(0.3, 0.6) * layout.duration_s)


@dataclass
class Fault:
    """Base: neutral hooks. Times ``t`` are seconds since the job's start (true time, no clock offset)."""

    name: str = ""
    onset_s: float = 0.0

    def on(self, t: float) -> bool:
        return t >= self.onset_s

    def truth(self, layout: Layout) -> dict[str, Any]:
        raise NotImplementedError

    def _entry(self, kind: str, component: str, scope: str, ranks: list[int], nodes: list[str],
               **extra: Any) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "kind": kind, "component": component, "scope": scope,
                             "ranks": ranks, "nodes": nodes, "onset_s": round(self.onset_s, 3)}
        d.update(extra)
        return d

    # --- timing hooks -------------------------------------------------------------------------
    def kernel_factor(self, rank: int, kclass: str, fn: str, t: float) -> float:
        """Multiplier on one kernel's duration on one rank."""
        return 1.0

    def host_factor(self, node: int, t: float) -> float:
        """Multiplier on host (Python) work and kernel-launch gaps on one node."""
        return 1.0

    def loader_period(self, rank: int, node: int, t: float, rng: Rng) -> float | None:
        """Seconds the loader workers need to produce one batch for this rank (None: keeps up)."""
        return None

    def io_factor(self, node: int, t: float) -> float:
        """Multiplier on checkpoint write time on one node."""
        return 1.0

    def pcie_factor(self, rank: int, t: float) -> float:
        """Fraction of its nominal PCIe bandwidth one GPU's host link delivers."""
        return 1.0

    def nvlink_factor(self, rank: int, t: float) -> float:
        """Fraction of its nominal NVLink bandwidth one GPU delivers."""
        return 1.0

    def nic_effect(self, node: int, rail: int, t: float, rng: Rng) -> tuple[float, float]:
        """(bandwidth fraction, stall seconds) of one RDMA port for one collective crossing it."""
        return 1.0, 0.0

    def intra_transport(self) -> str | None:
        """'pcie' when NCCL cannot use NVLink between GPUs of a node."""
        return None

    def tcp_gbps(self) -> float | None:
        """Per-rank socket bandwidth (Gb/s) when NCCL runs over TCP instead of RDMA."""
        return None

    def python_pause(self, rank: int, step: int, t: float, rng: Rng) -> float:
        """Extra seconds inside a host Python function on this rank at this step."""
        return 0.0

    def hang(self) -> tuple[int, float] | None:
        """(rank, time) at which that rank's next compute kernel never finishes."""
        return None

    # --- counter hooks (mutate the sample being built) ----------------------------------------
    def gpu_sample(self, rank: int, t: float, s: dict[str, Any], rng: Rng) -> None:
        return None

    def nic_sample(self, node: int, port: str, t: float, s: dict[str, Any], rates: dict[str, float]) -> None:
        """May change fields of ``s`` and the per-second rates of the cumulative counters."""
        return None

    def host_sample(self, node: int, t: float, s: dict[str, Any], rng: Rng) -> None:
        return None


# ------------------------------------------------------------------------------------------------
# GPU


@dataclass
class GpuThrottle(Fault):
    """One GPU runs at a lowered SM clock: thermal, hardware slowdown, or a lowered power cap.

    Compute-bound kernels (GEMM, attention) slow by max/actual clock; memory-bound ones barely;
    NVML shows the low clock and the matching clock-event reason bits.
    """

    rank: int = 0
    clock_ratio: float = 0.75
    cause: str = "thermal"
    power_limit_w: float = 700.0

    @classmethod
    def draw(cls, rng: Rng, layout: Layout) -> "GpuThrottle":
        cause = str(rng.choice(["thermal", "hw_slowdown", "power_cap"]))
        return cls(name="gpu_throttle", onset_s=_onset(rng, layout), rank=int(rng.integers(layout.world)),
                   clock_ratio=float(rng.uniform(0.6, 0.85)), cause=cause,
                   power_limit_w=float(rng.choice([350.0, 400.0, 450.0])))

    def kernel_factor(self, rank: int, kclass: str, fn: str, t: float) -> float:
        if rank != self.rank or not self.on(t):
            return 1.0
        slow = 1.0 / self.clock_ratio
        if kclass in COMPUTE_BOUND:
            return slow
        if kclass == "optimizer":
            return float(slow ** 0.5)
        return float(slow ** 0.25)

    def gpu_sample(self, rank: int, t: float, s: dict[str, Any], rng: Rng) -> None:
        if rank != self.rank or not self.on(t) or s.get("sm_util_pct", 0) < 5:
            return
        mx = s["max_sm_clock_mhz"]
        s["sm_clock_mhz"] = int(round(mx * self.clock_ratio * rng.uniform(0.98, 1.01) / 15) * 15)
        bits = s["throttle_reasons"] & ~SW_POWER_CAP
        if self.cause == "thermal":
            s["temp_c"] = int(rng.integers(86, 94))
            bits |= SW_THERMAL | HW_THERMAL
        elif self.cause == "hw_slowdown":
            bits |= HW_SLOWDOWN | (HW_POWER_BRAKE if rng.random() < 0.5 else 0)
            s["power_w"] = round(s["power_w"] * self.clock_ratio, 1)
        else:
            s["power_limit_w"] = self.power_limit_w
            s["power_w"] = round(self.power_limit_w * rng.uniform(0.97, 1.0), 1)
            s["temp_c"] = int(round(31 + 0.052 * s["power_w"] + rng.normal(0, 1)))
            bits |= SW_POWER_CAP
        s["throttle_reasons"] = bits

    def truth(self, layout: Layout) -> dict[str, Any]:
        return self._entry("slow", "gpu", "rank", [self.rank], [layout.node_names[layout.node_of(self.rank)]],
                           cause=self.cause, clock_ratio=round(self.clock_ratio, 3))


@dataclass
class PcieDegraded(Fault):
    """One GPU's host PCIe link trained below its capability (gen and/or width).

    Host<->device copies slow in proportion; GPUDirect RDMA to the rail NIC also crosses this
    link (GPU and NIC share a PCIe switch), so its inter-node traffic is capped too.
    """

    rank: int = 0
    gen: int = 3
    width: int = 16

    @classmethod
    def draw(cls, rng: Rng, layout: Layout) -> "PcieDegraded":
        gen, width = [(3, 16), (4, 8), (4, 16), (5, 8), (3, 8), (5, 4)][int(rng.integers(6))]
        return cls(name="pcie_degraded", onset_s=_onset(rng, layout, 0.7), rank=int(rng.integers(layout.world)),
                   gen=gen, width=width)

    @property
    def factor(self) -> float:
        return float(2.0 ** (self.gen - 5) * self.width / 16)

    def pcie_factor(self, rank: int, t: float) -> float:
        return self.factor if rank == self.rank and self.on(t) else 1.0

    def gpu_sample(self, rank: int, t: float, s: dict[str, Any], rng: Rng) -> None:
        if rank == self.rank and self.on(t):
            s["pcie_gen"] = min(s["pcie_gen"], self.gen)
            s["pcie_width"] = self.width

    def truth(self, layout: Layout) -> dict[str, Any]:
        return self._entry("slow", "pcie", "rank", [self.rank], [layout.node_names[layout.node_of(self.rank)]],
                           gen=self.gen, width=self.width)


@dataclass
class NvlinkDegraded(Fault):
    """Some of one GPU's 18 NVLinks are down: every intra-node ring through that GPU slows.

    The rank's tensor-parallel peers share the slow ring, so they legitimately show it too
    (affected_ranks); scope stays the rank, the GPU whose links failed.
    """

    rank: int = 0
    links_up: int = 9

    @classmethod
    def draw(cls, rng: Rng, layout: Layout) -> "NvlinkDegraded":
        return cls(name="nvlink_degraded", onset_s=_onset(rng, layout), rank=int(rng.integers(layout.world)),
                   links_up=int(rng.integers(3, 11)))

    def nvlink_factor(self, rank: int, t: float) -> float:
        return self.links_up / 18 if rank == self.rank and self.on(t) else 1.0

    def truth(self, layout: Layout) -> dict[str, Any]:
        peers = [r for r in layout.ranks_on(layout.node_of(self.rank)) if r != self.rank]
        return self._entry("slow", "nvlink", "rank", [self.rank], [layout.node_names[layout.node_of(self.rank)]],
                           affected_ranks=peers, links_up=self.links_up)


# ------------------------------------------------------------------------------------------------
# Network


@dataclass
class NicHalfSpeed(Fault):
    """One RDMA port of one node negotiated 200 of 400 Gb/s (bad cable / transceiver)."""

    node: int = 0
    rail: int = 0

    @classmethod
    def draw(cls, rng: Rng, layout: Layout) -> "NicHalfSpeed":
        return cls(name="nic_half_speed", onset_s=_onset(rng, layout, 0.6), node=int(rng.integers(layout.nodes)),
                   rail=int(rng.integers(layout.gpus_per_node)))

    def nic_effect(self, node: int, rail: int, t: float, rng: Rng) -> tuple[float, float]:
        return (0.5, 0.0) if node == self.node and rail == self.rail and self.on(t) else (1.0, 0.0)

    def nic_sample(self, node: int, port: str, t: float, s: dict[str, Any], rates: dict[str, float]) -> None:
        if node == self.node and port == f"mlx5_{self.rail}" and self.on(t):
            s["link_gbps"] = 200

    def truth(self, layout: Layout) -> dict[str, Any]:
        return self._entry("slow", "nic", "node", [], [layout.node_names[self.node]], port=f"mlx5_{self.rail}")


@dataclass
class NicErrors(Fault):
    """One port with a marginal link: symbol errors, retransmissions, occasional link flaps.

    Each collective crossing the port loses goodput to retransmission and sometimes stalls for a
    retransmit timeout (or a flap), so its throughput is bursty with stretches of zero.
    """

    node: int = 0
    rail: int = 0
    stall_p: float = 0.2
    err_rate: float = 100.0

    @classmethod
    def draw(cls, rng: Rng, layout: Layout) -> "NicErrors":
        return cls(name="nic_errors", onset_s=_onset(rng, layout), node=int(rng.integers(layout.nodes)),
                   rail=int(rng.integers(layout.gpus_per_node)), stall_p=float(rng.uniform(0.1, 0.35)),
                   err_rate=float(rng.uniform(20, 400)))

    def nic_effect(self, node: int, rail: int, t: float, rng: Rng) -> tuple[float, float]:
        if node != self.node or rail != self.rail or not self.on(t):
            return 1.0, 0.0
        stall = 0.0
        u = rng.random()
        if u < 0.015:
            stall = float(rng.uniform(0.8, 2.5))  # link flap: down, retrain, NCCL retries
        elif u < self.stall_p:
            stall = float(rng.uniform(0.02, 0.3))  # RC retransmit timeout(s)
        return float(rng.uniform(0.45, 0.9)), stall

    def nic_sample(self, node: int, port: str, t: float, s: dict[str, Any], rates: dict[str, float]) -> None:
        if node == self.node and port == f"mlx5_{self.rail}" and self.on(t):
            rates["symbol_errors"] += self.err_rate * 4
            rates["rx_errors"] += self.err_rate
            rates["retransmits"] += self.err_rate * 12
            rates["link_downed"] += 0.015
            rates["tx_discards"] += self.err_rate * 0.2

    def truth(self, layout: Layout) -> dict[str, Any]:
        return self._entry("slow", "nic", "node", [], [layout.node_names[self.node]], port=f"mlx5_{self.rail}")


@dataclass
class FabricCongestion(Fault):
    """Congested spine: flows to and from many nodes get ECN-marked, DCQCN throttles senders.

    Every inter-node collective touching a congested node runs at a fraction of line rate that
    changes from one collective to the next; CNPs and xmit_wait climb; no link errors.
    """

    congested: tuple[int, ...] = ()
    lo: float = 0.35
    hi: float = 0.7

    @classmethod
    def draw(cls, rng: Rng, layout: Layout) -> "FabricCongestion":
        k = int(rng.integers(max(2, (layout.nodes + 1) // 2), layout.nodes + 1))
        nodes = tuple(sorted(int(x) for x in rng.choice(layout.nodes, size=k, replace=False)))
        lo = float(rng.uniform(0.25, 0.5))
        return cls(name="fabric_congestion", onset_s=_onset(rng, layout), congested=nodes, lo=lo,
                   hi=float(min(0.9, lo + rng.uniform(0.2, 0.4))))

    def nic_effect(self, node: int, rail: int, t: float, rng: Rng) -> tuple[float, float]:
        if node in self.congested and self.on(t):
            return float(rng.uniform(self.lo, self.hi)), 0.0
        return 1.0, 0.0

    def nic_sample(self, node: int, port: str, t: float, s: dict[str, Any], rates: dict[str, float]) -> None:
        if node in self.congested and port.startswith("mlx5_") and self.on(t):
            rates["cnp_sent"] += 2.0e4 * (1 - self.lo)
            rates["xmit_wait"] += 4.0e7 * (1 - self.lo)

    def truth(self, layout: Layout) -> dict[str, Any]:
        return self._entry("slow", "network", "job", [], [], affected_nodes=[layout.node_names[n] for n in self.congested])


@dataclass
class NcclOverTcp(Fault):
    """NCCL found no usable IB/RoCE device (e.g. a missing plugin or NCCL_IB_DISABLE) and fell back to sockets.

    Inter-node traffic leaves through the front-end eth0 at tens of Gb/s per rank; the RDMA rails
    stay idle. Every rank is alike, so only the expected bandwidth can tell.
    """

    gbps: float = 15.0

    @classmethod
    def draw(cls, rng: Rng, layout: Layout) -> "NcclOverTcp":
        return cls(name="nccl_tcp", gbps=float(rng.uniform(10, 25)))

    def tcp_gbps(self) -> float | None:
        return self.gbps

    def truth(self, layout: Layout) -> dict[str, Any]:
        return self._entry("slow", "config", "job", [], [])


@dataclass
class NvlinkUnused(Fault):
    """NCCL_P2P_DISABLE (or a container without the fabric manager): intra-node rings bounce through host memory."""

    @classmethod
    def draw(cls, rng: Rng, layout: Layout) -> "NvlinkUnused":
        return cls(name="nvlink_unused")

    def intra_transport(self) -> str | None:
        return "pcie"

    def truth(self, layout: Layout) -> dict[str, Any]:
        return self._entry("slow", "config", "job", [], [])


# ------------------------------------------------------------------------------------------------
# Host side


@dataclass
class SlowDataloader(Fault):
    """One node's loader workers cannot keep up (CPU-heavy decode/augment, too few workers).

    The prefetch queue drains and ``DataLoader.__next__`` blocks; the node's CPUs are busier.
    """

    node: int = 0
    ratio: float = 1.6
    _period_base: float = 1.0

    @classmethod
    def draw(cls, rng: Rng, layout: Layout) -> "SlowDataloader":
        return cls(name="dataloader_slow", onset_s=_onset(rng, layout), node=int(rng.integers(layout.nodes)),
                   ratio=float(rng.uniform(1.3, 2.2)))

    def loader_period(self, rank: int, node: int, t: float, rng: Rng) -> float | None:
        if node != self.node or not self.on(t):
            return None
        return float(self._period_base * self.ratio * rng.lognormal(0, 0.08))

    def bind(self, step_time_s: float) -> None:
        self._period_base = step_time_s

    def host_sample(self, node: int, t: float, s: dict[str, Any], rng: Rng) -> None:
        if node == self.node and self.on(t):
            s["cpu_util_pct"] = round(min(99.0, s["cpu_util_pct"] + rng.uniform(15, 30)), 1)

    def truth(self, layout: Layout) -> dict[str, Any]:
        return self._entry("slow", "dataloader", "node", [], [layout.node_names[self.node]])


@dataclass
class SlowStorage(Fault):
    """One node's dataset mount is slow (degraded NFS/Lustre client): reads block, iowait climbs.

    Batch production time becomes heavy-tailed; checkpoint writes from that node slow too.
    """

    node: int = 0
    ratio: float = 1.5
    _period_base: float = 1.0

    @classmethod
    def draw(cls, rng: Rng, layout: Layout) -> "SlowStorage":
        return cls(name="storage_slow", onset_s=_onset(rng, layout), node=int(rng.integers(layout.nodes)),
                   ratio=float(rng.uniform(1.2, 2.0)))

    def bind(self, step_time_s: float) -> None:
        self._period_base = step_time_s

    def loader_period(self, rank: int, node: int, t: float, rng: Rng) -> float | None:
        if node != self.node or not self.on(t):
            return None
        return float(self._period_base * self.ratio * rng.lognormal(-0.18, 0.6))

    def io_factor(self, node: int, t: float) -> float:
        return 3.0 if node == self.node and self.on(t) else 1.0

    def host_sample(self, node: int, t: float, s: dict[str, Any], rng: Rng) -> None:
        if node == self.node and self.on(t):
            s["iowait_pct"] = round(float(rng.uniform(18, 55)), 1)
            s["load1"] = round(s["load1"] + rng.uniform(10, 40), 2)  # D-state readers count in load

    def truth(self, layout: Layout) -> dict[str, Any]:
        return self._entry("slow", "storage", "node", [], [layout.node_names[self.node]])


@dataclass
class CpuContention(Fault):
    """Another process (a stray job, a runaway agent) saturates one node's CPUs.

    The training processes get a fraction of a core: Python and kernel launches slow, so the GPU
    idles between kernels; the kernels themselves are unchanged.
    """

    node: int = 0
    factor: float = 3.0

    @classmethod
    def draw(cls, rng: Rng, layout: Layout) -> "CpuContention":
        return cls(name="cpu_contention", onset_s=_onset(rng, layout), node=int(rng.integers(layout.nodes)),
                   factor=float(rng.uniform(2.5, 6.0)))

    def host_factor(self, node: int, t: float) -> float:
        return self.factor if node == self.node and self.on(t) else 1.0

    def host_sample(self, node: int, t: float, s: dict[str, Any], rng: Rng) -> None:
        if node == self.node and self.on(t):
            s["cpu_util_pct"] = round(float(rng.uniform(96, 100)), 1)
            s["load1"] = round(float(rng.uniform(1.5, 3.0) * 224), 2)

    def truth(self, layout: Layout) -> dict[str, Any]:
        return self._entry("slow", "host_cpu", "node", [], [layout.node_names[self.node]])


@dataclass
class GcPauses(Fault):
    """Long CPython generation-2 collections (a large, growing heap of Python objects).

    Each rank's collector fires every few tens of seconds at its own phase, stalling whichever
    host function is running, so the paused rank differs from one pause to the next. The cause is
    the job's code, not a machine: scope ``job``; every rank that paused is listed as affected.
    """

    pause_lo: float = 0.15
    pause_hi: float = 0.8
    interval_steps: tuple[int, ...] = ()
    phase: tuple[int, ...] = ()

    @classmethod
    def draw(cls, rng: Rng, layout: Layout) -> "GcPauses":
        lo = float(rng.uniform(0.12, 0.3))
        per_s = rng.uniform(8, 30, size=layout.world)
        steps = [max(2, int(round(p / layout.step_time_s))) for p in per_s]
        phase = [int(rng.integers(s)) for s in steps]
        return cls(name="gc_pauses", onset_s=_onset(rng, layout, 0.7), pause_lo=lo,
                   pause_hi=float(lo + rng.uniform(0.3, 0.9)), interval_steps=tuple(steps), phase=tuple(phase))

    def python_pause(self, rank: int, step: int, t: float, rng: Rng) -> float:
        if not self.on(t) or step < 3 or (step - self.phase[rank]) % self.interval_steps[rank]:
            return 0.0
        return float(rng.uniform(self.pause_lo, self.pause_hi))

    def truth(self, layout: Layout) -> dict[str, Any]:
        return self._entry("slow", "python", "job", [], [], affected_ranks=list(range(layout.world)))


# ------------------------------------------------------------------------------------------------
# Workload and software


@dataclass
class StageImbalance(Fault):
    """The last pipeline stage holds more work (LM head + loss, an uneven layer split).

    Present from the first step: it is the model's partitioning. Clocks and counters are normal.
    """

    factor: float = 1.5
    stage: int = 0
    _ranks_per_stage: int = 1

    @classmethod
    def draw(cls, rng: Rng, layout: Layout) -> "StageImbalance":
        return cls(name="stage_imbalance", factor=float(rng.uniform(1.3, 1.7)), stage=layout.pp - 1)

    def kernel_factor(self, rank: int, kclass: str, fn: str, t: float) -> float:
        return self.factor if self._stage_of(rank) == self.stage and kclass != "optimizer" else 1.0

    def bind_layout(self, layout: Layout) -> None:
        self._ranks_per_stage = layout.tp * layout.dp

    def _stage_of(self, rank: int) -> int:
        return rank // self._ranks_per_stage

    def truth(self, layout: Layout) -> dict[str, Any]:
        ranks = layout.stage_ranks(self.stage)
        return self._entry("slow", "workload", "rank", ranks, [], factor=round(self.factor, 3))


@dataclass
class KernelRegression(Fault):
    """A library update / code change makes one kernel slower on every rank from some step on."""

    kernel: str = ""
    factor: float = 1.5

    @classmethod
    def draw(cls, rng: Rng, layout: Layout, kernels: tuple[str, ...] = ()) -> "KernelRegression":
        return cls(name="kernel_regression", onset_s=float(rng.uniform(0.3, 0.55) * layout.duration_s),
                   kernel=str(rng.choice(list(kernels))) if kernels else "", factor=float(rng.uniform(1.3, 2.0)))

    def kernel_factor(self, rank: int, kclass: str, fn: str, t: float) -> float:
        return self.factor if fn == self.kernel and self.on(t) else 1.0

    def truth(self, layout: Layout) -> dict[str, Any]:
        return self._entry("slow", "software", "job", [], [], kernel=self.kernel, factor=round(self.factor, 3))


@dataclass
class Hang(Fault):
    """One rank's compute kernel never completes (a GPU fault or a device-side deadlock).

    Every other rank ends up blocked in a collective that needs it; the NCCL watchdog / flight
    recorder later dumps everyone's in-flight function. Sometimes the driver logs an XID.
    """

    rank: int = 0
    xid: int = 0

    @classmethod
    def draw(cls, rng: Rng, layout: Layout) -> "Hang":
        xid = int(rng.choice([0, 0, 43, 79, 109]))
        return cls(name="hang", onset_s=float(rng.uniform(0.4, 0.6) * layout.duration_s),
                   rank=int(rng.integers(layout.world)), xid=xid)

    def hang(self) -> tuple[int, float] | None:
        return self.rank, self.onset_s

    def gpu_sample(self, rank: int, t: float, s: dict[str, Any], rng: Rng) -> None:
        if rank == self.rank and self.xid and t >= self.onset_s + 2.0:
            s["xid"] = self.xid

    def truth(self, layout: Layout) -> dict[str, Any]:
        return self._entry("hang", "gpu", "rank", [self.rank], [layout.node_names[layout.node_of(self.rank)]], xid=self.xid)


# ------------------------------------------------------------------------------------------------

Drawer = Callable[[Rng, Layout], Fault]

CATALOGUE: dict[str, Drawer] = {
    "gpu_throttle": GpuThrottle.draw,
    "pcie_degraded": PcieDegraded.draw,
    "nvlink_degraded": NvlinkDegraded.draw,
    "nic_half_speed": NicHalfSpeed.draw,
    "nic_errors": NicErrors.draw,
    "fabric_congestion": FabricCongestion.draw,
    "dataloader_slow": SlowDataloader.draw,
    "storage_slow": SlowStorage.draw,
    "cpu_contention": CpuContention.draw,
    "gc_pauses": GcPauses.draw,
    "stage_imbalance": StageImbalance.draw,
    "kernel_regression": KernelRegression.draw,
    "nccl_tcp": NcclOverTcp.draw,
    "nvlink_unused": NvlinkUnused.draw,
    "hang": Hang.draw,
}

# Faults whose physics needs a pipeline (pp > 1).
NEEDS_PIPELINE = frozenset({"stage_imbalance"})


def draw_fault(name: str, rng: Rng, layout: Layout, kernels: tuple[str, ...] = ()) -> Fault:
    """Draw one named fault's parameters for this layout."""
    if name == "kernel_regression":
        f: Fault = KernelRegression.draw(rng, layout, kernels)
    else:
        f = CATALOGUE[name](rng, layout)
    if isinstance(f, (SlowDataloader, SlowStorage)):
        f.bind(layout.step_time_s)
    if isinstance(f, StageImbalance):
        f.bind_layout(layout)
    return f


__all__ = ["CATALOGUE", "NEEDS_PIPELINE", "Fault", "Layout", "draw_fault"]
