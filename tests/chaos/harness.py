"""The chaos suite's harness: one ``eroica up`` stack per module, faults injected into it, verdict ids compared.

Each case simulates a small job of its own (4 nodes x 4 GPUs, a throttled GPU
and a degraded NIC: about 73 k records, 10 verdicts), asks ``eroica analyze``
for the expected verdict ids, replays the job onto the running stack at a
fixed rate (so a fault lands mid-stream), injects the fault, and then requires
that the verdict ids stored in ClickHouse for that job are **exactly** the
expected set (nothing lost, nothing extra), and that ``SELECT verdict_id ...
FINAL`` returns each of them once (nothing doubled). Every case's counts and
runtime are printed (``pytest -s``) and appended to ``$EROICA_CHAOS_REPORT``
when set (JSON lines).

Not a test module (imported as ``chaos.harness``; ``tests`` is on sys.path).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sink_helpers import stop_stack, wait_for

EROICA = [sys.executable, "-m", "eroica.cli"]
LAYOUT = ["--nodes", "4", "--gpus", "4", "--steps", "110"]
FAULTS = ["gpu_throttle:rank=6", "nic:node=2,nic=1"]
REPLAY_RATE = 20000  # records/s: the job's 73 k records take ~3.6 s, so faults land mid-stream
# Fast group joins and flushes; ClickHouse retries capped at 1 s so recovery shows quickly.
STACK_ENV = {
    "EROICA_SINK_SESSION_TIMEOUT_MS": "2000",
    "EROICA_SINK_FLUSH_MS": "100",
    "EROICA_CLICKHOUSE_RETRY_INITIAL_S": "0.2",
    "EROICA_CLICKHOUSE_RETRY_MAX_S": "1.0",
    "EROICA_KAFKA_PARTITIONS": "4",
}


def require_chdb() -> None:
    """chdb (a dependency) must import; skipped without it locally, a failure under ``CI``."""
    import pytest

    try:
        import chdb  # noqa: F401
    except ImportError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"chdb does not import in CI: {exc}", pytrace=False)
        pytest.skip(f"chdb does not import: {exc}")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EROICA_CLICKHOUSE", "EROICA_KAFKA",
                                                                     "EROICA_SINK", "EROICA_DATA_DIR"))}
    return {**env, **STACK_ENV, **extra}


def eroica(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EROICA, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or _clean_env())


@dataclass(frozen=True)
class Job:
    name: str
    path: Path
    expected: frozenset[str]


def make_jobs(tmp: Path, names: Sequence[str], seed: int = 31) -> dict[str, Job]:
    """One job per name and the verdict ids ``eroica analyze`` gives for each.

    One simulation, copied under each job name (only the ``job`` field differs, so every verdict id
    differs), and one ``analyze`` over all the copies: two process starts instead of two per case.
    """
    base = tmp / "base.jsonl"
    args = ["simulate", *LAYOUT, "--seed", str(seed), "--job", "chaos-base", "-o", str(base)]
    for f in FAULTS:
        args += ["--fault", f]
    sim = eroica(*args)
    assert sim.returncode == 0, sim.stderr
    data = base.read_bytes()
    assert data.count(b'"job":"chaos-base"') == data.count(b"\n"), "one job field per record expected"
    paths = {}
    for name in names:
        paths[name] = tmp / f"{name}.jsonl"
        paths[name].write_bytes(data.replace(b'"job":"chaos-base"', b'"job":"%s"' % name.encode()))
    batch = eroica("analyze", *map(str, paths.values()), "--format", "json")
    assert batch.returncode == 0, batch.stderr
    ids: dict[str, set[str]] = {name: set() for name in names}
    for v in json.loads(batch.stdout):
        ids[v["job"]].add(v["verdict_id"])
    for name in names:
        assert len(ids[name]) >= 5, f"{name}: too few verdicts to test with ({len(ids[name])})"
    return {name: Job(name, paths[name], frozenset(ids[name])) for name in names}


@dataclass
class ChaosStack:
    """``eroica up`` in its own session, and what the faults need of it (pids, bootstrap, the endpoint)."""

    data_dir: Path
    broker: str | None = "tansu"     # tansu, kafka, or None with ``kafka``
    kafka: str | None = None         # an external bootstrap (the 3-node cluster)
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    def start(self, timeout_s: float = 150) -> "ChaosStack":
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-up.log"
        argv = [*EROICA, "up", "--data-dir", str(self.data_dir), "--stop-timeout", "3", "--max-restarts", "20",
                "--ready-timeout", str(int(timeout_s))]
        argv += ["--kafka", self.kafka] if self.kafka else ["--broker", self.broker or "tansu"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=_clean_env(**self.extra_env),
                                         start_new_session=True)

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"eroica up exited {self.proc.returncode}:\n{self.log_tail()}")
            return "stack up" in self.log_path.read_text(errors="replace")

        wait_for(up, timeout_s, "eroica up", interval_s=0.25)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_stack(self.proc)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path else ""

    # -- state ------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return json.loads((self.data_dir / "stack.json").read_text())

    @property
    def bootstrap(self) -> str:
        return self.state()["kafka"]["bootstrap"]

    def pid(self, service: str) -> int:
        return int(self.state()["services"][service]["pid"])

    def restarts(self, service: str) -> int:
        return int(self.state()["services"][service]["restarts"])

    def kafka_config(self) -> Any:
        from eroica.kafka.config import KafkaConfig

        return KafkaConfig.from_env(_clean_env(**self.extra_env), bootstrap=self.bootstrap)

    # -- faults -----------------------------------------------------------------------
    def sigkill(self, service: str) -> int:
        """SIGKILL a child (the supervisor restarts it); returns the killed pid."""
        pid = self.pid(service)
        os.kill(pid, signal.SIGKILL)
        return pid

    def wait_restarted(self, service: str, old_pid: int, timeout_s: float = 60) -> None:
        def back() -> bool:
            s = self.state()["services"][service]
            return s["pid"] != old_pid and s["state"] == "running"

        wait_for(back, timeout_s, f"{service} restarted by the supervisor", interval_s=0.2)

    def kill_broker(self) -> int:
        """SIGKILL the managed broker (the supervisor starts it again on its port)."""
        pid = int(self.state()["kafka"]["pid"])
        os.kill(pid, signal.SIGKILL)
        return pid

    # -- input and output -------------------------------------------------------------
    def replay(self, job: Job, rate: int | None = REPLAY_RATE) -> subprocess.Popen:
        args = [*EROICA, "replay", "--kafka", self.bootstrap, "--quiet", "--connect-timeout", "30", str(job.path)]
        if rate:
            args += ["--rate", str(rate)]
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=_clean_env(**self.extra_env))

    def _endpoint(self) -> Any:
        from eroica.sinks.clickhouse.endpoint import EndpointClient
        from eroica.stack.query import stack_token

        return EndpointClient(self.state()["query_endpoint"], timeout_s=10.0, token=stack_token(self.data_dir))

    def stored(self, job: str) -> set[str]:
        """The job's verdict ids in ClickHouse (empty while the sink is away)."""
        try:
            return {v.verdict_id for v in self._endpoint().verdicts(job=job, limit=100_000)}
        except Exception:  # noqa: BLE001 - restarting sink: ask again
            return set()

    def stored_rows(self, job: str) -> list[str]:
        """Every verdict id row a reader sees for the job (FINAL): a doubled verdict shows twice here."""
        res = self._endpoint().sql(f"SELECT verdict_id FROM eroica.verdicts FINAL WHERE job = '{job}'")
        return [r[0] for r in res.rows]


