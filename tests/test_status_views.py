"""``eroica status`` says what each role really did (issue 36 item 3).

- every ``eroica alert`` sharing the stack's data directory is listed, each on its own line
  (they used to overwrite one ``metrics.json``: one consumer listed when two ran);
- the detector's delay runs from the window's close at the summariser (wall clock), so a replay of
  files minutes old shows seconds, not the files' age (it showed 305.9 s);
- a summariser's line says the digests it sent (it showed ``out 0``: it counts no records_out).
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from prometheus_client import REGISTRY

from eroica.cli.main import cli
from eroica.kafka.framing import FrameAccumulator
from eroica.models.frames import EndOfStream, encode_end_of_stream, encode_frame, encode_job
from eroica.models.reader import read_batches
from eroica.producers.replay import MAX_LAG_NS, _time_ordered
from eroica.runtime import metrics
from eroica.stack import health
from eroica.streams.cores.detector_core import VERDICTS, DetectorCore
from eroica.streams.cores.digest_messages import DigestMsg, decode_message, encode_message
from eroica.streams.cores.summariser_core import SUMMARIES, PartitionSummariser

W = 10 * 10**9

# --- every alert consumer ------------------------------------------------------------------------------

_CONSUMER = """
import sys, time
from eroica.runtime import metrics
server = metrics.serve("alert", 0)
n = int(sys.argv[1])
metrics.records_out("alert", "webhook", n)
metrics.ALERT_NOTIFICATIONS.labels("opened", "delivered").inc(n)
print(server.url, flush=True)
sys.stdin.read()          # until the test closes our stdin
if sys.argv[2] == "stop":
    server.stop()
# else a plain exit: the announcement goes all the same (atexit)
"""


def _consumer(data_dir: Path, notifications: int, stop: bool = True) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "EROICA_DATA_DIR": str(data_dir), "EROICA_METRICS_PORT": "0"}
    env.pop("EROICA_METRICS_PORT_BASE", None)
    proc = subprocess.Popen([sys.executable, "-c", _CONSUMER, str(notifications), "stop" if stop else "exit"], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("http://"), url
    return proc, url


def _stack_state(data_dir: Path) -> None:
    """A stack.json whose supervisor is this process, with no service (the consumers are what is looked at)."""
    (data_dir / "stack.json").write_text(json.dumps({"version": 1, "pid": os.getpid(), "data_dir": str(data_dir),
                                                     "kafka": {"bootstrap": "x:1"}, "services": {}}))


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "_broker", lambda kafka, timeout_s=3.0: health.Check("kafka", True, "stub"))
    monkeypatch.setattr(health, "_clickhouse", lambda state, timeout_s=3.0: health.Check("clickhouse", True, "stub"))


def test_two_alert_consumers_are_both_listed_and_dead_ones_dropped(tmp_path: Path, stubbed: None) -> None:
    data = tmp_path / "data"
    data.mkdir()
    _stack_state(data)
    # a consumer killed without cleaning up left its announcement behind: not listed
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (data / f"metrics-alert-{dead_pid}.json").write_text(json.dumps(
        {"version": 1, "pid": dead_pid, "url": "http://127.0.0.1:9/metrics", "component": "alert",
         "started_at_ns": 1}))
    procs = []
    try:
        procs.append(_consumer(data, 3))
        procs.append(_consumer(data, 5, stop=False))
        checks = health.check_stack(data, timeout_s=5.0)
        alerts = [c for c in checks if c.part.startswith("alert")]
        assert [c.part for c in alerts] == ["alert", "alert-2"], checks
        assert [c.pid for c in alerts] == [p.pid for p, _ in procs]
        assert all(c.ok for c in alerts), alerts
        assert [c.detail for c in alerts] == [f"metrics {url}: in 0, notifications sent {n}, open incidents 0"
                                              for (_, url), n in zip(procs, (3, 5))]
        assert not any(c.pid == dead_pid for c in checks)
        # `eroica status --format json` says the same
        r = CliRunner().invoke(cli, ["status", "--data-dir", str(data), "--format", "json"])
        doc = json.loads(r.output)
        assert [c["part"] for c in doc["checks"] if c["part"].startswith("alert")] == ["alert", "alert-2"]
        # one stops cleanly: its announcement goes with it, the other stays listed
        first, _ = procs[0]
        assert first.stdin is not None
        first.stdin.close()
        assert first.wait(20) == 0
        left = [c for c in health.check_stack(data, timeout_s=5.0) if c.part.startswith("alert")]
        assert [(c.part, c.pid) for c in left] == [("alert", procs[1][0].pid)]
    finally:
        for p, _ in procs:
            if p.poll() is None and p.stdin is not None:
                p.stdin.close()  # a clean stop
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
    assert [p.returncode for p, _ in procs] == [0, 0]
    # announcing removed the dead consumer's file; the live ones removed theirs when they stopped
    assert sorted(p.name for p in data.glob("metrics*.json")) == []


def test_read_announcement_keeps_the_one_of_a_pid_and_reads_the_old_single_file(tmp_path: Path) -> None:
    (tmp_path / metrics.METRICS_FILE).write_text(json.dumps({"pid": os.getpid(), "url": "http://a/metrics",
                                                             "component": "alert", "started_at_ns": 1}))
    server = metrics.MetricsServer("alert", "127.0.0.1", 0)
    try:
        server.announce(tmp_path)
        assert (tmp_path / f"metrics-alert-{os.getpid()}.json").exists()
        newest = metrics.read_announcement(tmp_path)
        assert newest is not None and newest["url"] == server.url
        assert [a["url"] for a in metrics.read_announcements(tmp_path)] == ["http://a/metrics", server.url]
        assert metrics.read_announcement(tmp_path, pid=123456789) is None
    finally:
        server.stop()


# --- detection delay from arrival ------------------------------------------------------------------------

def _frames(path: Path) -> list[tuple[str, bytes]]:
    """One partition's messages as ``eroica replay`` sends them: job record, frames, end markers."""
    out: list[tuple[str, bytes]] = []
    acc = FrameAccumulator(1000, max_lag_ns=MAX_LAG_NS)
    keys: dict[str, tuple[str, int, str | None]] = {}
    last: dict = {}
    for batch in read_batches(path, batch_records=8192):
        out += [(job.job, encode_job(job)) for job in batch.jobs]
        for f in _time_ordered([f for cols in batch.columns.values() for f in acc.add(cols)], last):
            keys.setdefault(f.key, (f.job, f.rank, f.node))
            out.append((f.key, encode_frame(f.cols)))
    for f in _time_ordered(list(acc.drain()), last):
        keys.setdefault(f.key, (f.job, f.rank, f.node))
        out.append((f.key, encode_frame(f.cols)))
    for k, (job, rank, node) in keys.items():
        out.append((k, encode_end_of_stream(EndOfStream(job, rank, node, 0, 0, {"job_keys": len(keys)}))))
    return out


