"""Import per-operation tables (the OSDI'25 straggler study format) as telemetry-v1 records.

The table (Parquet) has one row per operation: ``rank``, ``stage``,
``dp_rank``, ``step``, ``optype``, ``start_ts`` (seconds from the start of
its step), ``duration`` (seconds), and ``seq_id``, ``mc``, ``mb_id``, ``gmc``
(microbatch bookkeeping, which the contract has no field for: not imported).

Kinds, functions, collectives (``fn`` = the optype unless said otherwise)
  ``forward-compute`` / ``backward-compute``   -> ``kernel``
  ``forward-send`` / ``backward-send``         -> ``collective``, op ``send``
  ``forward-recv`` / ``backward-recv``         -> ``collective``, op ``recv``
  ``grads-reduce-scatter``                     -> ``collective``, op ``reduce_scatter``
  ``params-all-gather``                        -> ``collective``, op ``all_gather``
  ``layernorm-grads-all-reduce``               -> ``collective``, op ``all_reduce``
  ``embedding-grads-all-reduce``               -> ``collective``, op ``all_reduce``
  ``optimizer-clip-main-grad``                 -> ``collective``, op ``all_reduce`` (the norm's, all ranks)
  ``optimizer``                                -> ``optimizer``
  ``gc``                                       -> ``python``, fn ``gc.collect``
  an unknown optype: by the words in it (``compute``, ``send``, ``all-reduce``,
  ``optimizer``...), else ``other``.

Groups (communicators), named so that every member rank names them alike
  point-to-point between adjacent stages ``a < b`` of data-parallel replica
  ``d``: ``pp-<a>-<b>-dp<d>``. Forward sends go to the next stage and forward
  receives come from the previous one; backward ones the other way round, so
  stage ``s``'s ``forward-send`` and stage ``s+1``'s ``forward-recv`` (and
  ``backward-send`` of ``s+1`` / ``backward-recv`` of ``s``) share a group.
  The distributed optimizer's ``grads-reduce-scatter`` / ``params-all-gather``
  run over the data-parallel group of the stage: ``dp-stage<s>``. The
  embedding all-reduce ties the first and last stage of a replica:
  ``embedding-dp<d>``. The layernorm all-reduce runs over the tensor-parallel
  group of a (stage, replica): ``tp-stage<s>-dp<d>``. The grad-norm clip's
  all-reduce spans every rank: ``world``.

Steps
  The ``step`` column is required: ``start_ts`` counts from the start of its
  step, so a table without it cannot be put in steps (nor in time) and is
  refused with a one-line error, never imported as one fake step.

Time
  Steps are relative; they are laid end to end from ``start_ns`` (default
  2025-11-13T02:13:20Z, the simulator's): step ``k`` (in step order) starts at
  ``start_ns`` plus the lengths of the steps before it, a step's length being
  the latest end of any of its operations over all ranks, so that ranks stay
  aligned. Step numbers are kept as they are (the table samples steps: 23, 25,
  33...); the gaps between sampled steps are not reproduced.

Job record (written first)
  ``world_size``, ``dp``, ``pp``, ``tp`` from the meta file (``world_size``,
  ``dp_size``, ``pp_size``, ``tp_size``), else from the table; ``rank_stages``
  and ``rank_dp`` from the table; ``rank_nodes``: ``node-<rank // gpus_per_node>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from eroica.models.records import FnRecord, JobRecord, encode_record

from .common import ImportFailed, ImportStats, Spool, clip, write_spool

DEFAULT_START_NS = 1_763_000_000_000_000_000
DEFAULT_GPUS_PER_NODE = 8
COLUMNS = ("rank", "stage", "dp_rank", "step", "optype", "start_ts", "duration")
# read when present: the global model chunk of compute ops, which tells the no-op p2p records apart
OPTIONAL = ("gmc",)


def map_optype(optype: str) -> tuple[str, str, str | None]:
    """``(kind, fn, op)`` of an optype."""
    o = optype.lower()
    if o == "gc":
        return "python", "gc.collect", None
    if "clip" in o and "grad" in o:
        # Megatron's grad-norm clip all-reduces the norm over every rank before the optimizer runs: a
        # collective (its duration is mostly the wait for the last rank), not optimizer work
        return "collective", optype, "all_reduce"
    if "optimizer" in o:
        return "optimizer", optype, None
    if "reduce-scatter" in o or "reduce_scatter" in o:
        return "collective", optype, "reduce_scatter"
    if "all-gather" in o or "all_gather" in o or "allgather" in o:
        return "collective", optype, "all_gather"
    if "all-reduce" in o or "all_reduce" in o or "allreduce" in o:
        return "collective", optype, "all_reduce"
    if "broadcast" in o:
        return "collective", optype, "broadcast"
    if "send" in o:
        return "collective", optype, "send"
    if "recv" in o:
        return "collective", optype, "recv"
    if "compute" in o:
        return "kernel", optype, None
    return "other", optype, None


def group_of(optype: str, op: str | None, stage: int, dp_rank: int, pp: int) -> str | None:
    """The communicator of a collective, named alike by all its members."""
    o = optype.lower()
    if op in ("send", "recv"):
        backward = o.startswith("backward")
        # forward: send to s+1, receive from s-1; backward: send to s-1, receive from s+1
        towards_next = (op == "send") != backward
        peer = (stage + 1) % pp if towards_next else (stage - 1) % pp
        a, b = sorted((stage, peer))
        return f"pp-{a}-{b}-dp{dp_rank}"
    if "embedding" in o:
        return f"embedding-dp{dp_rank}"
    if "layernorm" in o:
        return f"tp-stage{stage}-dp{dp_rank}"
    if "clip" in o:
        return "world"
    if op is not None:
        return f"dp-stage{stage}"
    return None


def no_op_p2p(rank: np.ndarray, step: np.ndarray, optype: np.ndarray, start_s: np.ndarray,
              gmc: np.ndarray | None) -> np.ndarray:
    """True for the point-to-point records that move nothing: interleaved (VPP) Megatron records a recv
    and a send for every compute op, and those at either end of the virtual pipeline (a forward-recv of
    global model chunk 0, a forward-send of the last one; backward the other way round) have no peer.

    A rank's k-th ``forward-recv`` / ``forward-send`` goes with its k-th ``forward-compute`` (in time
    order; likewise backward), whose ``gmc`` tells; only where the counts are equal (a rank that records
    no such op at an end of the plain pipeline has none to tell apart). They are imported with no
    communicator: paired with a peer's real transfer they would tie two ranks that never waited on each other.
    """
    out = np.zeros(rank.size, bool)
    if gmc is None or rank.size == 0:
        return out
    comp = np.array([str(o).endswith("-compute") for o in optype.tolist()])
    if not comp.any():
        return out
    last = int(gmc[comp].max())
    if last < 1:
        return out
    names = np.array([str(o) for o in optype.tolist()], dtype=object)
    for direction in ("forward", "backward"):
        is_comp = names == f"{direction}-compute"
        for kind in ("recv", "send"):
            is_p2p = names == f"{direction}-{kind}"
            if not is_p2p.any():
                continue
            # the end of the virtual pipeline this op would reach past
            edge = 0 if (direction == "forward") == (kind == "recv") else last
            sel = np.flatnonzero(is_comp | is_p2p)
            key = np.lexsort((start_s[sel], ~is_comp[sel], step[sel], rank[sel]))
            sel = sel[key]
            _, first = np.unique(np.stack([rank[sel], step[sel]], 1), axis=0, return_index=True)
            for a, b in zip(first.tolist(), first[1:].tolist() + [sel.size]):
                run = sel[a:b]
                cs, ps = run[is_comp[run]], run[is_p2p[run]]
                if cs.size == ps.size:
                    out[ps[gmc[cs] == edge]] = True
    return out


def default_meta_path(path: Path) -> Path | None:
    """``meta-<X>.yaml`` beside ``trace-<X>.parquet`` (the study's layout), if it exists."""
    stem = path.name[: -len(".parquet")] if path.name.endswith(".parquet") else path.stem
    if stem.startswith("trace-"):
        cand = path.with_name("meta-" + stem[len("trace-"):] + ".yaml")
        if cand.is_file():
            return cand
    return None


def load_meta(path: str | Path) -> dict[str, Any]:
    import yaml

    try:
        meta = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ImportFailed(f"{path}: unreadable meta: {exc}") from None
    if not isinstance(meta, dict):
        raise ImportFailed(f"{path}: meta is not a mapping")
    return meta


def _missing_columns(path: str | Path, names: list[str]) -> str | None:
    """Why a table lacking some of COLUMNS cannot be imported (one line), None when none is missing.

    Without ``step`` no step can be inferred either: ``start_ts`` counts from
    the start of each row's own step, so the rows of all steps overlap on one
    time axis, and neither their time nor the row order (the study's tables
    are sorted by rank, step and optype) tells which iteration a row ran in.
    Importing them as one step would be a fake measurement.
    """
    missing = [c for c in COLUMNS if c not in names]
    if not missing:
        return None
    if "step" in missing:
        return (f"{path}: no 'step' column: start_ts counts from the start of each row's step, so the steps "
                "cannot be inferred from the rows; refusing to import them as one step: export the table with "
                "its step column (the training iteration of each row)")
    return f"{path}: not an operation table: no column {', '.join(repr(c) for c in missing)}"


def _load_table(path: str | Path) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        missing = _missing_columns(path, pq.read_schema(path).names)
        if missing:
            raise ImportFailed(missing)
        names = pq.read_schema(path).names
        table = pq.read_table(path, columns=list(COLUMNS) + [c for c in OPTIONAL if c in names])
    except (OSError, pa.ArrowInvalid, KeyError) as exc:
        raise ImportFailed(f"{path}: not a readable operation table: {exc}") from None
    cols: dict[str, np.ndarray] = {}
    for name in table.column_names:
        col = table.column(name)
        if name == "optype":
            if col.null_count:
                raise ImportFailed(f"{path}: column optype has {col.null_count} empty values")
            cols[name] = np.asarray(col.cast(pa.string()).to_pylist(), dtype=object)
        else:
            if col.null_count:
                raise ImportFailed(f"{path}: column {name} has {col.null_count} empty values")
            cols[name] = col.to_numpy()
    return cols


def _meta_int(meta: dict[str, Any], key: str) -> int | None:
    v = meta.get(key)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None


def import_optable(path: str | Path, output: str | Path, *, meta_path: str | Path | None = None,
                   job: str | None = None, gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
                   start_ns: int = DEFAULT_START_NS) -> ImportStats:
    """Import one operation table into ``output``: a ``job`` record, then ``fn`` records in time order."""
    path = Path(path)
    stats = ImportStats(sources=1)
    meta: dict[str, Any] = load_meta(meta_path) if meta_path else {}
    c = _load_table(path)
    n = c["rank"].size
    if n == 0:
        raise ImportFailed(f"{path}: the table has no row")
    rank = c["rank"].astype(np.int64)
    stage = c["stage"].astype(np.int64)
    dp = c["dp_rank"].astype(np.int64)
    step = c["step"].astype(np.int64)
    start_s = c["start_ts"].astype(np.float64)
    dur_s = c["duration"].astype(np.float64)
    gmc = c["gmc"].astype(np.int64) if "gmc" in c else None
    bad = (rank < 0) | (stage < 0) | (dp < 0) | (step < 0) | ~np.isfinite(start_s) | ~np.isfinite(dur_s) \
        | (start_s < 0) | (dur_s < 0)
    if bad.any():
        stats.skipped["rows with a negative or non-finite value"] += int(bad.sum())
        keep = ~bad
        rank, stage, dp, step, start_s, dur_s = (x[keep] for x in (rank, stage, dp, step, start_s, dur_s))
        gmc = gmc[keep] if gmc is not None else None
        c["optype"] = c["optype"][keep]
        n = rank.size
        if n == 0:
            raise ImportFailed(f"{path}: no valid row")
    optype = c["optype"]

    # Lay the steps end to end: each starts where the previous one's last operation (any rank) ended.
    start_rel = np.rint(start_s * 1e9).astype(np.int64)
    dur_ns = np.rint(dur_s * 1e9).astype(np.int64)
    steps, inverse = np.unique(step, return_inverse=True)
    length = np.zeros(steps.size, dtype=np.int64)
    np.maximum.at(length, inverse, start_rel + dur_ns)
    offset = start_ns + np.concatenate(([0], np.cumsum(length)[:-1]))
    ts = offset[inverse] + start_rel

    # Roles: from the table (authoritative), sizes from the meta file when it has them.
    ranks = np.unique(rank)
    pp = _meta_int(meta, "pp_size") or int(np.unique(stage).size)
    dp_size = _meta_int(meta, "dp_size") or int(np.unique(dp).size)
    tp = _meta_int(meta, "tp_size")
    world = _meta_int(meta, "world_size") or int(ranks.max()) + 1
    if world < int(ranks.max()) + 1:
        stats.warnings.append(f"meta world_size {world} but the table has rank {int(ranks.max())}; "
                              f"using {int(ranks.max()) + 1}")
        world = int(ranks.max()) + 1
    if int(stage.max()) >= pp:
        stats.warnings.append(f"pp_size {pp} but the table has stage {int(stage.max())}; using {int(stage.max()) + 1}")
        pp = int(stage.max()) + 1
    first = np.unique(rank, return_index=True)[1]
    rank_stage = dict(zip(rank[first].tolist(), stage[first].tolist()))
    rank_dp = dict(zip(rank[first].tolist(), dp[first].tolist()))
    for r in ranks.tolist():
        mine = rank == r
        if np.unique(stage[mine]).size > 1 or np.unique(dp[mine]).size > 1:
            stats.warnings.append(f"rank {r} appears with several stages or dp ranks; using the first")
    complete = ranks.size == world
    if not complete:
        stats.warnings.append(f"the table has {ranks.size} of {world} ranks: no rank_stages / rank_dp in the job record")
    job = clip(job) if job else clip(path.name[: -len(".parquet")] if path.name.endswith(".parquet") else path.stem)
    nodes = [f"node-{r // gpus_per_node}" for r in range(world)]
    head = [encode_record(JobRecord(
        job=job, world_size=world, ts_ns=start_ns, rank_nodes=nodes,
        rank_stages=[rank_stage[r] for r in range(world)] if complete else None,
        rank_dp=[rank_dp[r] for r in range(world)] if complete else None,
        dp=dp_size, pp=pp, tp=tp,
    ))]

    noop = no_op_p2p(rank, step, optype, start_s, gmc)
    mapped = {o: map_optype(str(o)) for o in set(optype.tolist())}
    for o, (kind, _, _) in mapped.items():
        if kind == "other":
            stats.warnings.append(f"unknown optype {o!r}: imported as kind other")
    order = np.lexsort((rank, ts))
    run: list[tuple[int, bytes]] = []
    groups: dict[tuple[str, int, int], str | None] = {}
    rank_l, stage_l, dp_l, step_l, ts_l, dur_l = (x.tolist() for x in (rank, stage, dp, step, ts, dur_ns))
    for i in order.tolist():
        o = optype[i]
        kind, fn, op = mapped[o]
        r, s, d, k = rank_l[i], stage_l[i], dp_l[i], step_l[i]
        group = None
        if kind == "collective" and not noop[i]:
            key = (o, s, d)
            group = groups.get(key)
            if group is None:
                group = groups[key] = group_of(str(o), op, s, d, pp)
        run.append((ts_l[i], encode_record(FnRecord(
            job=job, node=nodes[r] if r < world else f"node-{r // gpus_per_node}", rank=r, step=k, fn=clip(fn),
            kind=kind, ts_ns=ts_l[i], dur_ns=dur_l[i], op=op, group=group))))
        stats.count(kind, r, k)
    with Spool() as spool:
        spool.add(run)
        write_spool(spool, output, head)
    return stats
