"""A simulated job's counters through DCGM exporter and node_exporter text give the verdicts of its counters taken directly.

The simulator's ``gpu``, ``nic`` and ``host`` records are rendered, per node and
per sample time, as the two exporters would serve them (DCGM: gauges per
``gpu`` label; node_exporter: *cumulative* byte and CPU-second counters built by
integrating the simulated rates and shares, as a kernel would count them),
served by a local HTTP server, scraped through the bridge at each sample time
(the tick time is injected, nothing sleeps) and rebuilt into records. The job's
``fn`` records plus the bridged counters must give the same verdict ids as the
``fn`` records plus the simulator's own counters.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import pytest

from eroica.models.reader import read_batches
from eroica.producers.counters.exporter import ExporterNodeSampler, ExporterUrls
from eroica.producers.simulator import SimConfig, generate
from eroica.streams.detection import analyze

WINDOW_NS = 20 * 10**9  # the window the end-to-end analyze tests use
CPUS = 2  # CPUs per simulated node as node_exporter lists them (the bridge sums them)
MEM_TOTAL = 2**40  # bytes of a simulated node's memory (1 TiB)
BASE_CPU_S = 1000.0  # seconds each mode had counted before the job (counters do not start at 0)
BASE_BYTES = 10**12  # bytes a NIC port had counted before the job
# +-0.5 byte on each of the two whole-byte counter readings over the simulator's 0.5 s sample period,
# plus the agent's rounding of rates to 0.1 B/s
RATE_TOL_BPS = 1.0 / 0.5 + 0.05
CFG = SimConfig(nodes=4, gpus=4, steps=90, faults=["gpu_throttle:rank=5", "nic:node=2,nic=1"], seed=7)


def fmt(v: float) -> str:
    """A value as exposition text: repr is the shortest string that reads back as the same float."""
    return repr(float(v))


def dcgm_page(gpus: list[dict[str, Any]]) -> str:
    """The node's GPU samples as dcgm-exporter serves them (labels gpu, UUID, device, modelName, Hostname)."""
    series = {  # DCGM series -> (contract field, scale to DCGM's unit)
        "DCGM_FI_DEV_GPU_UTIL": ("sm_util_pct", 1.0), "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util_pct", 1.0),
        "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0), "DCGM_FI_DEV_MAX_SM_CLOCK": ("max_sm_clock_mhz", 1.0),
        "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0), "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("power_limit_w", 1.0),
        "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0), "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle_reasons", 1.0),
        "DCGM_FI_DEV_PCIE_LINK_GEN": ("pcie_gen", 1.0), "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": ("max_pcie_gen", 1.0),
        "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("pcie_width", 1.0), "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": ("max_pcie_width", 1.0),
        "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_Bps", 1.0), "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_Bps", 1.0),
        "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx_Bps", 1.0), "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx_Bps", 1.0),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_uncorrected", 1.0), "DCGM_FI_DEV_XID_ERRORS": ("xid", 1.0),
        # MiB, as DCGM: a power-of-two scale, so bytes / 2^20 reads back exactly
        "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", 2.0**-20), "DCGM_FI_DEV_FB_TOTAL": ("mem_total_bytes", 2.0**-20),
    }
    counters = {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}
    lines = []
    for name, (key, scale) in series.items():
        lines.append(f"# TYPE {name} {'counter' if name in counters else 'gauge'}")
        for g in gpus:
            if g.get(key) is not None:
                labels = (f'gpu="{g["gpu"]}",UUID="GPU-{g["node"]}-{g["gpu"]}",device="nvidia{g["gpu"]}",'
                          f'modelName="NVIDIA H100 80GB HBM3",Hostname="{g["node"]}"')
                lines.append(f"{name}{{{labels}}} {fmt(g[key] * scale)}")
    return "\n".join(lines) + "\n"


