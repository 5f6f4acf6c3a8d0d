"""Host counters from ``/proc``: CPU utilisation, iowait and steal, load, memory.

``/proc/stat``'s first line holds cumulative jiffies per CPU state (user nice
system idle iowait irq softirq steal guest guest_nice); the percentages are
shares of the increase between two samples, so the first sample has none.
Guest time is already counted in user/nice and is not added again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative jiffies of the aggregate ``cpu`` line."""

    user: int = 0
    nice: int = 0
    system: int = 0
    idle: int = 0
    iowait: int = 0
    irq: int = 0
    softirq: int = 0
    steal: int = 0

    @property
    def total(self) -> int:
        return self.user + self.nice + self.system + self.idle + self.iowait + self.irq + self.softirq + self.steal


def _read(root: str | Path, rel: str) -> str | None:
    try:
        return (Path(root) / rel).read_text()
    except OSError:
        return None


def read_cpu_times(root: str | Path = "/") -> CpuTimes | None:
    """The aggregate line of ``<root>/proc/stat``; None when absent or malformed."""
    text = _read(root, "proc/stat")
    if not text:
        return None
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            try:
                vals = [int(v) for v in parts[1:9]]
            except ValueError:
                return None
            vals += [0] * (8 - len(vals))  # old kernels lack steal/iowait columns
            return CpuTimes(*vals)
    return None


def cpu_percentages(prev: CpuTimes, cur: CpuTimes) -> dict[str, float]:
    """cpu_util_pct, iowait_pct and steal_pct over the interval between two readings."""
    total = cur.total - prev.total
    if total <= 0:
        return {}
    idle = (cur.idle - prev.idle) + (cur.iowait - prev.iowait)
    return {
        "cpu_util_pct": round(max(0.0, min(100.0, 100.0 * (total - idle) / total)), 2),
        "iowait_pct": round(max(0.0, 100.0 * (cur.iowait - prev.iowait) / total), 2),
        "steal_pct": round(max(0.0, 100.0 * (cur.steal - prev.steal) / total), 2),
    }


def read_load1(root: str | Path = "/") -> float | None:
    text = _read(root, "proc/loadavg")
    try:
        return float(text.split()[0]) if text else None
    except (ValueError, IndexError):
        return None


def read_mem_used_pct(root: str | Path = "/") -> float | None:
    """Used memory as a share of MemTotal, where used = MemTotal - MemAvailable."""
    text = _read(root, "proc/meminfo")
    if not text:
        return None
    info: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields:
            try:
                info[name.strip()] = int(fields[0])
            except ValueError:
                pass
    total = info.get("MemTotal")
    avail = info.get("MemAvailable")
    if avail is None and total is not None:  # kernels before 3.14
        avail = info.get("MemFree", 0) + info.get("Buffers", 0) + info.get("Cached", 0)
    if not total or avail is None:
        return None
    return round(100.0 * (total - avail) / total, 2)


class HostSampler:
    """Host fields of the contract's ``host`` record, one sample per call."""

    def __init__(self, root: str | Path = "/") -> None:
        self.root = root
        self._prev: CpuTimes | None = None

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        cur = read_cpu_times(self.root)
        if cur is not None:
            if self._prev is not None:
                out.update(cpu_percentages(self._prev, cur))
            self._prev = cur
        load = read_load1(self.root)
        if load is not None:
            out["load1"] = load
        mem = read_mem_used_pct(self.root)
        if mem is not None:
            out["mem_used_pct"] = mem
        return out
