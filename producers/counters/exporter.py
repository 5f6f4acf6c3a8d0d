"""Counters from exporters an operator already runs: NVIDIA DCGM exporter and Prometheus node_exporter.

Design: the bridge is one more *source* of samples for the same agent loop.
:class:`ExporterNodeSampler` is a :class:`~.sampler.NodeSampler` whose GPU,
NIC and host sources read a scrape instead of NVML, sysfs and ``/proc``:

- :class:`DcgmGpuSampler` stands in for :class:`~.gpu.GpuSampler` (same
  ``sample(ts_ns) -> list[dict]`` of contract fields, same rank rule:
  ``rank_of(gpu)`` else ``rank_base + gpu``);
- :class:`NodeExporterNicSampler` *is* a :class:`~.nic.NicSampler` whose
  ``read()`` builds the same :class:`~.nic.PortReading` values from the scrape,
  so rates, counter resets (a counter that went down gives no rate for that
  interval) and the first-sample rule (no rate before two readings) are the
  agent's own code;
- :class:`NodeExporterHostSampler` *is* a :class:`~.host.HostSampler`: the CPU
  percentages go through :func:`~.host.cpu_percentages` on
  :class:`~.host.CpuTimes` summed from ``node_cpu_seconds_total``.

Records are then built, cleaned and published exactly as the agent's own
(``NodeSampler._build``, :class:`eroica.producers.agent.NodeAgent`, any sink).
Each exporter replaces only what it covers: ``--from-exporter dcgm=URL`` alone
keeps NIC and host counters from this node's sysfs and ``/proc``;
``--from-exporter node=URL`` alone keeps GPU counters from NVML.
Both exporters are scraped once per tick, before the records are built, with
the tick's own time (so tests can drive it with an injected clock). An
exporter that does not answer gives no GPU or NIC records for that tick, and
a host record with no counter field, as the agent does when ``/proc`` cannot
be read (the failure is counted and logged on the 1st and every 100th time);
it never stops the other exporter.

The exposition text is parsed by ``prometheus_client``'s parser (already a core
dependency). Series are looked up by *sample* name, so a counter's ``_total``
is part of the name as the exporter writes it.

DCGM exporter (labels ``gpu`` = index on the node, ``UUID``, ``device``,
``modelName``, ``Hostname``; in MIG mode per-instance series carry
``GPU_I_ID`` and are skipped: the contract's record is one whole GPU):

===================  ==================================================================
contract field       DCGM exporter series (units)
===================  ==================================================================
sm_util_pct          DCGM_FI_DEV_GPU_UTIL (%)
mem_util_pct         DCGM_FI_DEV_MEM_COPY_UTIL (%; NVML's utilization.memory)
sm_clock_mhz         DCGM_FI_DEV_SM_CLOCK (MHz)
max_sm_clock_mhz     DCGM_FI_DEV_MAX_SM_CLOCK (MHz)
power_w              DCGM_FI_DEV_POWER_USAGE (W)
power_limit_w        DCGM_FI_DEV_ENFORCED_POWER_LIMIT, else DCGM_FI_DEV_POWER_MGMT_LIMIT (W)
temp_c               DCGM_FI_DEV_GPU_TEMP (C)
throttle_reasons     DCGM_FI_DEV_CLOCKS_EVENT_REASONS (older name
                     DCGM_FI_DEV_CLOCK_THROTTLE_REASONS); NVML's bitmask, same bits
pcie_gen, pcie_width DCGM_FI_DEV_PCIE_LINK_GEN / _LINK_WIDTH, max_*: _PCIE_MAX_LINK_GEN / _WIDTH
pcie_tx/rx_Bps       DCGM_FI_PROF_PCIE_TX_BYTES / _RX_BYTES (bytes/s gauges)
nvlink_tx/rx_Bps     DCGM_FI_PROF_NVLINK_TX_BYTES / _RX_BYTES (bytes/s gauges)
ecc_uncorrected      DCGM_FI_DEV_ECC_DBE_VOL_TOTAL (cumulative, as NVML's volatile uncorrected)
xid                  DCGM_FI_DEV_XID_ERRORS (last XID, 0 = none)
mem_used_bytes       DCGM_FI_DEV_FB_USED (MiB)
mem_total_bytes      DCGM_FI_DEV_FB_TOTAL, else FB_USED + FB_FREE (+ FB_RESERVED) (MiB)
===================  ==================================================================

What DCGM's *default* counter set (dcgm-exporter ``etc/default-counters.csv``)
cannot fill, and why: ``max_sm_clock_mhz``, ``power_limit_w``,
``throttle_reasons``, ``pcie_gen``/``pcie_width`` and their maxima,
``ecc_uncorrected`` are not in it (ECC is there, commented out);
``pcie_tx_Bps``/``pcie_rx_Bps`` and ``nvlink_tx_Bps``/``nvlink_rx_Bps`` are
profiling (DCP) fields, on only in ``dcp-metrics-included.csv`` (PCIe) or a
custom file (NVLink). Add their lines to the exporter's counters CSV
(``-f``) to get them. Mapped on purpose to nothing:
``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` (both directions summed, unit not
documented by the exporter: it cannot be split into the contract's tx and rx),
``DCGM_FI_DEV_PCIE_TX/RX_THROUGHPUT`` (deprecated; the exporter's CSV calls it a
KB counter, DCGM a KB/s throughput: the unit is not certain), the NVLink error
counters (``DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL``, ``..._CRC_DATA_...``,
``..._REPLAY_...``, ``..._RECOVERY_...``), the memory clock
(``DCGM_FI_DEV_MEM_CLOCK``) and ``DCGM_FI_PROF_*`` activity ratios: the
contract's ``gpu`` record has no field for them.

node_exporter (collectors ``infiniband``, ``netdev``, ``netclass``, ``cpu``,
``loadavg``, ``meminfo``):

===================  ==================================================================
contract field       node_exporter series
===================  ==================================================================
nic (IB port)        ``device`` + ``port`` labels of ``node_infiniband_*``
tx_Bps, rx_Bps       rate of node_infiniband_port_data_transmitted_bytes_total /
                     _received_bytes_total (already bytes: the exporter multiplies the
                     4-byte words); interfaces: node_network_transmit_bytes_total /
                     node_network_receive_bytes_total (label ``device``)
link_gbps            node_infiniband_rate_bytes_per_second x 8 / 1e9;
                     node_network_speed_bytes x 8 / 1e9 (netclass)
link_up              node_infiniband_state_id == 4 (ACTIVE); node_network_up
tx_discards          node_infiniband_port_discards_transmitted_total; node_network_transmit_drop_total
rx_errors            node_infiniband_port_errors_received_total; node_network_receive_errs_total
symbol_errors        node_infiniband_symbol_error_total
link_downed          node_infiniband_link_downed_total
xmit_wait            node_infiniband_port_transmit_wait_total
cpu_util_pct,        node_cpu_seconds_total summed over CPUs per mode, shares of the
iowait_pct,          increase between two scrapes (the agent's /proc/stat rule)
steal_pct
load1                node_load1
mem_used_pct         1 - node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes
===================  ==================================================================

``cnp_sent`` and ``retransmits`` stay absent: the agent reads them from the
port's ``hw_counters``, which node_exporter's infiniband collector (1.5) does
not export. The contract's ``host`` record has no pressure (PSI) field, so the
``pressure`` collector is not read. Loopback and virtual interfaces (by name,
:data:`VIRTUAL_NETDEV`; node_exporter does not say which interface has a
device) are skipped unless the node has no other, as the agent does; narrow
further with node_exporter's own ``--collector.netdev.device-exclude``.
"""

