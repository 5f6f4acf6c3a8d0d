"""Webhook bodies: plain JSON, Slack, Alertmanager v2 (pure shaping), and the config's parsing."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from eroica.sinks.alerts.config import AlertConfig, parse_duration_ns
from eroica.sinks.alerts.incidents import Notification
from eroica.sinks.alerts.payloads import render

S = 10**9


def note(event: str = "opened", **kw) -> Notification:
    base = dict(notification_id="n1", event=event, incident_id="i1", occurrence=1, sequence=0, job="j1",
                kind="slow", component="gpu", scope="rank", node="node-1", rank=13, gpu=5, fn="sm90_gemm",
                summary="rank 13 on node-1: GPU 5 throttled", confidence=0.99, slowdown=1.41,
                first_window_start_ns=1_700_000_000 * S, last_window_end_ns=1_700_000_030 * S, windows=3,
                opened_at_ns=1_700_000_031 * S, created_at_ns=1_700_000_031 * S,
                evidence={"sm_clock_mhz": {"culprit": 1410, "peer_median": 1980}, "gap": float("nan")})
    base.update(kw)
    return Notification(**base)


def test_json_is_the_notification_itself() -> None:
    doc = json.loads(render(note(), "json"))
    assert doc["schema"] == "eroica.notification/v1"
    assert (doc["event"], doc["notification_id"], doc["rank"], doc["job"]) == ("opened", "n1", 13, "j1")
    assert doc["evidence"]["gap"] is None   # NaN is not JSON


def test_slack_message() -> None:
    doc = json.loads(render(note(), "slack"))
    assert doc["text"].startswith(":rotating_light: [OPENED] job j1: gpu slowdown on rank 13 on node-1 (GPU 5)")
    assert doc["blocks"][0]["type"] == "section" and "throttled" in doc["blocks"][0]["text"]["text"]
    assert "n1" in json.dumps(doc["blocks"][-1])
    resolved = json.loads(render(note("resolved", resolution="windows", resolved_at_ns=1_700_000_100 * S), "slack"))
    assert "[RESOLVED]" in resolved["text"] and "Resolved:" in resolved["blocks"][0]["text"]["text"]


def test_alertmanager_v2_alerts() -> None:
    firing = json.loads(render(note(), "alertmanager", reminder_ns=1800 * S))
    assert isinstance(firing, list) and len(firing) == 1
    a = firing[0]
    assert a["labels"] == {"alertname": "EroicaSlowdown", "severity": "warning", "eroica_job": "j1",
                           "component": "gpu", "scope": "rank", "incident_id": "i1", "node": "node-1",
                           "rank": "13", "gpu": "5"}
    starts = dt.datetime.fromisoformat(a["startsAt"].replace("Z", "+00:00"))
    ends = dt.datetime.fromisoformat(a["endsAt"].replace("Z", "+00:00"))
    assert (ends - starts).total_seconds() == pytest.approx(3 * 1800)   # kept firing by the reminders
    assert a["annotations"]["notification_id"] == "n1"
    done = json.loads(render(note("resolved", resolution="stale", resolved_at_ns=1_700_000_100 * S),
                             "alertmanager"))[0]
    assert done["endsAt"] == "2023-11-14T22:15:00.000Z" and done["labels"] == a["labels"]
    hang = json.loads(render(note(kind="hang", scope="node", rank=-1, gpu=-1), "alertmanager"))[0]
    assert hang["labels"]["alertname"] == "EroicaHang" and "rank" not in hang["labels"]
    with pytest.raises(ValueError):
        render(note(), "xml")


def test_config_from_env_and_flags() -> None:
    env = {"EROICA_ALERT_WEBHOOK": "http://h/x", "EROICA_ALERT_COMPONENTS": "gpu, nic",
           "EROICA_ALERT_REMINDER": "off", "EROICA_ALERT_RESOLVE_AFTER": "4", "EROICA_KAFKA_BOOTSTRAP": "k:9092"}
    cfg = AlertConfig.from_env(env, fmt="slack", min_confidence=None)
    assert (cfg.webhook, cfg.components, cfg.reminder_ns, cfg.resolve_after, cfg.fmt, cfg.kafka.bootstrap) == (
        "http://h/x", ("gpu", "nic"), 0, 4, "slack", "k:9092")
    assert cfg.topics == ["eroica.verdicts", "eroica.window-summaries"]
    assert cfg.backoff(1) == 0.5 and cfg.backoff(20) == 30.0
    assert parse_duration_ns("30m") == 1800 * S and parse_duration_ns("250ms") == 250_000_000
    with pytest.raises(ValueError):
        AlertConfig.from_env({})                       # no webhook
    with pytest.raises(ValueError):
        AlertConfig.from_env(env, components=("cpu",))  # not a component
    with pytest.raises(ValueError):
        parse_duration_ns("soon")


def _mrkdwn_texts(doc: dict) -> list[str]:
    """Every mrkdwn string of a Slack message: the fallback ``text`` and each text object's."""
    texts = [doc["text"]]
    for block in doc["blocks"]:
        objs = ([block["text"]] if "text" in block else []) + block.get("fields", []) + block.get("elements", [])
        assert all(o["type"] == "mrkdwn" and o["verbatim"] is True for o in objs), block
        texts += [o["text"] for o in objs]
    return texts


@pytest.mark.parametrize("event", ["opened", "resolved"])
def test_slack_escapes_hostile_names(event: str) -> None:
    """A job named ``<!channel>`` pings nobody: no name leaves a raw ``<``, ``>`` or ``&`` in any mrkdwn text."""
    from hostile_names import HOSTILE

    for name in HOSTILE + ("R&D <@U123> & <#C42>",):
        n = note(event, job=name, node=name, fn=name, summary=f"rank 13 on {name}: GPU 5 throttled",
                 incident_id=name, notification_id=name, resolution="windows", resolved_at_ns=1_700_000_100 * S)
        texts = _mrkdwn_texts(json.loads(render(n, "slack")))
        for t in texts:
            bare = re.sub(r"&(amp|lt|gt);", "", t)
            assert not set("<>&") & set(bare), (name, t)
        # shown, not dropped: Slack decodes the three entities back to the name
        shown = "\n".join(texts).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
        assert name in shown and f"*Job*\n{name}" in shown


def test_slack_escape_rules() -> None:
    from eroica.sinks.alerts.mrkdwn import escape, text_object

    assert escape("<!channel>") == "&lt;!channel&gt;"
    assert escape("<https://evil.example|click>") == "&lt;https://evil.example|click&gt;"
    assert escape("a &amp; b") == "a &amp;amp; b"   # an entity in a name is shown as typed, not decoded
    assert escape("*bold* `code` plain") == "*bold* `code` plain"
    assert text_object("x") == {"type": "mrkdwn", "text": "x", "verbatim": True}


@pytest.mark.parametrize("fmt", ["json", "alertmanager"])
def test_json_and_alertmanager_keep_hostile_names_plain(fmt: str) -> None:
    """Names reach these bodies as JSON strings: decoded, they are the names byte for byte (no markup added)."""
    from hostile_names import HOSTILE

    for name in HOSTILE:
        n = note(job=name, node=name, fn=name, summary=name)
        doc = json.loads(render(n, fmt))
        if fmt == "json":
            assert (doc["job"], doc["node"], doc["fn"], doc["summary"]) == (name,) * 4
        else:
            a = doc[0]
            assert (a["labels"]["eroica_job"], a["labels"]["node"], a["annotations"]["function"],
                    a["annotations"]["description"]) == (name,) * 4
