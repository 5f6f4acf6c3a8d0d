"""Attribution on hand-built counter summaries: which component a finding names, and why."""

from __future__ import annotations

from .attribution import (CLOCK_RATIO_LOW, CPU_SATURATED_PCT, IOWAIT_HIGH_PCT, THROTTLE_SHARE, class_peers,
                          gpu_classes, host_component, is_compute_bound, kernel_component, loader_component,
                          pcie_reason, same_class, with_model_power_limits)
from .counters import CounterSummary

H100 = {"max_sm_clock_mhz": 1980.0, "power_limit_w": 700.0, "mem_total_bytes": 80e9}


def gpus(n: int = 8, **per_rank: dict[str, float]) -> CounterSummary:
    """n healthy GPUs of one class; ``per_rank`` ("r3"={...}) overrides one rank's metrics."""
    gpu = {r: {**H100, "sm_clock_mhz": 1980.0, "clock_ratio": 1.0, "throttle_share": 0.0} for r in range(n)}
    for key, m in per_rank.items():
        gpu[int(key[1:])].update(m)
    return CounterSummary(gpu=gpu)


PEERS = [r for r in range(8) if r != 3]


def test_a_clock_below_its_own_ceiling_is_the_gpu():
    c = gpus(r3={"sm_clock_mhz": 1500.0, "clock_ratio": 1500 / 1980})
    comp, why = kernel_component(c, 3, memory_share=0.0, gemm_ratio=1.3, peers=PEERS)
    assert comp == "gpu" and "SM clock 1500 of 1980 MHz" in why
    ok = gpus(r3={"clock_ratio": CLOCK_RATIO_LOW + 0.01})
    assert kernel_component(ok, 3, 0.0, 1.3, PEERS)[0] == "workload"


def test_throttle_reasons_count_only_when_the_class_does_not_share_them():
    c = gpus(r3={"throttle_share": THROTTLE_SHARE})
    assert kernel_component(c, 3, 0.0, 1.3, PEERS)[0] == "gpu"
    everyone = gpus(**{f"r{r}": {"throttle_share": 0.9} for r in range(8)})   # all at their power cap
    assert kernel_component(everyone, 3, 0.0, 1.3, PEERS)[0] == "workload"


def test_memory_bound_kernels_slow_with_gemms_and_clocks_normal_is_gpu_memory():
    c = gpus()
    assert kernel_component(c, 3, memory_share=0.8, gemm_ratio=1.0, peers=PEERS)[0] == "gpu_memory"
    assert kernel_component(c, 3, memory_share=0.5, gemm_ratio=1.0, peers=PEERS)[0] == "workload"
    # GEMMs slow too: not memory; no GEMM to compare: HBM is never blamed
    assert kernel_component(c, 3, memory_share=0.8, gemm_ratio=1.2, peers=PEERS)[0] == "workload"
    assert kernel_component(c, 3, memory_share=0.8, gemm_ratio=None, peers=PEERS)[0] == "workload"


def test_a_lower_ceiling_gpu_class_is_hardware_but_no_fault_and_no_counters_is_the_gpu():
    c = gpus(r3={"max_sm_clock_mhz": 1755.0, "sm_clock_mhz": 1755.0})
    comp, why = kernel_component(c, 3, 0.0, 1.3, PEERS)
    assert comp == "gpu" and "lower ceiling" in why and "max SM clock 1755 vs 1980" in why
    assert kernel_component(CounterSummary(), 3, 0.0, 1.3, PEERS)[0] == "gpu"


def test_gpu_classes_agree_within_two_percent():
    assert same_class(H100, {**H100, "max_sm_clock_mhz": 1980.0 * 0.985})
    assert not same_class(H100, {**H100, "max_sm_clock_mhz": 1755.0})
    assert same_class(H100, {"power_limit_w": 700.0})   # unknown ceilings do not separate
    assert same_class(None, H100)


