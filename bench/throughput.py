"""The throughput benchmark: every stage's records per CPU-second beside its floor on this machine.

One simulated job (:mod:`eroica.producers.simulator`) goes through every stage
of the pipeline in turn, each measured on its own, and each stage is set
beside its *floor*: the cost of merely reading and decoding the same bytes that
stage reads, measured in the same run on the same machine. The ratio says how
far a stage is from the least it could cost.

Stages (in the order they run; each one's input is the previous one's output):

=================  ==========================================================  ===========================
stage              what is timed                                               floor
=================  ==========================================================  ===========================
reader             ``models.reader.read_batches``: JSON Lines, validation,     ``json``
                   columnar batches
analyze (batch)    ``eroica analyze`` end to end: reader, windows, digests,    ``json``
                   detector (``streams.detection.analyze_windows``)
framing encode     ``FrameAccumulator`` (as replay cuts them) + ``encode_frame``  ``frames``
framing decode     ``decode_frame`` of every frame                             ``frames``
windowing          ``WindowAssembler`` on the decoded frames (event-time       ``frames``
                   windows of the summariser)
summariser         ``digest_window`` of every time window                      ``frames``
detector           ``detect_step`` over the time-window digests in order,      ``digests``
                   then ``flush_job`` (job windows of whole steps)
sink chdb          the sink worker's ``decode_summaries``/``decode_verdicts``  ``sink``
                   + INSERTs into chdb (embedded, in this process)
sink server        the same into a ClickHouse server (child process counted)   ``sink``
broker <name>      publish every frame (``FramePublisher``, as replay) and     ``frames``
                   consume them back (confluent-kafka); broker process counted
=================  ==========================================================  ===========================

Floors (each the same records, the same bytes):

- ``json``: read the file in 1 MiB chunks and ``msgspec.json.Decoder(Record).decode_lines``
  (typed decoding of every line into the contract's structs, nothing else);
- ``frames``: ``msgpack.unpackb`` of every frame and ``np.frombuffer`` of its columns;
- ``digests``: ``decode_digest`` of every time-window digest's bytes (what the detector reads);
- ``sink``: ``msgspec.msgpack``/``json`` decoding of the sink's messages (summary rows and verdicts).

CPU is ``time.process_time()`` of this process (all its threads: librdkafka,
chdb) plus, for stages that run in other processes (the broker, the ClickHouse
server), the CPU of this process's descendants read from ``/proc`` (and
``RUSAGE_CHILDREN`` for children reaped meanwhile). Peak memory is the growth
of the resident set's high-water mark during the stage (``VmHWM``, reset per
stage through ``/proc/self/clear_refs``, after ``malloc_trim`` has handed freed
heap back to the OS), descendants included; it counts what the stage keeps
(its output) as well as its transient work; with
``tracemalloc=True`` the traced Python/numpy peak is reported as well (and
CPU times then include tracemalloc's own overhead).

Record counts: ``records`` is the number of input records a stage handled (the
``job`` record is metadata and is not framed); the sink counts rows inserted
(summary rows and verdicts) and checks them with ``SELECT count()``. Only the
ratio of a stage to its floor is meaningful between machines.
"""

from __future__ import annotations

import gc
import os
import resource
import shutil
import tempfile
import time
import tracemalloc
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import msgpack
import msgspec
import numpy as np

from eroica.models.digest import decode_digest, encode_digest
from eroica.models.frames import decode_frame, encode_frame
from eroica.models.reader import read_batches
from eroica.models.records import Record
from eroica.kafka.framing import FrameAccumulator
from eroica.producers.replay import MAX_LAG_NS
from eroica.producers.simulator import SimConfig, write_jsonl
from eroica.runtime.system import columnar_gc_during
from eroica.streams.detection import DEFAULT_WINDOW_S, analyze_windows
from eroica.streams.detection.detector import detect_step, flush_job
from eroica.streams.detection.window_summaries import window_summaries
from eroica.streams.detection.summarise import digest_window
from eroica.streams.detection.windows import WindowAssembler

