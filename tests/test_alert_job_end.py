"""Issue 36 item 4: alerts that close and link.

Before, a job that ended kept its incidents open: the verdict topic had no
word for "this job ended", so `eroica alert` sent reminders and resolved them
as ``stale`` minutes later, and every payload's link was empty
(Alertmanager's ``generatorURL: ""``).

Here a simulated job (hostile name, a GPU throttled to the end) goes through
the real streaming path (summarisers and the detector core, end-of-stream
markers included, ``streams/cores/test_cores.py``) and what the detector
publishes on the verdict and window-summary topics is applied, message by
message and in order, to the alert consumer's own handler (``decode``, then
the delivery to a webhook stand-in). The job's incident opens, and resolves
on the detector's job-end marker: at the very message, without another window
or any wall time passing, reason ``job_ended``, no reminder after it. Every
payload links to the job's report page, and ``eroica report --out-dir`` writes
that page exactly where the link points.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest
from click.testing import CliRunner

from hostile_names import HOSTILE, JOB, hostile_run

from eroica.cli.main import cli
from eroica.models.job_end import JobEnd, decode_job_end, encode_job_end
from eroica.models.verdict import decode_verdict_message
from eroica.sinks.alerts.config import AlertConfig
from eroica.sinks.alerts.consumer import AlertConsumer
from eroica.sinks.alerts.links import check_base, report_file_name, report_url
from eroica.sinks.alerts.payloads import render
from eroica.sinks.alerts.state import AlertState
from eroica.sinks.alerts.webhook import Delivery
from eroica.streams.cores.detector_core import JOB_END, PATTERNS, VERDICTS
from eroica.streams.cores.test_cores import _messages, _Pipeline, _simulate

S = 10**9
WINDOW_NS = 10 * S
T0 = 1_800_000_000 * S  # the alert consumer's wall clock at the job's first window


class _Recording(_Pipeline):
    """The in-memory pipeline, also keeping what the detector publishes, in its order (role, key, value)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.published: list[tuple[str, bytes, bytes]] = []

    def take(self, out) -> None:  # type: ignore[no-untyped-def]
        super().take(out)
        self.published += [(s.topic, s.key, s.value) for s in out.sends if s.topic in (VERDICTS, JOB_END, PATTERNS)]


class _Msg:
    """The three things the alert consumer's handler reads of a Kafka message."""

    def __init__(self, topic: str, value: bytes) -> None:
        self._topic, self._value = topic, value

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def value(self) -> bytes:
        return self._value


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, bytes, bytes]]]:
    """A 2-node job named with every hostile name, GPU 1 of its second node throttled to the end,
    through the summarisers and the detector core (10 s windows, end-of-stream markers at the end)."""
    tmp = tmp_path_factory.mktemp("job-end")
    src = _simulate(tmp, "--nodes 2 --gpus 4 --steps 40 --fault gpu_throttle:rank=5 --seed 1")
    path = hostile_run(src, tmp / "hostile.jsonl")
    pipe = _Recording(2, window_ns=WINDOW_NS)
    pipe.run(_messages(path, 2), 0)
    return path, pipe.published


def test_the_detector_announces_the_end_once_after_the_jobs_last_verdict(run) -> None:  # type: ignore[no-untyped-def]
    _path, published = run
    roles = [role for role, _k, _v in published]
    assert roles.count(JOB_END) == 1, "the detector must announce the job's end (once)"
    end = roles.index(JOB_END)
    assert VERDICTS in roles and max(i for i, r in enumerate(roles) if r == VERDICTS) < end
    _role, key, value = published[end]
    marker = decode_job_end(value)
    assert marker is not None and marker.job == JOB and key == JOB.encode()
    assert marker.last_window_start_ns >= 0


