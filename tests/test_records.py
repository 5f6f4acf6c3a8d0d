"""Validation of input records against the contract (shared/spec/telemetry-v1.md).

The field tables below are written from the spec, not derived from the structs,
so a struct that drifts from the contract fails here. Every rejection must come
with a reason that names the field path (``$.field``) and the rule broken.
"""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eroica.models import records as R
from eroica.models.reader import parse_lines, reason_of, validate_line

# --------------------------------------------------------------------------
# The contract, as tables.

S, I, F, B, KIND, OP, LS, LI, POS = "str", "int", "float", "bool", "kind", "op", "list[str]", "list[int]", "int>=1"  # noqa: E741

REQUIRED: dict[str, dict[str, str]] = {
    "fn": {"job": S, "node": S, "rank": I, "step": I, "fn": S, "kind": KIND, "ts_ns": I, "dur_ns": I},
    "gpu": {"job": S, "node": S, "rank": I, "gpu": I, "ts_ns": I},
    "nic": {"job": S, "node": S, "nic": S, "ts_ns": I},
    "host": {"job": S, "node": S, "ts_ns": I},
    "job": {"job": S, "world_size": POS},
}

OPTIONAL: dict[str, dict[str, str]] = {
    "fn": {"bytes": I, "op": OP, "group": S, "stream": I, "in_flight": B, "stack": S},
    "gpu": {
        **{f: F for f in ("sm_util_pct", "mem_util_pct", "sm_clock_mhz", "max_sm_clock_mhz", "power_w",
                          "power_limit_w", "temp_c", "pcie_tx_Bps", "pcie_rx_Bps", "nvlink_tx_Bps",
                          "nvlink_rx_Bps")},
        **{f: I for f in ("throttle_reasons", "pcie_gen", "max_pcie_gen", "pcie_width", "max_pcie_width",
                          "ecc_uncorrected", "xid", "mem_used_bytes", "mem_total_bytes")},
    },
    "nic": {
        "port": I, "tx_Bps": F, "rx_Bps": F, "link_gbps": F, "link_up": B,
        **{f: I for f in ("tx_discards", "rx_errors", "symbol_errors", "link_downed", "retransmits",
                          "cnp_sent", "xmit_wait")},
    },
    "host": {f: F for f in ("cpu_util_pct", "load1", "iowait_pct", "mem_used_pct", "steal_pct")},
    "job": {"ts_ns": I, "rank_nodes": LS, "rank_stages": LI, "rank_dp": LI, "rank_roles": LS, "dp": POS, "tp": POS, "pp": POS},
}

TYPES = list(REQUIRED)

SAMPLE = {S: "x", I: 3, F: 2.5, B: True, KIND: "kernel", OP: "all_reduce", LS: ["a", "b"], LI: [0, 1], POS: 2}

MINIMAL: dict[str, dict] = {
    t: {"type": t, **{f: SAMPLE[k] for f, k in REQUIRED[t].items()}} for t in TYPES
}
FULL: dict[str, dict] = {t: {**MINIMAL[t], **{f: SAMPLE[k] for f, k in OPTIONAL[t].items()}} for t in TYPES}


def line(obj) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


def reject(raw: bytes) -> str:
    """The reason a line is rejected for; fails the test if it validates."""
    with pytest.raises((msgspec.DecodeError, UnicodeDecodeError)) as info:
        validate_line(raw)
    return reason_of(info.value, raw)


def fields_of(type_: str, *kinds: str) -> list[tuple[str, str, bool]]:
    """(type, field, required) for every field of the given value kinds."""
    out = []
    for t in TYPES if type_ == "*" else [type_]:
        for table, required in ((REQUIRED[t], True), (OPTIONAL[t], False)):
            out += [(t, f, required) for f, k in table.items() if k in kinds]
    return out


def ids(params):
    return [f"{t}.{f}" for t, f, *_ in params]


# --------------------------------------------------------------------------
# The contract tables match the structs.


