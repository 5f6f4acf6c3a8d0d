"""Pure shaping of notifications into webhook bodies: plain JSON, Slack, Alertmanager v2.

No I/O here: ``render(notification, fmt)`` returns the bytes to POST.

- ``json``: the notification itself, one JSON object (``"schema":
  "eroica.notification/v1"``), every field of
  :class:`~eroica.sinks.alerts.incidents.Notification`.
- ``slack``: a Slack incoming-webhook message (``text`` fallback plus Block
  Kit ``blocks``). Slack has no idempotency key, so the notification id is
  shown in the message's context line. Every piece of text that is not ours
  (names, the summary, ids) goes through :func:`.mrkdwn.escape` and the text
  objects are verbatim, so a job named ``<!channel>`` pings nobody.
- ``alertmanager``: the body of Alertmanager's ``POST /api/v2/alerts``, a JSON
  array with one alert. Its labels identify the incident (Alertmanager groups
  and deduplicates by labels); ``startsAt`` is the opening time; a firing alert
  carries ``endsAt`` a while in the future (three reminder intervals, so
  reminders keep it firing, or 24 h without reminders) and the resolved one
  ``endsAt`` = the resolution time, which is how Alertmanager learns it ended.

With a report URL base (``eroica alert --report-url-base``), every body links
to the job's report page (:mod:`.links`): ``report_url`` in ``json``, a link
in the Slack message (its URL holds no ``<``, ``>`` or ``|``, its text is
escaped), ``generatorURL`` in ``alertmanager`` (``""`` without a base).

Names reach the ``json`` and ``alertmanager`` bodies as plain JSON strings:
every body is a Python structure encoded by msgspec, nothing is built as JSON
or markup by string formatting, so the encoder escapes whatever a name holds.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import msgspec

from .incidents import Notification
from .links import report_url
from .mrkdwn import escape as md
from .mrkdwn import text_object

__all__ = ["FORMATS", "render", "as_json", "as_slack", "as_alertmanager", "headline"]

FORMATS = ("json", "slack", "alertmanager")
SCHEMA = "eroica.notification/v1"

_encoder = msgspec.json.Encoder()
_EMOJI = {"opened": ":rotating_light:", "reminder": ":hourglass_flowing_sand:", "resolved": ":white_check_mark:"}
_VERB = {"opened": "OPENED", "reminder": "STILL OPEN", "resolved": "RESOLVED"}


def _rfc3339(ns: int) -> str:
    t = _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def culprit(n: Notification) -> str:
    if n.scope == "rank":
        where = f"rank {n.rank}" + (f" on {n.node}" if n.node else "") + (f" (GPU {n.gpu})" if n.gpu >= 0 else "")
    elif n.scope == "node":
        where = f"node {n.node}"
    else:
        where = "the whole job"
    return where


def headline(n: Notification) -> str:
    """``[OPENED] job j1: gpu slowdown on rank 13 on node-1 (GPU 5), 1.38x``."""
    what = "hang" if n.kind == "hang" else "slowdown"
    text = f"[{_VERB.get(n.event, n.event.upper())}] job {n.job}: {n.component} {what} on {culprit(n)}"
    if n.kind != "hang" and n.slowdown > 1.0:
        text += f", {n.slowdown:.2f}x"
    return text


def cost_fields(n: Notification) -> dict[str, float]:
    """The verdict's optional cost fields that the notification carries (``job_slowdown``: the window's S,
    ``cost``: the culprit's S_X, ``gpu_hours_lost_per_hour``), absent ones left out."""
    out = {}
    for name in ("job_slowdown", "cost", "gpu_hours_lost_per_hour"):
        v = getattr(n, name, None)
        if v is not None and v == v:  # NaN is "none" too
            out[name] = float(v)
    return out


def cost_text(n: Notification) -> str:
    """``costs 22% of the job's throughput (6.9 GPU-hours per hour)``, or "" without a cost."""
    c = cost_fields(n)
    if c.get("cost", 0.0) <= 1.0:
        return ""
    text = f"costs {1.0 - 1.0 / c['cost']:.0%} of the job's throughput"
    if "gpu_hours_lost_per_hour" in c:
        text += f" ({c['gpu_hours_lost_per_hour']:.1f} GPU-hours per hour)"
    return text


def _resolution_text(n: Notification) -> str:
    if n.resolution == "stale":
        return "the job stopped sending telemetry"
    if n.resolution == "job_ended":
        return "the job ended (its telemetry stream's end)"
    return "no verdict for it in the following windows"


