"""Host (/proc) and NIC (sysfs) counter parsing against fake trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from eroica.producers.counters.host import (
    CpuTimes, HostSampler, cpu_percentages, read_cpu_times, read_load1, read_mem_used_pct,
)
from eroica.producers.counters.nic import NicSampler, parse_ib_rate, parse_ib_state, read_ib_ports, read_net_ifaces


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def proc_tree(root: Path, cpu: tuple[int, ...], load: str = "1.50 0.80 0.40 2/300 4242\n") -> None:
    write(root, "proc/stat", "cpu  " + " ".join(map(str, cpu)) + "\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1 2\n")
    write(root, "proc/loadavg", load)
    write(root, "proc/meminfo", "MemTotal:       1000000 kB\nMemFree:         100000 kB\n"
                                "MemAvailable:    250000 kB\nBuffers:  1 kB\n")


# --- host ---------------------------------------------------------------------------

def test_cpu_times_and_percentages(tmp_path: Path) -> None:
    proc_tree(tmp_path, (100, 0, 50, 800, 20, 5, 5, 20, 0, 0))
    a = read_cpu_times(tmp_path)
    assert a == CpuTimes(100, 0, 50, 800, 20, 5, 5, 20)
    b = CpuTimes(100 + 300, 0, 50 + 100, 800 + 400, 20 + 100, 5, 5, 20 + 100)  # +1000 jiffies
    pct = cpu_percentages(a, b)
    assert pct == {"cpu_util_pct": 50.0, "iowait_pct": 10.0, "steal_pct": 10.0}
    assert cpu_percentages(b, b) == {}  # no time passed: no percentage, no division by zero


def test_old_kernel_stat_without_steal(tmp_path: Path) -> None:
    write(tmp_path, "proc/stat", "cpu 10 0 10 80\n")
    assert read_cpu_times(tmp_path) == CpuTimes(10, 0, 10, 80, 0, 0, 0, 0)


def test_load_and_memory(tmp_path: Path) -> None:
    proc_tree(tmp_path, (1,) * 10)
    assert read_load1(tmp_path) == 1.5
    assert read_mem_used_pct(tmp_path) == 75.0
    write(tmp_path, "proc/meminfo", "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 100 kB\nCached: 300 kB\n")
    assert read_mem_used_pct(tmp_path) == 50.0  # before MemAvailable existed


def test_missing_or_garbled_proc_gives_nothing(tmp_path: Path) -> None:
    assert read_cpu_times(tmp_path) is None and read_load1(tmp_path) is None and read_mem_used_pct(tmp_path) is None
    write(tmp_path, "proc/stat", "cpu x y z\n")
    write(tmp_path, "proc/loadavg", "\n")
    assert read_cpu_times(tmp_path) is None and read_load1(tmp_path) is None
    assert HostSampler(tmp_path).sample() == {}


def test_host_sampler_rates_from_second_sample(tmp_path: Path) -> None:
    proc_tree(tmp_path, (100, 0, 0, 900, 0, 0, 0, 0, 0, 0))
    s = HostSampler(tmp_path)
    first = s.sample()
    assert "cpu_util_pct" not in first and first["load1"] == 1.5 and first["mem_used_pct"] == 75.0
    proc_tree(tmp_path, (190, 0, 0, 910, 0, 0, 0, 0, 0, 0))
    assert s.sample()["cpu_util_pct"] == 90.0


# --- NIC -------------------------------------------------------------------------------

def ib_port(root: Path, dev: str, port: int, *, xmit: int, rcv: int, rate: str = "200 Gb/sec (4X HDR)",
            state: str = "4: ACTIVE", symbol: int = 0, downed: int = 0, cnp: int | None = 7,
            timeouts: int | None = 3, seq: int | None = 2) -> None:
    base = f"sys/class/infiniband/{dev}/ports/{port}"
    for name, v in (("port_xmit_data", xmit), ("port_rcv_data", rcv), ("symbol_error", symbol),
                    ("link_downed", downed), ("port_rcv_errors", 1), ("port_xmit_discards", 4),
                    ("port_xmit_wait", 99)):
        write(root, f"{base}/counters/{name}", f"{v}\n")
    for name, v in (("np_cnp_sent", cnp), ("local_ack_timeout_err", timeouts), ("packet_seq_err", seq)):
        if v is not None:
            write(root, f"{base}/hw_counters/{name}", f"{v}\n")
    write(root, f"{base}/rate", rate + "\n")
    write(root, f"{base}/state", state + "\n")


def net_iface(root: Path, name: str, *, tx: int, rx: int, speed: str | None = "100000", oper: str = "up",
              physical: bool = True, dropped: int = 0, errors: int = 0) -> None:
    base = f"sys/class/net/{name}"
    write(root, f"{base}/statistics/tx_bytes", f"{tx}\n")
    write(root, f"{base}/statistics/rx_bytes", f"{rx}\n")
    write(root, f"{base}/statistics/tx_dropped", f"{dropped}\n")
    write(root, f"{base}/statistics/rx_errors", f"{errors}\n")
    write(root, f"{base}/operstate", oper + "\n")
    if speed is not None:
        write(root, f"{base}/speed", speed + "\n")
    if physical:
        (root / base / "device").mkdir(parents=True, exist_ok=True)


def test_ib_rate_and_state_parsing() -> None:
    assert parse_ib_rate("200 Gb/sec (4X HDR)") == 200.0
    assert parse_ib_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_ib_rate("garbage") is None and parse_ib_rate(None) is None
    assert parse_ib_state("4: ACTIVE") is True
    assert parse_ib_state("1: DOWN") is False
    assert parse_ib_state(None) is None


def test_ib_ports_counters_in_contract_units(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0", 1, xmit=1000, rcv=2000, symbol=5, downed=1)
    ib_port(tmp_path, "mlx5_1", 1, xmit=0, rcv=0, rate="100 Gb/sec (4X EDR)", state="1: DOWN",
            cnp=None, timeouts=None, seq=None)
    a, b = read_ib_ports(tmp_path)
    assert (a.nic, a.port, a.tx_bytes, a.rx_bytes) == ("mlx5_0", 1, 4000, 8000)  # 4-byte words
    assert a.link_gbps == 200.0 and a.link_up is True
    assert a.errors == {"tx_discards": 4, "rx_errors": 1, "symbol_errors": 5, "link_downed": 1,
                        "xmit_wait": 99, "cnp_sent": 7, "retransmits": 5}
    assert b.link_gbps == 100.0 and b.link_up is False
    assert "cnp_sent" not in b.errors and "retransmits" not in b.errors  # the driver exposes none


def test_net_ifaces_skip_loopback_and_virtual(tmp_path: Path) -> None:
    net_iface(tmp_path, "lo", tx=1, rx=1, speed=None, oper="unknown", physical=False)
    net_iface(tmp_path, "eth0", tx=10, rx=20, speed="25000")
    net_iface(tmp_path, "docker0", tx=5, rx=5, speed=None, oper="down", physical=False)
    (eth0,) = read_net_ifaces(tmp_path)
    assert (eth0.nic, eth0.port, eth0.link_gbps, eth0.link_up) == ("eth0", None, 25.0, True)
    assert eth0.errors == {"tx_discards": 0, "rx_errors": 0}
    assert [p.nic for p in read_net_ifaces(tmp_path, include_virtual=True)] == ["docker0", "eth0"]


def test_virtual_only_node_reports_its_virtual_interfaces(tmp_path: Path) -> None:
    net_iface(tmp_path, "veth1", tx=1, rx=2, speed="-1", physical=False)
    (v,) = read_net_ifaces(tmp_path)
    assert v.nic == "veth1" and v.link_gbps is None  # speed -1: unknown, not a contract value


def test_nic_sampler_rates_and_wrap(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0", 1, xmit=0, rcv=0)
    net_iface(tmp_path, "eth0", tx=1000, rx=1000)
    s = NicSampler(tmp_path)
    first = {r["nic"]: r for r in s.sample(ts_ns=0)}
    assert "tx_Bps" not in first["mlx5_0"] and first["mlx5_0"]["port"] == 1 and "port" not in first["eth0"]
    ib_port(tmp_path, "mlx5_0", 1, xmit=250_000_000, rcv=500_000_000)  # words: 1 GB, 2 GB
    net_iface(tmp_path, "eth0", tx=500, rx=3000)  # tx went backwards (driver reload): no rate
    second = {r["nic"]: r for r in s.sample(ts_ns=2_000_000_000)}
    assert second["mlx5_0"]["tx_Bps"] == 0.5e9 and second["mlx5_0"]["rx_Bps"] == 1e9
    assert "tx_Bps" not in second["eth0"] and second["eth0"]["rx_Bps"] == 1000.0
    assert second["mlx5_0"]["symbol_errors"] == 0 and second["mlx5_0"]["link_up"] is True


def test_no_sysfs_at_all(tmp_path: Path) -> None:
    assert NicSampler(tmp_path).sample(ts_ns=1) == []


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs a Linux /proc")
def test_this_machine_host_counters() -> None:
    s = HostSampler("/")
    s.sample()
    out = s.sample()
    assert 0.0 <= out.get("mem_used_pct", 0.0) <= 100.0 and "load1" in out
