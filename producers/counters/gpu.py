"""GPU counters through NVML (``pynvml``, from the ``nvidia-ml-py`` package).

Every field of the contract's ``gpu`` record that NVML provides:

===================================  ====================================================
contract field                       NVML
===================================  ====================================================
sm_util_pct, mem_util_pct            nvmlDeviceGetUtilizationRates (.gpu, .memory)
sm_clock_mhz, max_sm_clock_mhz       nvmlDeviceGetClockInfo / GetMaxClockInfo (SM)
power_w, power_limit_w               nvmlDeviceGetPowerUsage / GetEnforcedPowerLimit (mW)
temp_c                               nvmlDeviceGetTemperature (GPU sensor)
throttle_reasons                     nvmlDeviceGetCurrentClocksEventReasons (older
                                     drivers: ...ClocksThrottleReasons)
pcie_gen, max_pcie_gen               nvmlDeviceGetCurrPcieLinkGeneration / GetMaxPcieLinkGeneration
pcie_width, max_pcie_width           nvmlDeviceGetCurrPcieLinkWidth / GetMaxPcieLinkWidth
pcie_tx_Bps, pcie_rx_Bps             nvmlDeviceGetPcieThroughput (KB/s over 20 ms),
                                     every PCIE_THROUGHPUT_EVERY_S only (below)
nvlink_tx_Bps, nvlink_rx_Bps         rate of the NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX
                                     field values (cumulative KiB, all links)
ecc_uncorrected                      nvmlDeviceGetTotalEccErrors (uncorrected, volatile)
xid                                  last XID from an NVML event set (0 = none yet)
mem_used_bytes, mem_total_bytes      nvmlDeviceGetMemoryInfo
===================================  ====================================================

A query the device does not support (NVML_ERROR_NOT_SUPPORTED) is left out
of the record and not asked again. Without a driver (or without pynvml) the
sampler says once on stderr "no NVIDIA GPU: GPU counters off" and samples
nothing; everything else keeps working.

The NVML module is injectable (``nvml=``) so that the whole path runs in
tests against a stand-in object.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

NO_GPU_MESSAGE = "no NVIDIA GPU: GPU counters off"
_UINT_MAX = 0xFFFFFFFF
_said_no_gpu = False


def say_no_gpu(detail: str = "") -> None:
    """The one stderr line of a node without NVIDIA GPUs (once per process)."""
    global _said_no_gpu
    if not _said_no_gpu:
        _said_no_gpu = True
        print(f"eroica: {NO_GPU_MESSAGE}" + (f" ({detail})" if detail else ""), file=sys.stderr, flush=True)


def _load_pynvml() -> Any | None:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    return pynvml


def ranks_from_processes(nvml: Any, handles: list, proc_root: str | Path = "/proc",
                         pid_rank: Callable[[int], int | None] | None = None) -> dict[int, int]:
    """GPU index -> global rank of the process using each GPU.

    A process's rank comes from ``pid_rank`` (``eroica trace`` knows each
    traced pid's rank), else from the ``RANK`` variable torchrun sets in its
    environment. A GPU with no process, with several ranks, or whose
    processes we may not read (another user, another PID namespace) stays
    unmapped.
    """
    out: dict[int, int] = {}
    for index, h in enumerate(handles):
        ranks = set()
        try:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
        except Exception:
            continue
        for p in procs:
            rank = pid_rank(int(p.pid)) if pid_rank is not None else None
            if rank is None:
                rank = rank_of_pid(int(p.pid), proc_root)
            if rank is not None:
                ranks.add(rank)
        if len(ranks) == 1:
            out[index] = ranks.pop()
    return out


def rank_of_pid(pid: int, proc_root: str | Path = "/proc") -> int | None:
    """``RANK`` from ``<proc_root>/<pid>/environ``, None when unreadable or unset."""
    try:
        env = (Path(proc_root) / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    for item in env.split(b"\0"):
        if item.startswith(b"RANK="):
            try:
                return int(item[5:])
            except ValueError:
                return None
    return None


# nvmlDeviceGetPcieThroughput blocks for its 20 ms measuring window: 20.5 ms a call on an H100 (driver
# 580, `tools/gpu_overhead.py --micro`), against 2-80 us for every other query, so tx + rx took 41 of
# the 43 ms of one GPU's sample, and on an 8-GPU node 330 ms of a 500 ms interval. The value is a
# 20 ms snapshot (4% of a 500 ms interval), not a counter, so a slower cadence loses little: every
# 5 s still gives a 30 s window six snapshots, at 40 ms per GPU per 5 s (0.8% of a core).
PCIE_THROUGHPUT_EVERY_S = 5.0


class GpuSampler:
    """One dict of contract ``gpu`` fields per GPU per call of :meth:`sample`.

    ``rank_of(gpu_index) -> rank`` names the global rank that uses each GPU;
    by default: the ``RANK`` of the process NVML sees on it, else
    ``rank_base + gpu_index`` (torchrun's one rank per GPU, in order).
    """

    def __init__(self, nvml: Any | None = None, *, rank_base: int = 0,
                 rank_of: Callable[[int], int | None] | None = None, proc_root: str | Path = "/proc",
                 pid_rank: Callable[[int], int | None] | None = None, quiet: bool = False,
                 pcie_every_s: float = PCIE_THROUGHPUT_EVERY_S) -> None:
        self.nvml = nvml if nvml is not None else _load_pynvml()
        self.pcie_every_ns = int(pcie_every_s * 1e9)
        self._pcie_at: dict[int, int] = {}
        # the board's maximum SM clock does not change while it runs: asked once (1.9 ms a call on an H100)
        self._max_clock: dict[int, float] = {}
        self.rank_base = rank_base
        self.rank_of = rank_of
        self.proc_root = proc_root
        self.pid_rank = pid_rank
        self.handles: list = []
        self.uuids: list[str] = []
        self._unsupported: set[tuple[int, str]] = set()
        self._nvlink_prev: dict[int, tuple[int, int | None, int | None]] = {}
        self._events = None
        self._last_xid: dict[int, int] = {}
        self._process_ranks: dict[int, int] = {}
        self._ranks_at = float("-inf")
        self.available = False
        self.reason = ""
        self._init(quiet)

    # -- set-up ---------------------------------------------------------------

    def _init(self, quiet: bool) -> None:
        nv = self.nvml
        if nv is None:
            self.reason = "pynvml not installed"
        else:
            try:
                nv.nvmlInit()
                count = int(nv.nvmlDeviceGetCount())
                self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
                self.uuids = [self._text(self._try(-1, "uuid", "nvmlDeviceGetUUID", h)) for h in self.handles]
                self.available = count > 0
                if not count:
                    self.reason = "NVML sees no device"
            except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                self.reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if not self.available:
            if not quiet:
                say_no_gpu(self.reason)
            return
        self._setup_xid_events()

    def _setup_xid_events(self) -> None:
        nv = self.nvml
        try:
            events = nv.nvmlEventSetCreate()
            for h in self.handles:
                try:
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events)
                except Exception:
                    pass
            self._events = events
        except Exception:
            self._events = None

    @staticmethod
    def _text(v: Any) -> str:
        if isinstance(v, bytes):
            return v.decode(errors="replace")
        return "" if v is None else str(v)

    def _try(self, index: int, name: str, fn: str | Callable, *args: Any) -> Any:
        """``fn(*args)``, or None when NVML fails; NOT_SUPPORTED is remembered and not asked again."""
        key = (index, name)
        if key in self._unsupported:
            return None
        try:
            if isinstance(fn, str):
                fn = getattr(self.nvml, fn)
            return fn(*args)
        except Exception as exc:
            code = getattr(exc, "value", None)
            if code == getattr(self.nvml, "NVML_ERROR_NOT_SUPPORTED", 3) or not isinstance(code, int) \
                    or isinstance(exc, (AttributeError, TypeError)):
                self._unsupported.add(key)
            return None

    # -- sampling -------------------------------------------------------------

    RANK_REFRESH_S = 10.0

    def rank_for(self, index: int) -> int:
        if self.rank_of is not None:
            r = self.rank_of(index)
            if r is not None:
                return r
        now = time.monotonic()
        if index not in self._process_ranks and now - self._ranks_at >= self.RANK_REFRESH_S:
            self._ranks_at = now
            self._process_ranks.update(ranks_from_processes(self.nvml, self.handles, self.proc_root, self.pid_rank))
        return self._process_ranks.get(index, self.rank_base + index)

    def refresh_ranks(self) -> None:
        """Forget the process -> rank mapping (ranks restart, move between GPUs)."""
        self._process_ranks = {}
        self._ranks_at = float("-inf")

    def sample(self, ts_ns: int) -> list[dict]:
        if not self.available:
            return []
        self._drain_xid_events()
        return [self._sample_one(i, h, ts_ns) for i, h in enumerate(self.handles)]

    def _sample_one(self, i: int, h: Any, ts_ns: int) -> dict:
        nv = self.nvml
        f: dict = {"gpu": i, "rank": self.rank_for(i)}
        util = self._try(i, "util", "nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            f["sm_util_pct"] = float(util.gpu)
            f["mem_util_pct"] = float(util.memory)
        clock = self._try(i, "sm_clock", "nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1))
        if clock is not None:
            f["sm_clock_mhz"] = float(clock)
        max_clock = self._max_clock.get(i)
        if max_clock is None:
            got = self._try(i, "max_sm_clock", "nvmlDeviceGetMaxClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1))
            if got is not None:
                max_clock = self._max_clock[i] = float(got)
        if max_clock is not None:
            f["max_sm_clock_mhz"] = max_clock
        power = self._try(i, "power", "nvmlDeviceGetPowerUsage", h)
        if power is not None:
            f["power_w"] = power / 1000.0
        limit = self._try(i, "power_limit", "nvmlDeviceGetEnforcedPowerLimit", h)
        if limit is not None:
            f["power_limit_w"] = limit / 1000.0
        temp = self._try(i, "temp", "nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        if temp is not None:
            f["temp_c"] = float(temp)
        reasons_fn = "nvmlDeviceGetCurrentClocksEventReasons"
        if not hasattr(nv, reasons_fn):
            reasons_fn = "nvmlDeviceGetCurrentClocksThrottleReasons"  # drivers / pynvml before 535
        reasons = self._try(i, "throttle", reasons_fn, h)
        if reasons is not None:
            f["throttle_reasons"] = int(reasons)
        for field, fn_name in (("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                               ("max_pcie_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
                               ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
                               ("max_pcie_width", "nvmlDeviceGetMaxPcieLinkWidth")):
            v = self._try(i, field, fn_name, h)
            if v is not None:
                f[field] = int(v)
        last = self._pcie_at.get(i)
        if last is None or ts_ns - last >= self.pcie_every_ns or ts_ns < last:
            self._pcie_at[i] = ts_ns
            for field, counter in (("pcie_tx_Bps", getattr(nv, "NVML_PCIE_UTIL_TX_BYTES", 0)),
                                   ("pcie_rx_Bps", getattr(nv, "NVML_PCIE_UTIL_RX_BYTES", 1))):
                v = self._try(i, field, "nvmlDeviceGetPcieThroughput", h, counter)
                if v is not None:
                    f[field] = float(v) * 1024.0  # KB/s
        f.update(self._nvlink(i, h, ts_ns))
        ecc = self._try(i, "ecc", "nvmlDeviceGetTotalEccErrors", h, getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                        getattr(nv, "NVML_VOLATILE_ECC", 0))
        if ecc is not None:
            f["ecc_uncorrected"] = int(ecc)
        if self._events is not None:
            f["xid"] = self._last_xid.get(i, 0)
        mem = self._try(i, "mem", "nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            f["mem_used_bytes"] = int(mem.used)
            f["mem_total_bytes"] = int(mem.total)
        return f

    def _nvlink(self, i: int, h: Any, ts_ns: int) -> dict:
        nv = self.nvml
        ids = [(getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138), _UINT_MAX),
               (getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139), _UINT_MAX)]
        values = self._try(i, "nvlink", "nvmlDeviceGetFieldValues", h, ids)
        if values is None:
            return {}
        cur = []
        for v in values:
            if getattr(v, "nvmlReturn", 0) != 0:
                cur.append(None)
            else:
                cur.append(int(v.value.ullVal))
        if all(c is None for c in cur):
            self._unsupported.add((i, "nvlink"))
            return {}
        out: dict = {}
        prev = self._nvlink_prev.get(i)
        self._nvlink_prev[i] = (ts_ns, cur[0], cur[1])
        if prev is not None and ts_ns > prev[0]:
            dt = (ts_ns - prev[0]) / 1e9
            for field, a, b in (("nvlink_tx_Bps", prev[1], cur[0]), ("nvlink_rx_Bps", prev[2], cur[1])):
                if a is not None and b is not None and b >= a:
                    out[field] = (b - a) * 1024.0 / dt  # KiB
        return out

    def _drain_xid_events(self) -> None:
        if self._events is None:
            return
        nv = self.nvml
        for _ in range(64):  # bounded: never spin on a flood of events
            try:
                ev = nv.nvmlEventSetWait_v2(self._events, 0)
            except Exception:
                return  # NVML_ERROR_TIMEOUT: nothing pending
            try:
                index = self.handles.index(ev.device) if ev.device in self.handles else None
            except Exception:
                index = None
            if index is None:
                uuid = self._text(self._try(-1, "uuid", "nvmlDeviceGetUUID", ev.device))
                index = self.uuids.index(uuid) if uuid in self.uuids else None
            if index is not None and ev.eventType & nv.nvmlEventTypeXidCriticalError:
                self._last_xid[index] = int(ev.eventData)

    def close(self) -> None:
        if self.available:
            try:
                if self._events is not None:
                    self.nvml.nvmlEventSetFree(self._events)
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self.available = False


def env_rank_base(gpu_count: int, env: dict | None = None) -> int:
    """First global rank of this node under torchrun's layout: node rank x GPUs per node."""
    env = os.environ if env is None else env
    for name in ("GROUP_RANK", "NODE_RANK", "SLURM_NODEID"):
        v = env.get(name)
        if v and v.isdigit():
            per_node = int(env.get("LOCAL_WORLD_SIZE", gpu_count) or gpu_count)
            return int(v) * per_node
    return 0
