"""Columnar batches: records -> numpy columns -> records, concat, take, strings."""

from __future__ import annotations

import json
import math

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eroica.models import columns as C
from eroica.models import records as R
from eroica.models.reader import validate_line

COLUMN_TYPES = ["fn", "gpu", "nic", "host"]

FN_MIN = {"type": "fn", "job": "j1", "node": "n1", "rank": 0, "step": 0, "fn": "train.forward", "kind": "python",
          "ts_ns": 10, "dur_ns": 5}
FN_FULL = {**FN_MIN, "fn": "ncclAllReduce", "kind": "collective", "bytes": 1 << 20, "op": "all_reduce",
           "group": "pg0", "stream": 7, "in_flight": True, "stack": "main;train;step"}
GPU_MIN = {"type": "gpu", "job": "j1", "node": "n1", "rank": 3, "gpu": 1, "ts_ns": 99}
GPU_FULL = {**GPU_MIN, "sm_util_pct": 97.5, "mem_util_pct": 40.0, "sm_clock_mhz": 1410.0,
            "max_sm_clock_mhz": 1980.0, "power_w": 300.25, "power_limit_w": 400.0, "temp_c": -3.5,
            "throttle_reasons": 0x40, "pcie_gen": 4, "max_pcie_gen": 5, "pcie_width": 8, "max_pcie_width": 16,
            "pcie_tx_Bps": 1.5e9, "pcie_rx_Bps": 2e9, "nvlink_tx_Bps": 0.0, "nvlink_rx_Bps": 3e11,
            "ecc_uncorrected": 0, "xid": 79, "mem_used_bytes": 70 << 30, "mem_total_bytes": 80 << 30}
NIC_MIN = {"type": "nic", "job": "j1", "node": "n1", "nic": "mlx5_0", "ts_ns": 5}
NIC_FULL = {**NIC_MIN, "port": 1, "tx_Bps": 1e10, "rx_Bps": 2.5e10, "link_gbps": 400.0, "link_up": False,
            "tx_discards": 3, "rx_errors": 0, "symbol_errors": 12, "link_downed": 1, "retransmits": 99,
            "cnp_sent": 1000, "xmit_wait": 2**50}
HOST_MIN = {"type": "host", "job": "j1", "node": "n1", "ts_ns": 5}
HOST_FULL = {**HOST_MIN, "cpu_util_pct": 350.0, "load1": 12.5, "iowait_pct": 0.0, "mem_used_pct": 55.5,
             "steal_pct": 1.25}
SAMPLES = {"fn": (FN_MIN, FN_FULL), "gpu": (GPU_MIN, GPU_FULL), "nic": (NIC_MIN, NIC_FULL),
           "host": (HOST_MIN, HOST_FULL)}


def decode(objs: list[dict]) -> list:
    return [validate_line(json.dumps(o).encode()) for o in objs]


def cols_of(objs: list[dict]) -> C.Columns:
    return C.from_records(objs[0]["type"], decode(objs))


def mixed(type_: str, n: int = 6) -> list[dict]:
    """n records of one type alternating minimal/full, with varying strings."""
    lo, hi = SAMPLES[type_]
    out = []
    for i in range(n):
        o = dict(hi if i % 2 else lo)
        o["job"] = f"job{i % 2}"
        o["node"] = f"node{i % 3}"
        o["ts_ns"] = 1000 + i
        out.append(o)
    return out


# --------------------------------------------------------------------------
# Schema.


@pytest.mark.parametrize("t", COLUMN_TYPES)
def test_schema_covers_every_struct_field(t):
    assert set(C.SCHEMAS[t]) == set(R.RECORD_TYPES[t].__struct_fields__)
    assert C.RECORD_CLASSES[t] is R.RECORD_TYPES[t]


@pytest.mark.parametrize("t", COLUMN_TYPES)
def test_dtypes_follow_schema(t):
    cols = cols_of(mixed(t))
    for name, dtype in C.SCHEMAS[t].items():
        want = np.dtype("i4") if dtype == C.CAT else np.dtype(dtype)
        assert cols.arrays[name].dtype == want, name
        assert len(cols.arrays[name]) == len(cols)
    assert set(cols.vocab) == {k for k, d in C.SCHEMAS[t].items() if d == C.CAT}


# --------------------------------------------------------------------------
# Round trip.


