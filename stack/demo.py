"""``eroica demo``: the whole pipeline on this machine, end to end, in about a minute.

1. start a :class:`~eroica.stack.local.LocalStack` in a temporary data
   directory (tansu, the stream workers, the sink on chdb);
2. simulate a 64-rank job (8 nodes x 8 GPUs) with one throttled GPU;
3. replay the file onto Kafka as a live job would send it;
4. wait for the verdict to land in ClickHouse (asking the sink's endpoint),
   print it and the SQL that shows it;
5. stop everything.

When ``eroica worker`` (the faust processors) is not installed, step 4's
verdicts come from the same detection core run in batch over the file and
are published to the verdict topic, so the Kafka -> ClickHouse half still runs
for real; the demo says so.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eroica.models.verdict import Verdict
from eroica.sinks.clickhouse.client import QueryResult
from eroica.sinks.clickhouse.endpoint import EndpointClient

from .local import LocalStack, worker_command_available

__all__ = ["DemoResult", "run_demo", "demo_sql"]

DEMO_FAULT = "gpu_throttle:rank=13"
DEMO_WINDOW_S = "10"


@dataclass
class DemoResult:
    job: str
    verdicts: list[Verdict] = field(default_factory=list)
    sql: str = ""
    rows: QueryResult | None = None
    streamed: bool = True  # False: batch detection stood in for the stream workers
    timings: dict[str, float] = field(default_factory=dict)
    data_dir: Path | None = None


def demo_sql(job: str, database: str = "eroica") -> str:
    return (f"SELECT toDateTime(intDiv(window_start_ns, 1000000000)) AS window, component, scope, node, rank, gpu,\n"
            f"       round(slowdown, 2) AS slowdown, round(confidence, 2) AS confidence, summary\n"
            f"FROM {database}.verdicts FINAL\n"
            f"WHERE job = '{job}'\n"
            f"ORDER BY window_start_ns, component")


def _publish_batch_verdicts(stack: LocalStack, path: Path, window_s: float) -> int:
    """Stand-in for the stream workers: batch detection over the file, verdicts onto the verdict topic."""
    from confluent_kafka import Producer

    from eroica.models.reader import read_batches
    from eroica.models.verdict import encode_verdict
    from eroica.streams.detection import analyze

    found = list(analyze(read_batches(str(path)), int(window_s * 1e9), detected_at_ns=time.time_ns()))
    producer = Producer({"bootstrap.servers": stack.bootstrap, "acks": "all"})
    topic = stack.kafka_config().verdicts_topic
    for v in found:
        producer.produce(topic, encode_verdict(v), v.job)
    producer.flush(30)
    return len(found)


def run_demo(*, nodes: int = 8, gpus: int = 8, steps: int = 40, fault: str = DEMO_FAULT, seed: int = 1,
             timeout_s: float = 120.0, keep: bool = False, say: Callable[[str], None] = print) -> DemoResult:
    """Run the demo; the caller prints the result. The stack is always stopped on return."""
    import os

    from eroica.producers.replay import replay
    from eroica.producers.simulator import SimConfig, write_jsonl
    from eroica.producers.simulator.config import start_now_ns

    data_dir = Path(tempfile.mkdtemp(prefix="eroica-demo-"))
    job = f"demo-{uuid.uuid4().hex[:6]}"
    result = DemoResult(job, data_dir=data_dir if keep else None)
    env = dict(os.environ)
    env.setdefault("EROICA_WINDOW_S", DEMO_WINDOW_S)
    for var in ("EROICA_CLICKHOUSE_URL", "EROICA_KAFKA_BOOTSTRAP"):  # the demo runs its own stack
        env.pop(var, None)
    stack = LocalStack(data_dir, restart=False, stop_timeout_s=5.0, env=env,
                       on_event=lambda m: say(f"  {m}"))
    t0 = time.monotonic()
    try:
        say(f"[1/4] starting the stack in {data_dir}")
        stack.start(ready_timeout_s=min(90.0, timeout_s))
        result.timings["stack_start_s"] = time.monotonic() - t0
        result.streamed = worker_command_available()

        say(f"[2/4] simulating job {job}: {nodes} nodes x {gpus} GPUs, {steps} steps, fault {fault}")
        t = time.monotonic()
        run = data_dir / "run.jsonl"
        # stamped from now (as `eroica simulate`), so `eroica verdicts --since 1h` shows them on a kept stack
        truth = write_jsonl(SimConfig(nodes=nodes, gpus=gpus, steps=steps, faults=[fault], seed=seed, job=job,
                                      start_ns=start_now_ns()), run)
        result.timings["simulate_s"] = time.monotonic() - t
        say(f"      {truth['records']} records")

        say(f"[3/4] replaying onto Kafka at {stack.bootstrap}")
        t = time.monotonic()
        rep = replay([str(run)], stack.kafka_config())
        result.timings["replay_s"] = time.monotonic() - t
        say(f"      {rep.records} records in {rep.frames} frames, {rep.seconds:.1f} s")
        if not result.streamed:
            say("      (`eroica worker` is not installed: batch detection stands in for the stream workers "
                "and publishes its verdicts to the verdict topic)")
            n = _publish_batch_verdicts(stack, run, float(env["EROICA_WINDOW_S"]))
            say(f"      {n} verdicts published")

        say("[4/4] waiting for the verdict to land in ClickHouse")
        assert stack.query_endpoint is not None
        from .query import stack_token

        client = EndpointClient(stack.query_endpoint, timeout_s=10.0, token=stack_token(stack.data_dir))
        t = time.monotonic()
        deadline = t0 + timeout_s
        while time.monotonic() < deadline:
            result.verdicts = client.verdicts(job=job, limit=1000)
            if result.verdicts:
                break
            time.sleep(0.25)
        if result.verdicts:
            result.timings["verdict_after_replay_s"] = time.monotonic() - t
            settle = time.monotonic() + 2.0  # later windows of the same job land moments later
            while time.monotonic() < min(settle, deadline):
                time.sleep(0.5)
                result.verdicts = client.verdicts(job=job, limit=1000)
            result.sql = demo_sql(job)
            result.rows = client.sql(result.sql)
        result.timings["total_s"] = time.monotonic() - t0
        return result
    finally:
        say("stopping the stack")
        stack.stop()
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)
