"""The discrete-time model of a synchronous training job, vectorised over ranks.

Each rank has a host thread and a GPU stream. The host runs Python, the data
loader and kernel launches; a GPU op starts when the stream is free *and* the
host has launched it, so a slow host shows as gaps between kernels. The only
host syncs are the end-of-step ``Memcpy DtoH`` (``loss.item()``) and rank 0's
periodic ``log_metrics``.

Collectives: a member *arrives* when its GPU reaches the op; the group ends at
the last arrival plus the transfer time paced by the ring's slowest link
(ring factor 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter/all-gather,
plus per-hop latency). Every member's record has ``ts_ns`` = its own arrival
and ``dur_ns`` = end - arrival, so the slowest member waits least and all
leave together. Pipeline send/recv pairs end together at
max(arrivals) + bytes / link bandwidth.

Links: intra-node hops use NVLink (or PCIe P2P / shared memory when NVLink is
not used); inter-node hops use the NIC of each end's local GPU index (rails)
through that GPU's PCIe link (GPUDirect RDMA), so a hop's bandwidth is the
minimum of both NICs and both PCIe links.

Counters are averages over the sample period of what the model moved: GPU
busy time (any kernel, NCCL included, as NVML reports it), memory activity,
power, PCIe / NVLink / NIC bytes.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from .config import Layout, SimConfig
from .faults import FAULTS, FaultSpec
from .program import (CLASS_MEM, CLASS_POWER, DATALOADER, DEFAULT_HANG_FN, GiB, H2D, MS, Op,
                      Program, Variant)
from .realistic import Fleet

INF = math.inf
IDLE_W = 85.0
POWER_LIMIT_W = 700.0
MAX_CLOCK = 1980.0
MEM_TOTAL = 85_520_809_984  # H100 SXM 80 GB as NVML reports it (81559 MiB)
NVL_BW = 370.0  # NCCL bus bandwidth over NVLink, bytes/ns (= GB/s)
SHM_BW = 20.0  # NCCL shared-memory / PCIe path when P2P is disabled
NIC_GBPS = 400.0
NIC_EFF = 0.92
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938}
PCIE_EFF = 0.82
A_INTRA, A_INTER = 3_000.0, 8_000.0  # per-hop latency, ns
LOG_EVERY = 10
SPIKE_P = 0.12  # chance per step of a one-off 2-4x kernel on a random rank
SMALL_GC_P = 0.25  # chance per step of a short (2-12 ms) gen-0/1 GC pause somewhere

# accumulator channels, each W wide
BUSY, MEMACT, POWER, PCIE_TX, PCIE_RX, NVL_TX, NVL_RX, NIC_TX, NIC_RX = range(9)
NCH = 9


def nic_bw(gbps: float) -> float:
    return gbps / 8.0 * NIC_EFF


def pcie_bw(gen: int, width: int) -> float:
    return PCIE_LANE_GBS[gen] * width * PCIE_EFF


PCIE_FULL = pcie_bw(5, 16)


@dataclass
class ActiveFault:
    """A fault resolved against the layout: defaults filled, culprits named."""

    index: int
    spec: FaultSpec
    name: str
    params: dict
    start: int
    end: int
    kind: str
    component: str
    scope: str
    ranks: list
    nodes: list
    fn: str | None
    rng: np.random.Generator
    extra: dict = field(default_factory=dict)
    start_ns: int | None = None

    def active(self, k: int) -> bool:
        return self.start <= k < self.end


class Effects:
    """What the active faults do during one step (arrays over ranks / NICs)."""

    def __init__(self, W: int, nodes: int, node_cpu: np.ndarray):
        ones = np.ones(W)
        self.host_fac = ones.copy()
        self.kfac = {c: ones.copy() for c in ("gemm", "attn", "mem", "comm", "copy")}
        self.kfn: dict[str, float] = {}
        self.kfn_rank: dict[str, np.ndarray] = {}  # per-rank factors of a kernel (realistic MoE jitter)
        self.dl_extra = np.zeros(W)
        self.pcie_bw = np.full(W, PCIE_FULL)
        self.pcie_gen = np.full(W, 5, dtype=np.int64)
        self.pcie_width = np.full(W, 16, dtype=np.int64)
        self.nvl_bw = np.full(W, NVL_BW)
        self.nvl_pcie = np.zeros(W, dtype=bool)
        self.nic_bw = np.full(W, nic_bw(NIC_GBPS))  # index = node * gpus + rail
        self.nic_gbps = np.full(W, NIC_GBPS)
        self.flaky: list = []  # (fault, nic index, factor, flap_prob)
        self.congested: list = []  # (fault, nic indices, factor)
        self.gc: list = []  # (fault, rank, pause_ns)
        self.hang: tuple | None = None  # (fault, rank, fn)
        self.throttle: list = []  # (rank, factor, reason)
        self.mem_pressure: list = []
        self.cpu_t = 28.0 + node_cpu
        self.load_t = np.full(nodes, 14.0)
        self.iow_t = np.full(nodes, 0.4)


class Simulation:
    """Runs the model step by step; :meth:`steps` yields one record list per step.

    ``variant`` overrides the model structure (the realistic profile's calibration
    probe uses it); the realistic profile's nuisances live in ``self.fleet``
    (:class:`.realistic.Fleet`), ``None`` for the default profile, whose output
    none of the hooks below changes.
    """

    def __init__(self, cfg: SimConfig, variant: Variant | None = None):
        cfg.validate()
        self.cfg = cfg
        L = self.L = Layout(cfg)
        self.prog = Program(cfg, variant)
        W = self.W = L.world
        self.fleet = Fleet(cfg, L, self.prog) if cfg.realistic else None
        self.P = float(cfg.sample_period_ms) * MS
        self.job = cfg.job_id
        self.t0 = int(cfg.start_ns)
        seed = int(cfg.seed)
        self.noise = np.random.default_rng([seed, 1])
        self.crng = np.random.default_rng([seed, 2])
        srng = np.random.default_rng([seed, 3])
        self.speed = 1.0 + np.clip(srng.normal(0.0, 0.004, W), -0.01, 0.01)
        self.temp_off = srng.normal(0.0, 2.0, W)
        self.mem_base = srng.uniform(60.0, 66.0, W) * GiB
        self.node_cpu = srng.normal(0.0, 2.0, L.nodes)
        self.node_mem = srng.uniform(30.0, 45.0, L.nodes)
        fl = self.fleet
        if fl is not None:
            self.speed = self.speed * fl.rank_speed()
            self.prog.scale(fl.scale)
        ga = fl.gpu_arrays() if fl is not None else {}
        self.max_clock = ga.get("max_clock", np.full(W, MAX_CLOCK))
        self.power_limit = ga.get("power_limit", np.full(W, POWER_LIMIT_W))
        self.idle_w = ga.get("idle", np.full(W, IDLE_W))
        self.power_scale = ga.get("power_scale", np.ones(W))
        self.mem_total = ga.get("mem_total", np.full(W, MEM_TOTAL, dtype=np.int64))
        self.temp_model = ga.get("temp_model", np.zeros(W))
        self.faults = [self._resolve(i, f) for i, f in enumerate(cfg.faults)]
        self.host = np.zeros(W)
        self.gpu = np.zeros(W)
        self.t_cut = INF
        self.hung = False
        self.hang_onset: float | None = None
        self.acc = np.zeros((64, NCH * W))
        self.next_bin = 0
        self.step_starts: list[float] = []
        self.step_durs: list[float] = []
        self.E_by_step: dict[int, Effects] = {}
        self.flaps: list = []  # (nic index, t0, t1)
        self.cum = {k: np.zeros(W, dtype=np.int64) for k in (
            "tx_discards", "rx_errors", "symbol_errors", "link_downed", "retransmits", "cnp_sent", "xmit_wait")}
        self.ecc = np.zeros(W, dtype=np.int64)
        self.temp: np.ndarray | None = None
        self.load: np.ndarray | None = None
        self.spikes: list[dict] = []
        self.records = 0
        self.end_time = 0.0
        self.done = False
        self._tmp = np.zeros(W)
        self._prep_templates()
        self.n_kernel_calls = self._count_kernel_calls()

    # ------------------------------------------------------------------ faults
    def _resolve(self, i: int, spec: FaultSpec) -> ActiveFault:
        cfg, L = self.cfg, self.L
        fdef = FAULTS[spec.name]
        p = dict(spec.params)
        steps = cfg.steps
        start = spec.start if spec.start is not None else 0
        end = min(spec.end if spec.end is not None else steps, steps)
        fn = None
        ranks: list = []
        nodes: list = []
        extra: dict = {}
        component, scope, kind = fdef.component, fdef.scope, fdef.kind
        name = spec.name
        if name == "kernel_regression" and spec.start is None:
            start = steps // 2
        if name == "hang":
            p["step"] = p["step"] if p["step"] is not None else steps // 2
            if p["fn"] is None:
                stage = p["rank"] // L.stage_size
                p["fn"] = DEFAULT_HANG_FN if DEFAULT_HANG_FN in self.prog.stage_fns(stage) else self.prog.adam.fn
            start, end = p["step"], p["step"] + 1
            fn = p["fn"]
            component = ("dataloader" if fn == DATALOADER else "pcie" if fn == H2D else "gpu")
        if scope == "rank" and "rank" in p:
            ranks = [p["rank"]]
            nodes = [L.node_names[L.node[p["rank"]]]]
        elif name == "pp_imbalance":
            lo, hi = L.stage_slice(p["stage"])
            ranks = list(range(lo, hi))
            nodes = sorted({L.rank_node_names[r] for r in ranks}, key=lambda s: int(s[5:]))
        elif scope == "node":
            ranks = L.node_ranks(p["node"])
            nodes = [L.node_names[p["node"]]]
        if name in ("nic", "nic_flaky"):
            extra["nic"] = f"mlx5_{p['nic']}"
        if name == "congestion":
            extra["affected_nodes"] = [L.node_names[n] for n in p["nodes"]]
        if name == "gc":
            extra["affected_ranks"] = set()
        if name in ("dataloader", "storage", "few_workers"):
            fn = DATALOADER
        if name == "gc":
            fn = "gc.collect"
        if name == "kernel_regression":
            fn = p["fn"]
        if start >= end:
            end = start  # never active (validated against steps elsewhere)
        return ActiveFault(i, spec, name, p, start, end, kind, component, scope, ranks, nodes, fn,
                           np.random.default_rng([int(self.cfg.seed), 100 + i]), extra)

    def _effects(self, k: int) -> Effects:
        L, W = self.L, self.W
        E = Effects(W, L.nodes, self.node_cpu)
        g = L.gpus
        for f in self.faults:
            if not f.active(k):
                continue
            p, rng, n = f.params, f.rng, f.name
            if n == "gpu_throttle":
                r, fac = p["rank"], p["factor"]
                E.kfac["gemm"][r] *= fac
                E.kfac["attn"][r] *= fac
                E.kfac["mem"][r] *= 1 + 0.35 * (fac - 1)
                E.throttle.append((r, fac, p["reason"]))
            elif n == "gpu_memory":
                r, fac = p["rank"], p["factor"]
                E.kfac["mem"][r] *= fac
                E.kfac["attn"][r] *= 1 + 0.3 * (fac - 1)
                E.mem_pressure.append(r)
            elif n == "uneven_workload":
                r, fac = p["rank"], p["factor"]
                E.kfac["gemm"][r] *= fac
                E.kfac["attn"][r] *= fac
                E.kfac["mem"][r] *= 1 + 0.5 * (fac - 1)
            elif n == "pp_imbalance":
                lo, hi = L.stage_slice(p["stage"])
                for c in ("gemm", "attn", "mem"):
                    E.kfac[c][lo:hi] *= p["factor"]
            elif n == "pcie":
                r = p["rank"]
                E.pcie_gen[r], E.pcie_width[r] = p["gen"], p["width"]
                E.pcie_bw[r] = pcie_bw(p["gen"], p["width"])
            elif n == "nvlink":
                r = p["rank"]
                E.nvl_bw[r] = NVL_BW / p["factor"]
                E.nvl_pcie[r] = True
            elif n == "nic":
                i = p["node"] * g + p["nic"]
                E.nic_bw[i] = nic_bw(p["gbps"])
                E.nic_gbps[i] = p["gbps"]
            elif n == "nic_flaky":
                E.flaky.append((f, p["node"] * g + p["nic"], p["factor"], p["flap_prob"]))
            elif n == "congestion":
                idx = np.concatenate([np.arange(nd * g, (nd + 1) * g) for nd in p["nodes"]])
                E.congested.append((f, idx, p["factor"]))
            elif n in ("dataloader", "storage"):
                nd = p["node"]
                sig = 0.2 if n == "dataloader" else 0.5
                E.dl_extra[nd * g:(nd + 1) * g] += p["ms"] * MS * rng.lognormal(0.0, sig, g)
                if n == "dataloader":
                    E.cpu_t[nd], E.load_t[nd] = 62.0 + self.node_cpu[nd], 24.0
                else:
                    E.cpu_t[nd], E.load_t[nd], E.iow_t[nd] = 17.0 + self.node_cpu[nd], 32.0, 34.0
            elif n == "few_workers":
                E.dl_extra += p["ms"] * MS * rng.lognormal(0.0, 0.15, W)
                E.cpu_t[:] = 47.0 + self.node_cpu
                E.load_t[:] = 11.0
            elif n == "host_cpu":
                nd = p["node"]
                E.host_fac[nd * g:(nd + 1) * g] *= p["factor"]
                E.cpu_t[nd], E.load_t[nd] = 99.0, 60.0 * p["factor"]
            elif n == "nccl_tcp":
                E.nic_bw[:] = p["gbps"] / 8.0 * 0.9
                E.nvl_bw[:] = SHM_BW
                E.nvl_pcie[:] = True
            elif n == "kernel_regression":
                E.kfn[p["fn"]] = E.kfn.get(p["fn"], 1.0) * p["factor"]
            elif n == "gc":
                count = int(rng.poisson(p["rate"]))
                pool = p["ranks"] or None
                for _ in range(count):
                    r = int(rng.choice(pool)) if pool else int(rng.integers(W))
                    E.gc.append((f, r, p["ms"] * MS * float(rng.lognormal(0.0, 0.3)), int(rng.integers(1 << 30))))
            elif n == "hang":
                if k == p["step"]:
                    E.hang = (f, p["rank"], p["fn"])
        return E

    # ------------------------------------------------------------ primitives
    def _count_kernel_calls(self) -> int:
        pr = self.prog
        n = 2  # l2norm + adam
        if self.cfg.pp == 1:
            return n + sum(o.tag == "kernel" for o in pr.fwd[0] + pr.bwd[0])
        return n + self.cfg.mb * sum(o.tag == "kernel" for s in range(self.cfg.pp) for o in pr.fwd[s] + pr.bwd[s])

    def _jit(self, sigma: float, lo: int, hi: int) -> np.ndarray:
        return self.noise.lognormal(0.0, sigma, self.W)[lo:hi]

    def _dep(self, ch: int, idx, s, e, rate) -> None:
        """Queue a deposit: ``rate`` per ns over [s, e) into channel ``ch`` of rank/NIC ``idx``."""
        # flattened here (views), a scalar rate filled rather than broadcast: the hot path of long runs
        s = np.asarray(s, float)
        if np.ndim(rate) == 0:
            r = np.full(s.size, float(rate))
        else:
            r = np.asarray(rate, float)
            r = r.ravel() if r.shape == s.shape else np.broadcast_to(r, s.shape).ravel()
        self._deps.append(((np.asarray(idx) + ch * self.W).ravel(), s.ravel(), np.asarray(e, float).ravel(), r))

    def _flush_deps(self) -> None:
        if not self._deps:
            return
        deps = self._deps
        col = np.concatenate([d[0] for d in deps])
        s = np.concatenate([d[1] for d in deps])
        e = np.concatenate([d[2] for d in deps])
        rate = np.concatenate([d[3] for d in deps])
        self._deps = []
        e = np.minimum(e, self.t_cut)
        ok = np.isfinite(s) & (e > s) & (rate != 0) & np.isfinite(rate)
        if not ok.all():
            col, s, e, rate = col[ok], s[ok], e[ok], rate[ok]
        if not len(s):
            return
        P = self.P
        b0 = np.floor(s / P).astype(np.int64)
        b1 = np.floor(np.nextafter(e, -INF) / P).astype(np.int64)
        bmin, bmax = int(b0.min()), int(b1.max())
        if bmax >= len(self.acc):
            cap = max(2 * len(self.acc), bmax + 64)
            grown = np.zeros((cap, self.acc.shape[1]))
            grown[:len(self.acc)] = self.acc
            self.acc = grown
        width = self.acc.shape[1]
        nb = bmax - bmin + 1
        total = np.zeros(nb * width)
        span = b1 - b0
        for off in range(int(span.max()) + 1):
            m = span >= off
            b = b0[m] + off
            lo = np.maximum(s[m], b * P)
            hi = np.minimum(e[m], (b + 1) * P)
            total += np.bincount((b - bmin) * width + col[m], weights=rate[m] * np.maximum(hi - lo, 0.0),
                                 minlength=nb * width)
        self.acc[bmin:bmax + 1] += total.reshape(nb, width)

    def _emit(self, op: Op, lo: int, hi: int, ts, end, group=None) -> None:
        self._emits.append((op, lo, hi, np.array(ts, float), np.array(end, float), group))

    def _check_hang(self, fn: str, lo: int, hi: int, start: np.ndarray, end: np.ndarray) -> None:
        h = self.E.hang
        if h is None or self.hung or h[2] != fn:
            return
        f, r = h[0], h[1]
        if not lo <= r < hi or not math.isfinite(start[r - lo]):
            return
        self.hung = True
        onset = float(start[r - lo])
        end[r - lo] = INF
        self.hang_onset = onset
        est = float(np.median(self.step_durs[-5:])) if self.step_durs else 1.0e9
        self.t_cut = onset + f.params["after"] * est
        f.start_ns = self.t0 + int(round(onset))

    def _host_op(self, op: Op, lo: int, hi: int, dur: np.ndarray) -> None:
        ts = self.host[lo:hi].copy()
        end = ts + dur
        self._check_hang(op.fn, lo, hi, ts, end)
        self.host[lo:hi] = end
        self._emit(op, lo, hi, ts, end)

    def _launch(self, op: Op, lo: int, hi: int) -> np.ndarray:
        h = self.host[lo:hi] + op.host_ns * self.E.host_fac[lo:hi] * self._jit(0.03, lo, hi)
        self.host[lo:hi] = h
        return h

    def _kernel(self, op: Op, lo: int, hi: int) -> None:
        E = self.E
        h = self._launch(op, lo, hi)
        jg = self._jit(0.02, lo, hi)
        start = np.maximum(self.gpu[lo:hi], h)
        if op.tag == "kernel":
            d = op.gpu_ns * self.speed[lo:hi] * E.kfac[op.cls][lo:hi] * jg
            f = E.kfn.get(op.fn)
            if f is not None:
                d = d * f
            fr = E.kfn_rank.get(op.fn)
            if fr is not None:
                d = d * fr[lo:hi]
            sp = self.spike
            if sp is not None and sp[1] == self.kcount and lo <= sp[0] < hi:
                d[sp[0] - lo] *= sp[2]
                self.spikes.append({"step": self.k, "rank": sp[0], "fn": op.fn, "factor": round(sp[2], 3)})
            self.kcount += 1
        elif op.sync:
            d = op.gpu_ns * jg
        else:
            d = op.nbytes / E.pcie_bw[lo:hi] * jg + 10_000.0
        end = start + d
        self._check_hang(op.fn, lo, hi, start, end)
        self.gpu[lo:hi] = end
        if op.sync:
            self.host[lo:hi] = np.maximum(self.host[lo:hi], end)
        idx = np.arange(lo, hi)
        if op.tag == "kernel":
            self._dep(BUSY, idx, start, end, 1.0)
            self._dep(MEMACT, idx, start, end, CLASS_MEM[op.cls])
            self._dep(POWER, idx, start, end, CLASS_POWER[op.cls] - IDLE_W)
        elif not op.sync:
            self._dep(PCIE_RX, idx, start, end, op.nbytes / np.maximum(end - start, 1.0))
            self._dep(POWER, idx, start, end, CLASS_POWER["copy"] - IDLE_W)
        self._emit(op, lo, hi, start, end)

    def _hops(self, a: np.ndarray, b: np.ndarray, mult: np.ndarray | None):
        """Bandwidth (bytes/ns) of hops a->b, whether each is intra-node, and whether it uses PCIe."""
        E, node = self.E, self.L.node
        same = node[a] == node[b]
        viapcie = E.nvl_pcie[a] | E.nvl_pcie[b]
        intra = np.minimum(E.nvl_bw[a], E.nvl_bw[b])
        intra = np.where(viapcie, np.minimum(intra, np.minimum(E.pcie_bw[a], E.pcie_bw[b])), intra)
        nb = E.nic_bw if mult is None else E.nic_bw * mult
        inter = np.minimum(np.minimum(nb[a], nb[b]), np.minimum(E.pcie_bw[a], E.pcie_bw[b]))
        return np.where(same, intra, inter), same, viapcie

    def _nic_instance(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Per-collective random state of flaky / congested NICs: bandwidth multiplier and stall."""
        E = self.E
        if not E.flaky and not E.congested:
            return None, None
        mult = np.ones(self.W)
        stall = np.zeros(self.W)
        for f, i, fac, prob in E.flaky:
            slow = float(np.exp(f.rng.normal(math.log(fac), 0.5)))
            mult[i] /= max(1.0, slow)
            if f.rng.random() < prob:
                stall[i] = max(stall[i], f.rng.uniform(0.3, 1.5) * 1e9)
        for f, idx, fac in E.congested:
            mult[idx] /= f.rng.uniform(1.0, 2.0 * fac - 1.0, len(idx))
        return mult, stall

    def _traffic(self, a, b, same, viapcie, s, e, nbytes) -> None:
        """Deposit hop traffic a->b of ``nbytes`` each over [s, e)."""
        rate = nbytes / np.maximum(e - s, 1.0)
        nv = same & ~viapcie
        pc = ~nv
        if nv.any():
            self._dep(NVL_TX, a[nv], s[nv], e[nv], rate[nv])
            self._dep(NVL_RX, b[nv], s[nv], e[nv], rate[nv])
        if pc.any():
            self._dep(PCIE_TX, a[pc], s[pc], e[pc], rate[pc])
            self._dep(PCIE_RX, b[pc], s[pc], e[pc], rate[pc])
        x = ~same
        if x.any():
            self._dep(NIC_TX, a[x], s[x], e[x], rate[x])
            self._dep(NIC_RX, b[x], s[x], e[x], rate[x])

    def _collective(self, op: Op, lo: int, hi: int, stage: int | None) -> None:
        L = self.L
        h = self._launch(op, lo, hi)
        arr = np.maximum(self.gpu[lo:hi], h)
        fam = op.family
        if fam == "tp":
            rings = L.tp_rings[lo // L.tp:hi // L.tp]
            groups = L.tp_group
        elif fam == "dp":
            rings = L.dp_rings if stage is None else L.dp_rings[stage * L.tp:(stage + 1) * L.tp]
            groups = L.dp_group
        else:
            rings = np.arange(self.W)[None, :]
            groups = None
        tmp = self._tmp
        tmp[lo:hi] = arr
        A = tmp[rings]
        gmax = A.max(axis=1)
        n = rings.shape[1]
        if fam == "world":
            hops = 2 * max(1, math.ceil(math.log2(n)))
            end_g = gmax + hops * (A_INTER if L.nodes > 1 else A_INTRA) + 2_000.0
            xs = gmax
        else:
            b = np.roll(rings, -1, axis=1)
            mult, stall = self._nic_instance() if fam == "dp" else (None, None)
            bw, same, viapcie = self._hops(rings, b, mult)
            ar = op.op == "all_reduce"
            factor = (2.0 if ar else 1.0) * (n - 1) / n
            lat = np.where(same.all(axis=1), A_INTRA, A_INTER) * ((2 if ar else 1) * (n - 1))
            T = factor * op.nbytes / bw.min(axis=1) + lat
            xs = gmax
            if stall is not None and stall.any():
                hop_stall = np.where(same, 0.0, np.maximum(stall[rings], stall[b]))
                st = hop_stall.max(axis=1)
                xs = gmax + st
                for gi in np.nonzero(st > 0)[0]:
                    for i in np.unique(np.concatenate([rings[gi][~same[gi]], b[gi][~same[gi]]])):
                        if stall[i] > 0 and math.isfinite(gmax[gi]):
                            self.flaps.append((int(i), float(gmax[gi]), float(gmax[gi] + stall[i])))
            end_g = xs + T
            bb = np.broadcast_to
            self._traffic(rings.ravel(), b.ravel(), same.ravel(), viapcie.ravel(),
                          bb(xs[:, None], rings.shape).ravel(), bb(end_g[:, None], rings.shape).ravel(),
                          factor * op.nbytes)
        tmp[rings] = end_g[:, None]
        end = tmp[lo:hi].copy()
        self.gpu[lo:hi] = end
        self._comm_busy(lo, hi, arr, end)
        self._emit(op, lo, hi, arr, end, groups)

    def _comm_busy(self, lo, hi, arr, end) -> None:
        idx = np.arange(lo, hi)
        self._dep(BUSY, idx, arr, end, 1.0)
        self._dep(MEMACT, idx, arr, end, CLASS_MEM["comm"])
        self._dep(POWER, idx, arr, end, CLASS_POWER["comm"] - IDLE_W)

    def _send(self, op: Op, stage: int) -> np.ndarray:
        lo, hi = self.L.stage_slice(stage)
        h = self._launch(op, lo, hi)
        return np.maximum(self.gpu[lo:hi], h)

    def _recv(self, op_send: Op, op_recv: Op, src: int, dst: int, arr_s: np.ndarray,
              sender_waits: bool = True) -> None:
        """A pipeline transfer; ``sender_waits=False`` when the send did not block (1F1B's
        non-blocking sends): then only the receiver waits for it to end."""
        L = self.L
        slo, shi = L.stage_slice(src)
        lo, hi = L.stage_slice(dst)
        h = self._launch(op_recv, lo, hi)
        arr_r = np.maximum(self.gpu[lo:hi], h)
        a, b = np.arange(slo, shi), np.arange(lo, hi)
        mult, stall = self._nic_instance()
        bw, same, viapcie = self._hops(a, b, mult)
        start = np.maximum(arr_s, arr_r)
        xs = start
        if stall is not None and stall.any():
            st = np.where(same, 0.0, np.maximum(stall[a], stall[b]))
            xs = start + st
            for j in np.nonzero(st > 0)[0]:
                for i in (a[j], b[j]):
                    if stall[i] > 0 and math.isfinite(start[j]):
                        self.flaps.append((int(i), float(start[j]), float(start[j] + stall[i])))
        end = xs + op_send.nbytes / bw + np.where(same, A_INTRA, A_INTER)
        self._traffic(a, b, same, viapcie, xs, end, float(op_send.nbytes))
        if sender_waits:
            self.gpu[slo:shi] = end
        self.gpu[lo:hi] = end
        self._comm_busy(slo, shi, arr_s, end)
        self._comm_busy(lo, hi, arr_r, end)
        self._emit(op_send, slo, shi, arr_s, end, L.pp_group)
        self._emit(op_recv, lo, hi, arr_r, end, L.pp_group)

    def _run(self, op: Op, lo: int, hi: int, stage: int | None) -> None:
        if op.tag in ("kernel", "memcpy"):
            self._kernel(op, lo, hi)
        elif op.tag == "coll":
            self._collective(op, lo, hi, stage)
        else:  # pragma: no cover - programs hold only these
            raise AssertionError(op)

    def _gc_pauses(self, E: Effects, k: int) -> dict:
        """Pauses keyed by (stage, forward op position): [(rank, pause_ns, fault)]."""
        out: dict = {}
        u, r, pause, pos = (self.noise.random(), int(self.noise.integers(self.W)),
                            self.noise.uniform(2.0, 12.0) * MS, int(self.noise.integers(1 << 30)))
        events = [(None, r, pause, pos)] if u < SMALL_GC_P else []
        events += E.gc
        for f, r, pause, pos in events:
            stage = int(self.L.stage[r])
            key = (stage, pos % len(self.prog.fwd[stage]))
            out.setdefault(key, []).append((r, pause, f))
        return out

    def _pause(self, items) -> None:
        for r, pause, f in items:
            self._host_op(self.prog.gc, r, r + 1, np.array([pause]))
            if f is not None:
                f.extra["affected_ranks"].add(r)

    # ------------------------------------------------------------------ step
    def _step(self, k: int) -> None:
        cfg, pr, W = self.cfg, self.prog, self.W
        E = self.E = self._effects(k)
        self.E_by_step[k] = E
        self.k = k
        self.kcount = 0
        u, sr, so, sm = (self.noise.random(), int(self.noise.integers(W)),
                         int(self.noise.integers(1 << 30)), float(self.noise.uniform(2.0, 4.0)))
        self.spike = (sr, so % self.n_kernel_calls, sm) if u < SPIKE_P else None
        log_ms = float(self.noise.uniform(100.0, 300.0))
        if self.fleet is not None:
            self.fleet.step_effects(k, E, W)
            log_ms *= self.fleet.log_scale
        gcs = self._gc_pauses(E, k)
        open_ts = self.host.copy()
        fin = open_ts[np.isfinite(open_ts)]
        self.step_starts.append(float(fin.min()) if len(fin) else INF)
        for f in self.faults:
            if f.start == k and f.start_ns is None and f.name != "hang":
                f.start_ns = self.t0 + int(round(self.step_starts[-1]))
        if k > 0 and k % LOG_EVERY == 0:
            self._host_op(pr.log, 0, 1, np.array([log_ms * MS]))
        dl = pr.dataloader.host_ns * E.host_fac * self._jit(0.03, 0, W) + E.dl_extra
        self._host_op(pr.dataloader, 0, W, dl)
        self._kernel(pr.h2d, 0, W)
        if cfg.pp == 1:
            f_open = self.host.copy()
            for i, op in enumerate(pr.fwd[0]):
                if (0, i) in gcs:
                    self._pause(gcs[(0, i)])
                self._run(op, 0, W, 0)
            self._emit(pr.fwd_region, 0, W, f_open, self.host.copy())
            b_open = self.host.copy()
            for op in pr.bwd[0]:
                self._run(op, 0, W, 0)
            self._emit(pr.bwd_region, 0, W, b_open, self.host.copy())
        else:
            self._pipeline(gcs)
        if pr.rs is not None:
            self._collective(pr.rs, 0, W, None)
        c_open = self.host.copy()
        self.host += pr.clip_host * E.host_fac * self._jit(0.03, 0, W)
        self._kernel(pr.l2norm, 0, W)
        if pr.world_ar is not None:
            self._collective(pr.world_ar, 0, W, None)
        self._emit(pr.clip_region, 0, W, c_open, self.host.copy())
        o_open = self.host.copy()
        self.host += pr.opt_host * E.host_fac * self._jit(0.03, 0, W)
        self._kernel(pr.adam, 0, W)
        self._emit(pr.opt_region, 0, W, o_open, self.host.copy())
        if pr.ag is not None:
            self._collective(pr.ag, 0, W, None)
        self._kernel(pr.d2h, 0, W)
        close = self.host.copy()
        self._emit(pr.train_step, 0, W, open_ts, close)
        durs = (close - open_ts)[np.isfinite(close)]
        if len(durs) == W:
            self.step_durs.append(float(np.median(durs)))
        if self.fleet is not None:
            self._between_steps(k)

    def _pipeline(self, gcs: dict) -> None:
        if self.prog.schedule != "gpipe":
            self._pipeline_1f1b(gcs)
            return
        cfg, L, pr = self.cfg, self.L, self.prog
        pp, M = cfg.pp, cfg.mb
        p_open = self.host.copy()
        pend: dict = {}
        for m in range(M):
            for s in range(pp):
                lo, hi = L.stage_slice(s)
                if s > 0:
                    self._recv(pr.send_f, pr.recv_f, s - 1, s, pend.pop(("f", m, s - 1)))
                for i, op in enumerate(pr.fwd[s]):
                    if m == 0 and (s, i) in gcs:
                        self._pause(gcs[(s, i)])
                    self._run(op, lo, hi, s)
                if s < pp - 1:
                    pend[("f", m, s)] = self._send(pr.send_f, s)
        for m in range(M):
            for s in reversed(range(pp)):
                lo, hi = L.stage_slice(s)
                if s < pp - 1:
                    self._recv(pr.send_b, pr.recv_b, s + 1, s, pend.pop(("b", m, s + 1)))
                for op in pr.bwd[s]:
                    self._run(op, lo, hi, s)
                if s > 0:
                    pend[("b", m, s)] = self._send(pr.send_b, s)
        self._emit(pr.pipe_region, 0, self.W, p_open, self.host.copy())

    def _pipeline_1f1b(self, gcs: dict) -> None:
        """1F1B / interleaved 1F1B (realistic profile): each stage follows its schedule order.

        Stages advance in turn as far as their next receive allows. Sends are
        asynchronous (Megatron batches isend / irecv), so a sender's compute goes
        on while its activation or gradient is in flight, and the schedule cannot
        deadlock; a receive ends at max(send issued, receive posted) + transfer.
        """
        cfg, L, pr = self.cfg, self.L, self.prog
        pp, M, v = cfg.pp, cfg.mb, pr.variant.chunks
        p_open = self.host.copy()
        orders = [schedule_order(pp, M, v, s) for s in range(pp)]
        pos = [0] * pp
        pend: dict = {}
        left = sum(map(len, orders))
        while left:
            moved = False
            for s in range(pp):
                lo, hi = L.stage_slice(s)
                while pos[s] < len(orders[s]):
                    d, c, m = orders[s][pos[s]]
                    fwd = d == "F"
                    if fwd:
                        src = (s - 1, c) if s > 0 else ((pp - 1, c - 1) if c > 0 else None)
                    else:
                        src = (s + 1, c) if s < pp - 1 else ((0, c + 1) if c < v - 1 else None)
                    sop, rop = (pr.send_f, pr.recv_f) if fwd else (pr.send_b, pr.recv_b)
                    if src is not None:
                        key = (d, m) + src
                        if key not in pend:
                            break
                        self._recv(sop, rop, src[0], s, pend.pop(key), sender_waits=False)
                    ops = pr.fwd_chunks[s][c] if fwd else pr.bwd_chunks[s][c]
                    base = sum(len(x) for x in pr.fwd_chunks[s][:c])
                    for i, op in enumerate(ops):
                        if fwd and m == 0 and (s, base + i) in gcs:
                            self._pause(gcs[(s, base + i)])
                        self._run(op, lo, hi, s)
                    if (s < pp - 1 or c < v - 1) if fwd else (s > 0 or c > 0):
                        pend[(d, m, s, c)] = self._send(sop, s)
                    pos[s] += 1
                    left -= 1
                    moved = True
            if not moved:  # pragma: no cover - the orders below are valid schedules
                raise AssertionError(f"pipeline schedule stuck at {pos}")
        self._emit(pr.pipe_region, 0, self.W, p_open, self.host.copy())

    def _between_steps(self, k: int) -> None:
        """Realistic profile: a checkpoint and / or an evaluation after step ``k``, on every rank."""
        fl, W, pr = self.fleet, self.W, self.prog
        if fl is None or math.isfinite(self.t_cut) or not np.isfinite(self.host).all():
            return
        if fl.checkpoint_after(k):
            start = np.maximum(self.host, self.gpu)
            end = float((start + fl.checkpoint_ns(k, W)).max())  # every shard written, then a barrier
            self._emit(pr.ckpt, 0, W, start, np.full(W, end))
            self.host[:] = end
            self.gpu[:] = end
        if fl.eval_after(k):
            L, pp = self.L, self.cfg.pp
            for _ in range(fl.eval_batches):
                e_open = self.host.copy()
                arr = None
                for s in range(pp):
                    lo, hi = L.stage_slice(s)
                    if s > 0:
                        self._recv(pr.send_f, pr.recv_f, s - 1, s, arr)
                    for op in pr.fwd[s]:
                        self._run(op, lo, hi, s)
                    if s < pp - 1:
                        arr = self._send(pr.send_f, s)
                self.host = np.maximum(self.host, self.gpu)  # the batch's loss / metrics read back: a sync
                self._emit(pr.eval_region, 0, W, e_open, self.host.copy())
            if pr.world_ar is not None:  # the eval metrics averaged over every rank: all leave eval together
                self._collective(pr.world_ar, 0, W, None)
                self.host = np.maximum(self.host, self.gpu)

    # ------------------------------------------------------------- records
    def _prep_templates(self) -> None:
        for o in self.prog.all_ops():
            t: dict[str, Any] = {}
            if o.tag in ("memcpy", "coll", "send", "recv"):
                t["bytes"] = o.nbytes
            if o.op:
                t["op"] = o.op
            if o.family == "world":
                t["group"] = "world"
            if o.stream is not None:
                t["stream"] = o.stream
            if o.stack:
                t["stack"] = o.stack
            o.tmpl = t

    def _count(self) -> int:
        cut, n = self.t_cut, 0
        for op, lo, hi, ts, end, groups in self._emits:
            ok = ts < cut
            if op.tag == "region":
                ok &= end <= cut
            n += int(ok.sum())
        return n

    def _build(self, k: int) -> list[dict]:
        job, nn, cut, t0 = self.job, self.L.rank_node_names, self.t_cut, self.t0
        recs: list[dict] = []
        for op, lo, hi, ts, end, groups in self._emits:
            region = op.tag == "region"
            ok = ts < cut
            if region:
                ok &= end <= cut
            if not ok.all():
                idx = np.nonzero(ok)[0]
                if not len(idx):
                    continue
            else:
                idx = None
            endc = np.minimum(end, cut)
            ts_i = np.rint(np.where(ok, ts, 0.0)).astype(np.int64)
            dur = (np.rint(np.where(ok, endc, 0.0)).astype(np.int64) - ts_i).tolist()
            tsl = (ts_i + t0).tolist()
            sel = range(hi - lo) if idx is None else idx.tolist()
            fn, kind, tm = op.fn, op.kind, op.tmpl
            if groups is None:
                recs.extend([{"type": "fn", "job": job, "node": nn[lo + j], "rank": lo + j, "step": k, "fn": fn,
                              "kind": kind, "ts_ns": tsl[j], "dur_ns": dur[j], **tm} for j in sel])
            else:
                recs.extend([{"type": "fn", "job": job, "node": nn[lo + j], "rank": lo + j, "step": k, "fn": fn,
                              "kind": kind, "ts_ns": tsl[j], "dur_ns": dur[j], "group": groups[lo + j], **tm}
                             for j in sel])
            if not region and math.isfinite(cut):
                infl = np.nonzero(ok & (end > cut))[0]
                if len(infl):
                    # the in-flight records are the last ones appended for this op, in order
                    pos = {j: i for i, j in enumerate(sel)}
                    base = len(recs) - len(sel)
                    for j in infl.tolist():
                        recs[base + pos[j]]["in_flight"] = True
        return recs

    # ------------------------------------------------------------ counters
    def _step_at(self, t: float) -> int:
        return max(0, bisect.bisect_right(self.step_starts, t) - 1)

    def _windows(self, upto: float, build: bool = True) -> tuple[list[dict], int]:
        """Counter records of every complete sample period ending at or before ``upto``."""
        out: list[dict] = []
        P, n = self.P, 0
        while (self.next_bin + 1) * P <= upto + 1e-6:
            if build:
                self._window(self.next_bin, out)
            n += 2 * self.W + self.L.nodes
            self.next_bin += 1
        return out, n

    def _window(self, b: int, out: list) -> None:
        L, W, P, c = self.L, self.W, self.P, self.crng
        t = (b + 1) * P
        ts = self.t0 + int(round(t))
        k = self._step_at(t)
        E = self.E_by_step.get(k) or self.E
        a = self.acc[b] if b < len(self.acc) else np.zeros(NCH * W)
        ch = [a[i * W:(i + 1) * W] / P for i in range(NCH)]
        busy = np.clip(ch[BUSY], 0.0, 1.0)
        util = np.clip(100.0 * busy + c.normal(0.0, 0.5, W), 0.0, 100.0)
        memu = np.clip(100.0 * ch[MEMACT] + c.normal(0.0, 0.4, W), 0.0, 100.0)
        # per-rank model constants (all the engine's defaults but under the realistic profile's two models)
        maxc, plim, idle = self.max_clock, self.power_limit, self.idle_w
        extra = ch[POWER] * self.power_scale
        clock = np.where(c.random(W) < 0.04, maxc - 15.0, maxc)
        reasons = np.zeros(W, dtype=np.int64)
        hot = np.zeros(W)
        for r, fac, reason in E.throttle:
            clock[r] = round(maxc[r] / fac / 15.0) * 15.0 + 15.0 * int(c.integers(-1, 2))
            if reason == "thermal":
                reasons[r] = 0x20 | (0x40 if c.random() < 0.5 else 0)
                extra[r] *= fac ** -1.5
                hot[r] = 88.5 + c.normal(0.0, 0.8)
            else:
                reasons[r] = 0x4
                extra[r] = busy[r] * (plim[r] - idle[r] - 4.0)
        power = np.clip(idle + extra + c.normal(0.0, 3.0, W), idle - 25.0, plim + 2.0)
        target = 33.0 + 0.055 * power + self.temp_off + self.temp_model
        target = np.where(hot > 0, hot, target)
        self.temp = target.copy() if self.temp is None else self.temp + 0.35 * (target - self.temp)
        temp = self.temp + c.normal(0.0, 0.3, W)
        mem_used = self.mem_base + c.normal(0.0, 0.15, W) * GiB
        for r in E.mem_pressure:
            mem_used[r] = self.mem_total[r] - c.uniform(150.0, 400.0) * (1 << 20)
        mem_used = np.minimum(mem_used, self.mem_total).astype(np.int64)
        bg = c.uniform(1.0e6, 4.0e6, (2, W))
        pcie_tx = ch[PCIE_TX] * 1e9 + bg[0]
        pcie_rx = ch[PCIE_RX] * 1e9 + bg[1]
        nvl_tx = ch[NVL_TX] * 1e9
        nvl_rx = ch[NVL_RX] * 1e9
        job, nn = self.job, L.rank_node_names
        rows = zip(range(W), L.local.tolist(), np.round(util, 1).tolist(), np.round(memu, 1).tolist(),
                   clock.tolist(), np.round(power, 1).tolist(), np.round(temp, 1).tolist(), reasons.tolist(),
                   E.pcie_gen.tolist(), E.pcie_width.tolist(), np.round(pcie_tx).tolist(),
                   np.round(pcie_rx).tolist(), np.round(nvl_tx).tolist(), np.round(nvl_rx).tolist(),
                   self.ecc.tolist(), mem_used.tolist(), maxc.tolist(), plim.tolist(), self.mem_total.tolist())
        out.extend([{"type": "gpu", "job": job, "node": nn[r], "rank": r, "gpu": g, "ts_ns": ts,
                     "sm_util_pct": u, "mem_util_pct": mu, "sm_clock_mhz": ck, "max_sm_clock_mhz": mc,
                     "power_w": pw, "power_limit_w": pl, "temp_c": tc, "throttle_reasons": rs,
                     "pcie_gen": pg, "max_pcie_gen": 5, "pcie_width": pwd, "max_pcie_width": 16,
                     "pcie_tx_Bps": ptx, "pcie_rx_Bps": prx, "nvlink_tx_Bps": ntx, "nvlink_rx_Bps": nrx,
                     "ecc_uncorrected": ec, "xid": 0, "mem_used_bytes": mem, "mem_total_bytes": mt}
                    for r, g, u, mu, ck, pw, tc, rs, pg, pwd, ptx, prx, ntx, nrx, ec, mem, mc, pl, mt in rows])
        # NICs (index = node * gpus + rail)
        txb = ch[NIC_TX] * P  # bytes in the period
        cum = self.cum
        cum["retransmits"] += c.poisson(0.01, W)
        cum["cnp_sent"] += c.poisson(0.5 + txb / 2e9)
        cum["xmit_wait"] += c.poisson(txb / 5e6)
        link_up = np.ones(W, dtype=bool)
        for i, f0, f1 in self.flaps:
            if f0 <= t < f1:
                link_up[i] = False
            if t - P < f0 <= t:
                cum["link_downed"][i] += 1
        for f, i, fac, _ in E.flaky:
            cum["symbol_errors"][i] += c.poisson(1500.0 * fac)
            cum["rx_errors"][i] += c.poisson(8.0 * fac)
            cum["retransmits"][i] += c.poisson(150.0 * fac)
            cum["tx_discards"][i] += c.poisson(2.0)
        for f, idx, fac in E.congested:
            cum["cnp_sent"][idx] += c.poisson(800.0 * fac + txb[idx] / 2e6)
            cum["xmit_wait"][idx] += c.poisson(txb[idx] / 5e6 * 20.0 * fac + 2e4)
        nbg = c.uniform(2e4, 2e5, (2, W))
        ntx = np.round(ch[NIC_TX] * 1e9 + nbg[0]).tolist()
        nrx = np.round(ch[NIC_RX] * 1e9 + nbg[1]).tolist()
        names = [f"mlx5_{i}" for i in range(L.gpus)]
        cl = {k2: v.tolist() for k2, v in cum.items()}
        gb = E.nic_gbps.tolist()
        up = link_up.tolist()
        out.extend([{"type": "nic", "job": job, "node": nn[i], "nic": names[i % L.gpus], "ts_ns": ts, "port": 1,
                     "tx_Bps": ntx[i], "rx_Bps": nrx[i], "link_gbps": gb[i] if up[i] else 0.0, "link_up": up[i],
                     "tx_discards": cl["tx_discards"][i], "rx_errors": cl["rx_errors"][i],
                     "symbol_errors": cl["symbol_errors"][i], "link_downed": cl["link_downed"][i],
                     "retransmits": cl["retransmits"][i], "cnp_sent": cl["cnp_sent"][i],
                     "xmit_wait": cl["xmit_wait"][i]} for i in range(W)])
        # hosts
        N = L.nodes
        alpha = 1.0 - math.exp(-P / 60e9)
        if self.load is None:
            self.load = E.load_t.copy()
        self.load = self.load + alpha * (E.load_t - self.load)
        cpu = np.clip(E.cpu_t + c.normal(0.0, 2.0, N), 0.0, 100.0)
        iow = np.clip(E.iow_t + c.normal(0.0, 1.0, N) * (0.1 + 0.15 * E.iow_t), 0.0, 100.0)
        load = np.maximum(self.load + c.normal(0.0, 0.3, N), 0.0)
        mem = np.clip(self.node_mem + c.normal(0.0, 0.2, N), 0.0, 100.0)
        out.extend([{"type": "host", "job": job, "node": L.node_names[n], "ts_ns": ts, "cpu_util_pct": cu,
                     "load1": ld, "iowait_pct": io, "mem_used_pct": mm, "steal_pct": 0.0}
                    for n, cu, ld, io, mm in zip(range(N), np.round(cpu, 1).tolist(), np.round(load, 2).tolist(),
                                                 np.round(iow, 2).tolist(), np.round(mem, 1).tolist())])

    # ------------------------------------------------------------------ run
    def job_record(self) -> dict:
        L = self.L
        return {"type": "job", "job": self.job, "ts_ns": self.t0, "world_size": self.W,
                "rank_nodes": L.rank_node_names, "rank_stages": L.stage.tolist(), "rank_dp": L.dp_idx.tolist(),
                "dp": L.dp, "tp": L.tp, "pp": L.pp}

    def steps(self, build: bool = True) -> Iterator[list[dict]]:
        """Run the job; yield each step's records (fn + counter samples), sorted by ``ts_ns``.

        Under the realistic profile records are always built (the record-level
        nuisances decide what is written, so only building can count it), fn
        records only for the steps the tracer samples (in-flight ones always).
        """
        fl = self.fleet
        build = build or fl is not None
        first = True
        for k in range(self.cfg.steps):
            self._emits, self._deps = [], []
            with np.errstate(invalid="ignore"):  # inf - inf once a rank hangs
                self._step(k)
            self._flush_deps()
            live = np.isfinite(self.host) & (self.host < self.t_cut)
            ending = k == self.cfg.steps - 1 or not live.any()
            if ending:
                top = np.concatenate([self.host, self.gpu])
                top = top[np.isfinite(top)]
                horizon = self.t_cut if math.isfinite(self.t_cut) else float(top.max())
            else:
                cur = np.minimum(self.host, self.gpu)
                cur = cur[np.isfinite(cur)]
                horizon = min(float(cur.min()) if len(cur) else self.t_cut, self.t_cut)
            if fl is None or fl.traced(k):
                recs = self._build(k) if build else []
            elif math.isfinite(self.t_cut):
                recs = [r for r in self._build(k) if r.get("in_flight")]  # the hang dump
            else:
                recs = []
            nfn = len(recs) if build else self._count()
            wins, nwin = self._windows(horizon, build)
            if build:
                recs.extend(wins)
                if fl is not None:
                    recs = fl.transform(recs)
                recs.sort(key=_ts)
                if first and (fl is None or not fl.no_job):  # realistic nuisance 13: some collectors write none
                    recs.insert(0, self.job_record())
            if fl is not None:
                self.records += len(recs)  # what was written, the job record included or not
            else:
                self.records += nfn + nwin + (1 if first else 0)
            first = False
            self.end_time = horizon
            self._prune()
            yield recs
            if ending:
                break
        self.done = True

    def _prune(self) -> None:
        keep = self._step_at(self.next_bin * self.P) - 1
        for s in [s for s in self.E_by_step if s < keep]:
            del self.E_by_step[s]

    # ---------------------------------------------------------------- truth
    def truth(self) -> dict:
        if not self.done:
            for _ in self.steps(build=False):
                pass
        L, cfg = self.L, self.cfg
        faults = []
        for f in self.faults:
            params = {k: (sorted(v) if isinstance(v, list) else v) for k, v in f.params.items()}
            entry = {"name": f.name, "spec": str(f.spec), "params": params, "kind": f.kind,
                     "component": f.component, "scope": f.scope,
                     "ranks": [] if f.scope == "job" else list(f.ranks),
                     "nodes": [] if f.scope == "job" else list(f.nodes),
                     "fn": f.fn, "start_step": f.start, "end_step": f.end, "start_ns": f.start_ns}
            for key, v in f.extra.items():
                entry[key] = sorted(v) if isinstance(v, set) else v
            faults.append(entry)
        starts = [self.t0 + int(round(s)) for s in self.step_starts if math.isfinite(s)]
        t = {
            "job": self.job,
            "seed": cfg.seed,
            "layout": {"nodes": L.nodes, "gpus": L.gpus, "tp": L.tp, "pp": L.pp, "dp": L.dp,
                       "world_size": L.world, "microbatches": cfg.mb, "rank_nodes": L.rank_node_names,
                       "rank_stages": L.stage.tolist(), "rank_dp": L.dp_idx.tolist()},
            "healthy": not self.faults,
            "faults": faults,
            "steps_run": len(starts),
            "start_ns": self.t0,
            "end_ns": self.t0 + int(round(self.end_time)),
            "step_start_ns": starts,
            "sample_ns": int(self.P),
            "hang_cut_ns": (self.t0 + int(round(self.t_cut))) if math.isfinite(self.t_cut) else None,
            "noise": {"log_rank": 0, "log_every_steps": LOG_EVERY, "log_ms": [100, 300],
                      "spikes": self.spikes, "jitter_sigma": 0.02},
            "records": self.records,
        }
        if self.fleet is not None:
            t["profile"] = cfg.profile
            t["nuisances"] = self.fleet.describe()
        return t


def _ts(r: dict) -> int:
    return r["ts_ns"]


def schedule_order(pp: int, M: int, v: int, s: int) -> list[tuple[str, int, int]]:
    """Stage ``s``'s order of (F|B, model chunk, microbatch) under 1F1B (``v`` = 1) or interleaved 1F1B.

    Megatron's schedules: warm-up forwards (pp - s - 1, or 2 (pp - s - 1) +
    (v - 1) pp interleaved), then one forward / one backward, then the
    remaining backwards. Interleaved, the k-th forward of a stage runs chunk
    (k // pp) % v of microbatch (k // (pp v)) pp + k % pp; backwards visit
    the chunks in reverse.
    """
    if v == 1:
        F = [("F", 0, m) for m in range(M)]
        B = [("B", 0, m) for m in range(M)]
        warm = min(pp - s - 1, M)
    else:
        total = M * v

        def mb(k: int) -> int:
            return (k // (pp * v)) * pp + k % pp

        F = [("F", (k // pp) % v, mb(k)) for k in range(total)]
        B = [("B", v - 1 - (k // pp) % v, mb(k)) for k in range(total)]
        warm = min((pp - s - 1) * 2 + (v - 1) * pp, total)
    order = F[:warm]
    for i in range(len(F) - warm):
        order += [F[warm + i], B[i]]
    return order + B[len(F) - warm:]
