"""`eroica alert` end to end: a replayed fault that stops -> exactly one "opened" and one "resolved".

The detector's output for a 16-rank job whose rank 5 GPU is throttled for
the first 40 of 80 steps (verdicts + per-window summaries, exactly what the
streaming detector publishes) is published in two halves onto a real broker;
`eroica alert` runs as a subprocess with a local webhook, and is SIGKILLed and
restarted in between. The webhook must see one "opened" and one "resolved",
nothing twice, and the restarted process's metrics must count its delivery.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from alert_helpers import Webhook, detector_windows, publish, publish_job_end
from sink_helpers import wait_for

from eroica.runtime.metrics import read_announcement, scrape

PARTITIONS = 2


def _recorded(state: Path, notification_id: str) -> bool:
    try:
        return notification_id in json.loads(state.read_text()).get("delivered", {})
    except (OSError, ValueError):
        return False


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    out = open(log, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "eroica.cli", "alert", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        out.close()


def test_opened_once_and_resolved_once_across_a_sigkill(kafka_bootstrap: str, tmp_path: Path) -> None:
    windows = detector_windows(tmp_path)
    opening = [w for w in windows if any(c >= 0.7 for _i, c in w.incidents)]
    # 2-3 alarming windows, all among the first four (the job's first window, its warm-up, alarms on
    # nothing by itself); the fault has stopped by the last one
    assert 2 <= len(opening) <= 3 and all(w in windows[:4] for w in opening), "the fixture run changed"
    assert windows[-1].incidents == [], "the fixture run changed"
    prefix = f"e{uuid.uuid4().hex[:8]}"
    verdicts, patterns = f"{prefix}.eroica.verdicts", f"{prefix}.eroica.window-summaries"
    hook = Webhook()
    env = {**os.environ, "EROICA_KAFKA_TOPIC_VERDICTS": verdicts, "EROICA_KAFKA_TOPIC_WINDOW_SUMMARIES": patterns,
           "EROICA_KAFKA_PARTITIONS": str(PARTITIONS), "EROICA_ALERT_SESSION_TIMEOUT_MS": "2000",
           "EROICA_METRICS_PORT": "0", "EROICA_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1"}
    args = ["--webhook", hook.url, "--kafka", kafka_bootstrap, "--group", f"{prefix}.alert",
            "--state", str(tmp_path / "state.json"), "--resolve-after", "2", "--reminder", "off",
            "--stale-after", "10m", "--min-confidence", "0.7", "--format", "json"]
    log = tmp_path / "alert.log"
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_start(args, env, log))
        publish(kafka_bootstrap, verdicts, patterns, windows[:4])    # the fault, and the window it stops in
        wait_for(lambda: hook.events() == ["opened"], 40, "the opened notification")
        # The consumer records a delivery in its state file just after the webhook's 2xx; a crash in
        # between re-sends it with the same id (the module's documented at-least-once window, seen
        # here once on a loaded CI machine). What this test pins down is that nothing recorded is
        # ever sent again, so the kill comes once the delivery is on disk.
        wait_for(lambda: _recorded(tmp_path / "state.json", hook.ids()[0]), 20, "the delivery in the state file")
        os.killpg(procs[0].pid, signal.SIGKILL)                       # no chance to commit or clean up
        procs[0].wait(10)
        publish(kafka_bootstrap, verdicts, patterns, windows[:2])    # a replay re-sends some of it
        procs.append(_start(args, env, log))
        publish(kafka_bootstrap, verdicts, patterns, windows[4:])    # healthy windows: the fault stopped
        wait_for(lambda: "resolved" in hook.events(), 40, "the resolved notification")
        time.sleep(1.5)                                               # room for a duplicate to show up
        assert hook.events() == ["opened", "resolved"], log.read_text()[-3000:]
        assert len(set(hook.ids())) == 2
        opened, resolved = (r["body"] for r in hook.received)
        assert opened["incident_id"] == resolved["incident_id"] and opened["rank"] == 5
        assert opened["component"] == "gpu" and resolved["resolution"] == "windows"
        # the second process announced its metrics and counted its delivery
        ann = wait_for(lambda: read_announcement(tmp_path / "data"), 10, "the metrics announcement")
        samples = scrape(ann["url"])
        assert samples['eroica_alert_notifications_total{event=resolved,outcome=delivered}'] == 1
        assert 'eroica_alert_notifications_total{event=opened,outcome=delivered}' not in samples
        procs[1].send_signal(signal.SIGTERM)
        assert procs[1].wait(20) == 0, log.read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        hook.close()
    if procs[1].returncode not in (0, -signal.SIGKILL):
        pytest.fail(log.read_text()[-3000:])


def test_a_job_that_ends_resolves_at_once_with_a_link_to_its_report(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Issue 36 item 4: the job ends while its incident is open; the detector's job-end marker resolves it
    at once (no reminder, no 'stale' minutes later), and Alertmanager's generatorURL is the job's page."""
    from urllib.parse import quote

    from eroica.sinks.alerts.links import report_file_name

    windows = detector_windows(tmp_path)
    job = windows[0].job
    prefix = f"j{uuid.uuid4().hex[:8]}"
    verdicts, patterns = f"{prefix}.eroica.verdicts", f"{prefix}.eroica.window-summaries"
    hook = Webhook()
    env = {**os.environ, "EROICA_KAFKA_TOPIC_VERDICTS": verdicts, "EROICA_KAFKA_TOPIC_WINDOW_SUMMARIES": patterns,
           "EROICA_KAFKA_PARTITIONS": str(PARTITIONS), "EROICA_ALERT_SESSION_TIMEOUT_MS": "2000",
           "EROICA_METRICS_PORT": "0", "EROICA_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1",
           "EROICA_REPORT_URL_BASE": "https://reports.example/eroica/"}
    args = ["--webhook", hook.url, "--kafka", kafka_bootstrap, "--group", f"{prefix}.alert",
            "--state", str(tmp_path / "state.json"), "--resolve-after", "2", "--reminder", "2s",
            "--stale-after", "10m", "--format", "alertmanager"]
    log = tmp_path / "alert.log"

    def events() -> list[str]:
        return [r["body"][0]["annotations"]["event"] for r in list(hook.received)]

    proc = _start(args, env, log)
    try:
        upto = max(i for i, w in enumerate(windows) if any(c >= 0.7 for _i, c in w.incidents)) + 1
        publish(kafka_bootstrap, verdicts, patterns, windows[:upto])  # the fault, through its last alarm
        wait_for(lambda: events()[:1] == ["opened"], 40, "the opened notification")
        publish_job_end(kafka_bootstrap, verdicts, job, windows[upto - 1].start_ns)  # then the job ends
        t0 = time.monotonic()
        wait_for(lambda: "resolved" in events(), 20, "the resolved notification")
        took = time.monotonic() - t0
        time.sleep(3)                                                # a reminder (every 2 s) would show now
        got = events()
        assert got[-1] == "resolved" and got.count("resolved") == 1, log.read_text()[-3000:]
        assert "reminder" not in got[got.index("resolved"):]
        resolved = hook.received[-1]["body"][0]
        assert resolved["annotations"]["resolution"].startswith("the job ended") and took < 10
        link = f"https://reports.example/eroica/{quote(report_file_name(job), safe='')}"
        assert resolved["generatorURL"] == link
        assert all(r["body"][0]["generatorURL"] == link for r in hook.received)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        hook.close()
