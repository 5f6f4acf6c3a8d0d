"""A throttled GPU among too few peers, found by its clock against its own ceiling (hand-built patterns)."""

from __future__ import annotations

import numpy as np

from . import attribution as attr
from .clocks import KERNELS_FN, MATERIAL, clock_findings
from .collectives import CollectiveStats
from .counters import CounterSummary
from .expected import expected_findings
from .findings import Finding
from .layout import Layout
from .patterns import K_KERNEL, K_PYTHON
from .test_expected import STEP_NS, patterns

HEALTHY = {"sm_clock_mhz": 1980.0, "max_sm_clock_mhz": 1980.0, "clock_ratio": 1.0, "throttle_share": 0.0,
           "power_w": 540.0, "power_limit_w": 700.0, "temp_c": 62.0, "sm_util_pct": 95.0, "mem_total_bytes": 85e9}
# the simulator's thermal throttle: 1410 of 1980 MHz, thermal reasons in every sample, power well below the limit
THERMAL = {**HEALTHY, "sm_clock_mhz": 1410.0, "clock_ratio": 1410.0 / 1980.0, "throttle_share": 1.0,
           "power_w": 415.0, "temp_c": 88.5}


def job(n: int, throttled: dict[int, dict[str, float]], kernel_share: float = 0.6,
        nodes: int = 1) -> tuple[list[Finding], Layout]:
    """``n`` ranks in one role (``nodes`` nodes), kernels ``kernel_share`` of the step: the clock test's findings."""
    per_step = np.zeros((n, 2))
    per_step[:, 0] = kernel_share * STEP_NS
    per_step[:, 1] = 0.1 * STEP_NS
    p = patterns(per_step, [K_KERNEL, K_PYTHON])
    layout = Layout(rank_node={r: f"node-{r * nodes // n}" for r in range(n)}, rank_stage={r: 0 for r in range(n)})
    gpu = {r: {**HEALTHY, **throttled.get(r, {})} for r in range(n)}
    counters = attr.with_model_power_limits(CounterSummary(gpu=gpu, gpu_index={r: r for r in range(n)}),
                                            layout.rank_node)
    return clock_findings(p, layout, counters, STEP_NS), layout


def test_a_thermally_throttled_gpu_among_two_or_three_ranks_is_found():
    for n in (1, 2, 3):
        found, _ = job(n, {n - 1: THERMAL})
        assert [(f.component, f.scope, f.rank, f.fn) for f in found] == [("gpu", "rank", n - 1, KERNELS_FN)]
        f = found[0]
        assert abs(f.slowdown - 1980 / 1410) < 1e-3 and f.steady and f.confidence == 0.95
        assert f.culprits == [n - 1] and f.peers == [] and f.gpu == n - 1
        assert "SM clock 1410 of 1980 MHz" in f.summary and "not the power cap" in f.summary
        assert f.evidence["peer_test"] == {"ranks_like_it": n, "needed": 4}
        assert f.evidence["kernel_ns_per_step"]["culprit"] == round(0.6 * STEP_NS)
    # healthy small jobs: nothing
    assert job(3, {})[0] == []


def test_ranks_the_peer_test_compares_are_left_to_it():
    assert job(4, {1: THERMAL})[0] == []
    assert job(8, {1: THERMAL})[0] == []


def test_the_power_cap_is_the_models_operating_point_unless_something_says_otherwise():
    at_cap = {**THERMAL, "power_w": 690.0, "temp_c": 75.0}
    assert job(1, {0: at_cap})[0] == []             # alone at its cap: heavy kernels on this model
    assert job(3, {r: at_cap for r in range(3)})[0] == []   # every GPU of its role alike
    # its role's other GPUs of the model do the same work at full clock: this board is not fine
    found, _ = job(3, {1: at_cap})
    assert [f.rank for f in found] == [1] and "2 GPUs of its model in its role run at full clock" in found[0].summary
    # a board whose limit is set below its node-mates' of the same model
    capped = {**at_cap, "power_w": 495.0, "power_limit_w": 500.0}
    found, _ = job(3, {1: capped})
    assert [f.rank for f in found] == [1] and "power limit 500 W vs 700 W" in found[0].summary


def test_a_low_clock_without_slowdown_reasons_or_load_is_not_throttling():
    # NVML reports the reasons and none is a slowdown: idle or application clocks
    assert job(2, {1: {**THERMAL, "throttle_share": 0.1}})[0] == []
    # no reasons reported: a busy GPU's clock alone says it, with less confidence and not as a level
    found, _ = job(2, {1: {**THERMAL, "throttle_share": float("nan")}})
    assert [f.rank for f in found] == [1] and not found[0].steady and 0.5 <= found[0].confidence < 0.9
    assert job(2, {1: {**THERMAL, "throttle_share": float("nan"), "sm_util_pct": 20.0}})[0] == []
    # at the ceiling, or no ceiling reported
    assert job(2, {1: {**THERMAL, "clock_ratio": 0.95}})[0] == []
    assert job(2, {1: {k: v for k, v in THERMAL.items() if k != "clock_ratio"}})[0] == []


def test_a_gpu_that_hardly_computes_costs_nothing():
    # kernels x (1 - 0.712) below MATERIAL of the step
    share = 0.9 * MATERIAL / (1 - 1410 / 1980)
    assert job(2, {1: THERMAL}, kernel_share=share)[0] == []
    assert [f.rank for f in job(2, {1: THERMAL}, kernel_share=1.2 * MATERIAL / (1 - 1410 / 1980))[0]] == [1]


def test_a_gpu_model_too_rare_in_its_role_is_judged_by_its_clock():
    nvl = {"max_sm_clock_mhz": 1785.0, "power_limit_w": 400.0, "mem_total_bytes": 95e9, "sm_clock_mhz": 1785.0,
           "power_w": 300.0}
    hot_nvl = {**nvl, "sm_clock_mhz": 1200.0, "clock_ratio": 1200.0 / 1785.0, "throttle_share": 1.0, "power_w": 250.0}
    # 8 ranks on two nodes, the second node's last two ranks the only NVL boards: kernels never peer-compared
    found, _ = job(8, {6: nvl, 7: hot_nvl}, nodes=2)
    assert [f.rank for f in found] == [7]
    assert job(8, {4: nvl, 5: nvl, 6: nvl, 7: hot_nvl}, nodes=2)[0] == []   # four of them: the peer test's


def test_expected_findings_carry_the_clock_test():
    per_step = np.zeros((3, 1))
    per_step[:, 0] = 0.6 * STEP_NS
    p = patterns(per_step, [K_KERNEL])
    layout = Layout(rank_node={r: "node-0" for r in range(3)}, rank_stage={r: 0 for r in range(3)})
    counters = CounterSummary(gpu={0: HEALTHY, 1: THERMAL, 2: HEALTHY})
    coll = CollectiveStats(np.arange(3), np.zeros(3), np.zeros(3), [])
    out = expected_findings(p, layout, counters, coll, [], STEP_NS)
    assert [(f.component, f.scope, f.rank) for f in out] == [("gpu", "rank", 1)]
