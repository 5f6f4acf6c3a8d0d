"""Counter summaries from hand-built samples: levels, throttling share, increases across resets, digest keys."""

from __future__ import annotations

import numpy as np

import msgspec

from eroica.models.columns import Columns, from_records
from eroica.models.digest import WindowDigest
from eroica.models.records import GpuRecord, NicRecord

from .counters import THROTTLE_MASK, _medians, _sample_grid, _sums_by_value, from_digest, summarise_gpu, summarise_nic
from .grouping import group_quantiles

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


def test_medians_and_sums_of_unequal_groups_are_the_grouped_ones():
    """Entities with unequal sample counts, NaN samples, -0.0 and ties: the grid's medians and value-ordered sums
    are those of the grouped sort (and of ``np.lexsort``), bit for bit; a grid mostly padding is not built."""
    rng = np.random.default_rng(21)
    pool = np.array([0.0, -0.0, 1.5, 2.0, 100.0, 1e17, np.nan])
    for trial in range(200):
        n = int(rng.integers(1, 20))
        ids = rng.integers(0, n, int(rng.integers(1, 200)))
        if trial % 5 == 0:  # one entity with most samples: too sparse a grid
            ids[: ids.size * 3 // 4] = 0
        cols = Columns("gpu", {k: rng.choice(pool[:6] if k == "b" else pool, ids.size) for k in "ab"}, {})
        got = _medians(ids, n, cols, ("a", "b"))
        for k in "ab":
            v = cols.arrays[k]
            ok = ~np.isnan(v)
            want = group_quantiles(ids[ok], v[ok], n, (0.5,))[0] if ok.any() else np.full(n, np.nan)
            assert got[k].tobytes() == want.tobytes(), (trial, k)
        v = cols.arrays["b"]
        o = np.lexsort((v, ids))
        want_sums = [np.bincount(ids[o], weights=v[o] ** p, minlength=n) for p in (1, 2)]
        assert all(g.tobytes() == w.tobytes() for g, w in zip(_sums_by_value(ids, n, v, None, 1, 2), want_sums))
    sparse = np.concatenate((np.zeros(5000, dtype=np.int64), np.arange(1, 3000)))
    assert _sample_grid(sparse, 3000) is None


def _nic_samples(rng: np.random.Generator) -> list[NicRecord]:
    """Ports sampled unequally often, some counters missing now and then (NaN), one counter reset."""
    out = []
    for node in range(3):
        for port in range(2):
            for i in range(int(rng.integers(3, 9))):
                gaps = {k: None if rng.random() < 0.3 else float(rng.integers(0, 50) + 10 * i)
                        for k in ("symbol_errors", "retransmits", "cnp_sent", "xmit_wait")}
                out.append(NicRecord(job="j", node=f"n{node}", nic=f"mlx5_{port}", ts_ns=i * S + node, port=1,
                                     tx_Bps=None if rng.random() < 0.2 else float(rng.integers(0, 9)) * 1e9,
                                     rx_Bps=float(rng.integers(0, 9)) * 1e9, link_gbps=400.0, link_up=1.0,
                                     rx_errors=float(i), link_downed=0.0, tx_discards=float(i % 3), **gaps))
    return out


def test_counter_levels_do_not_depend_on_record_order():
    """Bit for bit (NaN included), whatever the order of the samples; ports come in their codes' order."""
    rng = np.random.default_rng(22)
    for _ in range(20):
        recs = _nic_samples(rng)
        want = msgspec.msgpack.encode(sorted(summarise_nic(from_records("nic", recs)).items()))
        order = rng.permutation(len(recs))
        got = summarise_nic(from_records("nic", [recs[i] for i in order]))
        assert msgspec.msgpack.encode(sorted(got.items())) == want
