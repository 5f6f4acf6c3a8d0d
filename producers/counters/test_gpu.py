"""GPU counters through NVML, at the function level with a pynvml stand-in (and for real where a GPU is)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from eroica.models.records import GpuRecord
from eroica.producers.counters import gpu as gpu_mod
from eroica.producers.counters.gpu import GpuSampler, env_rank_base, rank_of_pid, ranks_from_processes
from eroica.producers.counters.sampler import NodeSampler


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """Just enough of pynvml: two GPUs, GPU 1 throttled on an x8 gen-3 link, one query unsupported."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_TIMEOUT = 10
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, count: int = 2, fail_init: bool = False) -> None:
        self.count = count
        self.fail_init = fail_init
        self.nvlink_kib = [0, 0]
        self.calls: dict[str, int] = {}
        self.events: list = []
        self.procs: dict[int, list] = {}

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError(9)  # NVML_ERROR_DRIVER_NOT_LOADED

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int):
        return f"h{i}"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}".encode()

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 1410 if h == "h1" else 1980

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        self._call("max_clock")
        return 1980

    def nvmlDeviceGetPowerUsage(self, h):
        return 650_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 88 if h == "h1" else 60

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x40 if h == "h1" else 0

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 3 if h == "h1" else 5

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 8 if h == "h1" else 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        self._call("pcie_throughput")
        return 1000 if counter == 0 else 2000  # KB/s

    def nvmlDeviceGetFieldValues(self, h, ids):
        i = int(h[1:])
        out = []
        for fid, _scope in ids:
            v = self.nvlink_kib[i] if fid == 138 else 2 * self.nvlink_kib[i]
            out.append(SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(ullVal=v)))
        return out

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        self._call("ecc")
        raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=40 << 30, total=80 << 30)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self.procs.get(int(h[1:]), [])

    def nvmlEventSetCreate(self):
        return "events"

    def nvmlDeviceRegisterEvents(self, h, kinds, events) -> None:
        pass

    def nvmlEventSetWait_v2(self, events, timeout_ms):
        if not self.events:
            raise NVMLError(self.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlEventSetFree(self, events) -> None:
        pass


def test_every_contract_field_nvml_provides() -> None:
    nv = FakeNvml()
    s = GpuSampler(nv, rank_base=8, pcie_every_s=0)
    assert s.available and s.uuids == ["GPU-h0", "GPU-h1"]
    a = s.sample(ts_ns=1_000_000_000)
    nv.nvlink_kib = [1024, 2048]  # KiB since the last sample
    nv.events.append(SimpleNamespace(device="h1", eventType=0x8, eventData=79))
    b = s.sample(ts_ns=2_000_000_000)
    g1 = b[1]
    assert g1 == {
        "gpu": 1, "rank": 9, "sm_util_pct": 97.0, "mem_util_pct": 40.0, "sm_clock_mhz": 1410.0,
        "max_sm_clock_mhz": 1980.0, "power_w": 650.0, "power_limit_w": 700.0, "temp_c": 88.0,
        "throttle_reasons": 0x40, "pcie_gen": 3, "max_pcie_gen": 5, "pcie_width": 8, "max_pcie_width": 16,
        "pcie_tx_Bps": 1024_000.0, "pcie_rx_Bps": 2048_000.0, "nvlink_tx_Bps": 2048 * 1024.0,
        "nvlink_rx_Bps": 4096 * 1024.0, "xid": 79, "mem_used_bytes": 40 << 30, "mem_total_bytes": 80 << 30,
    }
    assert "nvlink_tx_Bps" not in a[0]  # a rate needs two samples
    assert b[0]["xid"] == 0 and "ecc_uncorrected" not in b[0]
    assert nv.calls["ecc"] == 2  # NOT_SUPPORTED on each GPU once, then never asked again


def test_slow_queries_are_asked_at_their_own_cadence() -> None:
    """PCIe throughput (a 20 ms blocking call) every PCIE_THROUGHPUT_EVERY_S; the fixed maximum clock once."""
    nv = FakeNvml()
    s = GpuSampler(nv)
    every_ns = int(gpu_mod.PCIE_THROUGHPUT_EVERY_S * 1e9)
    out = [s.sample(ts_ns=t) for t in range(0, 2 * every_ns + 1, every_ns // 10)]  # 21 samples at 10 a period
    with_pcie = [k for k, o in enumerate(out) if "pcie_tx_Bps" in o[0]]
    assert with_pcie == [0, 10, 20] and nv.calls["pcie_throughput"] == 3 * 2 * 2  # tx + rx, two GPUs
    assert nv.calls["max_clock"] == 2 and all(o[1]["max_sm_clock_mhz"] == 1980.0 for o in out)
    assert "pcie_tx_Bps" in s.sample(ts_ns=0)[0]  # a clock stepped back (a new run) reads again


def test_records_are_contract_valid_and_detector_readable() -> None:
    sampler = NodeSampler("job", "node-3", gpu=GpuSampler(FakeNvml(), rank_base=24), root="/nonexistent")
    recs = [r for r in sampler.sample(ts_ns=5) if isinstance(r, GpuRecord)]
    assert [(r.rank, r.gpu) for r in recs] == [(24, 0), (25, 1)]
    for r in recs:  # the struct round-trips through the contract's own decoder
        assert msgspec.json.decode(msgspec.json.encode(r), type=GpuRecord) == r
    assert recs[1].sm_clock_mhz / recs[1].max_sm_clock_mhz < 0.92  # what the detector reads as throttling


def test_no_driver_says_so_once_and_samples_nothing(capsys, monkeypatch) -> None:
    monkeypatch.setattr(gpu_mod, "_said_no_gpu", False)
    s1 = GpuSampler(FakeNvml(fail_init=True))
    s2 = GpuSampler(FakeNvml(count=0))
    assert not s1.available and not s2.available
    assert s1.sample(1) == [] and s2.sample(1) == []
    err = capsys.readouterr().err
    assert err.count("no NVIDIA GPU: GPU counters off") == 1


def test_without_pynvml(monkeypatch, capsys) -> None:
    monkeypatch.setattr(gpu_mod, "_said_no_gpu", False)
    monkeypatch.setattr(gpu_mod, "_load_pynvml", lambda: None)
    s = GpuSampler()
    assert not s.available and s.reason == "pynvml not installed"
    assert "no NVIDIA GPU: GPU counters off (pynvml not installed)" in capsys.readouterr().err


def test_rank_mapping_from_processes(tmp_path: Path) -> None:
    (tmp_path / "100").mkdir()
    (tmp_path / "100" / "environ").write_bytes(b"PATH=/bin\0RANK=13\0LOCAL_RANK=5\0")
    (tmp_path / "200").mkdir()
    (tmp_path / "200" / "environ").write_bytes(b"PATH=/bin\0")
    assert rank_of_pid(100, tmp_path) == 13 and rank_of_pid(200, tmp_path) is None
    assert rank_of_pid(300, tmp_path) is None
    nv = FakeNvml()
    nv.procs = {0: [SimpleNamespace(pid=200)], 1: [SimpleNamespace(pid=100)]}
    handles = ["h0", "h1"]
    assert ranks_from_processes(nv, handles, tmp_path) == {1: 13}
    assert ranks_from_processes(nv, handles, tmp_path, pid_rank=lambda pid: 6 if pid == 200 else None) == {0: 6, 1: 13}
    s = GpuSampler(nv, rank_base=8, proc_root=tmp_path)
    assert [g["rank"] for g in s.sample(1)] == [8, 13]  # GPU 0: no RANK anywhere, falls back to base + index


def test_rank_base_from_launcher_env() -> None:
    assert env_rank_base(8, {"GROUP_RANK": "2", "LOCAL_WORLD_SIZE": "8"}) == 16
    assert env_rank_base(4, {"NODE_RANK": "3"}) == 12
    assert env_rank_base(8, {}) == 0


@pytest.mark.skipif(not (os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia")),
                    reason="no NVIDIA driver on this machine: the real pynvml path runs where a GPU is")
def test_real_nvml() -> None:
    pytest.importorskip("pynvml")
    s = GpuSampler()
    assert s.available
    out = s.sample(1)
    assert out and all("sm_clock_mhz" in g and "mem_total_bytes" in g for g in out)
    s.close()