from __future__ import annotations

import logging
import math
import re
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .host import CpuTimes, HostSampler, cpu_percentages
from .nic import NicSampler, PortReading
from .sampler import NodeSampler

log = logging.getLogger(__name__)

# A scrape runs inside the agent's tick: an exporter answers in milliseconds, so one that has
# not answered in a second is stuck, and waiting longer would only push the next ticks back.
SCRAPE_TIMEOUT_S = 1.0
# Ask for the classic text format: both exporters would otherwise negotiate OpenMetrics or
# protobuf with a client that accepts them (the parser reads the 0.0.4 text format).
ACCEPT = "text/plain; version=0.0.4"
# IEC MiB: DCGM's framebuffer fields are in MiB ("Framebuffer memory used (in MiB)").
MIB = 1 << 20
# node_exporter reports link rates in bytes per second; the contract's link_gbps is Gbit/s.
BITS_PER_BYTE = 8
GBIT = 1e9
# IB port state ids (IBTA, node_infiniband_state_id): 4 is ACTIVE, the only state that moves data.
IB_STATE_ACTIVE = 4
# CPU seconds are kept as integer microseconds in CpuTimes (whose fields are ints): node_exporter
# writes seconds to 1/USER_HZ = 10 ms, which a microsecond holds exactly, and the percentages are
# ratios of differences, so the unit cancels out.
CPU_UNITS_PER_S = 1_000_000
# node_cpu_seconds_total's modes that /proc/stat's aggregate line holds (guest is inside user/nice).
CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# Interfaces that are never a node's physical NIC (node_exporter does not expose the sysfs
# `device` link the agent tests for): loopback, containers, bridges, tunnels, overlays.
VIRTUAL_NETDEV = re.compile(r"^(lo|docker\d*|veth.*|br-.*|virbr.*|cni.*|flannel.*|cali.*|tun.*|tap.*|vxlan.*"
                            r"|genev.*|kube-.*|tailscale.*|wg.*|dummy.*|bond.*\..*)$")