def as_json(n: Notification, *, report_url_base: str = "") -> dict[str, Any]:
    return {"schema": SCHEMA, **msgspec.to_builtins(n), **cost_fields(n),
            "report_url": report_url(report_url_base, n.job)}


def as_slack(n: Notification, *, report_url_base: str = "") -> dict[str, Any]:
    """The Slack message: mrkdwn whose only markup is ours (every name and the summary escaped)."""
    text = f"{_EMOJI.get(n.event, '')} {md(headline(n))}".strip()
    detail = md(n.summary)
    if n.event == "resolved":
        detail = f"Resolved: {md(_resolution_text(n))}. Was: {md(n.summary)}"
    fields = [
        f"*Job*\n{md(n.job)}", f"*Component*\n{md(n.component)} ({md(n.kind)})", f"*Culprit*\n{md(culprit(n))}",
        f"*Confidence*\n{n.confidence:.2f}", f"*Slowdown*\n{n.slowdown:.2f}x", f"*Windows*\n{n.windows}",
    ]
    if cost_text(n):
        fields.append(f"*Cost*\n{md(cost_text(n))}")
    if n.fn:
        fields.append(f"*Function*\n`{md(n.fn[:120])}`")  # cut before escaping: never half an entity
    link = report_url(report_url_base, n.job)
    if link:  # links.py: the URL holds no < > | or space; the text is escaped like every name, on one line
        detail += f"\n<{md(link)}|Report of job {md(' '.join(n.job[:120].splitlines()))}>"
    return {
        "text": text,
        "blocks": [
            {"type": "section", "text": text_object(f"*{text}*\n{detail}")},
            {"type": "section", "fields": [text_object(f) for f in fields[:10]]},
            {"type": "context", "elements": [text_object(
                f"incident `{md(n.incident_id)}` #{n.occurrence} · notification `{md(n.notification_id)}` · "
                f"since {_rfc3339(n.first_window_start_ns)}")]},
        ],
    }


def as_alertmanager(n: Notification, *, reminder_ns: int = 0, report_url_base: str = "") -> list[dict[str, Any]]:
    labels = {
        "alertname": "EroicaHang" if n.kind == "hang" else "EroicaSlowdown",
        "severity": "critical" if n.kind == "hang" else "warning",
        "eroica_job": n.job, "component": n.component, "scope": n.scope, "incident_id": n.incident_id,
    }
    if n.node:
        labels["node"] = n.node
    if n.rank >= 0:
        labels["rank"] = str(n.rank)
    if n.gpu >= 0:
        labels["gpu"] = str(n.gpu)
    if n.event == "resolved":
        ends = n.resolved_at_ns or n.created_at_ns
    else:
        ends = n.created_at_ns + (3 * reminder_ns if reminder_ns > 0 else 24 * 3600 * 10**9)
    annotations = {
        "summary": headline(n), "description": n.summary, "notification_id": n.notification_id,
        "event": n.event, "confidence": f"{n.confidence:.3f}", "slowdown": f"{n.slowdown:.3f}",
        "occurrence": str(n.occurrence),
    }
    if n.fn:
        annotations["function"] = n.fn
    annotations.update({k: f"{v:.4f}" for k, v in cost_fields(n).items()})  # annotation values are strings
    if n.event == "resolved":
        annotations["resolution"] = _resolution_text(n)
    return [{
        "labels": labels, "annotations": annotations,
        "startsAt": _rfc3339(n.opened_at_ns or n.created_at_ns), "endsAt": _rfc3339(ends),
        "generatorURL": report_url(report_url_base, n.job),
    }]


def render(n: Notification, fmt: str = "json", *, reminder_ns: int = 0, report_url_base: str = "") -> bytes:
    """The request body for ``fmt`` (one of :data:`FORMATS`); ``report_url_base``: see :mod:`.links`."""
    if fmt == "json":
        doc: Any = as_json(n, report_url_base=report_url_base)
    elif fmt == "slack":
        doc = as_slack(n, report_url_base=report_url_base)
    elif fmt == "alertmanager":
        doc = as_alertmanager(n, reminder_ns=reminder_ns, report_url_base=report_url_base)
    else:
        raise ValueError(f"unknown notification format {fmt!r} (use one of {', '.join(FORMATS)})")
    return _encoder.encode(doc)