@pytest.mark.parametrize("t", COLUMN_TYPES)
@pytest.mark.parametrize("which", ["min", "full", "mixed"])
def test_round_trip_equals_input(t, which):
    objs = {"min": [SAMPLES[t][0]], "full": [SAMPLES[t][1]], "mixed": mixed(t, 9)}[which]
    back = C.to_records(cols_of(objs))
    assert back == objs
    for got, want in zip(back, objs):
        assert set(got) == set(want)  # absent optionals stay absent
        for k, v in want.items():
            assert type(got[k]) is type(v), (k, got[k], v)  # ints stay int, floats float, bools bool


def test_round_trip_keeps_int_counters_int_and_bool_bool():
    (g,) = C.to_records(cols_of([GPU_FULL]))
    for k in ("throttle_reasons", "xid", "mem_used_bytes", "pcie_gen"):
        assert type(g[k]) is int
    (n,) = C.to_records(cols_of([NIC_FULL]))
    assert n["link_up"] is False and type(n["xmit_wait"]) is int
    (n,) = C.to_records(cols_of([{**NIC_FULL, "link_up": True}]))
    assert n["link_up"] is True


def test_in_flight_false_is_the_default_and_reads_back_absent():
    (f,) = C.to_records(cols_of([{**FN_MIN, "in_flight": False}]))
    assert "in_flight" not in f
    (f,) = C.to_records(cols_of([{**FN_MIN, "in_flight": True}]))
    assert f["in_flight"] is True


def test_absent_values_are_minus_one_and_nan():
    cols = cols_of([FN_MIN, FN_FULL])
    assert cols.arrays["bytes"].tolist() == [-1, 1 << 20]
    assert cols.arrays["op"].tolist() == [-1, C.OP_CODE["all_reduce"]]
    assert cols.arrays["stream"].tolist() == [-1, 7]
    assert cols.arrays["in_flight"].tolist() == [False, True]
    assert cols.strings("group").tolist() == ["", "pg0"]
    assert cols.arrays["kind"].tolist() == [C.KIND_CODE["python"], C.KIND_CODE["collective"]]
    g = cols_of([GPU_MIN, GPU_FULL])
    assert math.isnan(g.arrays["temp_c"][0]) and g.arrays["temp_c"][1] == -3.5
    assert math.isnan(g.arrays["xid"][0]) and g.arrays["xid"][1] == 79


def test_zero_values_are_not_absent():
    objs = [{**FN_FULL, "bytes": 0, "stream": 0, "rank": 0, "step": 0, "ts_ns": 0, "dur_ns": 0},
            {**GPU_MIN, "gpu": 0, "xid": 0, "temp_c": 0.0, "sm_util_pct": -0.0}]
    assert C.to_records(cols_of(objs[:1])) == objs[:1]
    assert C.to_records(cols_of(objs[1:])) == objs[1:]


def test_empty_optional_string_reads_back_absent():
    # Documented encoding: an absent string and "" share the code of "", so an
    # explicit empty group/stack reads back as absent; required strings stay.
    (f,) = C.to_records(cols_of([{**FN_MIN, "group": "", "stack": "", "job": "", "node": "", "fn": ""}]))
    assert f == {**FN_MIN, "job": "", "node": "", "fn": ""}


def test_extreme_values_round_trip():
    objs = [{**FN_FULL, "ts_ns": R.MAX_TS_NS, "dur_ns": R.MAX_DUR_NS, "step": 2**63 - 1, "bytes": 2**63 - 1,
             "rank": 2**31 - 1, "stream": 2**31 - 1, "job": "é" * 256, "stack": "😀" * 256}]
    assert C.to_records(cols_of(objs)) == objs
    g = [{**GPU_FULL, "gpu": 2**31 - 1, "mem_total_bytes": 2**53, "power_w": 1.7976931348623157e308}]
    assert C.to_records(cols_of(g)) == g
    n = [{**NIC_FULL, "port": 2**31 - 1}]
    assert C.to_records(cols_of(n)) == n


def test_from_records_of_nothing_is_empty():
    for t in COLUMN_TYPES:
        cols = C.from_records(t, [])
        assert len(cols) == 0 and C.to_records(cols) == []


# --------------------------------------------------------------------------
# strings(), code_of().


