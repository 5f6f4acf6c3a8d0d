"""FSDP, both APIs, on a real gloo job (4 processes) with one slowed rank: traced with no code change.

:mod:`.fsdp_job` shards a small model with ``FullyShardedDataParallel`` or
``fully_shard``, one unit per block plus the root. What must hold: every
rank records each unit's forward and backward and its all-gathers and
reduce-scatters, with the unit in their stack, the bytes of the unit's
unsharded parameters and the id of the world group; and ``eroica analyze``
names the slowed rank (drawn at random; its forward does 3x more compute)
and nobody else persistently (see :func:`.test_trace_pipeline.assert_names_only`).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

from eroica.producers.tracer.test_trace_pipeline import analyze, assert_names_only, fn_records, trace  # noqa: E402

# 150 steps (about 12 windows of 2 s): with 100 the run had 8 windows, and on a loaded CI machine
# (4 gloo processes on 2 cores) the slowed rank, plain in every window's numbers (its forward 1.8-2x
# its peers'), was named in 5 of them but confirmed in only 1: the assertion needs two. More steps give
# the same signal more windows; the assertion is unchanged.
STEPS, WIDTH, DEPTH = 150, 256, 4
UNITS = ["Net"] + [f"blocks.{i}" for i in range(DEPTH)]


@pytest.mark.parametrize("api", ["fsdp1", "fsdp2"])
def test_fsdp_units_are_timed_and_the_slowed_rank_is_named(tmp_path: Path, api: str) -> None:
    slow = random.randrange(4)
    run, proc = trace(tmp_path, "eroica.producers.tracer.fsdp_job", "--api", api, "--steps", str(STEPS),
                      "--width", str(WIDTH), "--depth", str(DEPTH), "--slow-rank", str(slow), "--slow-factor", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "could not instrument" not in proc.stderr, proc.stderr[-3000:]
    recs = fn_records(run)

    block_bytes = (WIDTH * WIDTH + WIDTH) * 4
    for rank in range(4):
        mine = [r for r in recs if r["rank"] == rank]
        spans = Counter(r["fn"] for r in mine if r["kind"] == "python")
        coll = Counter((r["fn"], r.get("stack"), r["op"], r["group"], r["bytes"]) for r in mine
                       if r["kind"] == "collective" and r["fn"].startswith("FSDP."))
        for unit in UNITS:
            assert spans[f"FSDP[{unit}].forward"] == STEPS and spans[f"FSDP[{unit}].backward"] == STEPS, (unit, spans)
        for i in range(DEPTH):
            unit = f"FSDP[blocks.{i}]"
            # gathered for the forward and again for the backward; gradients reduce-scattered once
            assert coll[("FSDP.all_gather", f"{unit};FSDP.all_gather", "all_gather", "ranks:0-3", block_bytes)] \
                == 2 * STEPS, (unit, coll)
            assert coll[("FSDP.reduce_scatter", f"{unit};FSDP.reduce_scatter", "reduce_scatter", "ranks:0-3",
                         block_bytes)] == STEPS, (unit, coll)
        assert sum(n for k, n in coll.items() if k[1].startswith("FSDP[Net];")) >= 2 * STEPS
        # a unit's forward runs inside the model's
        assert all(r.get("stack") == f"Net.forward;{r['fn']}" for r in mine
                   if r["fn"].startswith("FSDP[blocks.") and r["fn"].endswith(".forward"))

    assert_names_only(analyze(run), slow, {"python", "host_cpu"})