@dataclass
class CaseResult:
    case: str
    broker: str
    stored: int
    expected: int
    missing: int
    extra: int
    doubled: int
    seconds: float

    def line(self) -> str:
        return (f"chaos {self.broker:>9} | {self.case:<34} | stored {self.stored:>3} / expected {self.expected:>3}"
                f" | missing {self.missing} extra {self.extra} doubled {self.doubled} | {self.seconds:5.1f} s")


def record(result: CaseResult) -> None:
    print("\n" + result.line(), flush=True)
    out = os.environ.get("EROICA_CHAOS_REPORT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(result.__dict__) + "\n")


def check_job(stack: ChaosStack, job: Job, case: str, broker: str, started: float, timeout_s: float = 120,
              settle_s: float = 2.0) -> CaseResult:
    """Wait for the expected ids, let stragglers arrive, then require exactly them, each once."""
    try:
        wait_for(lambda: stack.stored(job.name) >= job.expected, timeout_s,
                 f"{case}: the {len(job.expected)} verdict ids of analyze in ClickHouse", interval_s=0.5)
    except AssertionError:
        got = stack.stored(job.name)
        raise AssertionError(f"{case}: stored {len(got)} of {len(job.expected)} expected; missing "
                             f"{sorted(job.expected - got)[:5]}\n{stack.log_tail()}") from None
    time.sleep(settle_s)
    got = stack.stored(job.name)
    rows = stack.stored_rows(job.name)
    result = CaseResult(case, broker, len(got), len(job.expected), len(job.expected - got), len(got - job.expected),
                        len(rows) - len(set(rows)), time.monotonic() - started)
    record(result)
    if got != job.expected:
        extra = [v for v in stack._endpoint().verdicts(job=job.name, limit=100_000) if v.verdict_id not in job.expected]
        detail = [(v.kind, v.component, v.scope, v.rank, v.node, v.window_start_ns, v.window_end_ns,
                   round(v.confidence, 3), v.summary[:120]) for v in extra]
        raise AssertionError(f"{result.line()}\nextra: {detail}\nmissing: {sorted(job.expected - got)}")
    assert result.doubled == 0, result.line()
    return result


def replay_with(stack: ChaosStack, job: Job, faults: Sequence[tuple[float, Callable[[], None]]]) -> None:
    """Replay ``job`` and run each fault at its offset (seconds from the replay's start); the replay must deliver all."""
    t0 = time.monotonic()
    rep = stack.replay(job)
    for at, fault in faults:
        delay = t0 + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        fault()
    out, _ = rep.communicate(timeout=180)
    assert rep.returncode == 0, f"replay failed ({rep.returncode}): {out[-2000:]}"


def kill_each_service_case(stack: ChaosStack, job: Job, broker: str) -> None:
    """The summariser, the detector and the sink SIGKILLed one after the other during one replay."""
    killed: dict[str, int] = {}
    t0 = time.monotonic()
    replay_with(stack, job, [(1.0 + i, lambda s=s: killed.__setitem__(s, stack.sigkill(s)))
                             for i, s in enumerate(("summariser", "detector", "sink"))])
    for service, pid in killed.items():
        stack.wait_restarted(service, pid)
    check_job(stack, job, "SIGKILL summariser+detector+sink", broker, t0, timeout_s=150)


# -- poison ---------------------------------------------------------------------------------------
DEEP_JSON = b"[" * 5000 + b"]" * 5000
DEEP_MSGPACK = b"\x91" * 5000 + b"\xc0"
NOT_UTF8 = b"\xff\xfe\xfd garbage \x00\x01"
HUGE_NUMBER = b'{"verdict_id": 1' + b"9" * 4000 + b"}"


def poison_messages() -> list[tuple[bytes, bytes]]:
    """(key, value) pairs no decoder may choke on: deep nesting (JSON and msgpack), bytes, a huge number."""
    return [(b"poison-deep-json", DEEP_JSON), (b"poison-deep-msgpack", DEEP_MSGPACK),
            (b"poison-bytes", NOT_UTF8), (b"poison-number", HUGE_NUMBER)]


def publish_poison(bootstrap: str, topics: Sequence[str]) -> int:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    n = 0
    for topic in topics:
        for key, value in poison_messages():
            producer.produce(topic, value, key)
            n += 1
    assert producer.flush(30) == 0
    return n


FUTURE_NS = 4_102_444_800 * 10**9  # 2100-01-01: a clock decades ahead
PAST_NS = 1_000  # 1970: a clock that never synced


def publish_clock_poison(bootstrap: str, ingest_topic: str, raw_topic: str, job: str) -> int:
    """Valid records of ``job`` stamped 2100 and 1970, from a new node and an existing one, on ingest and raw.

    Each is its own message, as an outside collector or a broken agent would send it; none may change the
    job's verdicts (issue 34: one 2100 record closed every window of its job; a 1970 one stretched its first).
    """
    from confluent_kafka import Producer

    from eroica.models.columns import from_records
    from eroica.models.frames import encode_frame
    from eroica.models.records import HostRecord

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    n = 0
    for ts in (FUTURE_NS, PAST_NS):
        for node in ("node-99", "node-0"):
            rec = {"type": "host", "job": job, "node": node, "ts_ns": ts, "cpu_util_pct": 20.0, "load1": 1.0}
            producer.produce(ingest_topic, json.dumps(rec).encode(), f"{job}/{node}".encode())
            frame = encode_frame(from_records("host", [HostRecord(job=job, node=node, ts_ns=ts,
                                                                  cpu_util_pct=20.0, load1=1.0)]))
            producer.produce(raw_topic, frame, f"{job}/{node}".encode())
            n += 2
    assert producer.flush(30) == 0
    return n


def deadletter_sources(bootstrap: str, topic: str, want: Callable[[list[dict]], bool], timeout_s: float = 60) -> list[dict]:
    """Dead letters on ``topic`` (JSON), read from the start of every partition until ``want`` holds.

    Assigned, not subscribed: no group join (tansu's waits half a session timeout).
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"chaos-dlq-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False})
    got: list[dict] = []
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not want(got):
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    try:
                        got.append(json.loads(m.value()))
                    except ValueError:
                        pass
    finally:
        c.close()
    return got


@contextmanager
def blocked_clickhouse(flag: Path) -> Iterator[None]:
    """Every insert of the stack's sink fails as "ClickHouse unavailable" while inside (EROICA_SINK_CHAOS_BLOCK_FILE)."""
    flag.write_text("blocked by the chaos suite\n")
    try:
        yield
    finally:
        flag.unlink(missing_ok=True)


# -- stats pages and settings -----------------------------------------------------------------------
def service_stats(stack: ChaosStack, service: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The JSON of a service's health page (``/eroica/stats`` for the workers); {} while it does not answer."""
    import urllib.request

    url = str(stack.state()["services"][service]["health_url"])
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):  # restarting or busy: ask again
        return {}


def stack_settings(stack: ChaosStack) -> Any:
    """The stream workers' settings (window, idle close...) as the stack's environment gives them."""
    from eroica.streams.faust.settings import WorkerSettings

    return WorkerSettings.from_env(_clean_env(**stack.extra_env))