DEFAULT_RANKS = 64
DEFAULT_STEPS = 60
GPUS_PER_NODE = 8
FRAME_RECORDS = 1000
CHUNK = 1 << 20
MIN_FLOOR_CPU_S = 0.2   # floors (and pure cheap stages) repeat until they used this much CPU
MAX_REPEATS = 50
BROKERS = ("tansu", "kafka", "none")


# -- measuring ------------------------------------------------------------------------------------

_CLK = os.sysconf("SC_CLK_TCK")
_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (ppid, CPU seconds) of every process we can read."""
    out: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rfind(b")") + 2:].split()
        # fields after the name: state ppid ... utime(14th overall -> index 11 here) stime(12)
        out[int(name)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / _CLK)
    return out


def descendants() -> dict[int, float]:
    """CPU seconds of every live descendant of this process (the broker, a server, their children)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, float] = {}
    todo = list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        out[pid] = table[pid][1]
        todo.extend(children.get(pid, []))
    return out


def _status_kb(pid: int | str, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _reset_hwm(pid: int | str) -> None:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


@dataclass
class Usage:
    """CPU and memory of one measured piece of work."""

    cpu_s: float = 0.0
    own_cpu_s: float = 0.0
    child_cpu_s: float = 0.0
    wall_s: float = 0.0
    peak_mb: float = 0.0
    traced_peak_mb: float | None = None
    repeats: int = 1


class Meter:
    """Measures a block: own CPU, descendants' CPU, resident high-water mark growth."""

    def __init__(self, children: bool = False, traced: bool = False) -> None:
        self.children = children
        self.traced = traced
        self.usage = Usage()

    def __enter__(self) -> "Meter":
        gc.collect()
        _malloc_trim()  # freed heap back to the OS, so the stage's own growth shows in the RSS
        self._kids0 = descendants() if self.children else {}
        self._reaped0 = _reaped_cpu()
        self._rss0 = {pid: _status_kb(pid, "VmRSS") for pid in ["self", *self._kids0]}
        for pid in self._rss0:
            _reset_hwm(pid)
        if self.traced:
            tracemalloc.start()
            tracemalloc.reset_peak()
        self._wall0 = time.perf_counter()
        self._cpu0 = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        cpu = time.process_time() - self._cpu0
        wall = time.perf_counter() - self._wall0
        u = self.usage
        if self.traced:
            u.traced_peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
        child = 0.0
        peak_kb = max(0, _status_kb("self", "VmHWM") - self._rss0["self"])
        if self.children:
            kids = descendants()
            child = sum(c - self._kids0.get(pid, 0.0) for pid, c in kids.items())
            child += _reaped_cpu() - self._reaped0
            for pid in kids:
                peak_kb += max(0, _status_kb(pid, "VmHWM") - self._rss0.get(pid, 0))
        u.own_cpu_s, u.child_cpu_s, u.cpu_s, u.wall_s = cpu, child, cpu + child, wall
        u.peak_mb = peak_kb / 1024


def _malloc_trim() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the RSS deltas may then understate
        pass


def _reaped_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(fn: Callable[[], Any], *, children: bool = False, traced: bool = False,
            min_cpu_s: float = 0.0) -> tuple[Any, Usage]:
    """Run ``fn`` (again while under ``min_cpu_s`` in all, at most MAX_REPEATS times); per-run usage."""
    with Meter(children, traced) as m:
        result = fn()
        n = 1
        while min_cpu_s and time.process_time() - m._cpu0 < min_cpu_s and n < MAX_REPEATS:
            # Each repeat runs as the first did: the previous result dropped (a stage's consumer
            # takes it away), not kept alive for the collector to walk while the next one is built.
            result = None
            result = fn()
            n += 1
    u = m.usage
    if n > 1:
        u.cpu_s /= n
        u.own_cpu_s /= n
        u.child_cpu_s /= n
        u.wall_s /= n
    u.repeats = n
    return result, u


# -- results --------------------------------------------------------------------------------------

@dataclass
class StageResult:
    stage: str
    records: int
    cpu_s: float
    records_per_cpu_s: float
    floor: str
    floor_records_per_cpu_s: float
    ratio_to_floor: float
    peak_mb: float
    wall_s: float
    own_cpu_s: float
    child_cpu_s: float
    repeats: int
    traced_peak_mb: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Floor:
    name: str
    what: str
    records: int
    usage: Usage

    @property
    def rate(self) -> float:
        return self.records / self.usage.cpu_s if self.usage.cpu_s > 0 else float("inf")


def _rate(records: int, cpu: float) -> float:
    return records / cpu if cpu > 0 else float("inf")


# -- the floors -----------------------------------------------------------------------------------

def warm_kernels() -> list[str]:
    """Load every compiled kernel the stages use; the names of those loaded (none without numba)."""
    from eroica.models import fastjson, limits
    from eroica.streams.detection import kernels
    return [name for name, warm in (("fastjson", fastjson.warm), ("summariser", kernels.warm),
                                    ("msgpack depth", limits.warm)) if warm()]


def json_floor(path: Path) -> int:
    """Read the file and decode every line into the contract's structs: the least a reader must do."""
    dec = msgspec.json.Decoder(Record)
    n = 0
    carry = b""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            chunk = carry + chunk
            cut = chunk.rfind(b"\n") + 1
            carry = chunk[cut:]
            n += len(dec.decode_lines(chunk[:cut]))
    if carry.strip():
        n += len(dec.decode_lines(carry))
    return n


def frames_floor(frames: list[bytes]) -> int:
    """Unpack every frame and view each column with ``np.frombuffer``: the least a frame consumer must do."""
    n = 0
    unpackb = msgpack.unpackb
    for data in frames:
        body = unpackb(data[4:])
        for _name, dtype, buf in body["c"]:
            np.frombuffer(buf, dtype=dtype)
        n += body["n"]
    return n


# -- the run --------------------------------------------------------------------------------------

@dataclass
class BenchConfig:
    ranks: int = DEFAULT_RANKS
    steps: int = DEFAULT_STEPS
    window_s: float = DEFAULT_WINDOW_S
    seed: int = 1
    fault: str | None = "auto"          # "auto": a throttled GPU, so the detector and sink have verdicts
    broker: str = "tansu"               # tansu | kafka | none
    server: bool | None = None          # None: a ClickHouse server when its binary is found
    chdb: bool = True
    tracemalloc: bool = False
    work_dir: Path | None = None
    progress: Callable[[str], None] | None = None
    passes: int = 1                     # every stage and floor this many times over (see combine_passes)


def sim_config(cfg: BenchConfig) -> SimConfig:
    if cfg.ranks < 1:
        raise ValueError(f"--ranks must be >= 1, got {cfg.ranks}")
    gpus = min(GPUS_PER_NODE, cfg.ranks)
    if cfg.ranks % gpus:
        raise ValueError(f"--ranks must be a multiple of {GPUS_PER_NODE} above {GPUS_PER_NODE}, got {cfg.ranks}")
    faults = []
    if cfg.fault == "auto":
        if cfg.ranks >= 4:
            faults = [f"gpu_throttle:rank={min(13, cfg.ranks - 1)}"]
    elif cfg.fault:
        faults = [cfg.fault]
    return SimConfig(nodes=cfg.ranks // gpus, gpus=gpus, steps=cfg.steps, faults=faults, seed=cfg.seed,
                     job=f"bench-{cfg.ranks}r")


def run(cfg: BenchConfig) -> dict[str, Any]:
    """Simulate once, run every stage and its floor ``cfg.passes`` times; the result as plain data
    (see :func:`to_json`, and :func:`combine_passes` for how passes are summarised).

    Under the collector's settings of the processes that run these stages (the
    stream workers, ``eroica analyze``: :func:`~eroica.runtime.system.columnar_gc`),
    so each stage is measured as it runs in production.
    """
    if cfg.passes < 1:
        raise ValueError(f"--passes must be >= 1, got {cfg.passes}")
    say = cfg.progress or (lambda _msg: None)
    own_dir = cfg.work_dir is None
    work = Path(tempfile.mkdtemp(prefix="eroica-bench-")) if own_dir else Path(cfg.work_dir)  # type: ignore[arg-type]
    work.mkdir(parents=True, exist_ok=True)
    try:
        with columnar_gc_during():
            inp = _simulate(cfg, work)
            say(f"simulated {inp.sim.nodes}x{inp.sim.gpus} ranks, {cfg.steps} steps: {inp.records:,} records, "
                f"{inp.bytes / 2**20:.1f} MiB in {inp.simulate_s:.1f} s")
            results = []
            for k in range(cfg.passes):
                if cfg.passes > 1:
                    say(f"pass {k + 1} of {cfg.passes}")
                # each pass its own databases and broker data, so no pass reads what another wrote
                results.append(_run(cfg, inp, work if cfg.passes == 1 else work / f"pass-{k + 1}"))
        return combine_passes(results)
    finally:
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)