def _histogram(name: str) -> tuple[float, float]:
    """(sum, count) of the detector's histogram ``name`` so far in this process."""
    labels = {"component": "detector"}
    return (REGISTRY.get_sample_value(f"{name}_sum", labels) or 0.0,
            REGISTRY.get_sample_value(f"{name}_count", labels) or 0.0)


def _replay(path: Path, strip_close: bool = False) -> tuple[int, list[DigestMsg]]:
    """Summarise and detect ``path`` in memory; (verdicts, digests seen by the detector)."""
    summariser = PartitionSummariser("raw/0", W, W, 2 * W, hold_s=0.0)
    detector = DetectorCore(grace_s=1e9)
    verdicts, digests = 0, []
    for i, (key, value) in enumerate(_frames(path)):
        step = summariser.on_message(key.encode(), value, i, float(i), offset=i, arrival_ns=time.time_ns())
        for s in step.sends:
            if s.topic != SUMMARIES:
                continue
            data = s.value
            msg = decode_message(data)
            if isinstance(msg, DigestMsg):
                digests.append(msg)
                if strip_close:  # a digest of an older summariser (or of an edge producer): no close stamped
                    data = encode_message(msgspec.structs.replace(msg, closed_at_ns=None))
            out = detector.on_message(data, None, 0, float(i))
            verdicts += sum(1 for o in out.sends if o.topic == VERDICTS)
    return verdicts, digests


