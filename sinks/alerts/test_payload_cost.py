"""The verdict's cost fields in the webhook bodies (job_slowdown, cost, gpu_hours_lost_per_hour)."""

from __future__ import annotations

import json

from eroica.sinks.alerts.incidents import Notification
from eroica.sinks.alerts.payloads import cost_fields, render

from .test_payloads import note


class CostedNotification(Notification, kw_only=True):
    """A notification carrying the cost fields (as incidents.py passes them on from the verdict)."""

    job_slowdown: float | None = None
    cost: float | None = None
    gpu_hours_lost_per_hour: float | None = None


def costed(**kw) -> CostedNotification:
    n = note()
    fields = {f: getattr(n, f) for f in Notification.__struct_fields__}
    return CostedNotification(**{**fields, "job_slowdown": 1.2749, "cost": 1.2749, "gpu_hours_lost_per_hour": 6.9,
                                 **kw})


def test_cost_in_every_format() -> None:
    doc = json.loads(render(costed(), "json"))
    assert (doc["job_slowdown"], doc["cost"], doc["gpu_hours_lost_per_hour"]) == (1.2749, 1.2749, 6.9)
    slack = json.dumps(json.loads(render(costed(), "slack")))
    assert "costs 22% of the job's throughput (6.9 GPU-hours per hour)" in slack
    am = json.loads(render(costed(), "alertmanager"))[0]["annotations"]
    assert (am["cost"], am["gpu_hours_lost_per_hour"], am["job_slowdown"]) == ("1.2749", "6.9000", "1.2749")


def test_no_cost_no_fields() -> None:
    assert cost_fields(note()) == {}
    assert cost_fields(costed(cost=None, gpu_hours_lost_per_hour=None)) == {"job_slowdown": 1.2749}
    assert "Cost" not in json.dumps(json.loads(render(costed(cost=None), "slack")))
    assert "cost" not in json.loads(render(note(), "alertmanager"))[0]["annotations"]
