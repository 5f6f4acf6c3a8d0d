"""What-if analysis: how much faster a job would run without its stragglers, and whose fault it is.

After the OSDI'25 straggler study ("Understanding Stragglers in Large Model
Training Using What-if Analysis", ByteDance-Seed/StragglerAnalysis): replay each
traced step on its dependency graph with operation durations replaced, and
compare step times.

* **S** (``slowdown``) = mean measured step time / mean step time of the same
  steps replayed with every operation at its *typical* duration.
* **S_X** = replayed step time when only the operations of X keep their measured
  durations (all others typical) / the ideal step time, for X = each rank,
  data-parallel index, pipeline stage and function.

The dependency graph, inferred from the records alone (pure numpy, no I/O):

* **Each rank's ops in sequence**: a rank's records of one step are split into
  lanes (its CUDA streams; records without a stream are packed greedily into
  non-overlapping lanes, so concurrent host / GPU work is not serialised). An
  op depends on its lane predecessor and, in every other lane of its rank, on
  the last op that had ended when it started. The measured gap after its
  latest dependency (launch delay, data loading not traced, ...) is kept.
  Host spans that enclose other records of their rank (``train_step``,
  ``model.forward``) are containers, not work, and are left out.
* **Collectives finish together**: the members of one collective instance
  (same step, communicator and op, k-th occurrence on each member) form one
  node that ends when its last member arrives plus its transfer time, the
  least member duration (the member that waited least).
* **Pipeline send/recv**: per communicator and direction (``forward-*`` /
  ``backward-*``), the k-th recv of one rank takes the k-th send of the other
  (p2p is delivered in order: a stage's forward of micro-batch m waits for the
  previous stage's forward of m, a backward for the next stage's backward, in
  any schedule: 1F1B, GPipe); where the counts differ, each recv takes the
  send of another rank that started before it ended and ended closest to it.
  The pair is a two-member collective, so a recv cannot finish before its
  send has started (the reference analyzer pairs them alike).
* **An asynchronous send does not hold its rank** (interleaved 1F1B, GPipe:
  Megatron's ``isend``, waited on later): the op after it on its rank waits
  for what the send waited for plus the measured gap (the send's issue
  time); only the receiver waits for the pair. A blocking send (1F1B's
  batched send/recv) holds its rank until its pair ends. Which one a send
  function is, the records tell: of its pairs whose sender came first, most
  ended before the receiver posted its recv (``_eager_sends``). Holding an
  asynchronous send's rank made a sender whose receiver came late wait in
  the replay; worse, the pair's node arrives with that late receiver, after
  the sender's next op, so that dependency was dropped as backward and the
  op replayed from the step start (interleaved replays up to 31% short).
* **The step time is the critical path**: from the step's first measured start
  to the last replayed end. Ops with no dependency in their step (a rank's
  first op) keep their measured offset from the step start.

When S is no measurement: S compares the measured steps with the replayed
ideal, so it measures the job only where the replay fits it. Two checks, and
a job that fails one gets no S and no decomposition, only the reason
(``WhatIf.reason``): the replay with every operation at its *measured*
duration must reproduce the measured step time within ``FIT_TOLERANCE``
(else S would measure the model's error: on the real Kineto traces the replay
comes out 5-21% short of the measured step), and S must
not be below 1 (an ideal slower than what was measured: typical durations
taken operation by operation compose a step no rank ran, and 1 - 1/S would
be a negative cost).

Typical durations (``stat``): ``"study"``, the OSDI'25 study's definition (the
one its published S uses): per function, the mean duration over every rank,
micro-batch and step (a straggler's own ops included), and for collectives
the median transfer (a lone one too: a no-op p2p record at an interleaved
pipeline's end gets its kind's transfer, not its function's mean, mostly
waits); measured against the study's reference analyzer on
generated pipelines (``eroica bench cost --reference``) and on its real trace,
S agrees within 5% with it. ``"auto"`` takes it for pipeline-parallel jobs
(ranks in several stages, the study's scope) and ``"median"`` otherwise.
``"median"`` / ``"mean"``: for each function and position (its k-th occurrence in the
rank's step, i.e. micro-batch), that statistic over the peer ranks (``peers``:
``"job"``, every rank that runs it, or ``"stage"``, the ranks of the same
pipeline stage) and, with ``pool_steps``, over all steps. Collective
instances get the typical transfer of their kind and position the same way.
In a scenario X a collective keeps its measured transfer when any member is
in X.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from eroica.models.columns import KIND_CODE, OP_CODE

_COLLECTIVE = KIND_CODE["collective"]
_SEND, _RECV = OP_CODE["send"], OP_CODE["recv"]
# kinds whose records may be host-side containers of other records
_HOST_KINDS = np.array([KIND_CODE[k] for k in ("python", "dataloader", "optimizer", "io", "other")])
# an op "follows" another that ended at most this long after it started (clock skew, rounding)
TOLERANCE_NS = 100_000
# A collective timed on the host ends when its completion callback runs on another thread (DDP's
# all-reduce hook, gloo's work): that thread reads the clock only once it holds the GIL, up to the
# interpreter's switch interval (5 ms) late and later on a loaded host (seen: 5.7 ms on 4 ranks sharing
# 2 cores). The rank's next op may then start before the collective's record ends though it waited for
# it; without this allowance that wait became a "measured gap" the replay kept (a DDP job's optimizer
# step 117 ms after its backward, the straggler's whole stall).
CALLBACK_LAG_NS = 10_000_000
# cells of the scenario-duration matrix replayed at once (bounds memory on large jobs)
MAX_CELLS = 8_000_000
# S is a measurement only where the replay of the measured durations is this close to the measured step time:
# its error is S's error, and a straggler cost of a few percent must not be the model's own
FIT_TOLERANCE = 0.05
# typical-duration statistics (see ``whatif``)
STATS = ("median", "mean", "study", "auto")
# S this little below 1 is float rounding of equal step times (reported as 1), not an ideal slower than the job
_ROUNDING = 1e-9


@dataclass(frozen=True)
class OpTable:
    """One job's per-operation records (fn records), flat numpy columns.

    ``fn`` and ``group`` are codes into ``fn_names`` / ``group_names`` (group
    -1: none); ``op`` is the contract's collective op code (-1: none);
    ``stream`` -1 when unknown.
    """

    rank: np.ndarray
    step: np.ndarray
    fn: np.ndarray
    kind: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    op: np.ndarray
    group: np.ndarray
    stream: np.ndarray
    fn_names: list[str]
    group_names: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.rank.size)

    def take(self, idx: np.ndarray) -> "OpTable":
        cols = {k: getattr(self, k)[idx] for k in
                ("rank", "step", "fn", "kind", "start", "dur", "op", "group", "stream")}
        return OpTable(**cols, fn_names=self.fn_names, group_names=self.group_names)


@dataclass
class WhatIf:
    """One job's what-if result; ``reason`` set (and ``slowdown`` NaN) when S is no measurement of it."""

    steps: int
    slowdown: float
    actual_s: float            # mean measured step time
    ideal_s: float             # mean replayed step time, every op typical
    replay_s: float            # mean replayed step time, every op measured (fidelity of the graph)
    by_rank: dict[str, float]
    by_dp: dict[str, float]
    by_stage: dict[str, float]
    by_fn: dict[str, float]
    # hardware and links: the ranks of a node with their own work only (compute, copies, loader: a node's
    # collectives are its rings', shared with every other node), and a communicator's collectives alone
    by_node: dict[str, float] = field(default_factory=dict)
    by_group: dict[str, float] = field(default_factory=dict)
    step_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    step_actual: np.ndarray = field(default_factory=lambda: np.empty(0))
    step_ideal: np.ndarray = field(default_factory=lambda: np.empty(0))
    reason: str | None = None  # why S is not measurable on this input (None: it is)

    @property
    def measurable(self) -> bool:
        return self.reason is None

    def to_json(self, job: str) -> dict[str, Any]:
        """The command's JSON: a job without a measurable S has ``slowdown`` null, the reason, no decomposition."""
        ok = self.measurable
        return {
            "job": job, "steps": self.steps, "measurable": ok, "slowdown": self.slowdown if ok else None,
            **({} if ok else {"reason": self.reason}),
            "step_s": {"actual": self.actual_s, "ideal": self.ideal_s, "replay": self.replay_s},
            "by_rank": self.by_rank if ok else {}, "by_dp": self.by_dp if ok else {},
            "by_stage": self.by_stage if ok else {}, "by_fn": self.by_fn if ok else {},
            "by_node": self.by_node if ok else {}, "by_group": self.by_group if ok else {},
        }