Labels = dict[str, str]
Series = dict[str, list[tuple[Labels, float]]]  # sample name -> [(labels, value)]
Fetch = Callable[[str, float], str]


def fetch_text(url: str, timeout_s: float) -> str:
    """GET ``url`` and return the body (exposition text)."""
    req = urllib.request.Request(url, headers={"Accept": ACCEPT})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        body: bytes = resp.read()
    return body.decode("utf-8", errors="replace")


def parse_exposition(text: str) -> Series:
    """Prometheus text exposition -> sample name -> [(labels, value)], NaNs dropped.

    The parser names every sample of a ``counter`` family ``<family>_total``:
    a counter the exporter writes without that suffix (all of DCGM's:
    ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``) is found under the name as written too.
    """
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            v = float(s.value)
            if math.isnan(v):
                continue
            labels = dict(s.labels)
            out.setdefault(s.name, []).append((labels, v))
            if family.type == "counter" and s.name == family.name + "_total":
                # the name may have been written either way: keep both (no other series is named so)
                out.setdefault(family.name, []).append((labels, v))
    return out


class ExporterSource:
    """One exporter's endpoint, scraped at most once per tick; :attr:`series` is the tick's scrape."""

    def __init__(self, kind: str, url: str, *, timeout_s: float = SCRAPE_TIMEOUT_S,
                 fetch: Fetch | None = None) -> None:
        self.kind = kind
        self.url = url
        self.timeout_s = timeout_s
        self.fetch = fetch or fetch_text
        self.series: Series = {}
        self.ts_ns: int | None = None
        self.scrapes = 0
        self.failures = 0

    def refresh(self, ts_ns: int) -> bool:
        """Scrape for the tick at ``ts_ns``; on failure the tick sees no series (and False)."""
        if ts_ns == self.ts_ns:
            return bool(self.series)
        self.ts_ns = ts_ns
        try:
            self.series = parse_exposition(self.fetch(self.url, self.timeout_s))
        except Exception as exc:  # a down or garbled exporter must not end the agent
            self.series = {}
            self.failures += 1
            if self.failures == 1 or self.failures % 100 == 0:
                log.warning("%s exporter %s: scrape failed (%d so far): %s: %s",
                            self.kind, self.url, self.failures, type(exc).__name__, exc)
            return False
        self.scrapes += 1
        return True

    def get(self, name: str) -> list[tuple[Labels, float]]:
        return self.series.get(name, [])


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _count(v: float | None) -> int | None:
    """A counter or id as the int the contract wants; None when it is not a non-negative number."""
    if v is None or not math.isfinite(v) or v < 0:
        return None
    return int(round(v))


# --- DCGM --------------------------------------------------------------------------------------

