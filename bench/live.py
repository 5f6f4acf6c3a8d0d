"""``eroica bench live``: one simulated job replayed at its real event rate through ``eroica up``.

The other benches price each stage in CPU-seconds per record; this one asks
the question an operator asks: does the running stack keep up with a job of
N ranks, and how soon after a fault does its verdict arrive? It

1. simulates a job (``producers/simulator``, every record it emits) with one
   clear fault (a throttled GPU by default) starting ``fault_at`` windows into
   the run, event time aligned on the epoch windows;
2. starts the stack as a user does (``eroica up``, tansu or Apache Kafka, all
   on 127.0.0.1, default settings unless the environment says otherwise);
3. replays the file in a child process, each frame released when the wall
   clock reaches its newest record's event time (``replay(clock_offset_ns=)``);
4. samples every second: records published (broker acknowledgements) against
   records the summariser read, digests sent against digests the detector
   read, committed offsets against the end offsets, CPU seconds and memory
   per process of the stack (``/proc``), and the verdicts in ClickHouse;
5. after the replay, waits for the pipeline to drain, counts dead letters,
   and stops the stack.

Digest mode (``LiveConfig.edge_digests``, ``--edge-digests``): the replay
child runs ``replay_digests`` instead, each node's records digested at the
edge as ``eroica replay --edge-digests`` does and the window digests sent
on the digests topic, paced by event time the same way. The summariser then
reads nothing, so the records lag is not applicable: the monitor judges on
the window digests the broker acknowledged to the replay against the
detector's ``digests`` counter (and the detector's committed offsets against
the replay's acknowledged digests-topic offsets), and the replay process's
CPU is the *edge* cost (the nodes' digesting, all in one process here).

Layout: measurement shaping (pure: :func:`parse_stat`, :func:`stage_cpu`,
:func:`lag_slope`, :func:`window_floors`, :func:`count_drops`, :func:`judge`,
:func:`verdict_timing`, :func:`summarise`, :func:`format_table`) is apart from the process I/O (:class:`Stack`,
:class:`ReplayChild`, :class:`Monitor`, :func:`run`), so the arithmetic is
tested without a stack.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import msgspec

from eroica.kafka.publisher import FramePublisher
from eroica.models.reader import DEFAULT_BATCH
from eroica.stack.local import service_role

BROKERS = ("tansu", "kafka")
# "edge": the replay process in digest mode, which does the nodes' digesting (reported as their cost).
STAGES = ("replay", "edge", "broker", "summariser", "detector", "sink", "supervisor", "monitor")
DEFAULT_WINDOW_S = 30.0
_CLK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
# A lag that grows by more than this share of the elapsed time falls behind (0.05: the stage
# takes less than 95% of the input rate); the replay may run this share of a window late.
GROWTH_LIMIT = 0.05
# Environment a run records as its settings: ours, and faust's own (it reads e.g. PRODUCER_MAX_REQUEST_SIZE).
SETTING_PREFIXES = ("EROICA_", "PRODUCER_", "CONSUMER_", "BROKER_")
REPLAY_LATE_WINDOWS = 1 / 3
# The workers' /eroica/stats counters the monitor reads (summed over a role's processes).
COUNTERS = ("records", "late_records", "corrupt", "digests", "windows", "pending_windows", "held_messages",
            "late_windows")
# Digest mode releases a reader batch when its newest record is due, so its oldest records wait the batch's
# span of event time: batches of half a second of the job's input hold a digest back no longer than a live
# node does (its tracer flushes every 0.5 s, producers/tracer/runtime.py DEFAULT_FLUSH_S), where the reader's
# default 65,536 records would be ~20 s of a 64-rank job and windows would close that much late.
DIGEST_BATCH_S = 0.5
# lag_stats' keys about the summariser's records lag: None in digest mode, where the summariser reads nothing.
RECORDS_LAG = ("max_records", "max_s", "mean_s", "slope_s_per_s", "end_records")


@dataclass
class LiveConfig:
    """One live run. ``steps`` None: enough steps for ``windows`` windows of the job's step time."""

    ranks: int = 1024
    steps: int | None = None
    windows: float = 8.0
    gpus: int = 8
    seed: int = 1
    fault: str | None = None  # a simulator fault without start= (default: gpu_throttle on one rank)
    fault_at: float = 3.5  # windows after the run's first (epoch-aligned) window start
    profile: str = "default"
    broker: str = "tansu"
    summarisers: int = 1  # summariser processes of the stack (`eroica up --summarisers`)
    window_s: float | None = None  # None: $EROICA_WINDOW_S, else 30 s (exported to the stack)
    sample_s: float = 1.0
    idle_s: float = 5.0  # idle CPU of the stack measured before the replay starts
    drain_s: float = 120.0
    # The replay stands in for live collectors, which declare their watermarks (frame meta "wm":
    # the tracer from its open spans, the agent from its sample times); False: guessed marks only.
    declared_watermarks: bool = True
    # Digest mode: the replay digests each node's records at the edge (``replay_digests``, the digesters of
    # ``eroica replay --edge-digests``); with ``declared_watermarks`` each node declares its marks as live
    # agents and tracers do (``producers.replay.in_order_mark``).
    edge_digests: bool = False
    # Raw mode: the most event time one frame spans (``replay(frame_lag_s=)``; None: the replay's default, a
    # tracer's 0.5 s flush and 1 s linger). The summariser's cost is per frame: longer frames, fewer of them.
    frame_s: float | None = None
    ready_timeout_s: float = 240.0
    work_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # extra EROICA_* for the stack (and replay)
    progress: Callable[[str], None] = lambda _msg: None

    def __post_init__(self) -> None:
        if self.broker not in BROKERS:
            raise ValueError(f"broker must be one of {', '.join(BROKERS)}, got {self.broker!r}")
        if self.ranks > self.gpus and self.ranks % self.gpus:
            raise ValueError(f"--ranks {self.ranks} must be a multiple of {self.gpus} GPUs per node")
        if self.frame_s is not None and (not self.frame_s > 0 or self.edge_digests):
            raise ValueError("--frame-s must be > 0 s, and applies to raw frames only (not with --edge-digests)")

    @property
    def layout(self) -> tuple[int, int]:
        """(nodes, gpus per node)."""
        gpus = min(self.gpus, self.ranks)
        return self.ranks // gpus, gpus

    def window(self, environ: Mapping[str, str]) -> float:
        env_w = self.env.get("EROICA_WINDOW_S") or environ.get("EROICA_WINDOW_S")
        return float(self.window_s or (float(env_w) if env_w else DEFAULT_WINDOW_S))

    def fault_spec(self) -> str:
        return self.fault or f"gpu_throttle:rank={self.ranks * 2 // 3 + 1}"