@pytest.mark.parametrize("t", TYPES)
def test_struct_fields_are_the_contract_fields(t):
    cls = R.RECORD_TYPES[t]
    assert set(cls.__struct_fields__) == set(REQUIRED[t]) | set(OPTIONAL[t])
    assert cls.__struct_config__.tag == t
    assert {f.name for f in msgspec.structs.fields(cls) if f.required} == set(REQUIRED[t])


def test_enums_are_the_contract_enums():
    assert set(R.FN_KINDS) == {"python", "kernel", "collective", "memcpy", "dataloader", "optimizer", "io", "other"}
    assert set(R.COLLECTIVE_OPS) == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv",
                                     "barrier"}


# --------------------------------------------------------------------------
# Valid records.


@pytest.mark.parametrize("t", TYPES)
def test_minimal_record_is_valid_and_optionals_absent(t):
    rec = validate_line(line(MINIMAL[t]))
    assert type(rec) is R.RECORD_TYPES[t]
    for f in REQUIRED[t]:
        assert getattr(rec, f) == MINIMAL[t][f]
    for f in OPTIONAL[t]:
        assert getattr(rec, f) in (None, False), f  # absent


@pytest.mark.parametrize("t", TYPES)
def test_full_record_is_valid(t):
    rec = validate_line(line(FULL[t]))
    for f in list(REQUIRED[t]) + list(OPTIONAL[t]):
        assert getattr(rec, f) == FULL[t][f], f


@pytest.mark.parametrize("t", TYPES)
def test_encode_record_round_trips_and_omits_absent(t):
    for obj in (MINIMAL[t], FULL[t]):
        rec = validate_line(line(obj))
        encoded = R.encode_record(rec)
        assert validate_line(encoded) == rec
        assert json.loads(encoded) == obj


@pytest.mark.parametrize("t", TYPES)
def test_unknown_fields_are_ignored(t):
    obj = {**FULL[t], "zz_new": 1, "nested": {"a": [1, {"b": None}]}, "flag": True, "s": "x" * 1000,
           "neg": -5, "f": 1.5}
    rec = validate_line(line(obj))
    assert rec == validate_line(line(FULL[t]))


@pytest.mark.parametrize("t", TYPES)
def test_fields_in_any_order(t):
    obj = dict(reversed(list(FULL[t].items())))
    assert list(obj)[-1] == "type"
    assert validate_line(line(obj)) == validate_line(line(FULL[t]))


def test_whitespace_around_record_is_accepted():
    raw = line(MINIMAL["host"])
    assert validate_line(b" \t" + raw + b" \r") == validate_line(raw)


@pytest.mark.parametrize("t,f,required", fields_of("*", F), ids=ids(fields_of("*", F)))
def test_int_is_accepted_for_float(t, f, required):
    assert getattr(validate_line(line({**MINIMAL[t], f: 7})), f) == 7.0


@pytest.mark.parametrize("value", [0.0, -0.0, -40.5, 1e-300, 1.7976931348623157e308, -1.7976931348623157e308])
def test_finite_extreme_floats_accepted(value):
    # Counters are only required to be finite (records.py: odd readings are not turned away).
    assert validate_line(line({**MINIMAL["host"], "load1": value})).load1 == value


@pytest.mark.parametrize("t,f,required", fields_of("*", S), ids=ids(fields_of("*", S)))
def test_string_of_256_chars_accepted(t, f, required):
    for s in ("a" * 256, "é" * 256, "😀" * 256):  # characters, not bytes
        assert getattr(validate_line(line({**MINIMAL[t], f: s})), f) == s


@pytest.mark.parametrize("t,f,required", fields_of("*", S), ids=ids(fields_of("*", S)))
def test_empty_string_accepted(t, f, required):
    assert getattr(validate_line(line({**MINIMAL[t], f: ""})), f) == ""


@pytest.mark.parametrize("t,f,required", fields_of("*", I), ids=ids(fields_of("*", I)))
def test_zero_accepted_for_ints(t, f, required):
    assert getattr(validate_line(line({**MINIMAL[t], f: 0})), f) == 0


