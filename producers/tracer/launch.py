"""``eroica trace``: run a training command with the tracer in every rank and a node agent beside it.

1. A private folder gets a ``sitecustomize.py`` (:mod:`.bootstrap`) and goes
   first on the command's ``PYTHONPATH``; ``EROICA_JOB`` gives every rank the
   same job id and ``EROICA_TRACE_DIR`` / ``EROICA_TRACE_KAFKA`` say where
   records go.
2. The command runs as a child with this process's stdin, stdout and stderr:
   its output passes through untouched. Ctrl-C reaches it directly (same
   process group; we ignore it meanwhile), SIGTERM / SIGHUP are forwarded.
3. A node agent thread samples GPU / NIC / host counters into the same place
   (unless ``agent=False``).
4. When the command ends: the agent stops, ``--out`` merges every per-process
   file into one time-ordered contract file (:mod:`.merge`), and we exit with
   the command's own status (re-raising the signal that killed it, if any).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .bootstrap import write_site_dir
from .merge import MergeResult, merge_parts, read_metas
from .runtime import ENV_DIGESTER, ENV_DIR, ENV_JOB, ENV_KAFKA


def make_job_id(command: list[str], env: dict | None = None) -> str:
    """``--job``'s default: torchrun's run id when set, else ``<program>-<utc time>-<random>``."""
    env = os.environ if env is None else env
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id.lower() != "none":
        return run_id[:256]
    prog = next((a for a in command if a.endswith(".py")), None)
    if prog is None and "-m" in command[:-1]:
        prog = command[command.index("-m") + 1].rsplit(".", 1)[-1]
    prog = Path(prog or (command[0] if command else "job")).stem
    return f"{prog}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"[:256]


@dataclass
class TraceResult:
    returncode: int
    job: str
    merged: MergeResult | None = None
    agent_records: int = 0


def _pid_ranks(parts: Path):
    """pid -> rank from the ranks' meta files (for the agent's GPU -> rank mapping)."""
    def lookup(pid: int) -> int | None:
        for m in read_metas(parts):
            if int(m.get("pid", -1)) == pid:
                return int(m["rank"])
        return None
    return lookup


def _start_agent(job: str, parts: Path | None, kafka: str | None, interval_s: float, digester=None):
    from eroica.producers.agent import NodeAgent
    from eroica.producers.counters.gpu import GpuSampler, env_rank_base
    from eroica.producers.counters.sampler import NodeSampler
    from eroica.producers.outputs import hostname, make_sink

    node = hostname()
    gpu = GpuSampler(pid_rank=_pid_ranks(parts) if parts is not None else None)
    gpu.rank_base = env_rank_base(len(gpu.handles))
    sampler = NodeSampler(job, node, gpu=gpu)
    sink = make_sink(kafka=kafka, digester=digester, path=None if parts is None else parts / f"agent-{node}.jsonl")
    return NodeAgent(sampler, sink, interval_s).start()


def prepare_kafka(bootstrap: str, digests: bool = False) -> None:
    """Create the raw (``digests``: the digests) topic if missing; a broker that is away is reported, never
    fatal (records drop and count)."""
    try:
        from eroica.kafka.config import KafkaConfig
        from eroica.producers.replay import ensure_topics

        ensure_topics(KafkaConfig.from_env(bootstrap=bootstrap), timeout_s=5.0, digests=digests)
    except Exception as exc:
        print(f"eroica: Kafka at {bootstrap} not ready ({type(exc).__name__}: {exc}); the job runs anyway, "
              "records that cannot be sent are dropped and counted", file=sys.stderr, flush=True)


def run_trace(command: list[str], *, job: str | None = None, out: str | Path | None = None,
              kafka: str | None = None, agent: bool = True, interval_s: float = 0.5,
              keep_parts: bool = False, quiet: bool = False, rank_digester: str | None = None,
              agent_digester=None) -> TraceResult:
    """Run ``command`` traced; returns its exit status and what was written (see the module doc).

    Digest mode (with ``kafka``): ``rank_digester`` names each rank's digester factory
    (``runtime.ENV_DIGESTER``) and ``agent_digester`` is the node agent's digester; both
    publish window digests instead of raw records.
    """
    if not command:
        raise ValueError("no command to trace")
    job = job or make_job_id(command)
    if out is None and kafka is None:
        out = f"eroica-{job}.jsonl"
    work = Path(tempfile.mkdtemp(prefix=".eroica-trace-", dir=Path(out).resolve().parent if out else None))
    parts = work / "parts" if out is not None else None
    site = write_site_dir(work / "site")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env[ENV_JOB] = job
    if parts is not None:
        parts.mkdir(parents=True)
        env[ENV_DIR] = str(parts)
    if kafka:
        env[ENV_KAFKA] = kafka
        prepare_kafka(kafka, digests=bool(rank_digester))
        if rank_digester:
            env[ENV_DIGESTER] = rank_digester
    runner = None
    if agent:
        try:
            runner = _start_agent(job, parts, kafka, interval_s, agent_digester)
        except Exception as exc:
            print(f"eroica: node agent off: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as exc:
        if runner is not None:
            runner.stop()
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError(f"cannot run {command[0]}: {exc}") from exc

    def forward(signum: int, frame: object) -> None:
        try:
            proc.send_signal(signum)
        except OSError:
            pass

    previous = {}
    for sig, handler in ((signal.SIGINT, signal.SIG_IGN), (signal.SIGTERM, forward), (signal.SIGHUP, forward)):
        try:
            previous[sig] = signal.signal(sig, handler)
        except (ValueError, OSError):  # not the main thread (tests)
            pass
    try:
        rc = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    result = TraceResult(rc, job)
    if runner is not None:
        runner.stop()
        result.agent_records = runner.records
    try:
        if out is not None and parts is not None:
            result.merged = merge_parts(parts, out, job)
            if not quiet:
                m = result.merged
                ranks = f"{len(m.ranks)} rank(s)" if m.ranks else "no rank"
                print(f"eroica: job {job}: {m.records} records from {ranks}"
                      + (f" (world size {m.world_size})" if m.world_size else "")
                      + (f", {m.dropped} dropped (queue full)" if m.dropped else "") + f" -> {out}",
                      file=sys.stderr, flush=True)
    finally:
        if keep_parts and parts is not None:
            print(f"eroica: per-process files kept in {parts}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return result


def exit_like(returncode: int) -> None:
    """Leave with the child's status: its exit code, or death by the same signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    if returncode < 0:
        sig = -returncode
        try:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        except (ValueError, OSError):
            pass
        sys.exit(128 + sig)
    sys.exit(returncode)
