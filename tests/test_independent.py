"""The independent generator (bench/independent) writes valid, deterministic, physically sane telemetry.

These test the *generator*, not the detector: contract validity through the project's reader,
byte-identical output per seed, well-formed ground truth, and the physics the benchmark relies
on (collective members leave together; a throttled rank computes slower but waits least; a hang
leaves in-flight records). Tiny scale (2 nodes x 8 GPUs, ~15 s of job time) keeps each fast.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eroica.bench.independent.faults import CATALOGUE
from eroica.bench.independent.generator import GEMM_FWD, make_config, write_jsonl
from eroica.models.reader import read_batches

SCENARIOS = ["healthy", "healthy_pp", *CATALOGUE]
# the contract's component vocabulary (telemetry-v1.md)
COMPONENTS = {"gpu", "gpu_memory", "pcie", "nvlink", "nic", "network", "host_cpu", "dataloader", "storage", "python",
              "workload", "config", "software"}


def _write(tmp: Path, scenario: str, seed: int = 1, **overrides: Any) -> tuple[Path, dict[str, Any]]:
    cfg = make_config("tiny", seed, scenario, duration_s=15.0)
    for key, value in overrides.items():
        setattr(cfg.faults[0], key, value)
    path = tmp / f"{scenario}-{seed}.jsonl"
    return path, write_jsonl(cfg, path)


def _records(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_record_passes_the_reader(tmp_path: Path, scenario: str) -> None:
    path, truth = _write(tmp_path, scenario)
    invalid = [i for b in read_batches(path) for i in b.invalid]
    assert invalid == [], invalid[:3]
    recs = _records(path)
    assert len(recs) == truth["records"]
    assert {r["type"] for r in recs} == {"job", "fn", "gpu", "nic", "host"}
    kinds = {r["kind"] for r in recs if r["type"] == "fn"}
    assert {"dataloader", "kernel", "python", "collective", "optimizer", "memcpy"} <= kinds
    assert all(1.6e18 < r["ts_ns"] < 1.8e18 for r in recs)


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path) -> None:
    def digest(seed: int, sub: str) -> str:
        (tmp_path / sub).mkdir(exist_ok=True)
        path, _ = _write(tmp_path / sub, "gpu_throttle", seed)
        return hashlib.sha256(path.read_bytes()).hexdigest()

    assert digest(3, "a") == digest(3, "b")
    assert digest(3, "a") != digest(4, "c")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_truth_is_well_formed(tmp_path: Path, scenario: str) -> None:
    _, truth = _write(tmp_path, scenario)
    assert truth["healthy"] is scenario.startswith("healthy")
    assert len(truth["faults"]) == (0 if truth["healthy"] else 1)
    rank_nodes = truth["layout"]["rank_nodes"]
    assert len(rank_nodes) == 16 and all(n.startswith("gpu-node-") for n in rank_nodes)
    for f in truth["faults"]:
        assert f["name"] == scenario
        assert f["kind"] in ("slow", "hang") and (f["kind"] == "hang") == (scenario == "hang")
        assert f["component"] in COMPONENTS
        assert f["scope"] in ("rank", "node", "job")
        assert all(0 <= r < len(rank_nodes) for r in f["ranks"] + f.get("affected_ranks", []))
        assert set(f["nodes"] + f.get("affected_nodes", [])) <= set(rank_nodes)
        if f["scope"] == "rank":
            assert f["ranks"]
        if f["scope"] == "node":
            assert f["nodes"]


def _collective_instances(recs: list[dict[str, Any]]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Group collective records into call instances: (group, step, n-th call of that group by the rank)."""
    per_rank: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        if r["type"] == "fn" and r["kind"] == "collective":
            per_rank[(r["group"], r["step"], r["rank"])].append(r)
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for (group, step, _), calls in per_rank.items():
        for i, r in enumerate(sorted(calls, key=lambda x: x["ts_ns"])):
            out[(group, step, i)].append(r)
    return out