@pytest.mark.parametrize("kind", R.FN_KINDS)
def test_every_fn_kind_accepted(kind):
    assert validate_line(line({**MINIMAL["fn"], "kind": kind})).kind == kind


@pytest.mark.parametrize("op", R.COLLECTIVE_OPS)
def test_every_collective_op_accepted(op):
    assert validate_line(line({**MINIMAL["fn"], "kind": "collective", "op": op})).op == op


def test_in_flight_is_optional_bool():
    assert validate_line(line(MINIMAL["fn"])).in_flight is False
    assert validate_line(line({**MINIMAL["fn"], "in_flight": True})).in_flight is True
    assert validate_line(line({**MINIMAL["fn"], "in_flight": False})).in_flight is False
    for bad, got in ((1, "int"), (0, "int"), ("true", "str"), (None, "null"), ([True], "array")):
        reason = reject(line({**MINIMAL["fn"], "in_flight": bad}))
        assert "$.in_flight" in reason and "Expected `bool" in reason and f"got `{got}`" in reason


def test_link_up_is_optional_bool():
    assert validate_line(line(MINIMAL["nic"])).link_up is None
    assert validate_line(line({**MINIMAL["nic"], "link_up": False})).link_up is False
    reason = reject(line({**MINIMAL["nic"], "link_up": 1}))
    assert "$.link_up" in reason and "bool" in reason and "got `int`" in reason


def test_optional_null_means_absent():
    assert validate_line(line({**MINIMAL["fn"], "op": None, "bytes": None})).op is None
    assert validate_line(line({**MINIMAL["gpu"], "temp_c": None})).temp_c is None


def test_int64_and_int32_limits_accepted():
    rec = validate_line(line({**MINIMAL["fn"], "ts_ns": 2**62, "dur_ns": 7 * 24 * 3600 * 10**9, "step": 2**63 - 1,
                              "bytes": 2**63 - 1, "rank": 2**31 - 1, "stream": 2**31 - 1}))
    assert rec.ts_ns == 2**62 and rec.step == 2**63 - 1 and rec.rank == 2**31 - 1


def test_time_and_duration_bounds_of_the_contract():
    """ts_ns <= 2^62 and dur_ns <= one week (telemetry-v1 "Bounds"): no valid record overflows int64."""
    for field, value in (("dur_ns", 7 * 24 * 3600 * 10**9 + 1), ("dur_ns", 7 * 10**18), ("ts_ns", 2**62 + 1)):
        reason = reject(line({**MINIMAL["fn"], field: value}))
        assert f"$.{field}" in reason and "<=" in reason
    assert "$.ts_ns" in reject(line({**MINIMAL["gpu"], "ts_ns": 2**63 - 1}))


def test_job_lists():
    rec = validate_line(line({**MINIMAL["job"], "rank_nodes": ["a" * 256, ""], "rank_stages": [], "rank_dp": [0]}))
    assert rec.rank_nodes == ["a" * 256, ""] and rec.rank_stages == [] and rec.rank_dp == [0]


# --------------------------------------------------------------------------
# Missing fields.


@pytest.mark.parametrize("t,f", [(t, f) for t in TYPES for f in REQUIRED[t]],
                         ids=[f"{t}.{f}" for t in TYPES for f in REQUIRED[t]])
def test_missing_required_field_rejected(t, f):
    obj = dict(FULL[t])
    del obj[f]
    reason = reject(line(obj))
    assert f"missing required field `{f}`" in reason


@pytest.mark.parametrize("t", TYPES)
def test_missing_required_field_null_rejected(t):
    for f, kind in REQUIRED[t].items():
        reason = reject(line({**MINIMAL[t], f: None}))
        assert f"$.{f}" in reason and "got `null`" in reason, (f, reason)


@pytest.mark.parametrize("t,f", [(t, f) for t in TYPES for f in OPTIONAL[t]],
                         ids=[f"{t}.{f}" for t in TYPES for f in OPTIONAL[t]])