@pytest.fixture(scope="module")
def old_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job that ran five to ten minutes ago, replayed now."""
    path = tmp_path_factory.mktemp("old") / "run.jsonl"
    start = time.time_ns() - 600 * 10**9
    r = CliRunner().invoke(cli, ["simulate", "--nodes", "1", "--gpus", "4", "--steps", "20", "--fault",
                                 "gpu_throttle:rank=1", "--seed", "2", "--start", str(start), "-o", str(path)])
    assert r.exit_code == 0, r.output
    return path


def test_a_replay_of_an_old_file_has_a_verdict_delay_of_seconds_not_its_age(old_file: Path) -> None:
    t0 = time.time_ns()
    age_before, verdict_before = _histogram("eroica_detection_delay_seconds"), _histogram("eroica_verdict_delay_seconds")
    verdicts, digests = _replay(old_file)
    age, verdict = _histogram("eroica_detection_delay_seconds"), _histogram("eroica_verdict_delay_seconds")
    windows = verdict[1] - verdict_before[1]
    assert verdicts > 0 and windows > 0 and age[1] - age_before[1] == windows
    # every digest says when its summariser closed the window (wall clock, now), not when its data happened
    assert digests and all(d.closed_at_ns is not None and t0 <= d.closed_at_ns <= time.time_ns() for d in digests)
    mean_age = (age[0] - age_before[0]) / windows
    mean_delay = (verdict[0] - verdict_before[0]) / windows
    assert mean_age > 120, mean_age          # the data's age: the file is minutes old
    assert mean_delay < 10, mean_delay       # what the pipeline took: the in-memory merge, milliseconds
    # and that is what the detector's status line says
    samples = {"eroica_verdict_delay_seconds_count{component=detector}": windows,
               "eroica_verdict_delay_seconds_sum{component=detector}": verdict[0] - verdict_before[0],
               "eroica_detection_delay_seconds_count{component=detector}": windows,
               "eroica_detection_delay_seconds_sum{component=detector}": age[0] - age_before[0]}
    line = metrics.summarise(samples, "detector", counts=False)
    assert line.startswith("verdict delay avg ") and line.endswith(" ms"), line


def test_digests_without_a_close_fall_back_to_the_window_end(old_file: Path) -> None:
    before = _histogram("eroica_verdict_delay_seconds")
    _replay(old_file, strip_close=True)
    after = _histogram("eroica_verdict_delay_seconds")
    assert after[1] > before[1] and (after[0] - before[0]) / (after[1] - before[1]) > 120


# --- what each role did ----------------------------------------------------------------------------------

# what a summariser that read 1,234 records and sent 4 digests serves (it counts no eroica_records_out)
SUMMARISER_METRICS = """\
# HELP eroica_records_in_total Records or messages read.
# TYPE eroica_records_in_total counter
eroica_records_in_total{component="summariser",source="fn"} 1000.0
eroica_records_in_total{component="summariser",source="gpu"} 234.0
# HELP eroica_windows_closed_total Job windows closed.
# TYPE eroica_windows_closed_total counter
eroica_windows_closed_total{component="summariser"} 4.0
# HELP eroica_records_dropped_total Valid records not counted in their window, by reason.
# TYPE eroica_records_dropped_total counter
eroica_records_dropped_total{component="summariser",reason="late"} 7.0
eroica_records_dropped_total{component="summariser",reason="repeated"} 0.0
"""

SUMMARISER_PAGE = {"role": "summariser", "frames": 12, "records": 1234, "digests": 4, "deadletters": 1,
                   "state": "up"}


def test_the_summariser_line_counts_the_digests_it_sent() -> None:
    samples = metrics.parse_samples(SUMMARISER_METRICS)
    assert metrics.summarise(samples, "summariser") == "records in 1,234, digests out 4, late 7"
    assert metrics.summarise(samples, "summariser-2", counts=False) == "late 7"
    assert health.role_detail("summariser", SUMMARISER_PAGE) == \
        "frames in 12 (1,234 records), digests out 4, dead letters 1"
    assert health.role_detail("detector", {"role": "detector", "digests": 4, "windows": 2, "verdicts": 3,
                                           "deadletters": 0}) == \
        "digests in 4, windows analysed 2, verdicts out 3, dead letters 0"
    assert health.role_detail("summariser", {"role": "detector"}) == ""  # another role's page: nothing claimed


class _Handler(http.server.BaseHTTPRequestHandler):
    pages: dict[str, tuple[str, bytes]] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        ctype, body = self.pages.get(self.path, ("text/plain", b""))
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def summariser_http() -> Iterator[str]:
    _Handler.pages = {"/eroica/stats": ("application/json", json.dumps(SUMMARISER_PAGE).encode()),
                      "/metrics": ("text/plain; version=0.0.4", SUMMARISER_METRICS.encode())}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_status_line_of_a_summariser_that_sent_digests(tmp_path: Path, summariser_http: str) -> None:
    service_dir = tmp_path / "summariser-2"
    service_dir.mkdir()
    (service_dir / f"metrics-summariser-{os.getpid()}.json").write_text(json.dumps(
        {"version": 1, "pid": os.getpid(), "url": f"{summariser_http}/metrics", "component": "summariser",
         "started_at_ns": 1}))
    svc = {"pid": os.getpid(), "port": 1, "health_url": f"{summariser_http}/eroica/stats", "state": "running"}
    check = health._service("summariser-2", svc, tmp_path)
    assert check.ok
    assert check.detail == (f"alive, port 1 answers; frames in 12 (1,234 records), digests out 4, dead letters 1; "
                            f"metrics {summariser_http}/metrics: late 7")