@pytest.mark.parametrize("scenario", ["healthy", "healthy_pp", "nic_errors"])
def test_collective_members_leave_together(tmp_path: Path, scenario: str) -> None:
    path, truth = _write(tmp_path, scenario, seed=2)
    recs = _records(path)
    offsets = truth["nuisances"]["clock_offset_s"]
    names = sorted(set(truth["layout"]["rank_nodes"]), key=truth["layout"]["rank_nodes"].index)
    off_ns = {n: int(round(o * 1e9)) for n, o in zip(names, offsets)}
    spread = max(off_ns.values()) - min(off_ns.values())
    instances = _collective_instances(recs)
    assert instances
    for key, calls in instances.items():
        ends = [c["ts_ns"] + c["dur_ns"] for c in calls]
        assert max(ends) - min(ends) <= spread + 2, key
        true_ends = [c["ts_ns"] + c["dur_ns"] - off_ns[c["node"]] for c in calls]
        assert max(true_ends) - min(true_ends) <= 2, key


def test_throttled_rank_computes_slower_and_waits_least(tmp_path: Path) -> None:
    path, truth = _write(tmp_path, "gpu_throttle", seed=5, onset_s=0.0, clock_ratio=0.7)
    (culprit,) = truth["faults"][0]["ranks"]
    recs = _records(path)
    first = truth["nuisances"]["step_offset"] + truth["nuisances"]["warmup_steps"]
    gemm: dict[int, list[int]] = defaultdict(list)
    waited: dict[int, int] = defaultdict(int)
    for r in recs:
        if r["type"] != "fn" or r["step"] < first:   # after the warm-up
            continue
        if r["fn"] == GEMM_FWD:
            gemm[r["rank"]].append(r["dur_ns"])
        if r["kind"] == "collective":
            waited[r["rank"]] += r["dur_ns"]
    med = {k: float(np.median(v)) for k, v in gemm.items()}
    peers = [v for k, v in med.items() if k != culprit]
    assert med[culprit] > 1.3 * max(peers)
    assert waited[culprit] == min(waited.values())
    assert waited[culprit] < 0.9 * min(v for k, v in waited.items() if k != culprit)
    clocks = [r["sm_clock_mhz"] for r in recs if r["type"] == "gpu" and r["rank"] == culprit and r["sm_util_pct"] > 50]
    assert np.median(clocks) < 0.75 * 1980


def test_hang_leaves_in_flight_records(tmp_path: Path) -> None:
    path, truth = _write(tmp_path, "hang", seed=1)
    (culprit,) = truth["faults"][0]["ranks"]
    recs = _records(path)
    flying = [r for r in recs if r.get("in_flight")]
    by_rank = {r["rank"]: r for r in flying}
    assert len(flying) == len(by_rank) == 16
    assert by_rank[culprit]["kind"] == "kernel"
    assert all(r["kind"] == "collective" for k, r in by_rank.items() if k != culprit)
    # the stuck kernel is the culprit's first one after the onset (up to its node's clock offset)
    job = recs[0]
    assert by_rank[culprit]["ts_ns"] >= job["ts_ns"] + int((truth["faults"][0]["onset_s"] - 0.05) * 1e9)
    assert all(r["dur_ns"] > 30e9 for r in flying), "the dump comes long after everyone stopped"
    last_fn = max(r["ts_ns"] for r in recs if r["type"] == "fn" and not r.get("in_flight"))
    last_counter = max(r["ts_ns"] for r in recs if r["type"] == "gpu")
    assert last_counter - last_fn > 30e9, "counters keep coming while the job hangs"


def test_counters_follow_the_links_used(tmp_path: Path) -> None:
    healthy, _ = _write(tmp_path, "healthy", seed=2)
    tcp, _ = _write(tmp_path, "nccl_tcp", seed=2)

    def tx(path: Path, nic: str) -> list[int]:
        return [r["tx_Bps"] for r in _records(path) if r["type"] == "nic" and r["nic"].startswith(nic)]

    assert np.mean(tx(healthy, "mlx5_")) > 1e8          # gradient traffic rides the RDMA rails
    assert max(tx(tcp, "mlx5_")) < 1e6                  # over TCP they carry only background traffic
    assert max(tx(tcp, "eth0")) > 1e9                   # and the front-end port carries the rings
    half, truth = _write(tmp_path, "nic_half_speed", seed=2, onset_s=0.0)
    node = truth["faults"][0]["nodes"][0]
    port = truth["faults"][0]["port"]
    speeds = {(r["node"], r["nic"]): r["link_gbps"] for r in _records(half) if r["type"] == "nic" and "link_gbps" in r}
    assert speeds[(node, port)] == 200
    assert sorted(v for k, v in speeds.items() if k[1].startswith("mlx5_") and k != (node, port)) == [400] * 15