def test_each_optional_field_may_be_missing(t, f):
    obj = dict(FULL[t])
    del obj[f]
    assert type(validate_line(line(obj))) is R.RECORD_TYPES[t]


def test_missing_type_rejected():
    obj = dict(FULL["fn"])
    del obj["type"]
    assert "missing required field `type`" in reject(line(obj))


@pytest.mark.parametrize("bad", ["zzz", "FN", "Fn", "", "verdict", "fn "])
def test_unknown_type_rejected(bad):
    reason = reject(line({**FULL["fn"], "type": bad}))
    assert "$.type" in reason and "Invalid value" in reason and repr(bad) in reason


@pytest.mark.parametrize("bad", [5, None, True, ["fn"], {"k": "fn"}])
def test_type_not_a_string_rejected(bad):
    reason = reject(line({**FULL["fn"], "type": bad}))
    assert "$.type" in reason and "Expected `str`" in reason


def test_empty_object_rejected():
    assert "missing required field `type`" in reject(b"{}")


# --------------------------------------------------------------------------
# Wrong types.

INT_FIELDS = fields_of("*", I, POS)
STR_FIELDS = fields_of("*", S)
FLOAT_FIELDS = fields_of("*", F)


@pytest.mark.parametrize("t,f,required", INT_FIELDS, ids=ids(INT_FIELDS))
@pytest.mark.parametrize("bad,got", [("3", "str"), (1.5, "float"), (3.0, "float"), (1e3, "float"), (True, "bool"),
                                     (False, "bool"), ([3], "array"), ({"v": 3}, "object")])
def test_wrong_type_for_int_rejected(t, f, required, bad, got):
    reason = reject(line({**FULL[t], f: bad}))
    assert f"$.{f}`" in reason and "Expected `int" in reason and f"got `{got}`" in reason, reason


@pytest.mark.parametrize("t,f,required", STR_FIELDS, ids=ids(STR_FIELDS))
@pytest.mark.parametrize("bad,got", [(5, "int"), (1.5, "float"), (True, "bool"), (["x"], "array"), ({"x": 1}, "object")])
def test_wrong_type_for_str_rejected(t, f, required, bad, got):
    reason = reject(line({**FULL[t], f: bad}))
    assert f"$.{f}`" in reason and "Expected `str" in reason and f"got `{got}`" in reason, reason


@pytest.mark.parametrize("t,f,required", FLOAT_FIELDS, ids=ids(FLOAT_FIELDS))
@pytest.mark.parametrize("bad,got", [("1.5", "str"), (True, "bool"), ([1.5], "array"), ({"v": 1}, "object")])
def test_wrong_type_for_float_rejected(t, f, required, bad, got):
    reason = reject(line({**FULL[t], f: bad}))
    assert f"$.{f}`" in reason and "Expected `float" in reason and f"got `{got}`" in reason, reason


@pytest.mark.parametrize("f", ["kind", "op"])
@pytest.mark.parametrize("bad,got", [(1, "int"), (True, "bool"), (["kernel"], "array")])
def test_wrong_type_for_enum_rejected(f, bad, got):
    reason = reject(line({**FULL["fn"], f: bad}))
    assert f"$.{f}`" in reason and f"got `{got}`" in reason


@pytest.mark.parametrize("bad", ["Python", "KERNEL", "", "gpu", "nccl", "kernel "])
def test_bad_kind_rejected(bad):
    reason = reject(line({**FULL["fn"], "kind": bad}))
    assert "$.kind" in reason and "Invalid enum value" in reason and repr(bad) in reason


@pytest.mark.parametrize("bad", ["allreduce", "AllReduce", "all-reduce", "", "reduce", "alltoall"])
def test_bad_op_rejected(bad):
    reason = reject(line({**FULL["fn"], "op": bad}))
    assert "$.op" in reason and "Invalid enum value" in reason and repr(bad) in reason