class NodeCounters:
    """One node's cumulative node_exporter counters, advanced by each simulated sample."""

    def __init__(self) -> None:
        self.cpu = dict.fromkeys(("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"), BASE_CPU_S)
        self.bytes: dict[tuple[str, int, str], float] = defaultdict(lambda: float(BASE_BYTES))
        self.prev_ts: int | None = None

    def advance(self, ts: int, nics: list[dict[str, Any]], host: dict[str, Any] | None) -> None:
        dt = (ts - self.prev_ts) / 1e9 if self.prev_ts is not None else 0.0
        self.prev_ts = ts
        for n in nics:
            for d, key in (("tx", "tx_Bps"), ("rx", "rx_Bps")):
                if n.get(key) is not None:
                    self.bytes[(n["nic"], n.get("port", 1), d)] += n[key] * dt
        if host is not None and host.get("cpu_util_pct") is not None:
            total = CPUS * dt
            busy, iowait, steal = host["cpu_util_pct"], host.get("iowait_pct", 0.0), host.get("steal_pct", 0.0)
            for mode, pct in (("user", busy - steal), ("steal", steal), ("iowait", iowait),
                              ("idle", 100.0 - busy - iowait)):
                self.cpu[mode] += pct / 100.0 * total

    def page(self, nics: list[dict[str, Any]], host: dict[str, Any] | None) -> str:
        """node_exporter's text for the node now: infiniband ports, cpu, load and memory."""
        lines = []
        for n in nics:
            lab = f'device="{n["nic"]}",port="{n.get("port", 1)}"'
            # a kernel counts whole bytes: the integrated rate is rounded as the counter would hold it
            lines.append(f'node_infiniband_port_data_transmitted_bytes_total{{{lab}}} '
                         f'{round(self.bytes[(n["nic"], n.get("port", 1), "tx")])}')
            lines.append(f'node_infiniband_port_data_received_bytes_total{{{lab}}} '
                         f'{round(self.bytes[(n["nic"], n.get("port", 1), "rx")])}')
            if n.get("link_gbps") is not None:
                lines.append(f"node_infiniband_rate_bytes_per_second{{{lab}}} {fmt(n['link_gbps'] * 1e9 / 8)}")
            if n.get("link_up") is not None:
                lines.append(f"node_infiniband_state_id{{{lab}}} {4 if n['link_up'] else 1}")
            for key, name in (("tx_discards", "port_discards_transmitted_total"), ("rx_errors", "port_errors_received_total"),
                              ("symbol_errors", "symbol_error_total"), ("link_downed", "link_downed_total"),
                              ("xmit_wait", "port_transmit_wait_total")):
                if n.get(key) is not None:
                    lines.append(f"node_infiniband_{name}{{{lab}}} {n[key]}")
        for mode, s in self.cpu.items():
            for cpu in range(CPUS):  # split evenly: the bridge must sum the CPUs back
                lines.append(f'node_cpu_seconds_total{{cpu="{cpu}",mode="{mode}"}} {fmt(s / CPUS)}')
        if host is not None:
            if host.get("load1") is not None:
                lines.append(f"node_load1 {fmt(host['load1'])}")
            if host.get("mem_used_pct") is not None:
                avail = round(MEM_TOTAL * (100.0 - host["mem_used_pct"]) / 100.0)
                lines += [f"node_memory_MemTotal_bytes {MEM_TOTAL}", f"node_memory_MemAvailable_bytes {avail}"]
        return "\n".join(lines) + "\n"


class Pages(ThreadingHTTPServer):
    pages: dict[str, str]


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        pages = self.server.pages  # type: ignore[attr-defined]
        body = pages.get(self.path)
        if body is None:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[Pages]:
    srv = Pages(("127.0.0.1", 0), Handler)
    srv.pages = {}
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    t = r["type"]
    if t == "gpu":
        return (t, r["node"], r["gpu"], r["ts_ns"])
    if t == "nic":
        return (t, r["node"], r["nic"], r.get("port"), r["ts_ns"])
    return (t, r["node"], r["ts_ns"])


