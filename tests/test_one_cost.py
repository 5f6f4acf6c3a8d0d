"""Issue 33: one culprit, one cost, from analyze to the fleet view.

One simulated job (a throttled GPU) through every consumer of a verdict's cost:
``analyze`` (batch), the streaming cores (summariser and detector), the alert
tracker and its payloads (json, Slack, Alertmanager), the report's cost bar, and
ClickHouse with ``eroica fleet``'s rows. Every one states the verdict's own S_X
for the same window (the report and fleet: their stated aggregate of those same
figures), never a figure of its own.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from eroica.cli.main import cli
from eroica.models.reader import read_batches
from eroica.streams.detection import analyze

W = 30 * 10**9


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("one-cost") / "run.jsonl"
    res = CliRunner().invoke(cli, ["simulate", "--nodes", "4", "--gpus", "8", "--steps", "120", "--seed", "3",
                                   "--fault", "gpu_throttle:rank=13", "--start", "default", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _culprit(vs: list) -> list:
    return [v for v in vs if v.kind == "slow" and v.rank == 13 and v.cost is not None]


def test_one_culprit_states_one_cost_everywhere(run: Path, verdict_sink) -> None:
    from eroica.report.data import culprit_costs
    from eroica.sinks.alerts.incidents import IncidentTracker
    from eroica.sinks.alerts.payloads import as_alertmanager, as_json, as_slack
    from eroica.sinks.clickhouse.fleet import fleet_rows, fleet_sql, job_ends_sql
    from eroica.streams.cores.test_cores import _messages, _Pipeline

    batch = _culprit(list(analyze(read_batches(run), W)))
    assert len(batch) >= 3, "the throttled GPU is named with a cost in several windows"
    by_id = {v.verdict_id: v for v in batch}

    # the stream: the same ids with the same cost fields
    pipe = _Pipeline(3)
    pipe.run(_messages(run, 3), seed=0)
    stream = {v.verdict_id: v for v in _culprit(pipe.verdicts)}
    assert stream.keys() == by_id.keys()
    for vid, v in by_id.items():
        s = stream[vid]
        assert (s.cost, s.job_slowdown, s.gpu_hours_lost_per_hour) == (v.cost, v.job_slowdown,
                                                                      v.gpu_hours_lost_per_hour)

    # alerts: the notification that opens the incident carries its verdict's figures, in every format
    tracker = IncidentTracker()
    first = min(batch, key=lambda v: v.window_start_ns)
    (n,) = tracker.observe_verdict(first, first.window_end_ns)
    assert n.event == "opened"
    assert as_json(n)["cost"] == first.cost
    assert f"{1 - 1 / first.cost:.0%}" in json.dumps(as_slack(n))
    (am,) = as_alertmanager(n)
    assert float(am["annotations"]["cost"]) == pytest.approx(first.cost, abs=1e-4)

    # the report: the culprit's bar is the median of those verdicts' costs
    (bar,) = [c for c in culprit_costs(batch) if c.component == batch[0].component]
    assert bar.cost == pytest.approx(statistics.median(v.cost for v in batch))

    # ClickHouse and fleet: the stored figures and the GPU-hours they add up to
    verdict_sink.ensure_schema()
    verdict_sink.write_verdicts(batch)
    stored = {v.verdict_id: v for v in verdict_sink.query_verdicts(limit=1000)}
    assert all(stored[vid].cost == v.cost for vid, v in by_id.items())
    cfg = verdict_sink.config
    vt, st = f"`{cfg.database}`.`{cfg.verdicts_table}`", f"`{cfg.database}`.`{cfg.summaries_table}`"
    rows = fleet_rows(verdict_sink.run_readonly_sql(fleet_sql(vt, None)).dicts(),
                      verdict_sink.run_readonly_sql(job_ends_sql(vt, st, None)).dicts())
    (row,) = [r for r in rows if r.component == batch[0].component]
    want = sum(v.gpu_hours_lost_per_hour * (v.window_end_ns - v.window_start_ns) / 3.6e12 for v in batch)
    assert math.isclose(row.gpu_hours_lost, want, abs_tol=1e-3)