def test_a_board_capped_below_its_node_mates_is_their_model_and_throttled():
    # rank 3's enforced limit was lowered (nvidia-smi -pl, a PSU fault): same max clock and memory as
    # its node-mates, so the same model; its clock sits far below its ceiling, at the cap.
    capped = {"power_limit_w": 400.0, "power_w": 398.0, "sm_clock_mhz": 1245.0, "clock_ratio": 1245 / 1980,
              "throttle_share": 1.0}
    node = {r: "n0" if r < 4 else "n1" for r in range(8)}
    raw = gpus(r3=capped)
    assert class_peers(raw, 3, PEERS) == []                     # by its own limit, a class of one: never compared
    c = with_model_power_limits(raw, node)
    assert c.gpu[3]["model_power_limit_w"] == 700.0 and raw.gpu[3].get("model_power_limit_w") is None
    assert class_peers(c, 3, PEERS) == PEERS and len(set(gpu_classes(c, list(range(8))).values())) == 1
    comp, why = kernel_component(c, 3, 0.0, 1.5, PEERS)
    assert comp == "gpu" and "SM clock 1245 of 1980 MHz" in why and "power limit 400 W vs 700 W" in why
    # A whole node at the lower limit (a lower-TDP SKU of the same clock and memory) stays a class of its own,
    # and a rank without node-mates keeps its own limit.
    low = gpus(**{f"r{r}": {"power_limit_w": 400.0} for r in range(4)})
    assert len(set(gpu_classes(with_model_power_limits(low, node), list(range(8))).values())) == 2
    assert with_model_power_limits(raw, {3: "n0"}).gpu[3]["model_power_limit_w"] == 400.0
    # another max clock on the node is another model: its limit says nothing about rank 3's
    other = gpus(r3={"power_limit_w": 350.0, "max_sm_clock_mhz": 1755.0})
    assert with_model_power_limits(other, node).gpu[3]["model_power_limit_w"] == 350.0


def test_storage_when_a_node_waits_on_io_more_than_the_others():
    host = {"n0": {"iowait_pct": 25.0}, "n1": {"iowait_pct": 2.0}, "n2": {"iowait_pct": 3.0}}
    assert loader_component(CounterSummary(host=host), "n0")[0] == "storage"
    assert loader_component(CounterSummary(host=host), "n1")[0] == "dataloader"
    # high, but every node waits alike (+5 points needed): the loader, not this node's disk
    alike = {"n0": {"iowait_pct": IOWAIT_HIGH_PCT + 2}, "n1": {"iowait_pct": IOWAIT_HIGH_PCT}}
    assert loader_component(CounterSummary(host=alike), "n0")[0] == "dataloader"
    assert loader_component(CounterSummary(), "n0")[0] == "dataloader"


def test_host_cpu_when_saturated_beyond_the_other_nodes():
    host = {"n0": {"cpu_util_pct": 97.0}, "n1": {"cpu_util_pct": 40.0}, "n2": {"cpu_util_pct": 45.0}}
    assert host_component(CounterSummary(host=host), "n0")[0] == "host_cpu"
    busy = {"n0": {"cpu_util_pct": CPU_SATURATED_PCT + 5}, "n1": {"cpu_util_pct": CPU_SATURATED_PCT}}
    assert host_component(CounterSummary(host=busy), "n0")[0] == "python"
    assert host_component(CounterSummary(host={"n0": {"cpu_util_pct": 95.0}}), "n0")[0] == "host_cpu"


def test_pcie_reason_names_a_downgraded_link():
    c = CounterSummary(gpu={0: {"pcie_gen": 3.0, "max_pcie_gen": 5.0, "pcie_width": 16.0, "max_pcie_width": 16.0}})
    assert pcie_reason(c, 0) == "PCIe gen 3 of 5"
    assert pcie_reason(CounterSummary(), 0) == "host-device copies slower than peers"


def test_compute_bound_names():
    assert is_compute_bound("sm90_xmma_gemm_bf16") and is_compute_bound("aten::addmm")
    assert not is_compute_bound("flash_fwd_kernel") and not is_compute_bound("elementwise_add")


def test_a_loader_is_storage_by_iowait_and_without_host_counters_by_the_shape_of_its_stalls():
    from .attribution import loader_component
    c = CounterSummary(host={"n0": {"iowait_pct": 35.0}, "n1": {"iowait_pct": 2.0}, "n2": {"iowait_pct": 1.0}})
    for bursty in (False, True):                         # with counters, iowait decides, not the shape
        assert loader_component(c, "n0", bursty)[0] == "storage"
        assert loader_component(c, "n1", bursty)[0] == "dataloader"
    blind = CounterSummary(host={"n1": {"iowait_pct": 2.0}})
    comp, why = loader_component(blind, "n0", bursty=False)  # a steady deficit: the loader, storage not ruled out
    assert comp == "dataloader" and "not ruled out" in why
    comp, why = loader_component(blind, "n0", bursty=True)   # long stalls in a few steps: storage, suspected
    assert comp == "storage" and "suspected" in why