@pytest.mark.parametrize("f,bad,path,got", [
    ("rank_nodes", "n1", "$.rank_nodes", "str"),
    ("rank_nodes", ["a", 1], "$.rank_nodes[1]", "int"),
    ("rank_stages", [0, "1"], "$.rank_stages[1]", "str"),
    ("rank_stages", [0, 1.5], "$.rank_stages[1]", "float"),
    ("rank_dp", [True], "$.rank_dp[0]", "bool"),
    ("rank_dp", {"0": 1}, "$.rank_dp", "object"),
])
def test_wrong_type_in_job_lists_rejected(f, bad, path, got):
    reason = reject(line({**FULL["job"], f: bad}))
    assert f"{path}`" in reason and f"got `{got}`" in reason


def test_float_time_rejected():
    # "Times are integers."
    reason = reject(line({**FULL["fn"], "ts_ns": 1.7e18}))
    assert "$.ts_ns" in reason and "Expected `int`, got `float`" in reason


# --------------------------------------------------------------------------
# Bounds.


@pytest.mark.parametrize("t,f,required", fields_of("*", I), ids=ids(fields_of("*", I)))
@pytest.mark.parametrize("bad", [-1, -(2**63)])
def test_negative_int_rejected(t, f, required, bad):
    reason = reject(line({**FULL[t], f: bad}))
    assert f"$.{f}`" in reason and ">= 0" in reason, reason


@pytest.mark.parametrize("t,f,required", fields_of("*", POS), ids=ids(fields_of("*", POS)))
@pytest.mark.parametrize("bad", [0, -1])
def test_degrees_must_be_positive(t, f, required, bad):
    reason = reject(line({**FULL[t], f: bad}))
    assert f"$.{f}`" in reason and ">= 1" in reason, reason


@pytest.mark.parametrize("f", ["dur_ns", "rank", "step"])
def test_negative_duration_rank_step_rejected(f):
    reason = reject(line({**MINIMAL["fn"], f: -5}))
    assert reason == f"Expected `int` >= 0 - at `$.{f}`"


@pytest.mark.parametrize("f", ["rank_stages", "rank_dp"])
def test_negative_in_job_lists_rejected(f):
    reason = reject(line({**FULL["job"], f: [0, -1]}))
    assert f"$.{f}[1]" in reason and ">= 0" in reason


@pytest.mark.parametrize("t,f,required", fields_of("*", I), ids=ids(fields_of("*", I)))
def test_int_too_large_for_its_column_rejected(t, f, required):
    # Integers that fit no int64 (or int32 for indices) column would crash the
    # columnar batch they land in; they are rejected at validation instead.
    reason = reject(line({**FULL[t], f: 2**64}))
    assert f"$.{f}`" in reason and "<= " in reason, reason
    reason = reject(line({**FULL[t], f: 10**400}))
    assert f"$.{f}`" in reason


@pytest.mark.parametrize("f", ["rank", "stream"])
def test_index_over_int32_rejected(f):
    reason = reject(line({**MINIMAL["fn"], f: 2**31}))
    assert reason == f"Expected `int` <= {2**31 - 1} - at `$.{f}`"


@pytest.mark.parametrize("t,f,required", STR_FIELDS, ids=ids(STR_FIELDS))
def test_string_over_256_chars_rejected(t, f, required):
    for s in ("a" * 257, "é" * 257, "x" * 100_000):
        reason = reject(line({**FULL[t], f: s}))
        assert f"$.{f}`" in reason and "length <= 256" in reason, reason


def test_string_over_256_in_rank_nodes_rejected():
    reason = reject(line({**FULL["job"], "rank_nodes": ["a", "b" * 257]}))
    assert "$.rank_nodes[1]" in reason and "length <= 256" in reason


# --------------------------------------------------------------------------
# Invalid JSON and non-finite numbers.