def not_measurable(actual: float, replay: float, ideal: float) -> str | None:
    """Why S = actual / ideal (mean step times, s) is no measurement of the job; None when it is one.

    The replay of the measured durations must fit the measured step time (the
    model's error would otherwise be read as a straggler cost), and the ideal
    must not be slower than the measured job (S < 1, a negative cost).
    """
    if not (actual > 0 and ideal > 0):
        return "no step with a positive duration to replay"
    miss = replay / actual - 1.0
    if abs(miss) > FIT_TOLERANCE:
        return (f"the replay model does not fit this input: replaying every operation at its measured duration "
                f"gives {replay:.3f} s per step where {actual:.3f} s were measured ({miss:+.0%}), "
                "so S would measure the model, not the job")
    if actual / ideal < 1.0 - _ROUNDING:
        return (f"the replay model does not fit this input: with every operation at its typical duration the "
                f"replayed step ({ideal:.3f} s) is longer than the measured one ({actual:.3f} s), S = "
                f"{actual / ideal:.3f} < 1: typical durations taken operation by operation compose a step that "
                "no rank ran, so there is no straggler cost to read from it")
    return None


# ----------------------------------------------------------------------------- helpers


def _group_ids(*keys: np.ndarray) -> np.ndarray:
    """Dense ids of the distinct tuples of the key columns."""
    if not keys or keys[0].size == 0:
        return np.zeros(0, np.int64)
    stacked = np.stack([np.asarray(k, np.int64) for k in keys], axis=1)
    _, inv = np.unique(stacked, axis=0, return_inverse=True)
    return inv.reshape(-1).astype(np.int64)