def test_an_ended_jobs_incident_resolves_at_its_end_and_links_to_its_report(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path, published = run
    reports = tmp_path / "reports"
    base = reports.as_uri()
    now = [T0]
    bodies: list[tuple[int, dict[str, Any]]] = []   # (index of the message that made it, JSON body)
    current = [-1]

    def webhook(url: str, body: bytes, notification_id: str, *, timeout_s: float) -> Delivery:
        bodies.append((current[0], json.loads(body)))
        return Delivery("accepted", 200)

    cfg = AlertConfig(webhook="http://127.0.0.1:9/hook", fmt="json", reminder_ns=60 * S, resolve_after=3,
                      state_path=tmp_path / "state.json", report_url_base=base + "/")
    alerts = AlertConsumer(cfg, sender=webhook, clock=lambda: now[0])
    alerts.state = AlertState.load(cfg.state_file, cfg.tracker_settings(), cfg.group_id)
    tracker = alerts.state.tracker
    topic = {VERDICTS: cfg.kafka.verdicts_topic, JOB_END: cfg.kafka.verdicts_topic,
             PATTERNS: cfg.kafka.window_summaries_topic}
    end_at = -1
    for i, (role, _key, value) in enumerate(published):
        if role == JOB_END:
            end_at = i
            # without the marker the job's incident would stay open past one more window (the bug:
            # reminders, then "stale" minutes later): nothing is due one window after the end
            assert tracker.open_count() == 1
            assert not tracker.could_resolve(now[0] + WINDOW_NS)
        current[0] = i
        alerts.decode(_Msg(topic[role], value))
        alerts._deliver_all()
        if role == PATTERNS:
            now[0] += WINDOW_NS  # a live job: one window of wall time per window
    assert end_at >= 0, "no job-end marker reached the alert consumer"
    events = [(i, b["event"], b.get("resolution")) for i, b in bodies]
    assert [e for _i, e, _r in events] == ["opened", "resolved"], events
    (opened_at, opened), (resolved_at, resolved) = bodies
    assert opened_at < end_at and resolved_at == end_at       # resolved by the job-end marker itself
    assert resolved["resolution"] == "job_ended" and resolved["incident_id"] == opened["incident_id"]
    assert resolved["resolved_at_ns"] - now[0] < WINDOW_NS    # within one window of the end (here: at it)
    assert resolved["job"] == JOB and resolved["rank"] == 5
    # no reminder, no second resolution afterwards, however long the consumer keeps running
    for later in (now[0] + 61 * S, now[0] + 3600 * S):
        assert tracker.due(later, caught_up=True) == []
    assert alerts.stats.job_ends == 1 and tracker.open_count() == 0

    # the link: the job's page under the base, the job URL-encoded (the name cannot escape the folder)
    link = report_url(check_base(base), JOB)
    assert opened["report_url"] == resolved["report_url"] == link
    assert link.startswith(base + "/") and not set(link) & set(" <>|\"'\r\n")
    # `eroica report --out-dir` writes the page where the link points
    res = CliRunner().invoke(cli, ["report", str(path), "--out-dir", str(reports), "--window", "10", "-q"])
    assert res.exit_code == 0, res.output
    target = Path(unquote(urlparse(link).path))
    assert target.parent == reports and target.name == report_file_name(JOB)
    assert [p.name for p in reports.iterdir()] == [target.name]
    assert "<html" in target.read_text(encoding="utf-8").lower()

    # the same link in the other destinations' bodies
    n = alerts.state.outbox  # delivered: empty; rebuild the resolved notification from its body
    assert n == []
    from eroica.sinks.alerts.incidents import Notification

    note = Notification(**{k: v for k, v in resolved.items()
                           if k in Notification.__struct_fields__})
    am = json.loads(render(note, "alertmanager", report_url_base=cfg.report_url_base))[0]
    assert am["generatorURL"] == link and am["annotations"]["resolution"].startswith("the job ended")
    slack = json.loads(render(note, "slack", report_url_base=cfg.report_url_base))
    section = slack["blocks"][0]["text"]["text"]
    links = re.findall(r"<([^<>|]*)\|([^<>]*)>", section)
    assert len(links) == 1 and links[0][0] == link.replace("&", "&amp;")
    # the rest of the message forms no Slack sequence of its own (every name escaped)
    assert not set("<>") & set(section.replace(f"<{links[0][0]}|{links[0][1]}>", ""))
    assert "Report of job &lt;!channel&gt;" in links[0][1] and "\n" not in links[0][1]


def test_link_names_stay_in_their_folder() -> None:
    for job in HOSTILE + ("a/b", "../../etc/passwd", ".", "..", ".hidden", "x" * 1000, "é" * 300, "sim-1"):
        name = report_file_name(job)
        assert "/" not in name and not name.startswith(".") and len(name.encode()) <= 255, name
        assert re.fullmatch(r"[A-Za-z0-9._~%-]+\.html", name), name
        url = report_url("https://reports.example/eroica", job)
        assert unquote(urlparse(url).path) == f"/eroica/{name}"
    assert report_file_name("sim-1") == "sim-1.html"
    assert report_file_name("x" * 1000) != report_file_name("x" * 999)
    assert report_url("https://g.example/d/x?var-job={job}", "a&b c") == "https://g.example/d/x?var-job=a%26b%20c"
    assert report_url("", "j") == ""
    for bad in ("ftp://x", "https://x/<y>", "https://x/a|b", "https://x/a b", "reports/"):
        with pytest.raises(ValueError):
            check_base(bad)


def test_the_report_url_base_comes_from_the_environment_or_the_flag() -> None:
    env = {"EROICA_ALERT_WEBHOOK": "http://h/x", "EROICA_REPORT_URL_BASE": "https://r.example/eroica/"}
    assert AlertConfig.from_env(env).report_url_base == "https://r.example/eroica"
    assert AlertConfig.from_env(env, report_url_base="file:///srv/r").report_url_base == "file:///srv/r"
    assert AlertConfig.from_env({"EROICA_ALERT_WEBHOOK": "http://h/x"}).report_url_base == ""
    with pytest.raises(ValueError):
        AlertConfig.from_env({**env, "EROICA_REPORT_URL_BASE": "javascript:alert(1)"})


def test_the_marker_is_no_verdict_and_the_clickhouse_sink_skips_it() -> None:
    from eroica.sinks.clickhouse.messages import RejectedMessage, decode_verdicts

    marker = encode_job_end(JobEnd(job=JOB, last_window_start_ns=5, detected_at_ns=7))
    assert decode_job_end(marker) == JobEnd(job=JOB, last_window_start_ns=5, detected_at_ns=7)
    assert decode_verdicts(marker) == []                   # no row and no dead letter
    with pytest.raises(Exception):                          # a reader of verdicts only rejects it, with a reason
        decode_verdict_message(marker)
    # not a marker: anything else is left to the verdict decoder
    for other in (b'{"type":"job_end"}', b'["job_end"]', b'"job_end"', b'{"job":"job_end"}', b"", None):
        assert decode_job_end(other) is None
    # a verdict of a job named "job_end" is a verdict (the marker needs its "type")
    from eroica.models.verdict import Verdict, encode_verdict

    v = Verdict(verdict_id="v1", job="job_end", window_start_ns=0, window_end_ns=10, detected_at_ns=11,
                kind="slow", component="gpu", scope="job", node="", rank=-1, gpu=-1, fn="", slowdown=1.5,
                score=4.0, confidence=0.9, peers=[], victims=[], evidence={}, summary="job_end")
    assert decode_job_end(encode_verdict(v)) is None and len(decode_verdicts(encode_verdict(v))) == 1
    with pytest.raises(RejectedMessage):
        decode_verdicts(b'{"type":"job_end"}')              # a marker without its job is a mistake