@pytest.mark.parametrize("raw", [
    b"{", b"}", b"not json", b'{"type":"host",}', b"{'type':'host'}", b'{"type":"host" "job":"j"}',
    line(MINIMAL["host"])[:-1], line(MINIMAL["host"]) + b"}", line(MINIMAL["host"]) + b" {}",
    line(MINIMAL["host"]) + line(MINIMAL["host"]), b'{"type":"host","job":"j\x01","node":"n","ts_ns":1}',
    b"\xef\xbb\xbf" + line(MINIMAL["host"]),  # a BOM is not JSON
    b'{"type":"host","job":"j","node":"n","ts_ns":01}',
    b'{"type":"host","job":"j","node":"n","ts_ns":+1}',
    b'{"type":"host","job":"j","node":"n","ts_ns":0x10}',
], ids=lambda r: repr(r[:30]))
def test_invalid_json_rejected(raw):
    reason = reject(raw)
    assert reason.startswith("invalid JSON: ")


@pytest.mark.parametrize("literal", [b"NaN", b"nan", b"Infinity", b"-Infinity", b"inf", b"-inf"])
@pytest.mark.parametrize("t,f", [("host", "load1"), ("gpu", "temp_c"), ("nic", "tx_Bps"), ("fn", "dur_ns")])
def test_non_finite_literal_rejected(literal, t, f):
    base = json.dumps({**MINIMAL[t], f: 12345}).encode()
    reason = reject(base.replace(b"12345", literal))
    assert reason.startswith("invalid JSON: ") and "malformed" in reason


@pytest.mark.parametrize("number", [b"1e999", b"-1e999", b"2e308", b"1" + b"0" * 400 + b".0"])
@pytest.mark.parametrize("t,f", [("host", "load1"), ("gpu", "power_w"), ("nic", "link_gbps"), ("fn", "dur_ns"),
                                 ("gpu", "xid")])
def test_out_of_range_number_rejected(number, t, f):
    base = json.dumps({**MINIMAL[t], f: 12345}).encode()
    reason = reject(base.replace(b"12345", number))
    assert f"$.{f}`" in reason and ("Number out of range" in reason or "Expected `int`" in reason), reason


@pytest.mark.parametrize("raw,got", [(b"[1]", "array"), (b"5", "int"), (b'"fn"', "str"), (b"null", "null"),
                                     (b"true", "bool"), (b"[" + line(MINIMAL["host"]) + b"]", "array")])
def test_non_object_rejected(raw, got):
    assert reject(raw) == f"Expected `object`, got `{got}`"


def test_invalid_utf8_rejected():
    raw = b'{"type":"host","job":"j\xff\xfe","node":"n","ts_ns":1}'
    reason = reject(raw)
    assert "utf-8" in reason.lower()


def test_reason_of_names_json_errors_and_passes_validation_errors():
    try:
        validate_line(b"{")
    except msgspec.DecodeError as e:
        assert reason_of(e, b"{").startswith("invalid JSON: ")
    try:
        validate_line(line({**MINIMAL["fn"], "dur_ns": -1}))
    except msgspec.ValidationError as e:
        assert reason_of(e, b"") == str(e)


# --------------------------------------------------------------------------
# Line numbers and reasons through the batch parser.


def test_invalid_records_carry_line_numbers_and_reasons():
    lines = [
        line(MINIMAL["fn"]),                              # 1 ok
        line({**MINIMAL["fn"], "dur_ns": -1}),            # 2
        b"",                                              # 3 blank
        line({**MINIMAL["gpu"], "rank": "0"}),            # 4
        line(MINIMAL["job"]),                             # 5 ok
        b"{oops",                                         # 6
        line({**MINIMAL["host"], "node": "n" * 257}),     # 7
        line({k: v for k, v in MINIMAL["nic"].items() if k != "nic"}),  # 8
        line({**MINIMAL["fn"], "kind": "gpu"}),           # 9
    ]
    batches = list(parse_lines(enumerate(lines, 1), "f.jsonl"))
    invalid = [i for b in batches for i in b.invalid]
    assert sum(b.valid_count for b in batches) == 2
    assert [(i.line, i.reason) for i in invalid] == [
        (2, "Expected `int` >= 0 - at `$.dur_ns`"),
        (4, "Expected `int`, got `str` - at `$.rank`"),
        (6, invalid[2].reason),
        (7, "Expected `str` of length <= 256 - at `$.node`"),
        (8, "Object missing required field `nic`"),
        (9, "Invalid enum value 'gpu' - at `$.kind`"),
    ]
    assert invalid[2].reason.startswith("invalid JSON: ")
    assert all(i.source == "f.jsonl" for i in invalid)
    assert invalid[0].raw == lines[1]
    assert invalid[0].describe() == "f.jsonl:2: Expected `int` >= 0 - at `$.dur_ns`"