@dataclass
class _Input:
    """The simulated job every pass reads."""

    sim: SimConfig
    path: Path
    records: int
    bytes: int
    simulate_s: float


def _simulate(cfg: BenchConfig, work: Path) -> _Input:
    sim = sim_config(cfg)
    path = work / "run.jsonl"
    t0 = time.perf_counter()
    truth = write_jsonl(sim, path, truth_path=False)
    sim_s = time.perf_counter() - t0
    lines = int(truth.get("records", 0)) or sum(1 for _ in open(path, "rb"))
    return _Input(sim, path, lines, path.stat().st_size, sim_s)


def _run(cfg: BenchConfig, inp: _Input, work: Path) -> dict[str, Any]:
    """One pass: every stage and its floor, in order, on the simulated job."""
    say = cfg.progress or (lambda _msg: None)
    work.mkdir(parents=True, exist_ok=True)
    traced = cfg.tracemalloc
    stages: list[StageResult] = []
    floors: dict[str, Floor] = {}
    skipped: dict[str, str] = {}
    sim, path, lines, size = inp.sim, inp.path, inp.records, inp.bytes

    def add(stage: str, records: int, u: Usage, floor: str, **detail: Any) -> StageResult:
        f = floors[floor]
        rate = _rate(records, u.cpu_s)
        r = StageResult(stage, records, u.cpu_s, rate, floor, f.rate,
                        f.rate / rate if rate > 0 else float("inf"), u.peak_mb, u.wall_s, u.own_cpu_s,
                        u.child_cpu_s, u.repeats, u.traced_peak_mb, detail)
        stages.append(r)
        say(f"{stage}: {records:,} records, {u.cpu_s:.3f} CPU s, {r.ratio_to_floor:.1f}x floor")
        return r

    window_ns = int(cfg.window_s * 1e9)
    # -- one-time costs ----------------------------------------------------------------
    # Loading compiled kernels (numba's cached machine code) is paid once per process, not per
    # record: a worker pays it at start. Charged to the first stage that used them, it made the
    # reader look 2x slower than it runs; measured here on its own and reported beside the table.
    _wl, startup = measure(warm_kernels)

    # -- JSON Lines ---------------------------------------------------------------------
    n, u = measure(lambda: json_floor(path), traced=traced, min_cpu_s=MIN_FLOOR_CPU_S)
    floors["json"] = Floor("json", "read the file + msgspec.json.Decoder(Record).decode_lines", n, u)

    batches, u = measure(lambda: list(read_batches(path)), traced=traced, min_cpu_s=MIN_FLOOR_CPU_S)
    valid = sum(b.valid_count for b in batches)
    invalid = sum(len(b.invalid) for b in batches)
    jobs = [j for b in batches for j in b.jobs]
    add("reader", valid + invalid, u, "json", valid=valid, invalid=invalid, batches=len(batches))

    def analyze_all() -> int:
        return sum(len(v) for _d, v in analyze_windows(read_batches(path), window_ns))

    n_verdicts, u = measure(analyze_all, traced=traced, min_cpu_s=MIN_FLOOR_CPU_S)
    add("analyze (batch)", valid + invalid, u, "json", verdicts=n_verdicts)

    # -- framing ------------------------------------------------------------------------
    def encode_all() -> list[tuple[str, int, bytes]]:
        acc = FrameAccumulator(FRAME_RECORDS, max_lag_ns=MAX_LAG_NS)
        out = []
        for b in batches:
            for cols in b.columns.values():
                for fs in acc.add(cols):
                    out.append((fs.key, len(fs.cols), encode_frame(fs.cols)))
        for fs in acc.drain():
            out.append((fs.key, len(fs.cols), encode_frame(fs.cols)))
        return out

    framed, u = measure(encode_all, traced=traced)
    batches = []  # free it: later stages do not read it
    frames = [v for _k, _n, v in framed]
    frame_records = sum(n for _k, n, _v in framed)
    frame_bytes = sum(len(v) for v in frames)
    n, fu = measure(lambda: frames_floor(frames), traced=traced, min_cpu_s=MIN_FLOOR_CPU_S)
    floors["frames"] = Floor("frames", "msgpack.unpackb of every frame + np.frombuffer of its columns", n, fu)
    add("framing encode", frame_records, u, "frames", frames=len(frames), bytes=frame_bytes)

    decoded, u = measure(lambda: [decode_frame(v)[0] for v in frames], traced=traced)
    add("framing decode", sum(len(c) for c in decoded), u, "frames", frames=len(frames))

    # -- summariser ---------------------------------------------------------------------
    def assemble() -> list:
        asm = WindowAssembler(window_ns, window_ns)
        for j in jobs:
            asm.add_meta(j)
        out = []
        for cols in decoded:
            asm.add(cols)
            out.extend(asm.complete())
        out.extend(asm.flush())
        return out

    windows, u = measure(assemble, traced=traced)
    win_records = sum(w.records for w in windows)
    add("windowing", win_records, u, "frames", windows=len(windows))
    decoded = []  # free it: later stages do not read it

    digests, u = measure(lambda: [digest_window(w) for w in windows], traced=traced, min_cpu_s=MIN_FLOOR_CPU_S)
    add("summariser", win_records, u, "frames", windows=len(windows))
    metas = {w.job: w.meta for w in windows}
    windows = []  # free it: later stages do not read it

    # -- detector -----------------------------------------------------------------------
    encoded_digests = [encode_digest(d) for d in digests]
    n, fu = measure(lambda: len([decode_digest(b) for b in encoded_digests]), traced=traced,
                    min_cpu_s=MIN_FLOOR_CPU_S)
    floors["digests"] = Floor("digests", "decode_digest of every time-window digest", win_records, fu)

    def detect_all() -> list:
        histories: dict = {}
        verdicts = []
        for d in sorted(digests, key=lambda d: (d.job, d.start_ns)):
            v, histories[d.job] = detect_step(d, metas.get(d.job), histories.get(d.job))
            verdicts += v
        for job, h in sorted(histories.items()):
            v, histories[job] = flush_job(metas.get(job), h)
            verdicts += v
        return verdicts

    verdicts, u = measure(detect_all, traced=traced, min_cpu_s=MIN_FLOOR_CPU_S)
    add("detector", win_records, u, "digests", digests=len(digests),
        digest_bytes=sum(len(b) for b in encoded_digests), verdicts=len(verdicts))

    # -- sink -----------------------------------------------------------------------------
    summary_msgs = []
    for d in digests:
        rows = window_summaries(d) if len(d.ranks) else []
        for lo in range(0, len(rows), 2000):
            summary_msgs.append(msgspec.msgpack.encode(rows[lo:lo + 2000]))
    verdict_msgs = [msgspec.json.encode(v) for v in verdicts]
    digests = []  # free it: later stages do not read it

    def sink_floor() -> int:
        n = 0
        for m in summary_msgs:
            n += len(msgspec.msgpack.decode(m))
        for m in verdict_msgs:
            msgspec.json.decode(m)
            n += 1
        return n

    n, fu = measure(sink_floor, traced=traced, min_cpu_s=MIN_FLOOR_CPU_S)
    floors["sink"] = Floor("sink", "msgspec decoding of the sink's messages (summary lists, verdicts)", n, fu)
    targets: list[tuple[str, str, Any]] = []
    if cfg.chdb:
        targets.append(("sink chdb", f"chdb://{work / 'chdb'}", None))
    else:
        skipped["sink chdb"] = "--no-chdb"
    server = None
    want_server = cfg.server
    if want_server is None or want_server:
        from eroica.stack.clickhouse_server import ClickHouseServer, find_server_binary
        if find_server_binary() is None:
            if want_server:
                raise RuntimeError("--server: clickhouse-server binary not found (.ci/install-clickhouse.sh)")
            skipped["sink server"] = "clickhouse-server binary not found"
        else:
            server = ClickHouseServer(work / "clickhouse-server", log_level="warning").start()
            targets.append(("sink server", server.url, server))
    try:
        for stage, url, srv in targets:
            rows_in, u, counted = _sink_stage(url, summary_msgs, verdict_msgs, traced, children=srv is not None)
            add(stage, rows_in, u, "sink", summary_rows=counted[0], verdict_rows=counted[1],
                messages=len(summary_msgs) + len(verdict_msgs))
    finally:
        if server is not None:
            server.stop()

    # -- broker ---------------------------------------------------------------------------
    if cfg.broker != "none":
        n, u, detail = _broker_stage(cfg.broker, framed, work, traced)
        add(f"broker {cfg.broker}", n, u, "frames", **detail)
    else:
        skipped["broker"] = "--broker none"

    return {
        "config": {"ranks": cfg.ranks, "steps": cfg.steps, "nodes": sim.nodes, "gpus": sim.gpus,
                   "window_s": cfg.window_s, "seed": cfg.seed, "faults": [str(f) for f in sim.faults],
                   "broker": cfg.broker, "frame_records": FRAME_RECORDS},
        "input": {"records": lines, "bytes": size, "simulate_s": round(inp.simulate_s, 3), "frames": len(frames),
                  "frame_bytes": frame_bytes},
        "machine": {"cpus": os.cpu_count(), "load1": os.getloadavg()[0]},
        "startup": {"kernels": _wl, "cpu_s": startup.cpu_s},
        "floors": {k: {"what": f.what, "records": f.records, "cpu_s": f.usage.cpu_s, "records_per_cpu_s": f.rate,
                       "repeats": f.usage.repeats, "peak_mb": f.usage.peak_mb}
                   for k, f in floors.items()},
        "stages": [asdict(s) for s in stages],
        "skipped": skipped,
        "furthest_from_floor": max(stages, key=lambda s: s.ratio_to_floor).stage if stages else None,
    }


