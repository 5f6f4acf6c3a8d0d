"""Raw records of a job window -> its digest: the summariser's pure function.

Used by the streaming summariser on the ranks of its partitions and by
``eroica analyze`` on whole windows; the detector only ever sees digests, so
both paths feed it identical input.
"""

from __future__ import annotations

import numpy as np

from eroica.models.columns import collective_kernels
from eroica.models.digest import WindowDigest

from .budget import fold_fns
from .collectives import summarise_collectives
from .counters import nic_key, summarise
from .fn_rows import summarise_fn
from .windows import CONT, JobWindow


def digest_window(window: JobWindow) -> WindowDigest:
    d = WindowDigest(window.job, window.start_ns, window.end_ns)
    # The counters first: their per-entity dicts are what makes the garbage collector run (a young-generation
    # pass every 700 containers), and a pass then traverses every element of the lists made before it, young
    # as they are: the function and collective rows' lists (about a million elements at 1,024 ranks, ~8 ms),
    # made last, are not yet there. (A digest kept past the next window's counters is traversed then.)
    c = summarise(window.get("gpu"), window.get("nic"), window.get("host"))
    d.gpu, d.gpu_index, d.host = c.gpu, c.gpu_index, c.host
    d.nic = {nic_key(node, nic): m for (node, nic), m in c.nic.items()}
    del c
    fn = window.get("fn")
    cont = window.get(CONT)
    if cont is not None:
        cont = collective_kernels(cont)
    if fn is not None and len(fn):
        fn = collective_kernels(fn)
        d.fns, d.ranks, d.in_flight = summarise_fn(fn, window.end_ns, cont)
        d.colls = summarise_collectives(fn)
    elif cont is not None and len(cont):  # spans of earlier windows only (a long pause everywhere)
        d.fns, d.ranks, d.in_flight = summarise_fn(cont.take(np.zeros(0, np.int64)), window.end_ns, cont)
    return fold_fns(d)
