"""Simulation configuration and the job layout (ranks, nodes, parallel groups)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .faults import FaultError, FaultSpec, parse_fault

DEFAULT_START_NS = 1_763_000_000_000_000_000
DEFAULT_STEPS = 40  # the default profile's run length (a ~0.7 s step: ~30 s of job, one detector window and more)
DEFAULT_SAMPLE_MS = 500.0  # NVML / sysfs polling period of a typical node agent (DCGM's default is 1 s)
PROFILES = ("default", "realistic")
# What `eroica simulate` and `eroica demo` start from by default: now, in DEFAULT_START_NS's phase of the
# minute, so the epoch-aligned windows (10, 20, 30, 60 s) cut a run at the same steps whatever second it
# was made. The library default stays DEFAULT_START_NS (tests compare verdict ids).
START_PHASE_NS = 60 * 10**9


def start_now_ns(now_ns: int | None = None) -> int:
    """The latest instant at or before now (``time.time_ns()``) in DEFAULT_START_NS's phase of the minute."""
    import time

    now = time.time_ns() if now_ns is None else int(now_ns)
    return now - (now - DEFAULT_START_NS) % START_PHASE_NS


@dataclass
class SimConfig:
    """What to simulate. ``faults`` may hold :class:`FaultSpec` objects or spec strings.

    ``tp`` defaults to ``gpus`` (tensor parallel inside a node), ``pp`` to 1 and
    ``dp`` is ``nodes * gpus / (tp * pp)``. ``microbatches`` (pipeline only)
    defaults to 2 when ``pp > 1`` and is 1 otherwise.

    ``profile``: ``default`` is the clean fleet the detector was written
    against (byte-identical to earlier releases); ``realistic`` draws a fleet of
    nuisances from the seed (:mod:`.realistic`): step time, sample period,
    pipeline schedule, microbatches, extra NICs, two GPU models, missing
    fields, clock offsets... ``steps`` and ``sample_ms`` left at ``None`` take
    the profile's value (40 steps and 500 ms by default; under ``realistic``
    enough steps for detection and a period that follows the step time).
    """

    nodes: int = 4
    gpus: int = 8
    steps: int | None = None
    tp: int | None = None
    pp: int = 1
    microbatches: int | None = None
    faults: list = field(default_factory=list)
    seed: int = 1
    job: str | None = None
    start_ns: int = DEFAULT_START_NS
    sample_ms: float | None = None
    profile: str = "default"

    def __post_init__(self) -> None:
        self.faults = [parse_fault(f) if isinstance(f, str) else f for f in self.faults]
        if self.steps is None:
            self.steps = self.plan.steps_for(self.pp) if self.realistic else DEFAULT_STEPS

    @property
    def realistic(self) -> bool:
        return self.profile == "realistic"

    @property
    def plan(self):
        """The seed's realistic-fleet plan (:class:`.realistic.Plan`); also for the default profile (unused there)."""
        from .realistic import plan_for
        return plan_for(int(self.seed))

    @property
    def sample_period_ms(self) -> float:
        """Counter sample period: ``sample_ms`` when given, else the profile's."""
        if self.sample_ms is not None:
            return float(self.sample_ms)
        return self.plan.sample_for(self.pp) * 1e3 if self.realistic else DEFAULT_SAMPLE_MS

    @property
    def job_id(self) -> str:
        return self.job if self.job else f"sim-{self.seed}"

    @property
    def tp_size(self) -> int:
        return self.tp if self.tp else self.gpus

    @property
    def world(self) -> int:
        return self.nodes * self.gpus

    @property
    def dp(self) -> int:
        return self.world // (self.tp_size * self.pp)

    @property
    def mb(self) -> int:
        if self.microbatches:
            return self.microbatches
        if self.pp > 1 and self.realistic:
            return self.plan.microbatches(self.pp)
        return 2 if self.pp > 1 else 1

    def validate(self) -> None:
        """Raise :class:`FaultError` (a ``ValueError``) when the layout or a fault does not fit."""
        if self.profile not in PROFILES:
            raise FaultError(f"profile must be one of {', '.join(PROFILES)}, got {self.profile!r}")
        for name in ("nodes", "gpus", "steps", "pp", "seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if name == "seed" else 1):
                raise FaultError(f"{name} must be an integer >= {0 if name == 'seed' else 1}, got {v!r}")
        if self.tp is not None and (not isinstance(self.tp, int) or self.tp < 1):
            raise FaultError(f"tp must be an integer >= 1, got {self.tp!r}")
        if not all(isinstance(f, FaultSpec) for f in self.faults):
            raise FaultError("faults must be FaultSpec objects or spec strings")
        tp = self.tp_size
        if tp < 1 or self.gpus % tp:
            raise FaultError(f"tp={tp} must divide gpus={self.gpus} (tensor parallelism stays inside a node)")
        if self.world % (tp * self.pp):
            raise FaultError(f"nodes*gpus={self.world} is not divisible by tp*pp={tp * self.pp}")
        if self.pp == 1 and self.microbatches not in (None, 1):
            raise FaultError("microbatches > 1 needs pp > 1")
        if self.mb < 1:
            raise FaultError("microbatches must be >= 1")
        if self.sample_ms is not None and not self.sample_ms > 0:
            raise FaultError("sample_ms must be > 0")
        if not (0 <= self.start_ns < 2**62):
            raise FaultError("start_ns out of range")
        if self.job is not None and not (0 < len(self.job) <= 256):
            raise FaultError("job id must be 1-256 characters")
        if sum(f.name == "hang" for f in self.faults) > 1:
            raise FaultError("at most one hang fault per run")
        for f in self.faults:
            _check_fault(self, f)


def _check_fault(cfg: SimConfig, f: FaultSpec) -> None:
    p = f.params
    where = f"fault {str(f)!r}"
    if "rank" in p and not 0 <= p["rank"] < cfg.world:
        raise FaultError(f"{where}: rank {p['rank']} not in 0..{cfg.world - 1}")
    for key in ("node",):
        if key in p and not 0 <= p[key] < cfg.nodes:
            raise FaultError(f"{where}: node {p[key]} not in 0..{cfg.nodes - 1}")
    if "nodes" in p:
        bad = [n for n in p["nodes"] if not 0 <= n < cfg.nodes]
        if bad:
            raise FaultError(f"{where}: nodes {bad} not in 0..{cfg.nodes - 1}")
    if p.get("ranks"):
        bad = [r for r in p["ranks"] if not 0 <= r < cfg.world]
        if bad:
            raise FaultError(f"{where}: ranks {bad} not in 0..{cfg.world - 1}")
    if "nic" in p and not 0 <= p["nic"] < cfg.gpus:
        raise FaultError(f"{where}: nic {p['nic']} not in 0..{cfg.gpus - 1} (one NIC per GPU)")
    if f.name == "pp_imbalance":
        if cfg.pp < 2:
            raise FaultError(f"{where}: needs pp > 1")
        if not 0 <= p["stage"] < cfg.pp:
            raise FaultError(f"{where}: stage {p['stage']} not in 0..{cfg.pp - 1}")
    if f.name == "kernel_regression":
        from .program import kernel_names
        names = kernel_names(cfg)
        if p["fn"] not in names:
            raise FaultError(f"{where}: no kernel {p['fn']!r} in this job; kernels: {', '.join(sorted(names))}")
    if f.name == "hang":
        from .program import hang_targets
        step = p["step"] if p["step"] is not None else cfg.steps // 2
        if step >= cfg.steps:
            raise FaultError(f"{where}: step {step} not in 0..{cfg.steps - 1}")
        if p["fn"] is not None and p["fn"] not in hang_targets(cfg, p["rank"]):
            raise FaultError(f"{where}: rank {p['rank']} never runs {p['fn']!r}; choose one of "
                             f"{', '.join(sorted(hang_targets(cfg, p['rank'])))}")
    start = f.start if f.start is not None else 0
    if start >= cfg.steps:
        raise FaultError(f"{where}: start={start} is not before the last step ({cfg.steps})")


class Layout:
    """Ranks, nodes and parallel groups: rank = node * gpus + local GPU.

    Megatron order, TP fastest: tp index = rank % tp, dp index = (rank // tp) % dp,
    stage = rank // (tp * dp). Local GPU i's inter-node traffic uses NIC mlx5_i.
    """

    def __init__(self, cfg: SimConfig):
        self.nodes, self.gpus, self.pp = cfg.nodes, cfg.gpus, cfg.pp
        self.tp, self.dp, self.world = cfg.tp_size, cfg.dp, cfg.world
        W = self.world
        r = np.arange(W)
        self.node = r // self.gpus
        self.local = r % self.gpus
        self.tp_idx = r % self.tp
        self.dp_idx = (r // self.tp) % self.dp
        self.stage = r // (self.tp * self.dp)
        self.stage_size = self.tp * self.dp
        self.node_names = [f"node-{n}" for n in range(self.nodes)]
        self.rank_node_names = [self.node_names[n] for n in self.node.tolist()]
        per_node = self.gpus // self.tp
        self.tp_group = [
            (f"tp-node-{n}" if per_node == 1 else f"tp-node-{n}.{lo // self.tp}")
            for n, lo in zip(self.node.tolist(), self.local.tolist())
        ]
        self.dp_group = [f"dp-pp{s}-tp{t}" for s, t in zip(self.stage.tolist(), self.tp_idx.tolist())]
        self.pp_group = [f"pp-dp{d}-tp{t}" for d, t in zip(self.dp_idx.tolist(), self.tp_idx.tolist())]
        # ring matrices: rows = groups in ring order, grouped by stage
        S = self.stage_size
        self.tp_rings = r.reshape(-1, self.tp)  # (W/tp, tp), stage s owns rows [s*dp, (s+1)*dp)
        self.dp_rings = np.concatenate(
            [(s * S + np.arange(S)).reshape(self.dp, self.tp).T for s in range(self.pp)])  # (pp*tp, dp)

    def stage_slice(self, s: int) -> tuple[int, int]:
        return s * self.stage_size, (s + 1) * self.stage_size

    def node_ranks(self, n: int) -> list[int]:
        return list(range(n * self.gpus, (n + 1) * self.gpus))
