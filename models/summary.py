"""Per-window function summaries: the rows behind history and heat-maps.

One row per (job, window, rank, function), produced by the detector from the
window's patterns (``slowdown_vs_peers`` needs every rank of the window) and
written by the sink to the ``summaries`` table.
"""

from __future__ import annotations

import msgspec


class WindowSummary(msgspec.Struct, kw_only=True):
    """What one rank did in one function during one window (a row of ``summaries``).

    ``beta`` is the share of the window the function spent on the rank's
    critical path; ``slowdown_vs_peers`` the rank's cost over its peers' median
    (NaN when it has no peers). Quantiles and totals are nanoseconds.
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