# contract field -> DCGM series, first present wins; values kept as floats.
DCGM_GAUGES: dict[str, tuple[str, ...]] = {
    "sm_util_pct": ("DCGM_FI_DEV_GPU_UTIL",),
    "mem_util_pct": ("DCGM_FI_DEV_MEM_COPY_UTIL",),
    "sm_clock_mhz": ("DCGM_FI_DEV_SM_CLOCK",),
    "max_sm_clock_mhz": ("DCGM_FI_DEV_MAX_SM_CLOCK",),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE",),
    "power_limit_w": ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT"),
    "temp_c": ("DCGM_FI_DEV_GPU_TEMP",),
    "pcie_tx_Bps": ("DCGM_FI_PROF_PCIE_TX_BYTES",),
    "pcie_rx_Bps": ("DCGM_FI_PROF_PCIE_RX_BYTES",),
    "nvlink_tx_Bps": ("DCGM_FI_PROF_NVLINK_TX_BYTES",),
    "nvlink_rx_Bps": ("DCGM_FI_PROF_NVLINK_RX_BYTES",),
}
# contract field -> DCGM series whose value is an integer (bitmask, generation, width, count, id).
DCGM_INTS: dict[str, tuple[str, ...]] = {
    "throttle_reasons": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
    "pcie_gen": ("DCGM_FI_DEV_PCIE_LINK_GEN",),
    "max_pcie_gen": ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN",),
    "pcie_width": ("DCGM_FI_DEV_PCIE_LINK_WIDTH",),
    "max_pcie_width": ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",),
    "ecc_uncorrected": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",),
    "xid": ("DCGM_FI_DEV_XID_ERRORS",),
}
FB_SERIES = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_FB_TOTAL")


def dcgm_by_gpu(series: Series) -> dict[int, dict[str, float]]:
    """GPU index -> DCGM series name -> value (whole-GPU series only: MIG instances are skipped)."""
    out: dict[int, dict[str, float]] = {}
    for name, samples in series.items():
        if not name.startswith("DCGM_"):
            continue
        for labels, v in samples:
            if labels.get("GPU_I_ID"):
                continue
            g = labels.get("gpu", "")
            if not g.isdigit():
                continue
            out.setdefault(int(g), {}).setdefault(name, v)  # first series of a GPU wins
    return out


def dcgm_fields(values: dict[str, float]) -> dict[str, Any]:
    """One GPU's contract ``gpu`` fields from its DCGM series (absent series -> absent field)."""
    f: dict[str, Any] = {}
    for contract, names in DCGM_GAUGES.items():
        v = next((_finite(values[n]) for n in names if n in values), None)
        if v is not None:
            f[contract] = v
    for contract, names in DCGM_INTS.items():
        c = next((_count(values[n]) for n in names if n in values), None)
        if c is not None:
            f[contract] = c
    used, free, reserved, total = (_finite(values.get(n)) for n in FB_SERIES)
    if used is not None:
        f["mem_used_bytes"] = int(round(used * MIB))
    if total is None and used is not None and free is not None:
        total = used + free + (reserved or 0.0)
    if total is not None:
        f["mem_total_bytes"] = int(round(total * MIB))
    return f


class DcgmGpuSampler:
    """The GPU source of :class:`ExporterNodeSampler`: GpuSampler's interface over a DCGM scrape."""

    def __init__(self, source: ExporterSource, *, rank_base: int = 0,
                 rank_of: Callable[[int], int | None] | None = None) -> None:
        self.source = source
        self.rank_base = rank_base
        self.rank_of = rank_of
        self.available = True
        self.handles: list[int] = []  # GPU indices of the last scrape (NodeSampler.describe counts them)

    def rank_for(self, index: int) -> int:
        if self.rank_of is not None:
            r = self.rank_of(index)
            if r is not None:
                return r
        return self.rank_base + index

    def sample(self, ts_ns: int) -> list[dict[str, Any]]:
        per_gpu = dcgm_by_gpu(self.source.series)
        self.handles = sorted(per_gpu)
        return [{"gpu": g, "rank": self.rank_for(g), **dcgm_fields(per_gpu[g])} for g in self.handles]

    def close(self) -> None:
        pass


# --- node_exporter: NICs -------------------------------------------------------------------------

IB_ERRORS = {
    "tx_discards": "node_infiniband_port_discards_transmitted_total",
    "rx_errors": "node_infiniband_port_errors_received_total",
    "symbol_errors": "node_infiniband_symbol_error_total",
    "link_downed": "node_infiniband_link_downed_total",
    "xmit_wait": "node_infiniband_port_transmit_wait_total",
}
NETDEV_ERRORS = {
    "tx_discards": "node_network_transmit_drop_total",
    "rx_errors": "node_network_receive_errs_total",
}