def digest_batch_records(records_per_s: float) -> int:
    """Reader batch of a digest-mode live replay: ``DIGEST_BATCH_S`` of the job's input (at least one record)."""
    return max(1, round(records_per_s * DIGEST_BATCH_S))


# -- pure measurement shaping ------------------------------------------------------------------------


def parse_stat(raw: bytes) -> tuple[int, float, int]:
    """``/proc/PID/stat`` -> (ppid, CPU seconds user+system, RSS bytes). The name may hold spaces."""
    rest = raw[raw.rfind(b")") + 2:].split()
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / _CLK, int(rest[21]) * _PAGE


def stage_cpu(table: Mapping[int, tuple[int, float, int]], roots: Mapping[str, int]) -> dict[str, tuple[float, int]]:
    """Per stage, (CPU s, RSS bytes) of its root process and the descendants that are no other stage's.

    The supervisor's tree holds every child: a stage's subtree stops at
    another stage's root, so each process is counted once.
    """
    children: dict[int, list[int]] = {}
    for pid, (ppid, _cpu, _rss) in table.items():
        children.setdefault(ppid, []).append(pid)
    owned = set(roots.values())
    out: dict[str, tuple[float, int]] = {}
    for stage, root in roots.items():
        cpu, rss, todo = 0.0, 0, [root]
        while todo:
            pid = todo.pop()
            if pid not in table:
                continue
            cpu += table[pid][1]
            rss += table[pid][2]
            todo.extend(c for c in children.get(pid, []) if c not in owned)
        out[stage] = (cpu, rss)
    return out


@dataclass
class Sample:
    """What the monitor saw at ``t`` seconds after the replay started (cumulative counters)."""

    t: float
    published: int  # records the broker acknowledged to the replay (digest mode: in the digests it acknowledged)
    summarised: int  # records the summariser read
    late: int  # of those, records the summariser found late (dropped from their window)
    corrupt: int
    digests_sent: int  # window digests the summariser sent (digest mode: the replay's, the broker acknowledged)
    digests_read: int  # digests the detector read
    windows: int  # job windows the detector analysed
    pending_windows: int
    held: int  # messages the workers hold unacknowledged (summariser + detector)
    raw_lag: int | None  # messages: end offsets of the replay's deliveries - the summariser's committed
    digests_lag: int | None  # messages: digests end offsets - the detector's committed (Apache Kafka only)
    cpu: dict[str, float]
    rss_mb: dict[str, float]
    load1: float
    replay_done: bool = False
    late_digests: int | None = None  # digest mode: digests the detector dropped, their window analysed (raw: None)

    @property
    def lag_records(self) -> int:
        return max(0, self.published - self.summarised)

    @property
    def lag_digests(self) -> int:
        return max(0, self.digests_sent - self.digests_read)


def lag_slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (t, lag) points: lag units per second (0 for fewer than 3 points)."""
    if len(points) < 3:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    ml = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if var == 0 else sum((t - mt) * (v - ml) for t, v in points) / var


def window_floors(points: Sequence[tuple[float, float]], window_s: float) -> list[tuple[float, float]]:
    """Per whole window of elapsed time, (its middle, the smallest lag seen in it).

    A lag that comes in bursts (every node closes the same window at once)
    is back at its floor between bursts when the stage keeps up, and its floor
    rises when it falls behind; a sample caught mid-burst is no trend. The
    last window, still open when the points end, is left out.
    """
    floors: dict[int, float] = {}
    for t, v in points:
        k = int(t // window_s)
        floors[k] = min(v, floors.get(k, v))
    last = int(points[-1][0] // window_s) if points else 0
    return [((k + 0.5) * window_s, v) for k, v in sorted(floors.items()) if k < last]


def lag_stats(samples: Sequence[Sample], rate: float, window_s: float, edge_digests: bool = False) -> dict[str, Any]:
    """The records lag (in records and in seconds of input), its peak and its trend while records flowed.

    The trend is fitted from the end of the first window (the stack has then
    seen a whole window) to the end of the replay: a stage that keeps up has a
    lag that comes and goes with each window's work; one that falls behind
    has a lag that grows with the time elapsed.

    ``edge_digests`` (digest mode): no record goes through the summariser,
    so the records keys are None; ``digests_trend_s_per_s`` is the digests
    lag's trend in seconds of digest input (delivered digests per second of
    the replay) per second, fitted on each window's floor
    (:func:`window_floors`), which is what digest mode is judged on.
    """
    during = [s for s in samples if not s.replay_done]
    trend = [(s.t, s.lag_records / rate) for s in during if s.t >= window_s] if rate > 0 else []
    dig_trend = [(s.t, float(s.lag_digests)) for s in during if s.t >= window_s]
    raw = [s.raw_lag for s in during if s.raw_lag is not None]
    dig = [s.digests_lag for s in during if s.digests_lag is not None]
    stats = {
        "max_records": max((s.lag_records for s in during), default=0),
        "max_s": round(max((s.lag_records for s in during), default=0) / rate, 2) if rate > 0 else None,
        "mean_s": round(sum(s.lag_records for s in during) / len(during) / rate, 2) if during and rate > 0 else None,
        "slope_s_per_s": round(lag_slope(trend), 4),
        "max_digests": max((s.lag_digests for s in during), default=0),
        "digests_slope_per_s": round(lag_slope(dig_trend), 4),
        "max_raw_offsets": max(raw, default=None),
        "max_digests_offsets": max(dig, default=None),
        "end_records": samples[-1].lag_records if samples else None,
        "end_digests": samples[-1].lag_digests if samples else None,
        "end_raw_offsets": samples[-1].raw_lag if samples else None,
        "end_digests_offsets": samples[-1].digests_lag if samples else None,
    }
    if edge_digests:
        stats.update(dict.fromkeys(RECORDS_LAG))
        per_s = during[-1].digests_sent / during[-1].t if during and during[-1].t > 0 else 0.0
        floors = window_floors([(s.t, s.lag_digests / per_s) for s in during if s.t >= window_s], window_s) \
            if per_s > 0 else []
        stats["digests_trend_s_per_s"] = round(lag_slope(floors), 4)
    return stats


def cpu_stats(samples: Sequence[Sample], start: Sample | None, idle: tuple[Sample, Sample] | None,
              records: int) -> dict[str, dict[str, float | None]]:
    """Per stage: CPU seconds from the replay's start to the end, cores on average, idle cores, records per CPU-s."""
    if not samples or start is None:
        return {}
    end = samples[-1]
    span = max(end.t - start.t, 1e-9)
    out: dict[str, dict[str, float | None]] = {}
    for stage in end.cpu:
        used = end.cpu[stage] - start.cpu.get(stage, 0.0)
        idle_cores = None
        if idle is not None and stage in idle[0].cpu and stage in idle[1].cpu and idle[1].t > idle[0].t:
            idle_cores = round((idle[1].cpu[stage] - idle[0].cpu[stage]) / (idle[1].t - idle[0].t), 3)
        out[stage] = {"cpu_s": round(used, 2), "cores": round(used / span, 3), "idle_cores": idle_cores,
                      "records_per_cpu_s": round(records / used) if used > 0 else None,
                      "peak_rss_mb": round(max(s.rss_mb.get(stage, 0.0) for s in samples), 1)}
    for role in STAGES:  # a role run as several processes (summariser, summariser-2, ...): their sum too
        parts = [out[k] for k in out if service_role(k) == role]
        if len(parts) > 1:
            used = sum(float(p["cpu_s"] or 0) for p in parts)
            idles = [p["idle_cores"] for p in parts]
            out[f"{role} (all)"] = {
                "cpu_s": round(used, 2), "cores": round(sum(float(p["cores"] or 0) for p in parts), 3),
                "idle_cores": None if None in idles else round(sum(float(i or 0) for i in idles), 3),
                "records_per_cpu_s": round(records / used) if used > 0 else None,
                "peak_rss_mb": round(sum(float(p["peak_rss_mb"] or 0) for p in parts), 1)}
    return out