def test_invalid_raw_is_the_whole_line():
    """The dead letter keeps the whole rejected line (issue 10: a 4 KB prefix could not be replayed)."""
    raw = line({**MINIMAL["host"], "x": "y" * 50_000, "ts_ns": -1})
    (batch,) = parse_lines([(1, raw)])
    assert batch.invalid[0].raw == raw


# --------------------------------------------------------------------------
# Property-based: mutations of valid records are classified correctly.

_MUTATIONS = ("drop", "wrong_type", "negative", "long_string", "extra_field")
_WRONG = {
    I: ["1", 1.5, True, [1], {"a": 1}], POS: ["1", 2.5, False, [], {}], S: [1, 2.5, True, ["s"], {"s": 1}],
    F: ["1.0", True, [1.0], {"f": 1}], B: [1, "true", [True], 0.5], KIND: [3, "bogus", True],
    OP: [3, "bogus", ["all_reduce"]], LS: ["abc", [1], [None], 5], LI: ["abc", [1.5], ["1"], [-1], 5],
}


@st.composite
def mutated(draw):
    t = draw(st.sampled_from(TYPES))
    obj = dict(draw(st.sampled_from([MINIMAL[t], FULL[t]])))
    table = {**REQUIRED[t], **{k: v for k, v in OPTIONAL[t].items() if k in obj}}
    mutation = draw(st.sampled_from(_MUTATIONS))
    if mutation == "drop":
        f = draw(st.sampled_from(sorted(REQUIRED[t]) + ["type"]))
        del obj[f]
        return obj, f"missing required field `{f}`"
    if mutation == "wrong_type":
        f = draw(st.sampled_from(sorted(table)))
        obj[f] = draw(st.sampled_from(_WRONG[table[f]]))
        return obj, f"$.{f}"
    if mutation == "negative":
        ints = sorted(f for f, k in table.items() if k in (I, POS))
        f = draw(st.sampled_from(ints))
        obj[f] = draw(st.integers(max_value=-1 if table[f] == I else 0, min_value=-(2**70)))
        return obj, f"$.{f}"
    if mutation == "long_string":
        f = draw(st.sampled_from(sorted(f for f, k in table.items() if k == S)))
        obj[f] = draw(st.text(min_size=257, max_size=600))
        return obj, f"length <= 256 - at `$.{f}`"
    known = {"type", *REQUIRED[t], *OPTIONAL[t]}
    name = draw(st.text(min_size=1, max_size=20).filter(lambda n: n not in known))
    obj[name] = draw(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False,
                                  allow_infinity=False) | st.text(max_size=300),
                                  lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c,
                                                                                        max_size=3),
                                  max_leaves=8))
    return obj, None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated(), min_size=1, max_size=20))
def test_mutated_records_are_classified(cases):
    lines = [line(obj) for obj, _ in cases]
    batches = list(parse_lines(enumerate(lines, 1), "m", batch_records=7))
    invalid = {i.line: i.reason for b in batches for i in b.invalid}
    expected_invalid = {n for n, (_, why) in enumerate(cases, 1) if why is not None}
    assert set(invalid) == expected_invalid
    assert sum(b.valid_count for b in batches) == len(cases) - len(expected_invalid)
    for n, (_, why) in enumerate(cases, 1):
        if why is not None:
            assert why in invalid[n], (why, invalid[n])