def _sink_stage(url: str, summary_msgs: list[bytes], verdict_msgs: list[bytes], traced: bool,
                children: bool) -> tuple[int, Usage, tuple[int, int]]:
    from eroica.sinks.clickhouse import ClickHouseConfig, VerdictSink
    from eroica.sinks.clickhouse.messages import decode_summaries, decode_verdicts
    from eroica.sinks.clickhouse.schema import SUMMARY_NAMES, VERDICT_NAMES
    from eroica.sinks.clickhouse.shaping import batched

    database = f"bench_{uuid.uuid4().hex[:10]}"
    sink = VerdictSink(ClickHouseConfig.from_url(url, database=database))
    try:
        sink.ensure_schema()
        cfg = sink.config

        def insert() -> int:
            now = time.time_ns()
            srows = [r for m in summary_msgs for r in decode_summaries(m, now)]
            vrows = [row for m in verdict_msgs for _v, row in decode_verdicts(m)]
            for batch in batched(srows, cfg.batch_size):
                sink.client.insert(cfg.summaries, SUMMARY_NAMES, batch)
            for batch in batched(vrows, cfg.batch_size):
                sink.client.insert(cfg.verdicts, VERDICT_NAMES, batch)
            return len(srows) + len(vrows)

        n, u = measure(insert, children=children, traced=traced)
        counted = tuple(int(sink.client.query(f"SELECT count() FROM {t}").rows[0][0])
                        for t in (cfg.summaries, cfg.verdicts))
        return n, u, counted  # type: ignore[return-value]
    finally:
        sink.close()


