"""Per-window function summaries: the rows behind history and heat-maps.

One row per (job, time window, rank, function), produced by the detector from
the window's patterns (``slowdown_vs_peers`` needs every rank of the window),
sent on the window-summaries topic (``eroica.window-summaries``) and written
by the sink to the ``summaries`` table.

**Not** :class:`~eroica.models.digest.FnRows`, though the fields look alike:
``FnRows`` are the digest's *partial* columns (per rank, function *and step
part*: interior and edge rows that the detector still sums across time
windows, with exclusive time, weights and low quantiles, no node or window),
the input of ``build_patterns``; a ``WindowSummary`` is one *finished* cell
of the patterns of a whole time window, with its rank's node, the function's
kind, its critical-path share and its slowdown, as stored. Keeping one type
for both would put storage fields into the wire digest, or step parts into
the table.

``slowdown_vs_peers`` (``streams/detection/window_summaries.py``) is the
peer test's own measure per function: the cell's per-step cost over the
**leave-one-out median of the other ranks of its role** (pipeline stage,
tensor-parallel position or role label), as a verdict's ``slowdown`` is for
the functions it names. What still differs (README, *Window summaries*): the
span (one time window here, a job window of whole steps for a verdict) and
the sum (a verdict adds the culprit's abnormal functions, each floored at
0.1% of a step); NaN where the median is 0 or there is no other rank.
"""

from __future__ import annotations

import msgspec


class WindowSummary(msgspec.Struct, kw_only=True):
    """What one rank did in one function during one window (a row of ``summaries``).

    ``beta`` is the share of the window the function spent on the rank's
    critical path; ``slowdown_vs_peers`` the rank's per-step cost over the
    median of all the window's ranks, itself included (NaN when undefined; not
    the verdict's ``slowdown``: see the module docstring). Quantiles and totals
    are nanoseconds.
    """

    job: str
    window_start_ns: int
    window_end_ns: int
    rank: int
    node: str
    fn: str
    kind: str
    count: int
    median_ns: float
    p90_ns: float
    p99_ns: float
    total_ns: float
    beta: float
    slowdown_vs_peers: float