def _occurrence(order_keys: tuple[np.ndarray, ...], by: np.ndarray) -> np.ndarray:
    """k-th occurrence of each row within its group ``by``, in the order of ``order_keys`` (lexsort, last key primary)."""
    n = by.size
    order = np.lexsort(order_keys + (by,))
    sb = by[order]
    first = np.r_[True, sb[1:] != sb[:-1]]
    starts = np.flatnonzero(first)
    run = np.repeat(starts, np.diff(np.r_[starts, n]))
    occ = np.empty(n, np.int64)
    occ[order] = np.arange(n) - run
    return occ


def _group_stat(values: npt.NDArray[np.float64], gid: npt.NDArray[np.intp], stat: str) -> npt.NDArray[np.float64]:
    """Per-row statistic (median or mean) of ``values`` over the rows of the same group."""
    n_groups = int(gid.max()) + 1 if gid.size else 0
    if stat == "mean":
        s = np.bincount(gid, weights=values, minlength=n_groups)
        c = np.bincount(gid, minlength=n_groups)
        return (s / np.maximum(c, 1))[gid]
    order = np.lexsort((values, gid))
    sg, sv = gid[order], values[order]
    starts = np.searchsorted(sg, np.arange(n_groups), "left")
    ends = np.searchsorted(sg, np.arange(n_groups), "right")
    lo = sv[starts + (ends - starts - 1) // 2]
    hi = sv[starts + (ends - starts) // 2]
    return ((lo + hi) / 2.0)[gid]


def _leaf_mask(t: OpTable) -> np.ndarray:
    """False for host spans that enclose another record of their rank (containers, not work)."""
    keep = np.ones(len(t), bool)
    cand = np.flatnonzero(np.isin(t.kind, _HOST_KINDS) & (t.stream < 0))
    if cand.size == 0:
        return keep
    end = t.start + t.dur
    for r in np.unique(t.rank[cand]):
        mine = np.flatnonzero(t.rank == r)
        c = cand[t.rank[cand] == r]
        order = mine[np.argsort(t.start[mine], kind="stable")]
        s, e = t.start[order], end[order]
        # candidates in chunks: contains[i, j] = record j lies inside candidate i (and is not i)
        for lo in range(0, c.size, 256):
            cc = c[lo:lo + 256]
            a = np.searchsorted(s, t.start[cc], "left")
            b = np.searchsorted(s, end[cc], "right")
            width = int((b - a).max(initial=0))
            if width == 0:
                continue
            idx = a[:, None] + np.arange(width)[None, :]
            valid = idx < b[:, None]
            idx = np.minimum(idx, s.size - 1)
            inside = valid & (e[idx] <= end[cc][:, None]) & (order[idx] != cc[:, None])
            keep[cc[inside.any(axis=1)]] = False
    return keep


def _lanes(rank_step: np.ndarray, start: np.ndarray, end: np.ndarray, stream: np.ndarray) -> np.ndarray:
    """Lane of each op within its (rank, step): its stream, or a greedy non-overlapping lane."""
    lane = np.where(stream >= 0, stream.astype(np.int64), -1)
    free = np.flatnonzero(stream < 0)
    if free.size == 0:
        return lane
    order = free[np.lexsort((start[free], rank_step[free]))]
    base = int(stream.max(initial=-1)) + 1
    cur_rs = None
    lane_end: list[int] = []
    for i in order.tolist():
        rs = rank_step[i]
        if rs != cur_rs:
            cur_rs, lane_end = rs, []
        s = start[i]
        for j, le in enumerate(lane_end):
            if s >= le - TOLERANCE_NS:
                lane_end[j] = max(le, end[i])
                lane[i] = base + j
                break
        else:
            lane_end.append(end[i])
            lane[i] = base + len(lane_end) - 1
    return lane


def _dependencies(rs: np.ndarray, lane: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges (src op, dst op): the lane predecessor and, in each other lane of the rank-step,
    the last op ended by the start of dst (within tolerance)."""
    ls = _group_ids(rs, lane)
    order = np.lexsort((start, ls))
    sl = ls[order]
    same = np.r_[False, sl[1:] == sl[:-1]]
    srcs, dsts = [order[np.flatnonzero(same) - 1]], [order[same]]
    # number the lanes of each rank-step 0, 1, ...; handle lane number k of every rank-step at once
    lane_ids, first = np.unique(ls, return_index=True)
    lane_no = _occurrence((lane_ids,), rs[first])[np.searchsorted(lane_ids, ls)]
    for k in range(int(lane_no.max(initial=-1)) + 1):
        keys = np.flatnonzero(lane_no == k)
        queries = np.flatnonzero(lane_no != k)
        if queries.size == 0:
            continue
        # merge lane-k ends with the others' starts by (rank-step, time); a query sees the last key before it
        item = np.r_[keys, queries]
        time = np.r_[end[keys], start[queries] + TOLERANCE_NS]
        flag = np.r_[np.zeros(keys.size, np.int8), np.ones(queries.size, np.int8)]
        o = np.lexsort((flag, time, rs[item]))
        is_key = flag[o] == 0
        last = np.maximum.accumulate(np.where(is_key, np.arange(o.size), -1))
        q = np.flatnonzero(~is_key)
        lk = last[q]
        ok = lk >= 0
        q, lk = q[ok], lk[ok]
        same_rs = rs[item[o[lk]]] == rs[item[o[q]]]
        srcs.append(item[o[lk[same_rs]]])
        dsts.append(item[o[q[same_rs]]])
    return np.concatenate(srcs).astype(np.int64), np.concatenate(dsts).astype(np.int64)


def _direction(name: str) -> str:
    """The pipeline direction a p2p function's name states (its first word: ``forward``, ``backward``), or ''."""
    head = name.lower().replace("_", "-").split("-")[0]
    return head if head in ("forward", "backward", "fwd", "bwd") else ""


def _pair_p2p(t: OpTable, idx: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict[int, int]:
    """Recv op -> matching send op, per (step, communicator, direction).

    Point-to-point transfers between two ranks are delivered in order (NCCL
    p2p is FIFO per peer and direction), so where the recvs of one rank and
    the sends of the other in one direction are equally many, the k-th recv
    takes the k-th send: a pipeline's pairs by their schedule, whether sends
    are blocking (their ends coincide) or eager (a send ends long before its
    recv). The direction (``forward-*`` / ``backward-*``, from the function
    name) separates the two flows that share a pair's communicator. Otherwise
    (counts differ: no-op records at either end of an interleaved pipeline,
    lost records), each recv, in order of end, takes the unused send of
    another rank that started before it ended and ended closest to it.
    """
    pairs: dict[int, int] = {}
    sr = idx[np.isin(t.op[idx], (_SEND, _RECV))]
    if sr.size == 0:
        return pairs
    dirs = np.array([_direction(t.fn_names[f]) for f in range(len(t.fn_names))] or [""], dtype=object)
    dir_code = np.unique(dirs[t.fn[sr]], return_inverse=True)[1].reshape(-1)
    key = _group_ids(t.step[sr], t.group[sr], dir_code)
    for g in np.unique(key):
        ops = sr[key == g]
        sends = ops[t.op[ops] == _SEND]
        recvs = ops[t.op[ops] == _RECV]
        if sends.size == 0 or recvs.size == 0:
            continue
        # one flow per sender: its sends and the recvs of the one other rank (a pp = 2 or interleaved
        # pipeline's two stages send each other forward on one communicator)
        s_ranks, r_ranks = np.unique(t.rank[sends]), np.unique(t.rank[recvs])
        flows = [(sends[t.rank[sends] == a], recvs[t.rank[recvs] != a]) for a in s_ranks.tolist()]
        if r_ranks.size <= 2 and all(np.unique(t.rank[rv]).size == 1 and sd.size == rv.size for sd, rv in flows):
            for sd, rv in flows:
                so = sd[np.argsort(start[sd], kind="stable")]
                ro = rv[np.argsort(start[rv], kind="stable")]
                pairs.update(zip(ro.tolist(), so.tolist()))
            continue
        used = np.zeros(sends.size, bool)
        for r in recvs[np.argsort(end[recvs], kind="stable")]:
            cost = np.abs(end[sends] - end[r]).astype(np.float64)
            cost[used | (t.rank[sends] == t.rank[r]) | (start[sends] > end[r] + TOLERANCE_NS)] = np.inf
            j = int(np.argmin(cost))
            if np.isfinite(cost[j]):
                used[j] = True
                pairs[int(r)] = int(sends[j])
    return pairs


def _eager_sends(t: OpTable, pairs: dict[int, int], end: np.ndarray) -> np.ndarray:
    """Per op: True for a send issued asynchronously (``isend``: it does not hold its rank until the receiver
    has taken it), told apart per send function from the records.

    A blocking send (1F1B's batched ``send_forward_recv_backward``...) that started before its receiver posted
    the recv waits for it and ends with the transfer, after the recv started; an asynchronous one
    (interleaved 1F1B, GPipe: Megatron's ``isend``, its handle waited on later) ends its own issue while the
    receiver is still busy. A function's sends are asynchronous when, of its pairs whose sender came first,
    most ended before their recv started (the same call issues them all alike; where the receiver always
    came first the two cannot be told apart, and the send stays blocking: the replay is the same).
    """
    eager = np.zeros(len(t), bool)
    if not pairs:
        return eager
    r = np.fromiter(pairs.keys(), np.int64, len(pairs))
    s = np.fromiter(pairs.values(), np.int64, len(pairs))
    first = t.start[s] < t.start[r] - TOLERANCE_NS
    early = first & (end[s] < t.start[r] - TOLERANCE_NS)
    fns = t.fn[s].astype(np.int64)
    n_fn = int(fns.max()) + 1
    is_eager = 2 * np.bincount(fns, weights=early, minlength=n_fn) > np.bincount(fns, weights=first, minlength=n_fn)
    eager[s[is_eager[fns]]] = True
    return eager


def _detach(src: np.ndarray, dst: np.ndarray, detached: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Op edges with the ``detached`` ops (asynchronous sends) taken out of their ranks' sequence: an edge
    from one becomes edges from each of its own sources (through a run of them), its in-edges stay (its
    transfer, the pair's node, still starts only once it was issued). The op after an asynchronous send
    then waits for what the send waited for plus the measured gap, which holds the send's issue time;
    the receiver alone waits for the transfer."""
    for _ in range(64):
        out = detached[src]
        if not out.any():
            break
        keep_s, keep_d = src[~out], dst[~out]
        # join (p -> s) with (s -> x) on s, for the detached s
        o = np.argsort(dst, kind="stable")
        in_dst, in_src = dst[o], src[o]
        s_out, x_out = src[out], dst[out]
        lo = np.searchsorted(in_dst, s_out, "left")
        hi = np.searchsorted(in_dst, s_out, "right")
        cnt = hi - lo
        rep = np.repeat(np.arange(s_out.size), cnt)
        idx = np.repeat(lo - np.r_[0, np.cumsum(cnt)[:-1]], cnt) + np.arange(int(cnt.sum()))
        new_s, new_d = in_src[idx], x_out[rep]
        ok = new_s != new_d
        src, dst = np.r_[keep_s, new_s[ok]], np.r_[keep_d, new_d[ok]]
    else:
        out = detached[src]
        src, dst = src[~out], dst[~out]
    return src.astype(np.int64), dst.astype(np.int64)


# ----------------------------------------------------------------------------- the graph


@dataclass
class _Graph:
    node: np.ndarray         # op -> node (collective members share one)
    n: int
    src: np.ndarray          # edges between nodes, in topological order of dst
    dst: np.ndarray
    w: np.ndarray            # gap kept after the source ends (s)
    init: np.ndarray         # node's earliest start (-inf unless it has a root member), s from step start
    level: np.ndarray        # topological level of each node
    step_of: np.ndarray      # node -> step slot
    step_start: np.ndarray   # per step slot, measured start (ns)
    is_coll: np.ndarray      # node is a collective instance


def _build(t: OpTable) -> _Graph:
    n_ops = len(t)
    end = t.start + t.dur
    steps, step_slot = np.unique(t.step, return_inverse=True)
    step_start = np.full(steps.size, np.iinfo(np.int64).max)
    np.minimum.at(step_start, step_slot, t.start)
    rel_start = (t.start - step_start[step_slot]).astype(np.float64) / 1e9
    rel_end = rel_start + t.dur / 1e9

    rs = _group_ids(t.rank, t.step)
    lane = _lanes(rs, t.start, end, t.stream)
    host_coll = (t.kind == _COLLECTIVE) & (t.stream < 0)
    src, dst = _dependencies(rs, lane, t.start, end - np.where(host_coll, CALLBACK_LAG_NS, 0))

    # collective instances -> nodes
    node = np.arange(n_ops, dtype=np.int64)
    coll = np.flatnonzero((t.kind == _COLLECTIVE) & (t.group >= 0))
    is_p2p = np.isin(t.op[coll], (_SEND, _RECV))
    grp = coll[~is_p2p]
    if grp.size:
        opk = np.where(t.op[grp] >= 0, t.op[grp].astype(np.int64), 1000 + t.fn[grp])
        occ = _occurrence((t.start[grp],), _group_ids(t.rank[grp], t.step[grp], t.group[grp], opk))
        inst = _group_ids(t.step[grp], t.group[grp], opk, occ)
        first = np.full(int(inst.max()) + 1, n_ops, np.int64)
        np.minimum.at(first, inst, grp)
        node[grp] = first[inst]
    pairs = _pair_p2p(t, coll[is_p2p], t.start, end)
    for r, s in pairs.items():
        node[r] = node[s] = min(r, s)
    # an asynchronous send does not hold its rank: what follows it waits for what it waited for
    src, dst = _detach(src, dst, _eager_sends(t, pairs, end))
    uniq, node = np.unique(node, return_inverse=True)
    n = uniq.size

    # edges between nodes, weight = the dst op's measured gap after its latest dependency
    latest = np.full(n_ops, -np.inf)
    np.maximum.at(latest, dst, rel_end[src])
    gap = np.where(np.isfinite(latest), np.maximum(rel_start - latest, 0.0), 0.0)
    e_src, e_dst = node[src], node[dst]
    w = gap[dst]
    # roots: ops without a dependency keep their measured start
    init = np.full(n, -np.inf)
    root = ~np.isfinite(latest)
    np.maximum.at(init, node[root], rel_start[root])
    # acyclic: keep only edges forward in the order of the nodes' measured arrival (last member start)
    arrive = np.full(n, -np.inf)
    np.maximum.at(arrive, node, rel_start)
    step_of = np.zeros(n, np.int64)
    step_of[node] = step_slot
    rank_order = np.empty(n, np.int64)
    rank_order[np.lexsort((np.arange(n), arrive, step_of))] = np.arange(n)
    fwd = (rank_order[e_src] < rank_order[e_dst]) & (e_src != e_dst)
    e_src, e_dst, w = e_src[fwd], e_dst[fwd], w[fwd]
    # dedupe parallel edges (keep the largest gap)
    if e_src.size:
        o = np.lexsort((-w, e_dst, e_src))
        e_src, e_dst, w = e_src[o], e_dst[o], w[o]
        k = np.r_[True, (e_src[1:] != e_src[:-1]) | (e_dst[1:] != e_dst[:-1])]
        e_src, e_dst, w = e_src[k], e_dst[k], w[k]
    # topological levels: process nodes in arrival order, a node's level = 1 + max level of its sources
    level = np.zeros(n, np.int64)
    if e_src.size:
        while True:
            new = level.copy()
            np.maximum.at(new, e_dst, level[e_src] + 1)
            if np.array_equal(new, level):
                break
            level = new
    o = np.lexsort((e_dst, level[e_dst]))
    is_coll = np.bincount(node, minlength=n) > 1
    return _Graph(node, n, e_src[o], e_dst[o], w[o], init, level, step_of, step_start, is_coll)


def _replay(g: _Graph, dur: np.ndarray) -> np.ndarray:
    """End time (s from the step start) of every node under each column of ``dur`` [n, k]."""
    k = dur.shape[1]
    ready = np.repeat(np.maximum(g.init, 0.0)[:, None], k, axis=1)
    ready[~np.isfinite(g.init)] = 0.0
    end = np.zeros_like(dur)
    lv_nodes = np.argsort(g.level, kind="stable")
    lv_sorted = g.level[lv_nodes]
    n_levels = int(g.level.max(initial=0)) + 1
    node_bounds = np.searchsorted(lv_sorted, np.arange(n_levels + 1))
    e_lv = g.level[g.dst]
    edge_bounds = np.searchsorted(e_lv, np.arange(n_levels + 1))
    for L in range(n_levels):
        a, b = edge_bounds[L], edge_bounds[L + 1]
        if b > a:
            d = g.dst[a:b]
            vals = end[g.src[a:b]] + g.w[a:b, None]
            cuts = np.r_[0, np.flatnonzero(d[1:] != d[:-1]) + 1]
            best = np.maximum.reduceat(vals, cuts, axis=0)
            tgt = d[cuts]
            ready[tgt] = np.maximum(ready[tgt], best)
        nodes = lv_nodes[node_bounds[L]:node_bounds[L + 1]]
        end[nodes] = ready[nodes] + dur[nodes]
    return end


def _step_times(g: _Graph, end: np.ndarray, n_steps: int) -> np.ndarray:
    out = np.zeros((n_steps, end.shape[1]))
    np.maximum.at(out, g.step_of, end)
    return out


# ----------------------------------------------------------------------------- the analysis


def whatif(t: OpTable, rank_stage: dict[int, int] | None = None, rank_dp: dict[int, int] | None = None,
           *, peers: str = "job", stat: str = "median", pool_steps: bool = True,
           rank_node: dict[int, str] | None = None) -> WhatIf | None:
    """The what-if slowdown of one job and its decompositions; None without a complete step.

    ``peers``: whose durations define an op's typical duration, ``"job"``
    (every rank running that function at that position: a stage that is
    slower than the others, e.g. holding too many layers, counts as a
    straggler, as in the OSDI'25 study) or ``"stage"`` (only the ranks of the
    same pipeline stage: stage imbalance is then part of the ideal).
    ``stat``: ``"median"`` or ``"mean"`` per function and position, ``"study"``
    (per function, the mean over positions, peers and steps; collectives the
    median transfer), ``"auto"`` (study on a job with several stages, median
    otherwise). ``pool_steps``: typical over all steps (one ideal per
    position) or per step. ``rank_node``: each rank's node, for ``by_node``.

    ``by_rank``, ``by_dp`` and ``by_stage`` keep every operation of their
    ranks measured, collectives included, as the OSDI'25 study does: every
    member of a slow ring then carries the ring's whole cost. ``by_group``
    prices each communicator's collectives alone (a slow link is its ring's
    cost, not its members'), and ``by_node`` a node's ranks' own work (their
    collectives are their rings').
    """
    if peers not in ("job", "stage") or stat not in STATS:
        raise ValueError(f"peers must be job|stage and stat one of {'|'.join(STATS)}")
    ok = (t.step >= 0) & (t.dur >= 0)
    t = t.take(np.flatnonzero(ok))
    if len(t) == 0:
        return None
    t = t.take(np.flatnonzero(_leaf_mask(t)))
    rank_stage = rank_stage or {}
    rank_dp = rank_dp or {}
    ranks = np.unique(t.rank)
    stage_of = np.array([rank_stage.get(int(r), 0) for r in t.rank], np.int64)
    dp_of = np.array([rank_dp.get(int(r), 0) for r in t.rank], np.int64)

    g = _build(t)
    n_steps = g.step_start.size
    dur_s = t.dur.astype(np.float64) / 1e9

    # typical duration of each op: same function and position (k-th in its rank-step), over the peers
    pos = _occurrence((t.start,), _group_ids(t.rank, t.step, t.fn))
    peer = stage_of if peers == "stage" else np.zeros(len(t), np.int64)
    step_key = np.zeros(len(t), np.int64) if pool_steps else t.step
    if stat == "auto":
        stat = "study" if np.unique(stage_of).size > 1 else "median"
    # the study's typical: one per function, over every position (micro-batch), peer and step
    pos_key = np.zeros(len(t), np.int64) if stat == "study" else pos
    typ_op = _group_stat(dur_s, _group_ids(t.fn, pos_key, peer, step_key), "mean" if stat == "study" else stat)

    # nodes: measured and typical durations (collective: transfer = least member duration)
    n = g.n
    meas = np.full(n, np.inf)
    np.minimum.at(meas, g.node, dur_s)
    # representative member of each node (its kind and position): a send if any, else the first op
    pref = np.where(t.op == _SEND, 0, 1) * (len(t) + 1) + np.arange(len(t))
    best = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(best, g.node, pref)
    key_op = best % (len(t) + 1)
    typ = typ_op[key_op].copy()
    # a collective's typical is its transfer's, of the instances of its kind: a lone one too (a no-op p2p record
    # of an interleaved pipeline's either end, an unmatched member), whose function's records are mostly waits
    coll_nodes = np.flatnonzero(g.is_coll | (t.kind[key_op] == _COLLECTIVE))
    if coll_nodes.size:
        k = key_op[coll_nodes]
        gid = _group_ids(t.fn[k], pos_key[k], peer[k], step_key[k])
        typ[coll_nodes] = _group_stat(meas[coll_nodes], gid, "median" if stat == "study" else stat)

    # scenarios: measured, ideal, then one per rank / dp / stage / fn
    fns = np.unique(t.fn)
    stages = np.unique(stage_of)
    dps = np.unique(dp_of)
    rank_node = rank_node or {}
    node_names = sorted({rank_node[int(r)] for r in ranks if int(r) in rank_node})
    node_code = {name: i for i, name in enumerate(node_names)}
    node_of = np.array([node_code.get(rank_node.get(int(r), ""), -1) for r in t.rank], np.int64)
    coll_op = (t.kind == _COLLECTIVE) & (t.group >= 0)
    groups = np.unique(t.group[coll_op])
    labels: list[tuple[str, int]] = ([("rank", int(r)) for r in ranks] + [("dp", int(d)) for d in dps]
                                     + [("stage", int(s)) for s in stages] + [("fn", int(f)) for f in fns]
                                     + [("node", i) for i in range(len(node_names))]
                                     + [("group", int(x)) for x in groups])
    attr = {"rank": t.rank.astype(np.int64), "dp": dp_of, "stage": stage_of, "fn": t.fn.astype(np.int64),
            "node": node_of, "group": np.where(coll_op, t.group, -1).astype(np.int64)}

    def member_of(kind: str, value: int) -> np.ndarray:
        hit = np.zeros(n, bool)
        hit[g.node[attr[kind] == value]] = True
        if kind == "node":
            hit &= ~g.is_coll  # a node's own work: its collectives are its rings' (by_group)
        return hit

    totals: list[np.ndarray] = []
    base = _step_times(g, _replay(g, np.stack([meas, typ], 1)), n_steps)
    replay_steps, ideal_steps = base[:, 0], base[:, 1]
    chunk = max(1, MAX_CELLS // max(n, 1))
    for lo in range(0, len(labels), chunk):
        part = labels[lo:lo + chunk]
        masks = np.stack([member_of(kd, v) for kd, v in part], 1)
        dur = np.where(masks, meas[:, None], typ[:, None])
        totals.append(_step_times(g, _replay(g, dur), n_steps))
    scen = np.concatenate(totals, axis=1) if totals else np.zeros((n_steps, 0))

    end_ns = t.start + t.dur
    last = np.full(n_steps, np.iinfo(np.int64).min)
    slot = np.searchsorted(np.unique(t.step), t.step)
    np.maximum.at(last, slot, end_ns)
    actual_steps = (last - g.step_start) / 1e9
    ideal = float(ideal_steps.mean())
    actual = float(actual_steps.mean())
    replay = float(replay_steps.mean())
    ratios = scen.mean(axis=0) / ideal if ideal > 0 else np.ones(len(labels))
    out: dict[str, dict[str, float]] = {"rank": {}, "dp": {}, "stage": {}, "fn": {}, "node": {}, "group": {}}
    for (kd, v), r in zip(labels, ratios.tolist()):
        name = (t.fn_names[v] if kd == "fn" else node_names[v] if kd == "node"
                else t.group_names[v] if kd == "group" and v < len(t.group_names) else str(v))
        out[kd][name] = float(r)
    reason = not_measurable(actual, replay, ideal)
    return WhatIf(
        steps=int(n_steps), slowdown=max(actual / ideal, 1.0) if reason is None else float("nan"),
        actual_s=actual, ideal_s=ideal, replay_s=replay,
        by_rank=out["rank"], by_dp=out["dp"], by_stage=out["stage"], by_fn=out["fn"],
        by_node=out["node"], by_group=out["group"],
        step_ids=np.unique(t.step), step_actual=actual_steps, step_ideal=ideal_steps, reason=reason,
    )