def _broker_stage(kind: str, framed: list[tuple[str, int, bytes]], work: Path,
                  traced: bool) -> tuple[int, Usage, dict[str, Any]]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from eroica.kafka.config import KafkaConfig
    from eroica.kafka.publisher import FramePublisher
    from eroica.kafka.admin import create_topics

    if kind == "tansu":
        from eroica.stack.tansu import TansuBroker
        broker: Any = TansuBroker(data_dir=work / "tansu").start()
    elif kind == "kafka":
        from eroica.stack.apache_kafka import KafkaCluster, kafka_available
        reason = kafka_available()
        if reason:
            raise RuntimeError(f"--broker kafka: {reason}")
        broker = KafkaCluster(1, data_dir=work / "kafka").start()
    else:
        raise ValueError(f"unknown broker {kind!r}")
    try:
        config = KafkaConfig(bootstrap=broker.bootstrap).with_topic_prefix(f"bench{uuid.uuid4().hex[:8]}")
        topic = config.raw_topic
        create_topics(broker.bootstrap, {topic: config.partitions})
        # which frame each (key, index) is: a key's frames stay in order on its partition
        sizes: dict[str, list[int]] = {}
        for key, n, _v in framed:
            sizes.setdefault(key, []).append(n)
        expected = len(framed)

        def publish_consume() -> tuple[int, int, int]:
            pub = FramePublisher.for_replay(config)
            for key, _n, value in framed:
                pub.publish(topic, value, key=key)
            left = pub.flush(60.0)
            stats = pub.close(timeout_s=5.0)
            if left or stats.failed:
                raise RuntimeError(f"broker {kind}: {left} frames undelivered, {stats.failed} failed")
            consumer = Consumer({"bootstrap.servers": config.bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                                 "enable.auto.commit": False, "fetch.wait.max.ms": 100})
            seen: dict[str, int] = {}
            got = records = nbytes = 0
            try:
                consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(config.partitions)])
                deadline = time.monotonic() + 120.0
                while got < expected and time.monotonic() < deadline:
                    for msg in consumer.consume(1000, 0.2):
                        if msg.error() is not None:
                            continue
                        key = msg.key().decode()
                        i = seen.get(key, 0)
                        seen[key] = i + 1
                        records += sizes[key][i]
                        nbytes += len(msg.value())
                        got += 1
            finally:
                consumer.close()
            return got, records, nbytes

        (got, records, nbytes), u = measure(publish_consume, children=True, traced=traced)
        if got != expected:
            raise RuntimeError(f"broker {kind}: consumed {got} of {expected} frames")
        return records, u, {"frames": got, "bytes": nbytes, "partitions": config.partitions}
    finally:
        broker.stop()