def test_strings_decodes_codes():
    objs = mixed("fn", 7)
    cols = cols_of(objs)
    for name in ("job", "node", "fn"):
        assert cols.strings(name).tolist() == [o[name] for o in objs]
        assert cols.strings(name).dtype == object
    assert sorted(cols.vocab["node"]) == ["node0", "node1", "node2"]  # each string once
    assert len(set(cols.arrays["node"].tolist())) == 3


def test_code_of():
    cols = cols_of(mixed("host", 5))
    for s in ("node0", "node1", "node2"):
        code = cols.code_of("node", s)
        assert code >= 0 and cols.vocab["node"][code] == s
        assert (cols.strings("node") == s).tolist() == (cols.arrays["node"] == code).tolist()
    assert cols.code_of("node", "nope") == -1


# --------------------------------------------------------------------------
# take().


def test_take_mask_and_index():
    objs = mixed("gpu", 8)
    cols = cols_of(objs)
    mask = np.array([i % 3 == 0 for i in range(8)])
    sub = cols.take(mask)
    assert len(sub) == 3
    assert sub.vocab is cols.vocab
    assert C.to_records(sub) == [o for o, m in zip(objs, mask) if m]
    idx = np.array([7, 0, 0, 4])
    sub = cols.take(idx)
    assert C.to_records(sub) == [objs[i] for i in idx]
    assert sub.strings("node").tolist() == [objs[i]["node"] for i in idx]


def test_take_nothing():
    cols = cols_of(mixed("nic", 4))
    sub = cols.take(np.zeros(4, dtype=bool))
    assert len(sub) == 0
    assert sub.strings("nic").tolist() == []
    assert C.to_records(sub) == []
    assert len(cols.take(np.array([], dtype=np.int64))) == 0


# --------------------------------------------------------------------------
# empty().


@pytest.mark.parametrize("t", COLUMN_TYPES)
def test_empty(t):
    cols = C.empty(t)
    assert cols.type == t and len(cols) == 0
    assert set(cols.arrays) == set(C.SCHEMAS[t])
    for name, dtype in C.SCHEMAS[t].items():
        assert cols.arrays[name].dtype == (np.dtype("i4") if dtype == C.CAT else np.dtype(dtype))
        assert len(cols.arrays[name]) == 0
    assert cols.vocab == {k: [] for k, d in C.SCHEMAS[t].items() if d == C.CAT}
    assert C.to_records(cols) == []
    for name in cols.vocab:
        assert cols.strings(name).tolist() == []
        assert cols.code_of(name, "x") == -1


# --------------------------------------------------------------------------
# concat().


def test_concat_merges_vocabularies():
    a = cols_of([{**HOST_MIN, "node": "a"}, {**HOST_MIN, "node": "b"}, {**HOST_MIN, "node": "a"}])
    b = cols_of([{**HOST_MIN, "node": "c"}, {**HOST_MIN, "node": "a"}])
    c = cols_of([{**HOST_MIN, "node": "b"}, {**HOST_MIN, "node": "d"}])
    # Same codes mean different strings in different batches.
    assert a.arrays["node"][0] == b.arrays["node"][0] == c.arrays["node"][0] == 0
    m = C.concat([a, b, c])
    assert len(m) == 7
    assert m.strings("node").tolist() == ["a", "b", "a", "c", "a", "b", "d"]
    assert sorted(m.vocab["node"]) == ["a", "b", "c", "d"]  # each string once
    assert len(m.vocab["node"]) == len(set(m.vocab["node"]))
    assert m.arrays["node"].dtype == np.int32
    assert m.vocab["job"] == ["j1"] and set(m.arrays["job"].tolist()) == {0}
    assert C.to_records(m) == C.to_records(a) + C.to_records(b) + C.to_records(c)


@pytest.mark.parametrize("t", COLUMN_TYPES)
def test_concat_round_trip(t):
    objs = mixed(t, 11)
    parts = [cols_of(objs[:3]), cols_of(objs[3:4]), cols_of(objs[4:])]
    m = C.concat(parts)
    assert C.to_records(m) == objs
    for name, dtype in C.SCHEMAS[t].items():
        assert m.arrays[name].dtype == (np.dtype("i4") if dtype == C.CAT else np.dtype(dtype))