def _by_key(source: ExporterSource, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for labels, v in source.get(name):
        out.setdefault(tuple(labels.get(k, "") for k in keys), v)
    return out


def ib_ports(source: ExporterSource) -> list[PortReading]:
    """Every InfiniBand / RoCE port in a node_exporter scrape, as the agent's readings."""
    tx = _by_key(source, "node_infiniband_port_data_transmitted_bytes_total", "device", "port")
    rx = _by_key(source, "node_infiniband_port_data_received_bytes_total", "device", "port")
    rate = _by_key(source, "node_infiniband_rate_bytes_per_second", "device", "port")
    state = _by_key(source, "node_infiniband_state_id", "device", "port")
    errors = {k: _by_key(source, n, "device", "port") for k, n in IB_ERRORS.items()}
    keys = set(tx) | set(rx) | set(rate) | set(state)
    for e in errors.values():
        keys |= set(e)
    out = []
    for dev, port in sorted(k for k in keys if k[0] and k[1].isdigit()):
        key = (dev, port)
        link = _finite(rate.get(key))
        st = state.get(key)
        out.append(PortReading(
            nic=dev, port=int(port), tx_bytes=_count(tx.get(key)), rx_bytes=_count(rx.get(key)),
            link_gbps=None if link is None else link * BITS_PER_BYTE / GBIT,
            link_up=None if st is None else int(st) == IB_STATE_ACTIVE,
            errors={k: c for k, e in errors.items() if (c := _count(e.get(key))) is not None},
        ))
    return out


def net_ifaces(source: ExporterSource) -> list[PortReading]:
    """Network interfaces in a node_exporter scrape (virtual ones only when there is nothing else)."""
    tx = _by_key(source, "node_network_transmit_bytes_total", "device")
    rx = _by_key(source, "node_network_receive_bytes_total", "device")
    speed = _by_key(source, "node_network_speed_bytes", "device")
    up = _by_key(source, "node_network_up", "device")
    errors = {k: _by_key(source, n, "device") for k, n in NETDEV_ERRORS.items()}
    devices = sorted(d for (d,) in set(tx) | set(rx) if d and d != "lo")
    physical = [d for d in devices if not VIRTUAL_NETDEV.match(d)]
    out = []
    for dev in physical or devices:
        key = (dev,)
        sp = _finite(speed.get(key))
        u = up.get(key)
        out.append(PortReading(
            nic=dev, port=None, tx_bytes=_count(tx.get(key)), rx_bytes=_count(rx.get(key)),
            link_gbps=sp * BITS_PER_BYTE / GBIT if sp is not None and sp > 0 else None,
            link_up=None if u is None else u == 1.0,
            errors={k: c for k, e in errors.items() if (c := _count(e.get(key))) is not None},
        ))
    return out


class NodeExporterNicSampler(NicSampler):
    """The agent's NicSampler (rates, resets) reading ports from a node_exporter scrape."""

    def __init__(self, source: ExporterSource) -> None:
        super().__init__(root="/nonexistent")  # never read: read() below replaces sysfs
        self.source = source

    def read(self) -> list[PortReading]:
        return ib_ports(self.source) + net_ifaces(self.source)


# --- node_exporter: host -------------------------------------------------------------------------


def cpu_times(source: ExporterSource) -> CpuTimes | None:
    """node_cpu_seconds_total summed over CPUs per mode, in CPU_UNITS_PER_S; None when absent."""
    sums = dict.fromkeys(CPU_MODES, 0.0)
    seen = False
    for labels, v in source.get("node_cpu_seconds_total"):
        mode = labels.get("mode", "")
        if mode in sums and math.isfinite(v):
            sums[mode] += v
            seen = True
    if not seen:
        return None
    return CpuTimes(**{m: int(round(s * CPU_UNITS_PER_S)) for m, s in sums.items()})


def _went_back(prev: CpuTimes, cur: CpuTimes) -> bool:
    return any(getattr(cur, m) < getattr(prev, m) for m in CPU_MODES)


def _gauge(source: ExporterSource, name: str) -> float | None:
    samples = source.get(name)
    return _finite(samples[0][1]) if samples else None


class NodeExporterHostSampler(HostSampler):
    """The agent's HostSampler fed from a node_exporter scrape."""

    def __init__(self, source: ExporterSource) -> None:
        super().__init__(root="/nonexistent")  # never read: sample() below replaces /proc
        self.source = source

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        cur = cpu_times(self.source)
        if cur is not None:
            # a mode that went down is a reset (reboot, CPU offlined): no percentages for that interval
            if self._prev is not None and not _went_back(self._prev, cur):
                out.update(cpu_percentages(self._prev, cur))
            self._prev = cur
        load = _gauge(self.source, "node_load1")
        if load is not None:
            out["load1"] = load
        total = _gauge(self.source, "node_memory_MemTotal_bytes")
        avail = _gauge(self.source, "node_memory_MemAvailable_bytes")
        if total and avail is not None:  # the same rule as host.read_mem_used_pct
            out["mem_used_pct"] = round(100.0 * (total - avail) / total, 2)
        return out


# --- the node sampler ----------------------------------------------------------------------------

EXPORTER_KINDS = ("dcgm", "node")


@dataclass
class ExporterUrls:
    """``--from-exporter`` values: which exporter answers where."""

    dcgm: str | None = None
    node: str | None = None

    @classmethod
    def parse(cls, specs: Iterable[str]) -> "ExporterUrls":
        """``["dcgm=http://...", "node=http://..."]`` -> urls; ValueError on a bad spec."""
        out = cls()
        for spec in specs:
            kind, sep, url = spec.partition("=")
            kind = kind.strip().lower()
            if not sep or kind not in EXPORTER_KINDS or not url.startswith(("http://", "https://")):
                raise ValueError(f"--from-exporter wants KIND=URL with KIND one of {', '.join(EXPORTER_KINDS)} "
                                 f"and an http(s) URL, got {spec!r}")
            if getattr(out, kind) is not None:
                raise ValueError(f"--from-exporter {kind}= given twice")
            setattr(out, kind, url)
        return out


class ExporterNodeSampler(NodeSampler):
    """A NodeSampler whose sources are exporters (the ones given); the rest stay the agent's own."""

    def __init__(self, job: str, node: str, urls: ExporterUrls, *, root: str | Path = "/",
                 gpu: Any | None = None, gpus: bool = True, rank_base: int = 0,
                 rank_of: Callable[[int], int | None] | None = None, timeout_s: float = SCRAPE_TIMEOUT_S,
                 fetch: Fetch | None = None) -> None:
        self.sources: list[ExporterSource] = []
        nic: NicSampler | None = None
        host: HostSampler | None = None
        if urls.dcgm:
            src = ExporterSource("dcgm", urls.dcgm, timeout_s=timeout_s, fetch=fetch)
            self.sources.append(src)
            gpu = DcgmGpuSampler(src, rank_base=rank_base, rank_of=rank_of)
        if urls.node:
            src = ExporterSource("node", urls.node, timeout_s=timeout_s, fetch=fetch)
            self.sources.append(src)
            nic, host = NodeExporterNicSampler(src), NodeExporterHostSampler(src)
        super().__init__(job, node, root=root, gpu=gpu, nic=nic, host=host, gpus=gpus)

    def sample(self, ts_ns: int | None = None) -> list[Any]:
        """Scrape every exporter for this tick, then build the records as the agent does."""
        ts = time.time_ns() if ts_ns is None else ts_ns
        for src in self.sources:
            src.refresh(ts)
        out: list[Any] = super().sample(ts)
        return out

    def describe(self) -> str:
        """Where each kind of counter comes from, for the agent's start-up line."""
        kinds = {s.kind: s.url for s in self.sources}
        if "dcgm" in kinds:
            gpus = f"GPUs: DCGM exporter {kinds['dcgm']}"
        else:
            n = len(self.gpu.handles) if self.gpu is not None and self.gpu.available else 0
            gpus = f"{n} GPU(s) via NVML"
        if "node" in kinds:
            rest = f"NICs and host: node_exporter {kinds['node']}"
        else:
            nics = [p.nic + (f"/{p.port}" if p.port is not None else "") for p in self.nic.read()]
            rest = f"NICs: {', '.join(nics) or 'none'}, host: /proc"
        return f"{gpus}; {rest}"
