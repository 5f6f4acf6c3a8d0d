"""The exporter bridge: DCGM exporter text (recorded) and a real node_exporter on fake sysfs / proc trees.

The node_exporter tests start Debian's ``prometheus-node-exporter`` on
127.0.0.1 (a free port) with ``--path.procfs`` / ``--path.sysfs`` pointing at
a tree the test writes, so counter values, and a counter reset, are known
exactly. Without the binary they skip, except under ``CI`` where they fail
(``.ci/install-node-exporter.sh`` installs it).
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from eroica.models.records import GpuRecord, HostRecord, NicRecord
from eroica.producers.counters.exporter import (
    ExporterNodeSampler, ExporterSource, ExporterUrls, dcgm_by_gpu, dcgm_fields, parse_exposition,
)

NS = 10**9
T0 = 1_763_000_000 * NS

# --- DCGM: recorded exposition text ------------------------------------------------------------------

# As dcgm-exporter writes it (HELP/TYPE from its counters CSV; labels gpu, UUID, device, modelName,
# Hostname, DCGM_FI_DRIVER_VERSION): the default counter set plus the fields the contract needs that a
# custom CSV adds, for two H100s, and one MIG-instance series that must not be taken for GPU 0.
_L = 'device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="node-7",DCGM_FI_DRIVER_VERSION="550.54.15"'
DCGM_LABELS = {0: f'gpu="0",UUID="GPU-3f0c2a1e-0000-0000-0000-00000000aa00",{_L.format(g=0)}',
               1: f'gpu="1",UUID="GPU-3f0c2a1e-0000-0000-0000-00000000aa01",{_L.format(g=1)}'}
DCGM_SERIES = [  # name, type, help, {gpu: value}
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", {0: 1980, 1: 1410}),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", {0: 2619, 1: 2619}),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", {0: 66, 1: 91}),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", {0: 629.214, 1: 416.9}),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).",
     {0: 123456789, 1: 98765432}),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", {0: 97, 1: 98}),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", {0: 41, 1: 35}),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", {0: 0, 1: 79}),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", {0: 18000, 1: 19000}),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", {0: 62000, 1: 61000}),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", {0: 559, 1: 559}),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes.",
     {0: 5e12, 1: 4e12}),
    # not in the default set: lines a custom counters CSV adds
    ("DCGM_FI_DEV_MAX_SM_CLOCK", "gauge", "Maximum SM clock (in MHz).", {0: 1980, 1: 1980}),
    ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "gauge", "Enforced power limit (in W).", {0: 700, 1: 700}),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons.", {0: 0, 1: 0x20 | 0x40}),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe current link generation.", {0: 5, 1: 4}),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "gauge", "PCIe max link generation.", {0: 5, 1: 5}),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe current link width.", {0: 16, 1: 8}),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "gauge", "PCIe max link width.", {0: 16, 1: 16}),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.", {0: 0, 1: 2}),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control CRC errors.",
     {0: 0, 1: 12}),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus in bytes per second.",
     {0: 3176578, 1: 1238520}),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus in bytes per second.",
     {0: 538537550, 1: 540165829}),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "The rate of data transmitted over NVLink in bytes per second.",
     {0: 19327352832, 1: 12884901888}),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "The rate of data received over NVLink in bytes per second.",
     {0: 19327352832, 1: 12884901888}),
]
DEFAULT_SET = {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
               "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
               "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
               "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"}
MIG_LINE = ('DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-3f0c2a1e-0000-0000-0000-00000000aa00",device="nvidia0",'
            'GPU_I_PROFILE="1g.10gb",GPU_I_ID="7",Hostname="node-7"} 210')


def dcgm_text(only: set[str] | None = None, mig: bool = True) -> str:
    lines = []
    for name, kind, help_, values in DCGM_SERIES:
        if only is not None and name not in only:
            continue
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        if mig and name == "DCGM_FI_DEV_SM_CLOCK":
            lines.append(MIG_LINE)  # before GPU 0's own series: the first-series-wins rule must not take it
        lines += [f"{name}{{{DCGM_LABELS[g]}}} {v}" for g, v in values.items()]
    return "\n".join(lines) + "\n"


def _source(text: str) -> ExporterSource:
    src = ExporterSource("dcgm", "http://dcgm.invalid/metrics", fetch=lambda url, timeout: text)
    src.refresh(T0)
    return src


def test_dcgm_text_maps_to_every_gpu_field_in_contract_units() -> None:
    per_gpu = dcgm_by_gpu(parse_exposition(dcgm_text()))
    assert sorted(per_gpu) == [0, 1]
    g1 = dcgm_fields(per_gpu[1])
    assert g1 == {
        "sm_util_pct": 98.0, "mem_util_pct": 35.0, "sm_clock_mhz": 1410.0, "max_sm_clock_mhz": 1980.0,
        "power_w": 416.9, "power_limit_w": 700.0, "temp_c": 91.0, "throttle_reasons": 0x60,
        "pcie_gen": 4, "max_pcie_gen": 5, "pcie_width": 8, "max_pcie_width": 16,
        "pcie_tx_Bps": 1238520.0, "pcie_rx_Bps": 540165829.0,
        "nvlink_tx_Bps": 12884901888.0, "nvlink_rx_Bps": 12884901888.0,
        "ecc_uncorrected": 2, "xid": 79,
        "mem_used_bytes": 61000 * 2**20, "mem_total_bytes": (61000 + 19000 + 559) * 2**20,
    }
    gpu_fields = set(GpuRecord.__struct_fields__) - {"job", "node", "rank", "gpu", "ts_ns"}
    assert set(g1) == gpu_fields  # every optional field of the contract's gpu record is filled
    assert dcgm_fields(per_gpu[0])["sm_clock_mhz"] == 1980.0  # GPU 0's own series, not its MIG instance's


def test_dcgm_default_counter_set_leaves_the_documented_fields_absent() -> None:
    src = _source(dcgm_text(only=DEFAULT_SET, mig=False))
    sampler = ExporterNodeSampler("job", "node-7", ExporterUrls(dcgm="http://dcgm.invalid/metrics"), gpus=False,
                                  rank_base=8, fetch=lambda url, timeout: src.fetch(url, timeout))
    recs = [r for r in sampler.sample(T0) if isinstance(r, GpuRecord)]
    assert [(r.gpu, r.rank) for r in recs] == [(0, 8), (1, 9)]  # rank_base + the exporter's gpu index
    filled = {k for k in GpuRecord.__struct_fields__ if getattr(recs[1], k) is not None}
    assert filled == {"job", "node", "rank", "gpu", "ts_ns", "sm_util_pct", "mem_util_pct", "sm_clock_mhz",
                      "power_w", "temp_c", "xid", "mem_used_bytes", "mem_total_bytes"}
    assert recs[1].mem_total_bytes == (61000 + 19000) * 2**20  # no FB_RESERVED in the default set


def test_exporter_that_does_not_answer_gives_no_records_and_does_not_stop_the_other(tmp_path: Path) -> None:
    def fetch(url: str, timeout: float) -> str:
        if url.startswith("http://127.0.0.1:9/"):  # the DCGM exporter is down
            raise ConnectionRefusedError("connection refused")
        return NODE_TEXT

    urls = ExporterUrls.parse(["dcgm=http://127.0.0.1:9/metrics", "node=http://node.invalid/metrics"])
    sampler = ExporterNodeSampler("job", "n", urls, fetch=fetch)
    recs = sampler.sample(T0)
    assert [type(r) for r in recs] == [NicRecord, HostRecord]
    assert sampler.sources[0].failures == 1 and recs[1].load1 == 0.5


NODE_TEXT = """# TYPE node_load1 gauge
node_load1 0.5
node_network_receive_bytes_total{device="eth0"} 10
node_network_transmit_bytes_total{device="eth0"} 10
"""


@pytest.mark.parametrize("spec", [["gpu=http://x/metrics"], ["dcgm=127.0.0.1:9400"], ["dcgm"],
                                  ["node=http://a/metrics", "node=http://b/metrics"]])
def test_bad_exporter_specs_are_refused(spec: list[str]) -> None:
    with pytest.raises(ValueError):
        ExporterUrls.parse(spec)


# --- node_exporter: the real binary on a fake tree ---------------------------------------------------

NODE_EXPORTER_NAMES = ("prometheus-node-exporter", "node_exporter")
COLLECTORS = ("cpu", "loadavg", "meminfo", "netdev", "netclass", "infiniband")
START_TIMEOUT_S = 10.0  # it listens within ~50 ms here; 10 s leaves room on a loaded CI machine
IB = "sys/class/infiniband/mlx5_0"


def node_exporter_binary() -> str:
    for name in NODE_EXPORTER_NAMES:
        found = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
        if found:
            return found
    reason = "node_exporter not installed (run .ci/install-node-exporter.sh)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: the real node_exporter path must run here)", pytrace=False)
    pytest.skip(reason)
    raise AssertionError("unreachable")


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


class FakeNode:
    """A procfs + sysfs tree node_exporter reads at every scrape: set the counters, call write()."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cpu = {"user": 1000, "nice": 10, "system": 300, "idle": 8000, "iowait": 50, "irq": 5, "softirq": 5,
                    "steal": 0}  # jiffies of each of the 2 CPUs
        self.load1 = 3.25
        self.mem_kb = (16_000_000, 4_000_000)  # MemTotal, MemAvailable
        self.ib = {"port_xmit_data": 1_000_000, "port_rcv_data": 2_000_000, "port_xmit_discards": 3,
                   "port_rcv_errors": 4, "symbol_error": 5, "link_downed": 1, "port_xmit_wait": 600}
        self.eth = {"rx_bytes": 10_000, "rx_errs": 2, "tx_bytes": 20_000, "tx_drop": 1}
        self.docker = 555  # a virtual interface's bytes: must not become a nic record

    def write(self) -> None:
        r, c = self.root, self.cpu
        order = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
        cpu_line = " ".join(str(c[m]) for m in order) + " 0 0"
        total = " ".join(str(2 * c[m]) for m in order) + " 0 0"
        _write(r, "proc/stat", f"cpu  {total}\ncpu0 {cpu_line}\ncpu1 {cpu_line}\nintr 0\nctxt 1\n"
                               "btime 1700000000\nprocesses 1\nprocs_running 1\nprocs_blocked 0\n")
        _write(r, "proc/loadavg", f"{self.load1} 1.00 0.50 2/100 1234\n")
        _write(r, "proc/meminfo", f"MemTotal: {self.mem_kb[0]} kB\nMemFree: 1000 kB\nMemAvailable: {self.mem_kb[1]} kB\n")
        e = self.eth
        _write(r, "proc/net/dev",
               "Inter-|   Receive                                                |  Transmit\n"
               " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls "
               "carrier compressed\n"
               f"  eth0: {e['rx_bytes']} 10 {e['rx_errs']} 0 0 0 0 0 {e['tx_bytes']} 20 0 {e['tx_drop']} 0 0 0 0\n"
               f"docker0: {self.docker} 1 0 0 0 0 0 0 {self.docker} 1 0 0 0 0 0 0\n"
               "    lo: 5 1 0 0 0 0 0 0 5 1 0 0 0 0 0 0\n")
        for iface, speed in (("eth0", "25000"), ("docker0", "10000")):
            _write(r, f"sys/class/net/{iface}/speed", speed + "\n")
            _write(r, f"sys/class/net/{iface}/operstate", "up\n")
            _write(r, f"sys/class/net/{iface}/carrier", "1\n")
        for dev, state in (("mlx5_0", "4: ACTIVE"), ("mlx5_1", "1: DOWN")):
            base = f"sys/class/infiniband/{dev}"
            for name, text in (("board_id", "MT_0000000223"), ("fw_ver", "28.39.1002"), ("hca_type", "MT4129")):
                _write(r, f"{base}/{name}", text + "\n")  # the collector skips a device without them
            _write(r, f"{base}/ports/1/link_layer", "InfiniBand\n")
            _write(r, f"{base}/ports/1/rate", "400 Gb/sec (4X NDR)\n")
            _write(r, f"{base}/ports/1/state", state + "\n")
            _write(r, f"{base}/ports/1/phys_state", "5: LinkUp\n")
            for name, v in self.ib.items():
                _write(r, f"{base}/ports/1/counters/{name}", f"{v if dev == 'mlx5_0' else 0}\n")