def verdict_timing(onset_ns: int, window_ns: int, offset_ns: int, first: Mapping[str, Any] | None
                   ) -> dict[str, Any]:
    """Fault onset to verdict: seconds and windows, from the detector's clock and from ClickHouse's arrival.

    ``offset_ns`` maps event time to wall time (the replay's pacing). Windows
    are counted as seconds / window, and as which window the verdict is about
    (0: the onset's own window). ``first``: the first matching verdict's
    ``window_start_ns``, ``detected_at_ns`` (the detector's wall clock) and
    ``seen_ns`` (when the monitor first read it from ClickHouse).
    """
    onset_window = onset_ns // window_ns * window_ns
    out: dict[str, Any] = {"onset_ns": onset_ns, "onset_window_start_ns": onset_window,
                           "onset_in_window_s": round((onset_ns - onset_window) / 1e9, 2), "found": first is not None}
    if first is None:
        return out
    onset_wall = onset_ns + offset_ns
    detected_s = (first["detected_at_ns"] - onset_wall) / 1e9
    stored_s = (first["seen_ns"] - onset_wall) / 1e9
    out.update({
        "verdict_window": (first["window_start_ns"] - onset_window) // window_ns,
        "detected_after_s": round(detected_s, 2), "detected_after_windows": round(detected_s * 1e9 / window_ns, 2),
        "stored_after_s": round(stored_s, 2), "stored_after_windows": round(stored_s * 1e9 / window_ns, 2),
        "detected_after_onset_window_end_s": round((first["detected_at_ns"] - onset_window - window_ns - offset_ns)
                                                   / 1e9, 2),
    })
    return out


def crash_lines(log_text: str) -> list[str]:
    """The distinct crash reasons of a worker's log, digits masked so one cause is listed once."""
    import re

    seen: dict[str, str] = {}
    for line in log_text.splitlines():
        m = re.search(r"Crashed reason=(.*)$", line) or re.match(r"^(\w+(?:\.\w+)*(?:Error|Exception): .*)$", line)
        if m:
            reason = m.group(1).strip()[:300]
            seen.setdefault(re.sub(r"\d+", "N", reason), reason)
    return list(seen.values())


def judge(lag: Mapping[str, Any], drops: Mapping[str, int], drained: bool, behind_s: float,
          window_s: float, restarts: Mapping[str, int] | None = None,
          edge_digests: bool = False) -> tuple[bool, list[str]]:
    """Keeps up: nothing dropped or dead-lettered, lags that do not grow, drained at the end, replay on time,
    and no process of the stack restarted (a crash loop is not keeping up, whatever the counters say).

    Digest mode (``edge_digests``): no records lag; the detector's digests lag, in seconds of digest input,
    must not grow by more than ``GROWTH_LIMIT`` (its per-window floor: see :func:`lag_stats`)."""
    why = [f"{name} restarted {n} times" for name, n in (restarts or {}).items() if n]
    for name, n in drops.items():
        if n:
            why.append(f"{n} {name.replace('_', ' ')}")
    if edge_digests:
        if lag["digests_trend_s_per_s"] > GROWTH_LIMIT:
            why.append(f"detector lag grew {lag['digests_trend_s_per_s']:.3f} s of digests per s")
    else:
        if lag["slope_s_per_s"] > GROWTH_LIMIT:
            why.append(f"summariser lag grew {lag['slope_s_per_s']:.3f} s per s")
        if lag["digests_slope_per_s"] > GROWTH_LIMIT * 10:  # digests come in bursts per window: a looser bound
            why.append(f"detector lag grew {lag['digests_slope_per_s']:.2f} digests per s")
    if not drained:
        why.append("not drained at the end")
    if behind_s > window_s * REPLAY_LATE_WINDOWS:
        why.append(f"the replay ran up to {behind_s:.1f} s behind real time")
    return not why, why


def summarise(samples: Sequence[Sample], *, cfg: Mapping[str, Any], input_: Mapping[str, Any],
              replay: Mapping[str, Any], deadletters: int | None, drained_after_s: float | None,
              timing: Mapping[str, Any], score: Mapping[str, Any], idle: tuple[Sample, Sample] | None,
              load: Mapping[str, Any]) -> dict[str, Any]:
    """The run's result document (what the table prints and the JSON holds)."""
    rate = input_["records_per_s"]
    edge = bool(cfg.get("edge_digests"))
    start = samples[0] if samples else None
    lag = lag_stats(samples, rate, cfg["window_s"], edge)
    end = samples[-1] if samples else None
    published = int(replay.get("delivered_records") or 0)
    drops = count_drops(replay, end, deadletters, edge)
    drained = drained_after_s is not None
    ok, why = judge(lag, drops, drained, float(replay.get("behind_s", 0.0)), cfg["window_s"],
                    replay.get("restarts"), edge)
    crashed = sorted(replay.get("crashes") or {})  # faust restarts a crashed agent inside the process
    if crashed:
        ok = False
        why.append(f"{', '.join(crashed)} crashed (see the log)")
    if not timing.get("found"):
        why.append("no verdict for the fault")
    return {
        "config": dict(cfg), "input": dict(input_), "replay": dict(replay), "load": dict(load),
        "lag": lag, "drops": drops, "deadletters_counted": deadletters is not None,
        "drained_after_s": drained_after_s, "cpu": _idle_summariser(cpu_stats(samples, start, idle, published), edge),
        "verdict": dict(timing), "score": dict(score), "keeps_up": ok and bool(timing.get("found")),
        "why_not": why, "samples": [_sample_json(s, edge) for s in samples],
    }