def test_concat_skips_empty_batches_and_rejects_all_empty():
    a = cols_of(mixed("fn", 3))
    assert C.concat([C.empty("fn"), a, C.from_records("fn", [])]) is a
    b = cols_of(mixed("fn", 2))
    assert C.to_records(C.concat([C.empty("fn"), a, C.empty("fn"), b])) == C.to_records(a) + C.to_records(b)
    with pytest.raises(ValueError):
        C.concat([C.empty("fn"), C.empty("fn")])
    with pytest.raises(ValueError):
        C.concat([])


def test_concat_of_taken_batches():
    objs = mixed("fn", 10)
    cols = cols_of(objs)
    left, right = cols.take(np.arange(10) % 2 == 0), cols.take(np.arange(10) % 2 == 1)
    m = C.concat([right, left])
    assert C.to_records(m) == [objs[i] for i in (1, 3, 5, 7, 9, 0, 2, 4, 6, 8)]


# --------------------------------------------------------------------------
# Property-based: any valid record validates and round-trips through columns.

S256 = st.text(max_size=256)
S256_NONEMPTY = st.text(min_size=1, max_size=256)  # "" reads back as absent for optional strings
I64 = st.integers(0, 2**63 - 1)
TS = st.integers(0, R.MAX_TS_NS)     # the contract's bounds on times and durations (telemetry-v1 "Bounds")
DUR = st.integers(0, R.MAX_DUR_NS)
I32 = st.integers(0, 2**31 - 1)
F = st.floats(allow_nan=False, allow_infinity=False)
# Integer counters ride in float64 columns: exact up to 2**53.
I53 = st.integers(0, 2**53)


def record(type_: str, required: dict, optional: dict):
    @st.composite
    def build(draw):
        obj = {"type": type_, **{k: draw(v) for k, v in required.items()}}
        for k in draw(st.lists(st.sampled_from(sorted(optional)), unique=True)):
            obj[k] = draw(optional[k])
        return obj
    return build()


GPU_FLOATS = ("sm_util_pct", "mem_util_pct", "sm_clock_mhz", "max_sm_clock_mhz", "power_w", "power_limit_w",
              "temp_c", "pcie_tx_Bps", "pcie_rx_Bps", "nvlink_tx_Bps", "nvlink_rx_Bps")
GPU_INTS = ("throttle_reasons", "pcie_gen", "max_pcie_gen", "pcie_width", "max_pcie_width", "ecc_uncorrected",
            "xid", "mem_used_bytes", "mem_total_bytes")
NIC_INTS = ("tx_discards", "rx_errors", "symbol_errors", "link_downed", "retransmits", "cnp_sent", "xmit_wait")

RECORDS = {
    "fn": record("fn", {"job": S256, "node": S256, "rank": I32, "step": I64, "fn": S256,
                        "kind": st.sampled_from(R.FN_KINDS), "ts_ns": TS, "dur_ns": DUR},
                 {"bytes": I64, "op": st.sampled_from(R.COLLECTIVE_OPS), "group": S256_NONEMPTY, "stream": I32,
                  "in_flight": st.just(True), "stack": S256_NONEMPTY}),
    "gpu": record("gpu", {"job": S256, "node": S256, "rank": I32, "gpu": I32, "ts_ns": TS},
                  {**{k: F for k in GPU_FLOATS}, **{k: I53 for k in GPU_INTS}}),
    "nic": record("nic", {"job": S256, "node": S256, "nic": S256, "ts_ns": TS},
                  {"port": I32, "tx_Bps": F, "rx_Bps": F, "link_gbps": F, "link_up": st.booleans(),
                   **{k: I53 for k in NIC_INTS}}),
    "host": record("host", {"job": S256, "node": S256, "ts_ns": TS},
                   {k: F for k in ("cpu_util_pct", "load1", "iowait_pct", "mem_used_pct", "steal_pct")}),
}
JOB_RECORD = record("job", {"job": S256, "world_size": st.integers(1, 2**31 - 1)},
                    {"ts_ns": TS, "rank_nodes": st.lists(S256, max_size=5),
                     "rank_stages": st.lists(I64, max_size=5), "rank_dp": st.lists(I64, max_size=5),
                     "dp": st.integers(1, 2**31 - 1), "tp": st.integers(1, 2**31 - 1),
                     "pp": st.integers(1, 2**31 - 1)})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(COLUMN_TYPES).flatmap(lambda t: st.lists(RECORDS[t], min_size=1, max_size=8)),
       st.data())