@pytest.fixture
def node_exporter(tmp_path: Path) -> Iterator[tuple[str, FakeNode]]:
    """A real node_exporter on 127.0.0.1 reading a FakeNode tree; yields (metrics URL, tree)."""
    binary = node_exporter_binary()
    fake = FakeNode(tmp_path / "root")
    fake.write()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/metrics"
    argv = [binary, f"--web.listen-address=127.0.0.1:{port}", f"--path.procfs={fake.root / 'proc'}",
            f"--path.sysfs={fake.root / 'sys'}", "--collector.disable-defaults",
            *(f"--collector.{c}" for c in COLLECTORS),
            # read the fake tree's /proc/net/dev and sysfs, not this machine's interfaces over netlink
            "--no-collector.netdev.netlink", "--no-collector.netclass.netlink"]
    log = (tmp_path / "node_exporter.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(url, timeout=1).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"node_exporter did not start: {(tmp_path / 'node_exporter.log').read_text()[-2000:]}")
                time.sleep(0.02)
        yield url, fake
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def _by_type(recs: list[Any]) -> tuple[dict[str, NicRecord], HostRecord]:
    nics = {r.nic: r for r in recs if isinstance(r, NicRecord)}
    hosts = [r for r in recs if isinstance(r, HostRecord)]
    assert len(hosts) == 1
    return nics, hosts[0]


# every nic / host field node_exporter gives the bridge (cnp_sent, retransmits: not exported, see the module)
NIC_FIELDS = {"port", "tx_Bps", "rx_Bps", "link_gbps", "link_up", "tx_discards", "rx_errors", "symbol_errors",
              "link_downed", "xmit_wait"}
NETDEV_FIELDS = {"tx_Bps", "rx_Bps", "link_gbps", "link_up", "tx_discards", "rx_errors"}
HOST_FIELDS = set(HostRecord.__struct_fields__) - {"job", "node", "ts_ns"}


def _filled(rec: Any) -> set[str]:
    return {k for k in rec.__struct_fields__ if getattr(rec, k) is not None} - {"job", "node", "nic", "ts_ns"}


def test_real_node_exporter_fills_every_host_and_nic_field_across_a_counter_reset(node_exporter) -> None:
    url, fake = node_exporter
    sampler = ExporterNodeSampler("job", "node-3", ExporterUrls(node=url), gpus=False)

    nics, host = _by_type(sampler.sample(T0))
    assert sorted(nics) == ["eth0", "mlx5_0", "mlx5_1"]  # docker0 and lo are not NICs
    # one scrape: link, state and the cumulative counters; no rate and no CPU share before a second
    assert _filled(nics["mlx5_0"]) == NIC_FIELDS - {"tx_Bps", "rx_Bps"}
    assert _filled(host) == {"load1", "mem_used_pct"}

    fake.ib["port_xmit_data"] += 250_000  # 4-byte words: 1,000,000 bytes in the second
    fake.ib["port_rcv_data"] += 500_000
    fake.ib["symbol_error"] += 2
    fake.eth["tx_bytes"] += 3_000
    fake.eth["rx_bytes"] += 7_000
    for mode, d in (("user", 40), ("system", 20), ("idle", 30), ("iowait", 5), ("steal", 5)):
        fake.cpu[mode] += d  # 100 jiffies per CPU
    fake.load1, fake.mem_kb = 7.5, (16_000_000, 2_000_000)
    fake.write()
    nics, host = _by_type(sampler.sample(T0 + NS))
    ib, eth = nics["mlx5_0"], nics["eth0"]
    assert _filled(ib) == NIC_FIELDS and _filled(eth) == NETDEV_FIELDS
    assert (ib.port, ib.tx_Bps, ib.rx_Bps, ib.link_gbps, ib.link_up) == (1, 1_000_000.0, 2_000_000.0, 400.0, True)
    assert (ib.tx_discards, ib.rx_errors, ib.symbol_errors, ib.link_downed, ib.xmit_wait) == (3, 4, 7, 1, 600)
    assert nics["mlx5_1"].link_up is False and nics["mlx5_1"].tx_Bps == 0.0
    assert (eth.tx_Bps, eth.rx_Bps, eth.link_gbps, eth.link_up, eth.tx_discards, eth.rx_errors) == \
        (3_000.0, 7_000.0, 25.0, True, 1, 2)
    assert _filled(host) == HOST_FIELDS
    # busy = user + system + steal = 65 of 100 jiffies; iowait counts as idle time
    assert (host.cpu_util_pct, host.iowait_pct, host.steal_pct) == (65.0, 5.0, 5.0)
    assert (host.load1, host.mem_used_pct) == (7.5, 87.5)

    # the HCA is reset (driver reload): its counters restart near zero, eth0 keeps counting
    fake.ib.update(port_xmit_data=1_000, port_rcv_data=2_000, symbol_error=0)
    fake.eth["tx_bytes"] += 1_000
    fake.write()
    nics, host = _by_type(sampler.sample(T0 + 2 * NS))
    assert nics["mlx5_0"].tx_Bps is None and nics["mlx5_0"].rx_Bps is None  # no rate across the reset
    assert nics["mlx5_0"].symbol_errors == 0  # cumulative error counters go as read
    assert nics["eth0"].tx_Bps == 1_000.0

    fake.ib["port_xmit_data"] += 500  # 2,000 bytes over 2 s
    fake.cpu["user"] += 25
    fake.cpu["idle"] += 75
    fake.write()
    nics, host = _by_type(sampler.sample(T0 + 4 * NS))
    assert nics["mlx5_0"].tx_Bps == 1_000.0 and nics["mlx5_0"].rx_Bps == 0.0  # rates again after it
    assert _filled(nics["mlx5_0"]) == NIC_FIELDS and _filled(host) == HOST_FIELDS
    assert (host.cpu_util_pct, host.iowait_pct, host.steal_pct) == (25.0, 0.0, 0.0)

    # a CPU counter that goes back (a reboot under the exporter) gives no share for that interval
    fake.cpu = {m: v // 10 for m, v in fake.cpu.items()}
    fake.write()
    _, host = _by_type(sampler.sample(T0 + 5 * NS))
    assert host.cpu_util_pct is None and host.load1 == 7.5


def test_agent_cli_publishes_node_exporter_counters(node_exporter, tmp_path: Path) -> None:
    from eroica.models.reader import decode_line

    url, _fake = node_exporter
    out = tmp_path / "node.jsonl"
    res = subprocess.run([sys.executable, "-m", "eroica.cli", "agent", "--job", "j", "--node", "node-3",
                          "--out", str(out), "--interval", "0.2", "--duration", "1", "--from-exporter", f"node={url}"],
                         capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert f"node_exporter {url}".encode() in res.stderr
    recs = [decode_line(line) for line in out.read_bytes().splitlines()]  # contract-valid, or this raises
    nics = [r for r in recs if isinstance(r, NicRecord) and r.nic == "mlx5_0"]
    hosts = [r for r in recs if isinstance(r, HostRecord)]
    assert len(nics) >= 3 and len(hosts) == len(nics)
    assert all(r.tx_Bps == 0.0 and r.link_gbps == 400.0 for r in nics[1:])  # the fake tree stands still
    assert all(math.isclose(h.mem_used_pct or 0, 75.0) for h in hosts)
    assert {r.node for r in recs} == {"node-3"}


def test_bridged_records_are_contract_structs(node_exporter) -> None:
    """What the bridge gives round-trips through the contract's JSON (what the sinks write)."""
    url, _ = node_exporter
    sampler = ExporterNodeSampler("job", "node-3", ExporterUrls(node=url), gpus=False)
    sampler.sample(T0)
    recs = sampler.sample(T0 + NS)
    enc = msgspec.json.Encoder()
    for r in recs:
        assert msgspec.json.decode(enc.encode(r), type=type(r)) == r


def test_missing_node_exporter_fails_under_ci_and_skips_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        node_exporter_binary()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="install-node-exporter"):
        node_exporter_binary()