def count_drops(replay: Mapping[str, Any], end: Sample | None, deadletters: int | None,
                edge_digests: bool = False) -> dict[str, int]:
    """What went missing, by where (each must be 0).

    Raw mode: records the broker did not acknowledge, records the summariser
    did not read, records it found late. Digest mode (the summariser reads
    nothing): window digests the broker did not acknowledge, records in no
    delivered digest (late at their node, or in a digest not delivered),
    delivered digests the detector did not read, and digests it dropped
    because their window had been analysed without them.
    """
    published = int(replay.get("delivered_records") or 0)
    if edge_digests:
        delivered = int(replay.get("delivered_digests") or 0)
        flow = {
            "digests_not_delivered": int(replay.get("digests", delivered)) - delivered,
            "records_not_covered": int(replay.get("records", 0)) - published,
            "digests_not_read": (delivered - end.digests_read) if end else delivered,
            "late_digests": int(end.late_digests or 0) if end else 0,
        }
    else:
        flow = {
            "records_not_delivered": int(replay.get("records", 0)) - published,
            "records_not_summarised": (published - end.summarised) if end else published,
            "late_records": end.late if end else 0,
        }
    return {**flow, "corrupt_messages": end.corrupt if end else 0,
            "dead_letters": deadletters if deadletters is not None else 0,
            "invalid_lines": int(replay.get("invalid", 0))}


def _idle_summariser(cpu: dict[str, dict[str, float | None]], edge_digests: bool) -> dict[str, dict[str, float | None]]:
    """Digest mode: the summariser read no record, so it has no records per CPU-s (its CPU is idle cost)."""
    if edge_digests:
        for stage, c in cpu.items():
            if service_role(stage.removesuffix(" (all)")) == "summariser":
                c["records_per_cpu_s"] = None
    return cpu


def _sample_json(s: Sample, edge_digests: bool = False) -> dict[str, Any]:
    d = asdict(s)
    if s.late_digests is None:
        del d["late_digests"]  # a digest-mode counter: raw mode's samples keep the fields they had
    d["lag_records"] = None if edge_digests else s.lag_records
    d["lag_digests"] = s.lag_digests
    d["cpu"] = {k: round(v, 2) for k, v in s.cpu.items()}
    d["rss_mb"] = {k: round(v, 1) for k, v in s.rss_mb.items()}
    return d