def test_valid_records_validate_and_round_trip(objs, data):
    t = objs[0]["type"]
    recs = [validate_line(json.dumps(o, ensure_ascii=data.draw(st.booleans())).encode()) for o in objs]
    assert all(type(r) is R.RECORD_TYPES[t] for r in recs)
    assert [msgspec.json.decode(R.encode_record(r)) for r in recs] == objs
    cols = C.from_records(t, recs)
    assert len(cols) == len(objs)
    assert C.to_records(cols) == objs
    # Any split, concatenated back, gives the same records.
    cut = data.draw(st.integers(0, len(objs)))
    parts = [C.from_records(t, recs[:cut]), C.from_records(t, recs[cut:])]
    assert C.to_records(C.concat(parts)) == objs


@settings(max_examples=100, deadline=None)
@given(JOB_RECORD)
def test_valid_job_records_validate(obj):
    rec = validate_line(json.dumps(obj).encode())
    assert type(rec) is R.JobRecord
    assert msgspec.json.decode(R.encode_record(rec)) == obj


def test_nccl_kernels_recorded_as_kernels_are_read_as_collectives():
    """A CUPTI-style collector writes a collective as the NCCL kernel it launches: read it as one."""
    def fn(name: str, kind: str, op: str | None = None) -> R.FnRecord:
        return R.FnRecord(job="j", node="n", rank=0, step=1, fn=name, kind=kind, ts_ns=1, dur_ns=2, op=op)

    recs = [fn("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "kernel"), fn("ncclKernel_SendRecv", "kernel"),
            fn("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "kernel", "reduce_scatter"),
            fn("sm90_xmma_gemm_bf16bf16", "kernel"), fn("ncclAllReduce", "python"),
            fn("rcclKernel_AllGather_RING", "kernel"), fn("ncclDevKernel_Generic", "kernel")]
    out = C.collective_kernels(C.from_records("fn", recs))
    kinds = [R.FN_KINDS[k] for k in out.arrays["kind"]]
    ops = [R.COLLECTIVE_OPS[o] if o >= 0 else None for o in out.arrays["op"]]
    assert kinds == ["collective", "collective", "collective", "kernel", "python", "collective", "collective"]
    assert ops == ["all_reduce", "send", "reduce_scatter", None, None, "all_gather", None]
    plain = C.from_records("fn", [fn("sm90_xmma_gemm_bf16bf16", "kernel")])
    assert C.collective_kernels(plain) is plain  # nothing to change: the same batch, no copy


def _concat_one_by_one(batches: list[C.Columns], name: str) -> tuple[np.ndarray, list[str]]:
    """The plain merge: every batch's vocabulary mapped string by string, in order."""
    table: dict[str, int] = {}
    parts = []
    for b in batches:
        remap = np.fromiter((table.setdefault(s, len(table)) for s in b.vocab[name]), dtype=np.int32,
                            count=len(b.vocab[name]))
        parts.append(remap[b.arrays[name]] if len(remap) else b.arrays[name])
    return np.concatenate(parts), list(table)


VOCABS = [["a", "b", "c"], ["c", "a"], ["x"], ["b", "z", "a", "q"], ["a", "b"]]  # the last: a prefix (no remap)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(range(len(VOCABS))), st.lists(st.integers(0, 3), min_size=1, max_size=12)),
                min_size=2, max_size=6))
def test_concat_merges_repeated_vocabularies_as_one_by_one(spec) -> None:
    batches = []
    for v, picks in spec:
        voc = VOCABS[v]
        arrays = {name: (np.array([p % len(voc) for p in picks], dtype=np.int32) if d == C.CAT
                         else np.zeros(len(picks), dtype=d)) for name, d in C.SCHEMAS["fn"].items()}
        batches.append(C.Columns("fn", arrays, {name: list(voc) for name, d in C.SCHEMAS["fn"].items() if d == C.CAT}))
    out = C.concat(batches)
    for name, d in C.SCHEMAS["fn"].items():
        if d == C.CAT:
            codes, vocab = _concat_one_by_one(batches, name)
            assert out.vocab[name] == vocab and out.arrays[name].dtype == np.int32
            assert np.array_equal(out.arrays[name], codes)