def bridge(records: list[dict[str, Any]], server: Pages) -> list[dict[str, Any]]:
    """Every counter record of the run, taken through exporter text, a scrape and the bridge."""
    job = next(r for r in records if r["type"] == "job")
    by_node_ts: dict[str, dict[int, dict[str, list[dict[str, Any]]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    for r in records:
        if r["type"] in ("gpu", "nic", "host"):
            by_node_ts[r["node"]][r["ts_ns"]][r["type"]].append(r)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    out = []
    for node, samples in sorted(by_node_ts.items()):
        dcgm_path, node_path = f"/{node}/dcgm", f"/{node}/node"
        urls = ExporterUrls(dcgm=base + dcgm_path, node=base + node_path)
        sampler = ExporterNodeSampler(job["job"], node, urls, gpus=False,
                                      rank_base=job["rank_nodes"].index(node))  # torchrun: rank = base + gpu
        counters = NodeCounters()
        times = sorted(samples)
        period = times[1] - times[0]
        first = samples[times[0]]
        # the exporters were up before the job: one scrape a sample period before its first sample
        counters.advance(times[0] - period, [], None)
        server.pages[node_path] = counters.page(first["nic"], None)
        server.pages[dcgm_path] = dcgm_page([])
        sampler.sample(times[0] - period)
        for ts in times:
            s = samples[ts]
            host = s["host"][0] if s["host"] else None
            counters.advance(ts, s["nic"], host)
            server.pages[node_path] = counters.page(s["nic"], host)
            server.pages[dcgm_path] = dcgm_page(s["gpu"])
            out += [msgspec.to_builtins(r) for r in sampler.sample(ts)]
        assert [src.failures for src in sampler.sources] == [0, 0]
    return out


def _verdict_ids(path: Path) -> list[str]:
    return [v.verdict_id for v in analyze(read_batches(path), WINDOW_NS)]


def test_bridged_counters_give_the_verdict_ids_of_direct_counters(server: Pages, tmp_path: Path) -> None:
    records = [r for step in generate(CFG) for r in step]
    bridged = {_key(r): r for r in bridge(records, server)}
    direct_counters = [r for r in records if r["type"] in ("gpu", "nic", "host")]
    assert set(bridged) == {_key(r) for r in direct_counters}  # one bridged record per simulated sample

    # the values, field by field: gauges exactly; NIC rates within the whole-byte counter's rounding
    for r in direct_counters:
        b = bridged[_key(r)]
        for k, v in r.items():
            if k in ("cnp_sent", "retransmits"):
                assert k not in b  # node_exporter does not export the port's hw_counters
            elif k in ("tx_Bps", "rx_Bps"):
                assert abs(b[k] - v) <= RATE_TOL_BPS, (k, v, b[k])
            else:
                assert b[k] == v, (r["type"], k, v, b.get(k))

    enc = msgspec.json.Encoder()
    direct, through = tmp_path / "direct.jsonl", tmp_path / "bridged.jsonl"
    with direct.open("wb") as d, through.open("wb") as t:
        for r in records:  # same order, the counters swapped for their bridged twins
            d.write(enc.encode(r) + b"\n")
            t.write(enc.encode(bridged[_key(r)] if r["type"] in ("gpu", "nic", "host") else r) + b"\n")

    want = _verdict_ids(direct)
    got = _verdict_ids(through)
    assert got == want
    # the comparison means something: both faults are found, by their components, from the counters
    verdicts = list(analyze(read_batches(through), WINDOW_NS))
    alarms = {(v.component, v.rank if v.scope == "rank" else v.node) for v in verdicts if v.confidence >= 0.5}
    assert ("gpu", 5) in alarms and ("nic", "node-2") in alarms, alarms
    print(f"verdict ids equal: {len(want)} verdicts, {len(bridged)} bridged counter records")