def table_rows(result: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """One row per process, in pipeline order; a role of several processes: each (no rate: they share the
    records), then their sum."""
    rows: list[tuple[str, ...]] = []
    cpu = result["cpu"]
    for role in STAGES:
        names = [role, *sorted((k for k in cpu if k != role and service_role(k) == role),
                               key=lambda k: int(k.rpartition("-")[2]))]
        shared = f"{role} (all)" in cpu
        for stage in [*names, f"{role} (all)"]:
            c = cpu.get(stage)
            if c is None:
                continue
            rate = c["records_per_cpu_s"]
            rows.append((stage, f"{c['cpu_s']:.1f}", f"{c['cores']:.3f}",
                         "-" if c["idle_cores"] is None else f"{c['idle_cores']:.3f}",
                         "-" if not rate or role in ("supervisor", "monitor") or (shared and stage in names)
                         else f"{rate:,}",
                         f"{c['peak_rss_mb']:,.0f}"))
    return rows


COLUMNS = ("process", "CPU s", "cores", "idle cores", "records/CPU-s", "peak RSS MB")


def format_table(result: Mapping[str, Any]) -> str:
    """The run as text: one line of input, the CPU table, then lag, drops, verdict and the judgement."""
    rows = [COLUMNS, *table_rows(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = []
    for k, r in enumerate(rows):
        lines.append("  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    c, i, rp, lag, d, v = (result[k] for k in ("config", "input", "replay", "lag", "drops", "verdict"))
    many = f", {c['summarisers']} summarisers" if c.get("summarisers", 1) > 1 else ""
    many += ", edge digests" if c.get("edge_digests") else ""
    many += f", frames of up to {c['frame_s']:g} s" if c.get("frame_s") else ""
    head = (f"eroica bench live: {c['ranks']} ranks ({c['nodes']} x {c['gpus']}), {c['steps']} steps of "
            f"{i['step_s']:.2f} s ({i['seconds']:.0f} s, {i['seconds'] / c['window_s']:.1f} windows of "
            f"{c['window_s']:g} s), {c['broker']}{many}: {i['records']:,} records at {i['records_per_s']:,.0f}/s, "
            f"{i['bytes'] / 2**20:,.0f} MiB JSON; fault {c['fault']} at {v['onset_in_window_s']:g} s into window "
            f"{c['fault_window']}")
    foot = [
        *(_digest_flow(rp, lag) if c.get("edge_digests") else [
            f"replay: {rp.get('delivered_records', 0):,} of {rp.get('records', 0):,} records delivered in "
            f"{rp.get('seconds', 0):.0f} s, at most {rp.get('behind_s', 0):.2f} s behind real time",
            f"lag (summariser, records): max {lag['max_records']:,} ({lag['max_s']} s of input), mean "
            f"{lag['mean_s']} s, trend {lag['slope_s_per_s']:+.4f} s/s, at the end {lag['end_records']}; digests "
            f"(detector): max {lag['max_digests']}, trend {lag['digests_slope_per_s']:+.3f}/s, at the end "
            f"{lag['end_digests']}; committed offsets behind: raw max {lag['max_raw_offsets']} end "
            f"{lag['end_raw_offsets']}, digests max {lag['max_digests_offsets']} end {lag['end_digests_offsets']}"]),
        "drops: " + ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in d.items())
        + ("" if result["deadletters_counted"] else " (dead-letter topic not read)"),
        f"drained {result['drained_after_s']} s after the replay ended" if result["drained_after_s"] is not None
        else "NOT drained",
    ]
    for name, reasons in (rp.get("crashes") or {}).items():
        foot.append(f"{name} crashed ({rp.get('restarts', {}).get(name, 0)} restarts"
                    f"{', then failed' if name in (rp.get('failed') or []) else ''}): {reasons[0]}")
    if v["found"]:
        foot.append(f"fault -> verdict: detected {v['detected_after_s']} s ({v['detected_after_windows']} windows) "
                    f"after the onset, in ClickHouse {v['stored_after_s']} s ({v['stored_after_windows']} windows); "
                    f"the verdict is about window onset+{v['verdict_window']}")
    else:
        foot.append("fault -> verdict: NO matching verdict")
    s = result["score"]
    foot.append(f"verdicts: {s.get('alarms', 0)} alarms, fault localised: {s.get('localised')}, found "
                f"{s.get('found')}, victims blamed {s.get('victims_blamed')}, false alarms {s.get('false_alarms')}")
    settings = {k: v for k, v in c.get("settings", {}).items() if k != "EROICA_WINDOW_S"}
    if settings:
        foot.append("settings: " + " ".join(f"{k}={v}" for k, v in settings.items()))
    ld = result["load"]
    foot.append(f"load average at start {ld.get('start')}, at end {ld.get('end')}, max 1-min during "
                f"{ld.get('max1')} ({os.cpu_count()} CPUs)")
    foot.append("KEEPS UP" if result["keeps_up"] else "FALLS BEHIND: " + "; ".join(result["why_not"]))
    return "\n".join([head, *lines, *foot])


def _digest_flow(rp: Mapping[str, Any], lag: Mapping[str, Any]) -> list[str]:
    """Digest mode's replay and lag lines: what the edge sent and what the detector read of it."""
    return [
        f"edge (the replay process digests every node's records, as the nodes would): "
        f"{rp.get('delivered_digests', 0):,} of {rp.get('digests', 0):,} window digests delivered "
        f"({rp.get('messages', 0):,} messages, {rp.get('message_bytes', 0) / 2**20:,.1f} MiB) covering "
        f"{rp.get('delivered_records', 0):,} of {rp.get('records', 0):,} records ({rp.get('late_records', 0)} late "
        f"at their node), in {rp.get('seconds', 0):.0f} s, at most {rp.get('behind_s', 0):.2f} s behind real time "
        f"(batches of {rp.get('batch_records', 0):,} records)",
        f"lag: records not applicable (the summariser reads none in digest mode); digests (detector): max "
        f"{lag['max_digests']}, trend of its per-window floor {lag['digests_trend_s_per_s']:+.4f} s/s, at the end "
        f"{lag['end_digests']}; committed offsets behind: digests max {lag['max_digests_offsets']} end "
        f"{lag['end_digests_offsets']}",
    ]


def to_json(result: Mapping[str, Any]) -> bytes:
    return msgspec.json.format(msgspec.json.encode(result, enc_hook=str), indent=1) + b"\n"


# -- process I/O -------------------------------------------------------------------------------------


def proc_table() -> dict[int, tuple[int, float, int]]:
    """pid -> (ppid, CPU s, RSS bytes) of every process we can read."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    out[int(name)] = parse_stat(f.read())
            except (OSError, ValueError, IndexError):
                continue
    return out


def loadavg() -> str:
    """The 1, 5 and 15-minute load averages (the machine is shared: they qualify every CPU number)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _load1() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError):
        return 0.0


def clean_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without a stack's addresses (the bench's stack is found by its state file)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EROICA_CLICKHOUSE", "EROICA_KAFKA_BOOTSTRAP", "EROICA_DATA_DIR"))}
    env.update(extra)
    return env


class Stack:
    """``eroica up`` as a child process in its own session: started, found (``stack.json``), stopped."""

    def __init__(self, data_dir: Path, broker: str, env: Mapping[str, str], log: Path, summarisers: int = 1) -> None:
        self.data_dir, self.broker, self.env, self.log_path = data_dir, broker, dict(env), log
        self.summarisers = summarisers
        self.proc: subprocess.Popen[bytes] | None = None
        self.state: dict[str, Any] = {}

    def start(self, timeout_s: float) -> dict[str, Any]:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "eroica.cli", "up", "--data-dir", str(self.data_dir), "--broker", self.broker,
                 "--summarisers", str(self.summarisers)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"eroica up exited {self.proc.returncode}: {self.tail()}")
            if "stack up" in self.log_path.read_text(errors="replace"):
                self.state = json.loads((self.data_dir / "stack.json").read_text())
                return self.state
            time.sleep(0.25)
        raise RuntimeError(f"eroica up not ready within {timeout_s:.0f} s: {self.tail()}")

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def roots(self) -> dict[str, int]:
        """Stage -> pid of the stack's processes (re-read: the supervisor may have restarted one)."""
        try:
            self.state = json.loads((self.data_dir / "stack.json").read_text())
        except (OSError, ValueError):
            pass
        roots = {"supervisor": int(self.state.get("pid") or 0)}
        broker_pid = (self.state.get("kafka") or {}).get("pid")
        if broker_pid:
            roots["broker"] = int(broker_pid)
        for name, svc in (self.state.get("services") or {}).items():
            if svc.get("pid"):
                roots[name] = int(svc["pid"])
        return roots

    def restarts(self) -> dict[str, int]:
        out = {name: int(svc.get("restarts") or 0) for name, svc in (self.state.get("services") or {}).items()}
        out["broker"] = int((self.state.get("kafka") or {}).get("restarts") or 0)
        return out

    def failed(self) -> list[str]:
        """Services the supervisor gave up restarting (their restart budget is spent)."""
        return [name for name, svc in (self.state.get("services") or {}).items() if svc.get("state") == "failed"]

    def crash_reasons(self, limit: int = 3) -> dict[str, list[str]]:
        """Per service, the distinct reasons its log gives for crashes (faust's ``Crashed reason=``, tracebacks)."""
        out: dict[str, list[str]] = {}
        for name, svc in (self.state.get("services") or {}).items():
            try:
                text = Path(svc.get("log") or self.data_dir / "logs" / f"{name}.log").read_text(errors="replace")
            except OSError:
                continue
            found = crash_lines(text)
            if found:
                out[name] = found[:limit]
        return out

    def stop(self) -> None:
        """SIGTERM and a minute to stop cleanly (workers, sink, broker), then SIGKILL of the whole group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything of the group left behind
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(10)


class TrackingPublisher(FramePublisher):
    """The replay's publisher, also keeping each partition's end offset of the topic it feeds (``topic``: the
    raw topic, or in digest mode the digests topic) from the delivery reports, and counting the window
    digests delivered there.

    tansu misreports high watermarks, so the offsets the broker acknowledged
    to the replay are the only end offsets a lag can trust on both brokers.
    """

    def __init__(self, *args: Any, topic: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.topic = topic or self.config.raw_topic
        self.ends: dict[int, int] = {}
        self.delivered_digests = 0

    def _on_delivery(self, err: Any, msg: Any, records: int = 0) -> None:
        super()._on_delivery(err, msg, records)
        if err is None and msg.topic() == self.topic:
            p = msg.partition()
            self.ends[p] = max(self.ends.get(p, 0), msg.offset() + 1)
            if records and self.topic == self.config.digests_topic:
                self.delivered_digests += 1  # the one digests-topic message that carries records (progress, end, job: none)


# The replay child's shared counters: delivered records, failed records, delivered window digests, then
# the end offset of each partition of the topic it feeds.
_ENDS = 3


def _replay_child(path: str, env: dict[str, str], offset_ns: int, shared: Any, done: Any,
                  declare: bool = True, edge_digests: bool = False, batch_records: int = DEFAULT_BATCH,
                  frame_s: float | None = None) -> None:
    """The replay process: publishes ``path`` paced by event time, mirrors its counts into ``shared``.

    Digest mode (``edge_digests``): digests each node's records as ``eroica replay --edge-digests`` does
    (the same digester factory), ``batch_records`` at a time (see ``DIGEST_BATCH_S``).
    """
    os.environ.clear()
    os.environ.update(env)
    from eroica.kafka.config import KafkaConfig
    from eroica.producers.replay import ReplayError, replay, replay_digests

    config = KafkaConfig.from_env()
    pub = TrackingPublisher.for_replay(config, topic=config.digests_topic if edge_digests else None)
    stop = threading.Event()

    def mirror() -> None:
        shared[0] = pub.stats.delivered_records
        shared[1] = pub.stats.failed_records
        shared[2] = pub.delivered_digests
        for p, end in list(pub.ends.items()):
            if _ENDS + p < len(shared):
                shared[_ENDS + p] = end

    def loop() -> None:
        while not stop.wait(0.2):
            mirror()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    doc: dict[str, Any] = {}
    try:
        if edge_digests:
            from eroica.streams.faust.settings import edge_digester_factory

            result = replay_digests([path], config, edge_digester_factory(declares=declare), publisher=pub,
                                    clock_offset_ns=offset_ns, batch_records=batch_records,
                                    declare_watermarks=declare)
        else:
            result = replay([path], config, publisher=pub, clock_offset_ns=offset_ns, declare_watermarks=declare,
                            frame_lag_s=frame_s)
    except ReplayError as exc:
        result, doc["error"] = exc.result, str(exc)
    finally:
        pub.close(timeout_s=30.0)
        stop.set()
        t.join()
        mirror()
    doc.update({"records": result.records, "delivered_records": pub.stats.delivered_records,
                "failed_records": pub.stats.failed_records, "invalid": result.invalid, "frames": result.frames,
                "messages": result.messages, "message_bytes": result.message_bytes, "seconds": round(result.seconds, 2),
                "behind_s": round(result.behind_s, 3), "blocked_s": round(pub.stats.blocked_s, 2),
                "declared_watermarks": declare,
                "watermark_violations": result.watermark_violations})
    if edge_digests:
        doc.update({"digests": result.digests, "delivered_digests": pub.delivered_digests,
                    "late_records": result.late_records, "end_of_stream": result.end_of_stream,
                    "batch_records": batch_records})
    done.put(doc)


class ReplayChild:
    """The replay in a process of its own, so its CPU is its own and the monitor's is apart."""

    def __init__(self, path: Path, env: Mapping[str, str], offset_ns: int, partitions: int,
                 declare: bool = True, edge_digests: bool = False, batch_records: int = DEFAULT_BATCH,
                 frame_s: float | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.shared = ctx.Array("q", _ENDS + partitions, lock=False)
        self.done = ctx.Queue()
        self.proc = ctx.Process(target=_replay_child,
                                args=(str(path), dict(env), offset_ns, self.shared, self.done, declare, edge_digests,
                                      batch_records, frame_s),
                                name="eroica-live-replay", daemon=True)
        self.result: dict[str, Any] | None = None

    def start(self) -> int:
        self.proc.start()
        assert self.proc.pid is not None
        return self.proc.pid

    @property
    def delivered(self) -> int:
        return int(self.shared[0])

    @property
    def delivered_digests(self) -> int:
        return int(self.shared[2])

    def ends(self) -> dict[int, int]:
        return {p: int(v) for p, v in enumerate(self.shared[_ENDS:]) if v}

    def finished(self) -> bool:
        if self.result is None:
            try:
                self.result = self.done.get_nowait()
            except queue.Empty:
                if not self.proc.is_alive():
                    self.result = {"error": f"replay process exited {self.proc.exitcode}", "records": 0,
                                   "delivered_records": self.delivered}
        return self.result is not None

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
        self.proc.join(10)


def _http_json(url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - 127.0.0.1 only
            doc = json.loads(r.read())
            return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


class Monitor:
    """Samples the running stack once a second: counters, committed offsets, CPU, verdicts."""

    def __init__(self, stack: Stack, kafka: Any, job: str, truth: Mapping[str, Any], broker: str,
                 edge_digests: bool = False) -> None:
        from confluent_kafka import Consumer

        from eroica.kafka.client import consumer_conf
        from eroica.stack.query import EndpointTarget, stack_token

        self.stack, self.kafka, self.job, self.truth, self.broker = stack, kafka, job, truth, broker
        self.edge = edge_digests  # digest mode: the replay feeds the digests topic, the summariser reads nothing
        self.consumers = {role: Consumer(consumer_conf(kafka, "bench-live", f"eroica-{role}"))
                          for role in ("summariser", "detector")}
        self.target = EndpointTarget(stack.state["query_endpoint"], 5.0, stack_token(stack.data_dir))
        self.stats: dict[str, dict[str, Any]] = {"summariser": {}, "detector": {}}
        self._by_name: dict[str, dict[str, Any]] = {}  # service -> its latest /eroica/stats
        self.first: dict[str, Any] | None = None
        self.verdicts: dict[str, Any] = {}
        self.replay: ReplayChild | None = None
        self.pids: dict[str, dict[int, float]] = {}  # stage -> pid -> its last CPU s (a restart adds a pid)
        self.fault = truth["faults"][0]
        self.rank_nodes = truth["layout"]["rank_nodes"]

    def close(self) -> None:
        for c in self.consumers.values():
            c.close()

    def _committed(self, role: str, topic: str) -> dict[int, int] | None:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            tps = self.consumers[role].committed([TopicPartition(topic, p) for p in range(self.kafka.partitions)],
                                                 timeout=2)
        except KafkaException:
            return None
        return {tp.partition: max(tp.offset, 0) for tp in tps}

    def _digests_end(self) -> dict[int, int] | None:
        """The digests topic's end offsets (Apache Kafka only: tansu misreports them); in digest mode the
        offsets the broker acknowledged to the replay, the topic's one producer (on both brokers)."""
        from confluent_kafka import KafkaException, TopicPartition

        if self.edge and self.replay is not None:
            return self.replay.ends()
        if self.broker == "tansu":
            return None
        out = {}
        try:
            for p in range(self.kafka.partitions):
                _lo, hi = self.consumers["detector"].get_watermark_offsets(
                    TopicPartition(self.kafka.digests_topic, p), timeout=2, cached=False)
                out[p] = hi
        except KafkaException:
            return None
        return out

    def _worker_stats(self) -> None:
        """Each role's counters, summed over its processes (``summariser``, ``summariser-2``, ...)."""
        by_name = self._by_name
        for name, svc in (self.stack.state.get("services") or {}).items():
            if service_role(name) in self.stats and svc.get("health_url"):
                doc = _http_json(svc["health_url"])
                if doc is not None:
                    by_name[name] = doc  # one that does not answer this time keeps its last counters
        for role in self.stats:
            docs = [d for n, d in by_name.items() if service_role(n) == role]
            self.stats[role] = {k: sum(int(d.get(k) or 0) for d in docs) for k in COUNTERS}

    def poll_verdicts(self) -> None:
        """Read the job's verdicts from ClickHouse; keep when the fault's first one was first seen."""
        from eroica.bench.scoring import ALARM_CONFIDENCE, matches

        try:
            got = self.target.verdicts(job=self.job, limit=100_000)
        except Exception:  # noqa: BLE001 - the sink may be busy; the next poll tries again
            return
        now = time.time_ns()
        for v in got:
            self.verdicts.setdefault(v.verdict_id, v)
        if self.first is None:
            hits = [v for v in got if v.confidence >= ALARM_CONFIDENCE and matches(v, self.fault, self.rank_nodes)]
            if hits:
                v = min(hits, key=lambda x: (x.detected_at_ns, x.window_start_ns))
                self.first = {"window_start_ns": v.window_start_ns, "detected_at_ns": v.detected_at_ns, "seen_ns": now,
                              "verdict_id": v.verdict_id}

    def sample(self, t: float) -> Sample:
        self._worker_stats()
        s, d = self.stats["summariser"], self.stats["detector"]
        raw_lag = digests_lag = None
        if self.replay is not None and not self.edge:
            committed = self._committed("summariser", self.kafka.raw_topic)
            if committed is not None:
                raw_lag = sum(max(0, e - committed.get(p, 0)) for p, e in self.replay.ends().items())
        ends = self._digests_end()
        if ends is not None:
            committed = self._committed("detector", self.kafka.digests_topic)
            if committed is not None:
                digests_lag = sum(max(0, e - committed.get(p, 0)) for p, e in ends.items())
        roots = self.stack.roots()
        if self.replay is not None and self.replay.proc.pid:
            roots["edge" if self.edge else "replay"] = self.replay.proc.pid
        roots["monitor"] = os.getpid()
        usage = stage_cpu(proc_table(), roots)
        for stage, (cpu, _rss) in usage.items():
            self.pids.setdefault(stage, {})[roots[stage]] = cpu
        cpu_total = {stage: sum(by_pid.values()) for stage, by_pid in self.pids.items()}
        return Sample(
            t=round(t, 2), published=self.replay.delivered if self.replay else 0,
            summarised=int(s.get("records", 0)), late=int(s.get("late_records", 0)),
            corrupt=int(s.get("corrupt", 0)) + int(d.get("corrupt", 0)),
            digests_sent=self._digests_sent(s), digests_read=int(d.get("digests", 0)),
            windows=int(d.get("windows", 0)), pending_windows=int(d.get("pending_windows", 0)),
            held=int(s.get("held_messages", 0)) + int(d.get("held_messages", 0)),
            raw_lag=raw_lag, digests_lag=digests_lag,
            cpu=cpu_total, rss_mb={k: v[1] / 2**20 for k, v in usage.items()},
            load1=_load1(), replay_done=bool(self.replay and self.replay.finished()),
            late_digests=int(d.get("late_windows", 0)) if self.edge else None)

    def _digests_sent(self, summariser: Mapping[str, Any]) -> int:
        """Window digests on their way to the detector: the summariser's, or in digest mode the replay's
        that the broker acknowledged."""
        if self.edge:
            return self.replay.delivered_digests if self.replay else 0
        return int(summariser.get("digests", 0))

    def deadletters(self) -> int:
        """The count of all dead letters on the topic, read from its start (tansu's end offsets are wrong)."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from eroica.kafka.client import consumer_conf

        c = Consumer(consumer_conf(self.kafka, "bench-live", f"bench-live-dlq-{os.getpid()}"))
        try:
            c.assign([TopicPartition(self.kafka.deadletter_topic, p, OFFSET_BEGINNING)
                      for p in range(self.kafka.partitions)])
            n, quiet_until = 0, time.monotonic() + 3.0
            while time.monotonic() < quiet_until:
                m = c.poll(0.2)
                if m is not None and m.error() is None:
                    n += 1
                    quiet_until = time.monotonic() + 3.0
            return n
        finally:
            c.close()


def drained(s: Sample, replay_ok: bool, edge_digests: bool = False) -> bool:
    """Everything published was read and summarised, every digest analysed, nothing held back, and the
    consumer groups committed it all (where the end offsets are known). Digest mode (``edge_digests``):
    no record is summarised; every digest the replay delivered was read."""
    return (s.replay_done and replay_ok and s.published > 0 and (edge_digests or s.summarised >= s.published)
            and s.digests_read >= s.digests_sent and s.pending_windows == 0 and s.held == 0
            and not s.raw_lag and not s.digests_lag)


def simulate(cfg: LiveConfig, window_s: float, path: Path) -> tuple[dict[str, Any], int, int]:
    """Write the run; returns its truth, the steps and the fault's start step.

    Event time starts on an epoch window boundary near now, so ``fault_at``
    says where in its window the fault begins (3.5: half-way through the 4th).
    """
    from eroica.producers.simulator import SimConfig, truth, write_jsonl

    nodes, gpus = cfg.layout
    w_ns = int(window_s * 1e9)
    start_ns = time.time_ns() // w_ns * w_ns
    base = dict(nodes=nodes, gpus=gpus, seed=cfg.seed, job=f"live-{cfg.ranks}", start_ns=start_ns,
                profile=cfg.profile)
    probe = truth(SimConfig(steps=12, **base))  # type: ignore[arg-type]
    step_s = (probe["step_start_ns"][-1] - probe["step_start_ns"][1]) / 1e9 / (len(probe["step_start_ns"]) - 2)
    steps = cfg.steps or max(4, math.ceil(cfg.windows * window_s / step_s))
    start = max(1, min(steps - 2, round(cfg.fault_at * window_s / step_s)))
    spec = f"{cfg.fault_spec()},start={start}"
    t = write_jsonl(SimConfig(steps=steps, faults=[spec], **base), path, truth_path=False)  # type: ignore[arg-type]
    return dict(t), steps, start


def run(cfg: LiveConfig) -> dict[str, Any]:
    """Simulate, start the stack, replay in real time while sampling, drain, stop; the result document."""
    from eroica.bench.scoring import score_run
    from eroica.kafka.config import KafkaConfig

    window_s = cfg.window(os.environ)
    w_ns = int(window_s * 1e9)
    env = clean_env({**cfg.env, "EROICA_WINDOW_S": f"{window_s:g}"})
    tmp = None if cfg.work_dir else tempfile.mkdtemp(prefix="eroica-live-")
    work = Path(cfg.work_dir or tmp)  # type: ignore[arg-type]
    work.mkdir(parents=True, exist_ok=True)
    path = work / "run.jsonl"
    load_start = loadavg()
    try:
        cfg.progress(f"simulating {cfg.ranks} ranks")
        t_sim = time.monotonic()
        truth, steps, fault_step = simulate(cfg, window_s, path)
        sim_s = time.monotonic() - t_sim
        seconds = (truth["end_ns"] - truth["start_ns"]) / 1e9
        records = int(truth["records"])
        input_ = {"records": records, "bytes": path.stat().st_size, "seconds": round(seconds, 1),
                  "records_per_s": round(records / seconds, 1), "step_s": round(seconds / steps, 3),
                  "simulate_s": round(sim_s, 1)}
        onset_ns = int(truth["step_start_ns"][fault_step])
        nodes, gpus = cfg.layout
        conf = {"ranks": cfg.ranks, "nodes": nodes, "gpus": gpus, "steps": steps, "seed": cfg.seed,
                "profile": cfg.profile, "broker": cfg.broker, "summarisers": cfg.summarisers,
                "edge_digests": cfg.edge_digests, "frame_s": cfg.frame_s, "window_s": window_s,
                "fault": cfg.fault_spec(),
                "fault_step": fault_step, "fault_window": (onset_ns - truth["start_ns"]) // w_ns,
                "job": truth["job"], "cpus": os.cpu_count(),
                "settings": {k: v for k, v in sorted(env.items()) if k.startswith(SETTING_PREFIXES)}}
        cfg.progress(f"{records:,} records ({records / seconds:,.0f}/s over {seconds:.0f} s); starting eroica up "
                     f"({cfg.broker})")
        stack = Stack(work / "stack", cfg.broker, env, work / "up.log", cfg.summarisers)
        try:
            stack.start(cfg.ready_timeout_s)
            return _measure(cfg, stack, env, path, truth, conf, input_, onset_ns, w_ns, window_s, load_start,
                            score_run, KafkaConfig.from_env(env, bootstrap=stack.state["kafka"]["bootstrap"]))
        finally:
            stack.stop()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        elif path.exists():
            path.unlink()  # the input can be tens of GB; the logs stay


def _measure(cfg: LiveConfig, stack: Stack, env: Mapping[str, str], path: Path, truth: dict[str, Any],
             conf: dict[str, Any], input_: dict[str, Any], onset_ns: int, w_ns: int, window_s: float, load_start: str,
             score_run: Callable[..., Any], kafka: Any) -> dict[str, Any]:
    """The replay and the sampling loop on a started stack (split from :func:`run` for its length)."""
    monitor = Monitor(stack, kafka, truth["job"], truth, cfg.broker, cfg.edge_digests)
    samples: list[Sample] = []
    child: ReplayChild | None = None
    try:
        idle0 = monitor.sample(-cfg.idle_s)
        time.sleep(cfg.idle_s)
        idle1 = monitor.sample(0.0)
        # the first record is released ~2 s from now (the child needs to start and import)
        offset_ns = time.time_ns() + 2_000_000_000 - int(truth["start_ns"])
        child = ReplayChild(path, {**env, "EROICA_KAFKA_BOOTSTRAP": kafka.bootstrap}, offset_ns, kafka.partitions,
                            declare=cfg.declared_watermarks, edge_digests=cfg.edge_digests,
                            batch_records=digest_batch_records(input_["records_per_s"]) if cfg.edge_digests
                            else DEFAULT_BATCH, frame_s=cfg.frame_s)
        child.start()
        monitor.replay = child
        t0 = time.monotonic()
        samples.append(monitor.sample(0.0))
        end_at: float | None = None
        drained_after: float | None = None
        next_t = t0
        while True:
            next_t += cfg.sample_s
            time.sleep(max(0.0, next_t - time.monotonic()))
            monitor.poll_verdicts()
            s = monitor.sample(time.monotonic() - t0)
            samples.append(s)
            if end_at is None and s.replay_done:
                end_at = s.t
                cfg.progress(f"replay done at {s.t:.0f} s: {child.result}")
            if int(s.t) % 30 == 0:
                flow = "" if cfg.edge_digests else f"summarised {s.summarised:,} lag {s.lag_records:,} "
                cfg.progress(f"t={s.t:.0f}s published {s.published:,} {flow}digests {s.digests_read}/{s.digests_sent} "
                             f"windows {s.windows} load {s.load1}")
            if stack.failed():
                cfg.progress(f"stopping early: {', '.join(stack.failed())} failed (restart budget spent)")
                break
            if end_at is not None:
                ok = not (child.result or {}).get("error")
                done = drained(s, ok, cfg.edge_digests)
                if done and monitor.first is not None:
                    drained_after = round(s.t - end_at, 1)
                    break
                if done and s.t - end_at > 10:  # drained, but no verdict: give up soon
                    drained_after = round(s.t - end_at, 1)
                    break
                if s.t - end_at > cfg.drain_s:
                    break
                if s.t - end_at > 20 and int(s.t) % 5 == 0 and stack.crash_reasons():
                    cfg.progress("stopping the drain: a worker crashed (its held messages never drain)")
                    break
        monitor.poll_verdicts()
        dead = monitor.deadletters()
        replay_doc = dict(child.result or {"records": input_["records"] - 1, "unfinished": True,
                                            "delivered_records": child.delivered,
                                            **({"delivered_digests": child.delivered_digests} if cfg.edge_digests
                                               else {})})
        replay_doc["restarts"] = stack.restarts()
        replay_doc["failed"] = stack.failed()
        replay_doc["crashes"] = stack.crash_reasons()
        score = score_run(list(monitor.verdicts.values()), truth)
        score_doc = {"alarms": score.alarms, "localised": all(f.ok for f in score.faults),
                     "found": "; ".join(f.found for f in score.faults), "victims_blamed": score.victims_blamed,
                     "false_alarms": score.false_alarms, "verdicts": len(monitor.verdicts),
                     "first_verdict_id": (monitor.first or {}).get("verdict_id")}
        load = {"start": load_start, "end": loadavg(), "max1": max((s.load1 for s in samples), default=None)}
        timing = verdict_timing(onset_ns, w_ns, offset_ns, monitor.first)
        return summarise(samples, cfg=conf, input_=input_, replay=replay_doc, deadletters=dead,
                         drained_after_s=drained_after, timing=timing, score=score_doc, idle=(idle0, idle1),
                         load=load)
    finally:
        if child is not None:
            child.stop()
        monitor.close()


def run_ladder(base: LiveConfig, ranks: Sequence[int], steps_for: Callable[[int], int | None],
               report: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Runs of growing size until the first that falls behind (each is reported as it ends)."""
    out = []
    for n in ranks:
        cfg = LiveConfig(**{**base.__dict__, "ranks": n, "steps": steps_for(n)})
        r = run(cfg)
        report(r)
        out.append(r)
        if not r["keeps_up"]:
            break
    return out
