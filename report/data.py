"""What the report shows, as plain data (pure): built from analysed windows or from ClickHouse rows.

:class:`JobReport` holds, for one job:

- the **heat-map**: ranks x functions, each cell the rank's per-step cost of
  the function over its peers' median (``slowdown_vs_peers`` of the window
  summaries), the median over the windows where a verdict fired (all windows
  when none did). Collectives are left out: in a lock-step job their duration
  is waiting, so they are hot on the *victims*, not on the culprit;
  Every rank is kept (up to :data:`MAX_RANKS`): the page draws a node x GPU
  grid of each rank's hottest cell when there are more ranks than fit a
  screen, with the rank x function detail of one node at a time;
- the **timeline**: per window the culprit's hottest function against its
  peers, the most different other rank's and the median rank's (from the
  window summaries, so from files and from ClickHouse alike), plus the median
  step time when built from files, and the windows with verdicts;
- the **cost** of each culprit, when its verdicts carry the optional
  ``job_slowdown`` / ``cost`` / ``gpu_hours_lost_per_hour`` (read with
  defaults: older verdicts have none): its share of the job's lost time;
- the **verdicts**, newest last;
- the **counters** of the main culprit against the peer median (clocks,
  throttle reasons, power, temperature, PCIe / NVLink / NIC throughput, host
  load): from the windows' counter digests when built from files, from the
  verdict's evidence when built from the database.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eroica.models.summary import WindowSummary
from eroica.models.verdict import Verdict
from eroica.streams.detection.patterns import build_patterns

from .core import WindowResult

__all__ = ["JobReport", "WindowRow", "CounterRow", "CulpritCost", "from_windows", "from_rows", "MAX_RANKS",
           "MAX_FN_COLUMNS", "WORSE_WHEN", "culprit_costs"]

MAX_RANKS = 16384
MAX_FN_COLUMNS = 40
HEAT_SKIP_KINDS = frozenset({"collective"})

# (group, digest key, label, unit) of the counters panel, in display order.
GPU_COUNTERS = (
    ("gpu", "sm_clock_mhz", "SM clock", "MHz"), ("gpu", "clock_ratio", "clock / max clock", "ratio"),
    ("gpu", "throttle_share", "samples with clock-event (throttle) reasons", "share"),
    ("gpu", "power_w", "power", "W"), ("gpu", "temp_c", "temperature", "°C"),
    ("gpu", "sm_util_pct", "SM utilisation", "%"), ("gpu", "mem_util_pct", "memory utilisation", "%"),
    ("pcie", "pcie_gen", "PCIe generation", ""), ("pcie", "pcie_width", "PCIe width", "lanes"),
    ("pcie", "pcie_tx_Bps", "PCIe TX", "B/s"), ("pcie", "pcie_rx_Bps", "PCIe RX", "B/s"),
    ("nvlink", "nvlink_tx_Bps", "NVLink TX", "B/s"), ("nvlink", "nvlink_rx_Bps", "NVLink RX", "B/s"),
)
NIC_COUNTERS = (
    ("nic", "tx_Bps", "NIC TX", "B/s"), ("nic", "rx_Bps", "NIC RX", "B/s"), ("nic", "link_gbps", "link speed", "Gb/s"),
    ("nic", "symbol_errors_inc", "symbol errors (increase)", ""), ("nic", "retransmits_inc", "retransmits (increase)", ""),
    ("nic", "xmit_wait_inc", "xmit_wait (increase)", ""),
)
HOST_COUNTERS = (
    ("host", "cpu_util_pct", "CPU utilisation", "%"), ("host", "load1", "load (1 min)", ""),
    ("host", "iowait_pct", "iowait", "%"),
)
# Which way a counter is bad: the culprit is painted red only when it differs from its peers that way
# (MORE retransmits, a LOWER clock). Counters with no bad direction (power, utilisation, traffic share)
# are marked as different, never red.
WORSE_WHEN: dict[str, str] = {
    "sm_clock_mhz": "lower", "clock_ratio": "lower", "throttle_share": "higher", "temp_c": "higher",
    "pcie_gen": "lower", "pcie_width": "lower", "pcie_tx_Bps": "lower", "pcie_rx_Bps": "lower",
    "nvlink_tx_Bps": "lower", "nvlink_rx_Bps": "lower",
    "tx_Bps": "lower", "rx_Bps": "lower", "link_gbps": "lower",
    "symbol_errors_inc": "higher", "retransmits_inc": "higher", "xmit_wait_inc": "higher",
    "load1": "higher", "iowait_pct": "higher",
    # keys only verdict evidence carries (the report from ClickHouse)
    "throughput_Bps": "lower", "compute_ns_per_step": "higher", "transfer_ns_per_step": "higher",
    "excess_share_of_step": "higher", "stuck_s": "higher",
}
DIFFERENT = 0.1  # |culprit / peers - 1| from which a counter counts as different


@dataclass
class WindowRow:
    """One window of the timeline: slowdowns against peers (each rank's hottest function) and step time."""

    start_ns: int
    end_ns: int
    median_x: float | None       # the median rank's hottest function / its peers
    other_x: float | None        # the most different rank other than the culprit
    culprit_x: float | None      # the main culprit's (None: no single-rank culprit)
    step_ns: float | None = None  # median step time over the ranks (files only: ClickHouse keeps none)
    verdicts: int = 0
    other_rank: int | None = None


@dataclass
class CounterRow:
    group: str
    name: str
    unit: str
    culprit: float | None
    peer_median: float | None
    subject: str = ""            # which device (e.g. NIC name) when several
    key: str = ""                # the digest / evidence key (says which direction is bad)

    @property
    def ratio(self) -> float | None:
        if self.culprit is None or self.peer_median in (None, 0):
            return None
        return self.culprit / self.peer_median  # type: ignore[operator]

    @property
    def worse_when(self) -> str:
        return WORSE_WHEN.get(self.key, "")

    @property
    def direction(self) -> str:
        """``higher``/``lower`` when the culprit differs from its peers by >= 10% (or from a zero), else ``""``."""
        if self.culprit is None or self.peer_median is None:
            return ""
        if self.peer_median == 0:
            return "" if self.culprit == 0 else ("higher" if self.culprit > 0 else "lower")
        ratio = self.culprit / self.peer_median
        if abs(ratio - 1.0) < DIFFERENT:
            return ""
        return "higher" if (self.culprit > self.peer_median) else "lower"

    @property
    def verdict(self) -> str:
        """``worse`` (different in the bad direction: red), ``better``, ``different`` (no bad direction) or ``""``."""
        d = self.direction
        if not d:
            return ""
        if not self.worse_when:
            return "different"
        return "worse" if d == self.worse_when else "better"


@dataclass
class CulpritCost:
    """What one culprit costs the job, from its verdicts' optional cost fields."""

    label: str
    component: str
    job_slowdown: float | None      # the job's S over the culprit's windows (median)
    cost: float | None              # S_X: the job's step time with only this culprit slow / ideal
    gpu_hours_per_hour: float | None
    windows: int

    @property
    def lost_share(self) -> float | None:
        """The share of the job's time this culprit alone loses: 1 - 1/S_X."""
        return None if self.cost is None or self.cost <= 0 else max(0.0, 1.0 - 1.0 / self.cost)

    @property
    def share_of_lost(self) -> float | None:
        """Its share of all the time the job loses: (1 - 1/S_X) / (1 - 1/S), at most 1."""
        mine, s = self.lost_share, self.job_slowdown
        if mine is None or s is None or s <= 1.0:
            return None
        return min(1.0, mine / (1.0 - 1.0 / s))


@dataclass
class JobReport:
    job: str
    source: str
    window_ns: int
    windows: list[WindowRow]
    timeline: str                 # "step_time" or "slowdown"
    ranks: list[int]
    nodes: dict[int, str]
    fns: list[str]
    fn_kinds: list[str]
    heat: list[list[float | None]]  # len(ranks) x len(fns)
    heat_basis: str
    gpus: dict[int, int]          # rank -> GPU index on its node (its position there when unknown)
    verdicts: list[Verdict]
    culprit_ranks: list[int]
    culprit_nodes: list[str]
    subject: str                  # whose counters
    counters: list[CounterRow]
    counters_basis: str
    notes: list[str] = field(default_factory=list)
    costs: list[CulpritCost] = field(default_factory=list)

    def row_max(self) -> dict[int, float]:
        """Each rank's largest cell (what the test and the page's sort use)."""
        out: dict[int, float] = {}
        for rank, row in zip(self.ranks, self.heat):
            vals = [v for v in row if v is not None]
            out[rank] = max(vals) if vals else float("nan")
        return out


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _median(values: Iterable[float]) -> float | None:
    vals = [float(v) for v in values if _finite(v)]
    return float(np.median(vals)) if vals else None


def main_verdict(verdicts: Sequence[Verdict]) -> Verdict | None:
    """The finding to explain first: most confident, then slowest, then latest."""
    if not verdicts:
        return None
    return max(verdicts, key=lambda v: (v.confidence, v.slowdown, v.window_end_ns))


def _culprits(verdicts: Sequence[Verdict]) -> tuple[list[int], list[str]]:
    ranks = sorted({v.rank for v in verdicts if v.scope == "rank" and v.rank >= 0})
    nodes = sorted({v.node for v in verdicts if v.scope in ("rank", "node") and v.node})
    return ranks, nodes


def _heat(summaries: Iterable[WindowSummary | dict[str, Any]], windows: set[int] | None,
          culprit_fns: set[str]) -> tuple[list[int], dict[int, str], list[str], list[str], list[list[float | None]], list[str]]:
    """Median slowdown per (rank, fn) over the chosen windows; columns = the hottest functions."""
    cells: dict[tuple[int, str], list[float]] = defaultdict(list)
    kinds: dict[str, str] = {}
    nodes: dict[int, str] = {}
    all_ranks: set[int] = set()
    for s in summaries:
        get = s.get if isinstance(s, dict) else lambda k, _s=s: getattr(_s, k)  # type: ignore[misc]
        rank = int(get("rank"))
        all_ranks.add(rank)
        if get("node"):
            nodes[rank] = str(get("node"))
        if windows is not None and int(get("window_start_ns")) not in windows:
            continue
        kind = str(get("kind"))
        if kind in HEAT_SKIP_KINDS:
            continue
        fn = str(get("fn"))
        kinds[fn] = kind
        value = get("slowdown_vs_peers")
        if _finite(value):
            cells[(rank, fn)].append(float(value))
    med = {k: float(np.median(v)) for k, v in cells.items() if v}
    ranks_with = defaultdict(int)
    for (_r, fn) in med:
        ranks_with[fn] += 1
    med = {k: v for k, v in med.items() if ranks_with[k[1]] >= 2}  # a function one rank runs has no peers
    notes: list[str] = []
    fn_peak: dict[str, float] = defaultdict(float)
    for (_r, fn), v in med.items():
        fn_peak[fn] = max(fn_peak[fn], abs(v - 1.0))
    fns = sorted(fn_peak, key=lambda f: (-(f in culprit_fns), -fn_peak[f], f))
    if len(fns) > MAX_FN_COLUMNS:
        notes.append(f"{len(fns) - MAX_FN_COLUMNS} functions with the smallest spread across ranks left out of "
                     "the heat-map")
        fns = fns[:MAX_FN_COLUMNS]
    fns.sort(key=lambda f: (kinds.get(f, ""), f))
    ranks = sorted(all_ranks)
    if len(ranks) > MAX_RANKS:
        peak = {r: max((med.get((r, f), 1.0) for f in fns), default=1.0) for r in ranks}
        keep = set(sorted(ranks, key=lambda r: -peak[r])[:MAX_RANKS])
        notes.append(f"{len(ranks) - MAX_RANKS} ranks closest to their peers left out of the heat-map")
        ranks = [r for r in ranks if r in keep]
    heat = [[med.get((r, f)) for f in fns] for r in ranks]
    return ranks, nodes, fns, [kinds.get(f, "") for f in fns], heat, notes


def _counter_rows(windows: Sequence[WindowResult], rank: int | None, node: str | None) -> list[CounterRow]:
    """The culprit's counters (median over the windows) against the median of everyone else's."""
    rows: list[CounterRow] = []
    if rank is not None:
        per_rank: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for w in windows:
            for r, m in w.digest.gpu.items():
                for _g, key, _l, _u in GPU_COUNTERS:
                    if _finite(m.get(key)):
                        per_rank[int(r)][key].append(float(m[key]))
        mine = per_rank.get(rank, {})
        for group, key, label, unit in GPU_COUNTERS:
            others = [_median(vals[key]) for r, vals in per_rank.items() if r != rank and vals.get(key)]
            culprit = _median(mine.get(key, []))
            if culprit is None and not others:
                continue
            rows.append(CounterRow(group, label, unit, culprit, _median(o for o in others if o is not None),
                                   key=key))
    if node:
        per_nic: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        per_host: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for w in windows:
            for key_str, m in w.digest.nic.items():
                n, _, nic = key_str.rpartition("/")
                for _g, key, _l, _u in NIC_COUNTERS:
                    if _finite(m.get(key)):
                        per_nic[(n, nic)][key].append(float(m[key]))
            for n, m in w.digest.host.items():
                for _g, key, _l, _u in HOST_COUNTERS:
                    if _finite(m.get(key)):
                        per_host[n][key].append(float(m[key]))
        for (n, nic), vals in sorted(per_nic.items()):
            if n != node:
                continue
            for group, key, label, unit in NIC_COUNTERS:
                # the same port on the other nodes (a rail with its rail, eth0 with eth0)
                others = [_median(v[key]) for (n2, x), v in per_nic.items() if n2 != node and x == nic and v.get(key)]
                culprit = _median(vals.get(key, []))
                if culprit is None:
                    continue
                rows.append(CounterRow(group, label, unit, culprit, _median(o for o in others if o is not None),
                                       subject=nic, key=key))
        for group, key, label, unit in HOST_COUNTERS:
            culprit = _median(per_host.get(node, {}).get(key, []))
            others = [_median(v[key]) for n2, v in per_host.items() if n2 != node and v.get(key)]
            if culprit is None:
                continue
            rows.append(CounterRow(group, label, unit, culprit, _median(o for o in others if o is not None),
                                   subject=node, key=key))
    return rows


def _window_slowdowns(summaries: Iterable[WindowSummary | dict[str, Any]]) -> dict[int, dict[int, float]]:
    """window start -> rank -> the rank's hottest non-collective function against its peers."""
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for s in summaries:
        get = s.get if isinstance(s, dict) else lambda k, _s=s: getattr(_s, k)  # type: ignore[misc]
        if get("kind") in HEAT_SKIP_KINDS:
            continue
        value = get("slowdown_vs_peers")
        if not _finite(value):
            continue
        per = out[int(get("window_start_ns"))]
        r = int(get("rank"))
        per[r] = max(per.get(r, 0.0), float(value))
    return out


def _window_row(start: int, end: int, per_rank: dict[int, float], focus: int | None, verdicts: int,
                step_ns: float | None) -> WindowRow:
    others = {r: x for r, x in per_rank.items() if r != focus}
    top = max(others, key=lambda r: (others[r], -r)) if others else None
    return WindowRow(start, end, float(np.median(list(per_rank.values()))) if per_rank else None,
                     others[top] if top is not None else None,
                     per_rank.get(focus) if focus is not None else None, step_ns=step_ns, verdicts=verdicts,
                     other_rank=top)


def _opt(v: Any, name: str) -> float | None:
    """An optional numeric field of a verdict (absent on older verdicts; maybe in its evidence)."""
    x = getattr(v, name, None)
    if x is None and isinstance(getattr(v, "evidence", None), dict):
        x = v.evidence.get(name)
    return float(x) if _finite(x) else None


def culprit_label(v: Verdict) -> str:
    if v.scope == "rank":
        return f"rank {v.rank} on {v.node or '?'}" + (f", GPU {v.gpu}" if v.gpu >= 0 else "")
    if v.scope == "node":
        return f"node {v.node}"
    return f"job ({v.component})"


def culprit_costs(verdicts: Sequence[Verdict]) -> list[CulpritCost]:
    """Per culprit (component, scope, node, rank, gpu): the medians of its verdicts' cost fields, costliest first."""
    groups: dict[tuple, list[Verdict]] = defaultdict(list)
    for v in verdicts:
        groups[(v.component, v.scope, v.node, v.rank, v.gpu)].append(v)
    out = []
    for vs in groups.values():
        costs = [c for c in (_opt(v, "cost") for v in vs) if c is not None]
        if not costs:
            continue
        s = [x for x in (_opt(v, "job_slowdown") for v in vs) if x is not None]
        h = [x for x in (_opt(v, "gpu_hours_lost_per_hour") for v in vs) if x is not None]
        out.append(CulpritCost(culprit_label(vs[0]), vs[0].component, _median(s), _median(costs), _median(h),
                               len(vs)))
    return sorted(out, key=lambda c: (-(c.cost or 0.0), c.label))


def _gpus(nodes: dict[int, str], known: dict[int, int]) -> dict[int, int]:
    """rank -> GPU index: the digest's when known, else the rank's position among its node's ranks."""
    by_node: dict[str, list[int]] = defaultdict(list)
    for r, n in nodes.items():
        by_node[n].append(r)
    out = {}
    for ranks in by_node.values():
        for i, r in enumerate(sorted(ranks)):
            out[r] = known.get(r, i)
    return out


def _subject(v: Verdict | None) -> str:
    if v is None:
        return ""
    if v.scope == "rank":
        return f"rank {v.rank} on {v.node or '?'}" + (f", GPU {v.gpu}" if v.gpu >= 0 else "")
    if v.scope == "node":
        return f"node {v.node}"
    return f"job {v.job}"


def from_windows(job: str, windows: Sequence[WindowResult], source: str, window_ns: int) -> JobReport:
    """The report of one job from the core's window results (``eroica report FILE...``)."""
    windows = sorted((w for w in windows if w.job == job), key=lambda w: w.start_ns)
    verdicts = sorted((v for w in windows for v in w.verdicts), key=lambda v: (v.window_start_ns, -v.confidence))
    main = main_verdict(verdicts)
    culprit_ranks, culprit_nodes = _culprits(verdicts)
    fired = {v.window_start_ns for v in verdicts}
    chosen = fired or None
    ranks, nodes, fns, kinds, heat, notes = _heat(
        (s for w in windows for s in w.summaries), chosen, {v.fn for v in verdicts})
    for w in windows:
        nodes.update({int(r): n for r, n in zip(w.digest.ranks.rank.tolist(), w.digest.ranks.node)})
    focus = main.rank if main is not None and main.scope == "rank" else None
    known_gpu: dict[int, int] = {}
    rows = []
    for w in windows:
        known_gpu.update({int(r): int(g) for r, g in w.digest.gpu_index.items()})
        pat = build_patterns(w.digest) if len(w.digest.ranks) else None
        st = dict(zip(pat.ranks.tolist(), pat.step_time_ns.tolist())) if pat is not None else {}
        vals = [float(x) for x in st.values() if _finite(x)]
        per_rank = _window_slowdowns(w.summaries).get(w.start_ns, {})
        rows.append(_window_row(w.start_ns, w.end_ns, per_rank, focus, len(w.verdicts),
                                float(np.median(vals)) if vals else None))
    chosen_windows = [w for w in windows if w.start_ns in fired] or list(windows)
    node = main.node if main is not None and main.scope in ("rank", "node") else None
    counters = _counter_rows(chosen_windows, focus, node)
    basis = (f"median over the {len(fired)} window(s) with a verdict" if fired
             else f"median over all {len(windows)} window(s) (no verdict)")
    return JobReport(
        job=job, source=source, window_ns=window_ns, windows=rows, timeline="step_time", ranks=ranks, nodes=nodes,
        fns=fns, fn_kinds=kinds, heat=heat, heat_basis=basis, gpus=_gpus(nodes, known_gpu), verdicts=verdicts,
        culprit_ranks=culprit_ranks, culprit_nodes=culprit_nodes, subject=_subject(main), counters=counters,
        counters_basis=f"counter digests, {basis.replace('median over', 'medians over')}", notes=notes,
        costs=culprit_costs(verdicts),
    )


def _evidence_rows(v: Verdict | None) -> list[CounterRow]:
    """Counters quoted in a verdict's evidence ({metric: {culprit, peer_median}})."""
    if v is None:
        return []
    rows = []
    known = {key: (group, label, unit) for group, key, label, unit in GPU_COUNTERS + NIC_COUNTERS + HOST_COUNTERS}
    for key, value in v.evidence.items():
        if not isinstance(value, dict) or "culprit" not in value:
            continue
        c = value.get("culprit")
        p = next((value[k] for k in ("peer_median", "same_rail_median", "victim_median") if k in value), None)
        if not _finite(c):
            continue
        group, label, unit = known.get(key, ("evidence", key, ""))
        rows.append(CounterRow(group, label, unit, float(c), float(p) if _finite(p) else None, key=key))
    return rows


def from_rows(job: str, verdicts: Sequence[Verdict], summaries: Sequence[dict[str, Any]], source: str) -> JobReport:
    """The report of one job from the verdicts and summaries tables (``eroica report --job``)."""
    verdicts = sorted((v for v in verdicts if v.job == job), key=lambda v: (v.window_start_ns, -v.confidence))
    main = main_verdict(verdicts)
    culprit_ranks, culprit_nodes = _culprits(verdicts)
    fired = {v.window_start_ns for v in verdicts}
    ranks, nodes, fns, kinds, heat, notes = _heat(summaries, fired or None, {v.fn for v in verdicts})
    focus = main.rank if main is not None and main.scope == "rank" else None
    per_window = _window_slowdowns(summaries)
    bounds = {(int(s["window_start_ns"]), int(s["window_end_ns"])) for s in summaries}
    bounds |= {(v.window_start_ns, v.window_end_ns) for v in verdicts}
    count: dict[int, int] = defaultdict(int)
    for v in verdicts:
        count[v.window_start_ns] += 1
    rows = [_window_row(start, end, per_window.get(start, {}), focus, count[start], None)
            for start, end in sorted(bounds)]
    window_ns = int(np.median([e - s for s, e in bounds])) if bounds else 0
    if not summaries:
        notes.append("no window summaries stored for this job: the heat-map is empty")
    return JobReport(
        job=job, source=source, window_ns=window_ns, windows=rows, timeline="slowdown", ranks=ranks, nodes=nodes,
        fns=fns, fn_kinds=kinds, heat=heat,
        heat_basis=(f"median over the {len(fired)} window(s) with a verdict" if fired else "median over all windows"),
        gpus=_gpus(nodes, {v.rank: v.gpu for v in verdicts if v.scope == "rank" and v.gpu >= 0}), verdicts=verdicts,
        costs=culprit_costs(verdicts), culprit_ranks=culprit_ranks, culprit_nodes=culprit_nodes, subject=_subject(main),
        counters=_evidence_rows(main), counters_basis="the verdict's evidence (ClickHouse keeps no raw counters)",
        notes=notes,
    )
