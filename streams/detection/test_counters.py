"""Counter summaries from hand-built samples: levels, throttling share, increases across resets, digest keys."""

from __future__ import annotations

import numpy as np

from eroica.models.columns import from_records
from eroica.models.digest import WindowDigest
from eroica.models.records import GpuRecord

from .counters import THROTTLE_MASK, from_digest, summarise_gpu

S = 10**9
HW_SLOWDOWN, IDLE = 0x8, 0x1


def gpu_samples(rank: int, clocks: list[float], reasons: list[int], ecc: list[int]) -> list[GpuRecord]:
    return [GpuRecord(job="j", node="node-0", rank=rank, gpu=rank % 8, ts_ns=i * S, sm_clock_mhz=c, max_sm_clock_mhz=2000.0,
                      throttle_reasons=t, ecc_uncorrected=e)
            for i, (c, t, e) in enumerate(zip(clocks, reasons, ecc))]


def test_clock_ratio_throttle_share_and_ecc_increase():
    recs = gpu_samples(3, [1500, 1500, 1400, 1600], [HW_SLOWDOWN, 0, HW_SLOWDOWN, IDLE], [10, 15, 3, 5])
    recs += gpu_samples(4, [2000] * 4, [IDLE] * 4, [7] * 4)
    gpu, index = summarise_gpu(from_records("gpu", recs))
    assert index == {3: 3, 4: 4}
    g = gpu[3]
    assert g["sm_clock_mhz"] == 1500 and g["clock_ratio"] == 0.75
    # only slowdown reasons count (idle does not): 2 of 4 samples
    assert IDLE & THROTTLE_MASK == 0 and g["throttle_share"] == 0.5
    # the counter restarted after 15: 5 before, then 3 + 2 after (never 15 - 3 or max - min)
    assert g["ecc_increase"] == 10
    assert gpu[4]["throttle_share"] == 0.0 and gpu[4]["ecc_increase"] == 0 and gpu[4]["clock_ratio"] == 1.0


def test_record_order_changes_nothing():
    recs = gpu_samples(0, [1500, 1700, 1600], [HW_SLOWDOWN, 0, 0], [1, 4, 2])
    a, _ = summarise_gpu(from_records("gpu", recs))
    b, _ = summarise_gpu(from_records("gpu", recs[::-1]))
    assert a[0]["ecc_increase"] == b[0]["ecc_increase"] == 5   # 1 -> 4, then a reset to 2
    assert a[0]["throttle_share"] == b[0]["throttle_share"]


def test_without_reasons_or_max_clock_the_fields_say_unknown():
    recs = [GpuRecord(job="j", node="n", rank=0, gpu=0, ts_ns=0, sm_clock_mhz=1500.0)]
    g = summarise_gpu(from_records("gpu", recs))[0][0]
    assert np.isnan(g["throttle_share"]) and np.isnan(g["ecc_increase"]) and "clock_ratio" not in g


def test_a_digests_nic_keys_split_into_node_and_port():
    d = WindowDigest("j", 0, 1, gpu={1: {"clock_ratio": 1.0}}, gpu_index={1: 1},
                     nic={"node-1/mlx5_0": {"link_gbps": 400.0}, "rack/a/node-2/mlx5_1:2": {"link_gbps": 200.0}},
                     host={"node-1": {"iowait_pct": 1.0}})
    c = from_digest(d)
    assert set(c.nic) == {("node-1", "mlx5_0"), ("rack/a/node-2", "mlx5_1:2")}
    assert c.gpu == {1: {"clock_ratio": 1.0}} and c.gpu_index == {1: 1} and c.host == {"node-1": {"iowait_pct": 1.0}}
