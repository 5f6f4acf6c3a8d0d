"""Process-group ids that every member of a communicator computes alike, with no collective call.

torch's own process-group names (``pg.group_name``) are counters or hashes
that depend on the order in which each rank created its groups, and asking the
members to agree on one would be a collective: a tracer must never issue one
(a rank that is not in a group, or is stuck elsewhere, would hang the job, as
detectors that broadcast their ids do under DTensor). The global ranks of a
communicator are known locally (``get_process_group_ranks`` reads torch's
own table), so the id is derived from them, sorted:

* ``ranks:0-7``     a contiguous range (the data-parallel world, a node's TP group);
* ``ranks:1-7:2``   an arithmetic progression (one stage's DP group, a strided TP group);
* ``ranks:0,3,5``   any other small set, listed;
* ``ranks:n600:<12 hex>``  a large irregular set: its size and a hash of the list.

Two communicators over the same ranks share an id: the detector compares
groups of the same shape, which is what it needs. Point-to-point transfers
are named after the pair (``p2p:3,4``), so a pipeline send and its receive
share one id, while a collective group over the same two ranks does not.
Importing this module does not import torch.
"""

from __future__ import annotations

import hashlib
import sys
import weakref
from typing import Any, Sequence

MAX_LISTED = 16          # sets up to this size are listed rank by rank
MAX_STR = 256

_cache: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_by_id: dict[int, str] = {}   # groups that do not take weak references (never seen on torch 2.x)


def ranks_id(ranks: Sequence[int]) -> str:
    """The id of the communicator over these global ranks (order does not matter)."""
    r = sorted({int(x) for x in ranks})
    n = len(r)
    if n == 0:
        return "ranks:"
    if n == 1:
        return f"ranks:{r[0]}"
    stride = r[1] - r[0]
    if all(b - a == stride for a, b in zip(r, r[1:])):
        return f"ranks:{r[0]}-{r[-1]}" if stride == 1 else f"ranks:{r[0]}-{r[-1]}:{stride}"
    if n <= MAX_LISTED:
        listed = "ranks:" + ",".join(map(str, r))
        if len(listed) <= MAX_STR:
            return listed
    digest = hashlib.sha1(",".join(map(str, r)).encode()).hexdigest()[:12]
    return f"ranks:n{n}:{digest}"


def pair_id(a: int, b: int) -> str:
    """The id of a point-to-point channel between two global ranks (the same from both ends)."""
    lo, hi = sorted((int(a), int(b)))
    return f"p2p:{lo},{hi}"


def _c10d():
    mod = sys.modules.get("torch.distributed.distributed_c10d")
    if mod is None:
        from torch.distributed import distributed_c10d as mod  # type: ignore[no-redef]
    return mod


def default_group() -> Any | None:
    try:
        return _c10d()._get_default_group()
    except Exception:  # not initialised yet
        return None


def group_ranks(group: Any) -> list[int] | None:
    """The global ranks of ``group`` (``None``: the default group), read locally; None if unknown."""
    try:
        c10d = _c10d()
        pg = group if group is not None else c10d._get_default_group()
        return list(c10d.get_process_group_ranks(pg))
    except Exception:
        return None


def group_name(group: Any) -> str | None:
    """The id of ``group`` (``None``: the default group), the same on every member; None before init."""
    pg = group if group is not None else default_group()
    if pg is None:
        return None
    try:
        return _cache[pg]
    except TypeError:
        name = _by_id.get(id(pg))
        if name is not None:
            return name
    except KeyError:
        pass
    ranks = group_ranks(pg)
    if not ranks:
        return None  # a rank outside the group (NON_GROUP_MEMBER): torch does nothing, nor do we
    name = ranks_id(ranks)
    try:
        _cache[pg] = name
    except TypeError:
        _by_id[id(pg)] = name
    return name


def global_peer(group: Any, peer: int | None, group_peer: int | None) -> int | None:
    """The global rank of a point-to-point peer given as ``dst``/``src`` or ``group_dst``/``group_src``."""
    if peer is not None:
        return int(peer)
    if group_peer is None:
        return None
    try:
        c10d = _c10d()
        pg = group if group is not None else c10d._get_default_group()
        return int(c10d.get_global_rank(pg, group_peer))
    except Exception:
        return None
