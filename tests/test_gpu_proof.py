"""The GPU proof's checks (tools/gpu_proof.py) on hand-built records: they pass on plausible
samples and fail on each kind of implausible one, so a run on a real GPU means something."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("gpu_proof", Path(__file__).parents[1] / "tools" / "gpu_proof.py")
assert spec is not None and spec.loader is not None
gpu_proof = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_proof)

GOOD = {"sm_clock_mhz": 1980, "max_sm_clock_mhz": 1980, "power_w": 450, "power_limit_w": 700, "temp_c": 55,
        "pcie_gen": 5, "max_pcie_gen": 5, "pcie_width": 16, "max_pcie_width": 16, "pcie_tx_Bps": 1e9,
        "pcie_rx_Bps": 2e9, "throttle_reasons": 0, "ecc_uncorrected": 0, "xid": 0, "sm_util_pct": 97,
        "mem_util_pct": 40, "mem_used_bytes": 3e10, "mem_total_bytes": 8.5e10, "nvlink_tx_Bps": 0.0,
        "nvlink_rx_Bps": 0.0}


def records(**override):
    gpu = [{"type": "gpu", "rank": 0, "gpu": 0, "ts_ns": i, **GOOD, **override} for i in range(5)]
    fns = [{"type": "fn", "rank": 0, "step": s, "fn": "Net.forward", "kind": "python", "ts_ns": s * 100, "dur_ns": 90}
           for s in range(3)]
    fns += [{"type": "fn", "rank": 0, "step": s, "fn": "Net.forward[gpu]", "kind": "kernel", "ts_ns": s * 100 + 5,
             "dur_ns": 95} for s in range(3)]
    return gpu + fns


def test_plausible_records_pass():
    out = gpu_proof.check(records(), nvlink_expected=True)
    assert out["ok"], out["problems"]
    assert out["cuda_event_regions"] == ["Net.forward[gpu]"]


def test_each_implausible_thing_fails():
    assert not gpu_proof.check(records(temp_c=400), True)["ok"]
    assert not gpu_proof.check(records(sm_clock_mhz=2500), True)["ok"]  # above its own maximum
    missing = [r for r in records() if r["type"] != "gpu"] + [
        {k: v for k, v in r.items() if k != "xid"} for r in records() if r["type"] == "gpu"]
    assert "xid: never reported" in gpu_proof.check(missing, True)["problems"]
    no_cuda = [r for r in records() if not str(r.get("fn", "")).endswith("[gpu]")]
    assert not gpu_proof.check(no_cuda, True)["ok"]
    no_nvlink = [{k: v for k, v in r.items() if not k.startswith("nvlink")} for r in records()]
    assert gpu_proof.check(no_nvlink, nvlink_expected=False)["ok"]
    assert not gpu_proof.check(no_nvlink, nvlink_expected=True)["ok"]


def test_cuda_regions_are_held_to_their_own_step_and_host_region():
    base = records()
    slow_step = [dict(r, dur_ns=r["dur_ns"] * 3) if r.get("step") == 1 else r for r in base]
    assert gpu_proof.check(slow_step, True)["ok"]  # a slow step's GPU region is as long as that step: fine
    too_long = [dict(r, dur_ns=500) if str(r.get("fn", "")).endswith("[gpu]") and r.get("step") == 1 else r for r in base]
    assert any("twice" in p for p in gpu_proof.check(too_long, True)["problems"])
    early = [dict(r, ts_ns=r["ts_ns"] - 2_000_000) if str(r.get("fn", "")).endswith("[gpu]") else r for r in base]
    assert any("before their host region" in p for p in gpu_proof.check(early, True)["problems"])
    assert gpu_proof.check(base, True)["gpu_start_after_host_ms"]["median"] == 5e-6


def writes(*entries):
    """(wm or None, [(fn, ts)...]) per write, written 1 ms after its mark."""
    return [{"at_ns": (wm or 0) + 1_000_000, "wm": wm, "recs": [[fn, ts, 10] for fn, ts in recs]}
            for wm, recs in entries]


def test_marks_kept_pass_and_report_how_far_they_trail():
    ok = gpu_proof.check_watermarks(writes(
        (100, [("Net.forward", 50), ("Net.forward[gpu]", 60)]),   # older than its own mark: written with it
        (200, [("Net.forward[gpu]", 150), ("SGD.step", 180)]),
        (None, [("Net.forward", 300)])), allowance_ns=50)
    assert ok["ok"], ok["problems"]
    assert ok["declared"] == 2 and ok["gpu_records"] == 2 and ok["mark_trails_write_ms"]["max"] == 1.0


def test_a_record_older_than_a_declared_mark_fails_past_the_allowance():
    within = gpu_proof.check_watermarks(writes((100, [("a[gpu]", 100)]), (200, [("b[gpu]", 70)])), allowance_ns=50)
    assert within["ok"] and within["late_within_allowance"] == {"gpu": 1, "host": 0}
    late = gpu_proof.check_watermarks(writes((100, [("a[gpu]", 100)]), (200, [("b[gpu]", 20)])), allowance_ns=50)
    assert not late["ok"] and late["worst_late_ms"] == 80 / 1e6


def test_a_mark_that_goes_back_or_no_mark_at_all_fails():
    back = gpu_proof.check_watermarks(writes((200, [("a[gpu]", 200)]), (100, [("b[gpu]", 250)])), allowance_ns=50)
    assert not back["ok"] and "went back" in back["problems"][0]
    none = gpu_proof.check_watermarks(writes((None, [("a[gpu]", 1)])), allowance_ns=50)
    assert not none["ok"]