# -- passes ---------------------------------------------------------------------------------------

def combine_passes(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from several passes over the same input: each stage's row is its median pass's.

    Why: on a shared or throttled machine the CPU time of a fixed piece of work
    moves by tens of percent from one minute to the next (on this project's
    2-core VM the same ``digest_window`` calls took 0.31 and 0.54 CPU-s two
    minutes apart), so one pass's ratio can be the machine's mood. Within a
    pass a stage and its floor are measured seconds apart, so their ratio
    cancels much of the drift; over passes, the median pass by that ratio (the
    lower middle one for an even count) gives the row, so all of a row's
    figures come from one pass and agree with each other, and ``ratio_range``
    and ``rate_range`` give the spread. Each pass's own stages and floors stay
    in ``pass_results``.
    """
    if len(results) == 1:
        return {**results[0], "passes": 1}
    by_stage: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        for st in r["stages"]:
            by_stage.setdefault(st["stage"], []).append(st)
    stages = []
    for rows in by_stage.values():
        ordered = sorted(rows, key=lambda st: st["ratio_to_floor"])
        rates = [st["records_per_cpu_s"] for st in rows]
        stages.append({**ordered[(len(ordered) - 1) // 2], "passes": len(rows),
                       "ratio_range": [ordered[0]["ratio_to_floor"], ordered[-1]["ratio_to_floor"]],
                       "rate_range": [min(rates), max(rates)]})
    floors = {}
    for name in results[0]["floors"]:
        runs = sorted((r["floors"][name] for r in results if name in r["floors"]),
                      key=lambda f: f["records_per_cpu_s"])
        floors[name] = {**runs[(len(runs) - 1) // 2], "passes": len(runs),
                        "rate_range": [runs[0]["records_per_cpu_s"], runs[-1]["records_per_cpu_s"]]}
    return {**results[0], "passes": len(results), "stages": stages, "floors": floors,
            "furthest_from_floor": max(stages, key=lambda st: st["ratio_to_floor"])["stage"] if stages else None,
            "pass_results": [{k: r[k] for k in ("machine", "floors", "stages")} for r in results]}


# -- output ---------------------------------------------------------------------------------------

COLUMNS = ("stage", "records", "CPU s", "records/CPU-s", "floor rec/CPU-s", "x floor", "peak MB")


def _si(x: float) -> str:
    if x == float("inf"):
        return "inf"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def _ratio_cell(s: dict[str, Any]) -> str:
    """The stage's ratio to its floor; over several passes the median pass's, with the range beside it."""
    if "ratio_range" not in s:
        return f"{s['ratio_to_floor']:.1f}"
    lo, hi = s["ratio_range"]
    return f"{s['ratio_to_floor']:.1f} ({lo:.1f}-{hi:.1f})"


def table_rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    return [(s["stage"], f"{s['records']:,}", f"{s['cpu_s']:.3f}", _si(s["records_per_cpu_s"]),
             f"{_si(s['floor_records_per_cpu_s'])} ({s['floor']})", _ratio_cell(s),
             f"{s['peak_mb']:.1f}") for s in result["stages"]]


def format_table(result: dict[str, Any]) -> str:
    rows = [COLUMNS, *table_rows(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = []
    for k, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  ".join(cells))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    c, i = result["config"], result["input"]
    head = (f"eroica bench throughput: {c['ranks']} ranks ({c['nodes']} nodes x {c['gpus']} GPUs), "
            f"{c['steps']} steps, window {c['window_s']:g} s: {i['records']:,} records, "
            f"{i['bytes'] / 2**20:.1f} MiB JSON, {i['frames']:,} frames ({i['frame_bytes'] / 2**20:.1f} MiB)")
    if result.get("passes", 1) > 1:
        head += (f"\n{result['passes']} passes: each row is its median pass by ratio to floor, "
                 "with the range of that ratio over passes")
    foot = ["floors: " + "; ".join(f"{k} = {f['what']}" for k, f in result["floors"].items())]
    st = result.get("startup")
    if st:
        loaded = ", ".join(st["kernels"]) or "none (numba not installed)"
        foot.append(f"once per process, not in any stage: compiled kernels loaded ({loaded}) in {st['cpu_s']:.3f} CPU s")
    for k, why in result["skipped"].items():
        foot.append(f"skipped {k}: {why}")
    if result["furthest_from_floor"]:
        foot.append(f"furthest from its floor: {result['furthest_from_floor']}")
    return "\n".join([head, *lines, *foot])


def to_json(result: dict[str, Any]) -> bytes:
    def default(o: Any) -> Any:
        if isinstance(o, Path):
            return str(o)
        raise TypeError
    return msgspec.json.format(msgspec.json.encode(result, enc_hook=default), indent=1) + b"\n"
