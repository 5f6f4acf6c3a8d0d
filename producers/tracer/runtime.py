"""The tracer inside one training process: span timing, step counter, bounded queue, writer thread.

Hot path (the training loop's own thread, autograd threads, collective
callbacks): :meth:`Tracer.begin` / :meth:`Tracer.end` take two clock reads, a
dict insert and pop, and one append to a ``deque``; nothing blocks and
nothing is encoded. When the queue holds ``capacity`` records the new one is
dropped and counted (``Tracer.dropped``), never waited for.

A daemon thread wakes every ``flush_s``: it turns the queued tuples into
contract ``fn`` records with the rank's identity (resolved once
torch.distributed is up, so records queued before ``init_process_group``
still get the right rank), orders them by start time and hands them to the
sink (a per-process JSON Lines file, or Kafka frames). The same thread dumps
``in_flight`` records of spans open longer than ``hang_s`` (a hang), resolves
CUDA event timings, and a process-wide SIGTERM or exit writes every
still-open span as ``in_flight`` before the final flush.

Importing this module imports neither torch nor numpy: ``sitecustomize``
loads it into every Python process of a traced job.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import itertools
import json
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from eroica.models.records import UNTRACED_FN

time_ns = time.time_ns

DEFAULT_CAPACITY = 100_000      # queued records (a few hundred bytes each) before new ones are dropped
DEFAULT_FLUSH_S = 0.5
WATERMARK_HORIZON_NS = 30 * 10**9  # open spans older than this do not hold the declared watermark
DEFAULT_HANG_S = 60.0           # a span open this long is dumped as in_flight (hang evidence)
# Time no traced call covers (no span open on any thread): the training loop's own Python between
# the calls the tracer sees (a per-step metric, logging, a sleep). Recorded as a ``python`` record
# named UNTRACED_FN (models.records), one per gap, so the detector compares it across ranks like
# any function.
# Shorter gaps are the hook-to-hook bookkeeping between back-to-back calls: dropping them loses at
# most this much per gap and keeps the records per step few.
MIN_GAP_NS = 10_000
WRITE_BATCH = 20_000
MAX_STR = 256

ENV_DIR = "EROICA_TRACE_DIR"
ENV_KAFKA = "EROICA_TRACE_KAFKA"
ENV_JOB = "EROICA_JOB"
ENV_CAPACITY = "EROICA_TRACE_QUEUE"
ENV_FLUSH = "EROICA_TRACE_FLUSH_S"
ENV_HANG = "EROICA_TRACE_HANG_S"
# Digest mode (``eroica trace --edge-digests``): "module:function" of a factory ``(job, node, rank) ->
# digester`` (``eroica.streams.edge.EdgeDigester``). Producers do not import the streams layer; the
# command that starts the job (the cli layer, which joins both) names the factory here, across the
# process boundary, as ``eroica agent --edge-digests`` hands its digester in within one process.
ENV_DIGESTER = "EROICA_TRACE_DIGESTER"
DEFAULT_DIR = "eroica-trace"

# extra = (bytes, op, group, stack, stream); None when a span has none of them
Extra = tuple


@dataclass
class Identity:
    """Who this process is in the job; ``final`` once torch.distributed said so."""

    job: str
    node: str
    rank: int
    world_size: int
    local_rank: int
    pid: int
    final: bool = False


def _env_int(env: dict, name: str) -> int | None:
    v = env.get(name, "")
    return int(v) if v.strip().lstrip("-").isdigit() else None


def job_id(env: dict | None = None) -> str:
    """``EROICA_JOB``, else torchrun's run id, else one derived from the rendezvous (same on every rank)."""
    env = os.environ if env is None else env
    for name in (ENV_JOB, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        v = env.get(name, "")
        if v and v.lower() != "none":
            return v[:MAX_STR]
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if addr and port:
        return "job-" + hashlib.sha1(f"{addr}:{port}".encode()).hexdigest()[:10]
    return f"job-{socket.gethostname()}-{os.getpid()}"[:MAX_STR]


def env_identity(env: dict | None = None) -> Identity:
    env = os.environ if env is None else env
    from eroica.producers.outputs import hostname

    rank = _env_int(env, "RANK")
    world = _env_int(env, "WORLD_SIZE")
    local = _env_int(env, "LOCAL_RANK")
    return Identity(job=job_id(env), node=hostname(), rank=max(rank or 0, 0), world_size=max(world or 1, 1),
                    local_rank=max(local if local is not None else (rank or 0), 0), pid=os.getpid())


def _dist_identity(base: Identity) -> Identity | None:
    """The identity from torch.distributed once it is initialised (mp.spawn jobs set no RANK)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        return Identity(job=base.job, node=base.node, rank=int(dist.get_rank()), world_size=int(dist.get_world_size()),
                        local_rank=base.local_rank, pid=base.pid, final=True)
    except Exception:
        return None


def _in_dataloader_worker() -> bool:
    worker = sys.modules.get("torch.utils.data._utils.worker")
    return worker is not None and getattr(worker, "_worker_info", None) is not None


def _truncate_stack(stack: str) -> str:
    """Keep the innermost frames of a stack longer than the contract's 256 characters."""
    if len(stack) <= MAX_STR:
        return stack
    tail = stack[-MAX_STR:]
    cut = tail.find(";")
    return tail[cut + 1:] if 0 <= cut < len(tail) - 1 else tail


class Tracer:
    """Per-process recorder of contract ``fn`` records (see the module doc)."""

    def __init__(self, *, out_dir: str | Path | None = None, kafka: str | None = None,
                 capacity: int | None = None, flush_s: float | None = None, hang_s: float | None = None,
                 sink_factory: Callable[[Identity], Any] | None = None, identity: Identity | None = None) -> None:
        env = os.environ
        self.out_dir = Path(out_dir or env.get(ENV_DIR) or DEFAULT_DIR)
        self.kafka = kafka if kafka is not None else (env.get(ENV_KAFKA) or None)
        self.capacity = int(capacity or _env_int(env, ENV_CAPACITY) or DEFAULT_CAPACITY)
        self.flush_s = float(flush_s or float(env.get(ENV_FLUSH) or DEFAULT_FLUSH_S))
        self.hang_s = float(hang_s or float(env.get(ENV_HANG) or DEFAULT_HANG_S))
        self._sink_factory = sink_factory
        self._fixed_identity = identity
        # SIGTERM dump: installed by the first record on the main thread of a process that records
        self.sigterm_dump = env.get("EROICA_TRACE_SIGTERM", "1") != "0"
        self._reset()
        atexit.register(self._atexit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork_child)

    def _reset(self) -> None:
        """Fresh state (also in a forked child: its parent's queue, spans and thread are not its own)."""
        self.step = 0
        self._advance = False
        self._q: deque = deque()
        self._open: dict[int, tuple] = {}
        self._idle_since: int | None = None  # when the last open span closed (None: a span is open, or none yet)
        self._gap_before: dict[int, int] = {}  # token -> start of the gap its span ended (UNTRACED_FN)
        self._ids = itertools.count(1)
        self._dumped: set[int] = set()
        self.dropped = 0
        self.written = 0
        self.enabled = True
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._sink = None
        self._identity: Identity | None = self._fixed_identity
        self._meta_written: Identity | None = None
        self._closed = False
        self._pid = os.getpid()
        self._tls = threading.local()
        self.gpu_timer = None  # set by torch_hooks when CUDA is in use
        self._step_ends: deque = deque(maxlen=64)
        self._wake: tuple | None = None
        self._sigterm_installed = False

    def _after_fork_child(self) -> None:
        """A forked child (a DataLoader worker...) starts clean and must not signal its parent."""
        if self._wake is not None:
            try:
                signal.set_wakeup_fd(-1)
            except (ValueError, OSError):
                pass
            for sock in self._wake:
                sock.close()
        try:
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except (ValueError, OSError):
            pass
        self._reset()

    # -- hot path -------------------------------------------------------------

    def begin(self, fn: str, kind: str, extra: Extra | None = None, step: int | None = None) -> int:
        """Open a span; returns its token for :meth:`end`."""
        tok = next(self._ids)
        now = time_ns()
        at = self.step if step is None else step
        idle = self._idle_since
        if idle is not None and not self._open:
            self._idle_since = None
            # the gap belongs to the step of the call that ends it, and is recorded with that call
            # (a call that is discarded, such as the fetch that ends an epoch, leaves it open)
            self._gap_before[tok] = idle
        self._open[tok] = (fn, kind, now, at, extra)
        return tok

    def end(self, tok: int | None, extra: Extra | None = None, start_ns: int | None = None,
            end_ns: int | None = None) -> None:
        """Close a span and queue its record (a token already closed is ignored).

        ``extra`` replaces the span's own when what it carries is only known at
        the end (the sender of a receive from any source); ``start_ns``, when
        later than the span's start, moves it (only the exposed part of an
        overlapped all-reduce is kept). ``end_ns`` is the end the caller read
        with its ``start_ns``: read again here, a thread that lost the GIL
        between the two reads (up to the 5 ms switch interval under load)
        would give an empty span that much spurious length.
        """
        s = self._open.pop(tok, None)
        if s is None:
            return
        idle = self._gap_before.pop(tok, None)
        if idle is not None and s[2] - idle >= MIN_GAP_NS:
            self.emit(UNTRACED_FN, "python", idle, s[2] - idle, s[3])
        now = time_ns() if end_ns is None else end_ns
        ts = s[2] if start_ns is None else min(max(s[2], start_ns), now)
        self.emit(s[0], s[1], ts, max(0, now - ts), s[3], s[4] if extra is None else extra)
        if not self._open:
            self._idle_since = now

    def discard(self, tok: int | None) -> None:
        """Forget a span (no record); a gap it ended stays open until the next call's."""
        idle = self._gap_before.pop(tok, None)
        if self._open.pop(tok, None) is not None and not self._open:
            self._idle_since = idle if idle is not None else time_ns()

    def emit(self, fn: str, kind: str, ts_ns: int, dur_ns: int, step: int, extra: Extra | None = None,
             in_flight: bool = False) -> None:
        """Queue one finished record; drop (and count) when the queue is full."""
        if not self.enabled:
            return
        if len(self._q) >= self.capacity:
            self.dropped += 1
            return
        self._q.append((fn, kind, ts_ns, dur_ns, step, extra, in_flight))
        if self._thread is None:
            self._start()

    def step_done(self) -> None:
        """An optimizer step finished: the next loader / forward call opens a new step."""
        self._advance = True
        self._step_ends.append(time_ns())
        if not self._sigterm_installed:
            self._try_sigterm()

    def maybe_advance(self) -> None:
        if self._advance:
            self._advance = False
            self.step += 1

    def next_step(self) -> int:
        """Start a new step now (for loops without an optimizer); returns its index."""
        self._advance = False
        self.step += 1
        return self.step

    # name stack of nested host spans on this thread (forward, custom spans)
    def names(self) -> list:
        names = getattr(self._tls, "names", None)
        if names is None:
            names = self._tls.names = []
        return names

    def stack_of(self, name: str) -> str | None:
        names = self.names()
        if not names:
            return None
        return _truncate_stack(";".join(names) + ";" + name)

    # -- writer thread --------------------------------------------------------

    def _start(self) -> None:
        if _in_dataloader_worker():  # a model run inside a data-loader worker is not the rank's training
            self.enabled = False
            self._q.clear()
            return
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="eroica-tracer", daemon=True)
            self._thread.start()
        self._try_sigterm()

    def _try_sigterm(self) -> None:
        if self.sigterm_dump and not self._sigterm_installed and \
                threading.current_thread() is threading.main_thread():
            self._sigterm_installed = True
            self.install_sigterm()

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            try:
                self.flush()
                self._watch_hangs()
            except Exception as exc:  # never let telemetry take the job down; say it once
                self._warn_once(f"tracer writer failed: {type(exc).__name__}: {exc}")

    def identity(self) -> Identity:
        ident = self._identity
        if ident is not None and ident.final:
            return ident
        if ident is None:
            ident = self._identity = env_identity()
        resolved = _dist_identity(ident)
        if resolved is not None:
            self._identity = ident = resolved
        return ident

    def _sink_for(self, ident: Identity):
        if self._sink is None:
            if self._sink_factory is not None:
                self._sink = self._sink_factory(ident)
            else:
                from eroica.producers.outputs import make_sink

                digester = self._digester(ident) if self.kafka else None
                self._sink = make_sink(kafka=self.kafka, digester=digester,
                                       path=None if self.kafka else self.path_for(ident))
        return self._sink

    def _digester(self, ident: Identity):
        """This rank's edge digester when ``ENV_DIGESTER`` names a factory, else None (raw frames).

        The digester's one key is the rank's (``job/rank``), fixed when the
        sink is made, at the first flush: torchrun's ``RANK`` is known by then.
        A factory that cannot be loaded falls back to raw frames, said once:
        telemetry never takes the job down.
        """
        spec = os.environ.get(ENV_DIGESTER, "")
        if not spec:
            return None
        try:
            module, _, name = spec.partition(":")
            return getattr(importlib.import_module(module), name)(ident.job, ident.node, ident.rank)
        except Exception as exc:
            self._warn_once(f"digest mode off ({spec}: {type(exc).__name__}: {exc}); sending raw records")
            return None

    def path_for(self, ident: Identity) -> Path:
        return self.out_dir / f"fn-{ident.node}-{ident.pid}.jsonl"

    def _write_meta(self, ident: Identity) -> None:
        """``fn-<node>-<pid>.meta.json`` beside the records: who wrote them (for the job record)."""
        if self._meta_written == ident or self.kafka or self._sink_factory is not None:
            return
        path = self.out_dir / f"fn-{ident.node}-{ident.pid}.meta.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({**asdict(ident), "dropped": self.dropped, "written": self.written}))
            os.replace(tmp, path)
            self._meta_written = ident
        except OSError:
            pass

    def flush(self, *, final: bool = False) -> int:
        """Write what is queued (and resolved GPU timings); returns how many records."""
        with self._lock:
            if os.getpid() != self._pid:
                return 0
            if self.gpu_timer is not None:
                try:
                    self.gpu_timer.resolve(self, final=final)
                except Exception as exc:
                    self._warn_once(f"GPU timing off: {type(exc).__name__}: {exc}")
                    self.gpu_timer = None
            wm = self.watermark_ns()
            q = self._q
            if not q:
                if final and self._sink is not None:
                    self._write_meta(self.identity())
                return 0
            from eroica.models.records import FnRecord

            ident = self.identity()
            sink = self._sink_for(ident)
            declare = getattr(sink, "declares_watermarks", False) and not final
            n = 0
            while q:
                batch = []
                while q and len(batch) < WRITE_BATCH:
                    batch.append(q.popleft())
                recs = [self._record(FnRecord, ident, item) for item in batch]
                recs.sort(key=lambda r: r.ts_ns)
                if declare and not q:
                    sink.write(recs, watermark_ns=wm)
                else:
                    sink.write(recs)
                n += len(recs)
            self.written += n
            if final or self._meta_written != ident:
                self._write_meta(ident)
            return n

    def watermark_ns(self) -> int:
        """The time before which this rank has nothing left to emit, read before the queue is drained.

        Every record still to come is a span open now (it starts no earlier
        than its start), a GPU region not resolved yet (it runs no earlier than
        its host-side start), or begins later. Spans whose start was read just
        before this snapshot but entered after it (a preempted thread) are the
        summariser's few seconds of allowance (``DECLARED_LATENESS_NS``).
        """
        now = time_ns()
        starts = [s[2] for s in self._open.copy().values()]
        if self.gpu_timer is not None:
            oldest = self.gpu_timer.oldest_open_ns()
            if oldest is not None:
                starts.append(oldest)
        # A span open longer than a default window's lateness (a user's span around the whole
        # loop) would pin the mark and hold every window; its record would be late under guessed
        # marks too, and a hang is dumped as in_flight at hang_s.
        return max(min([now, *starts]), now - WATERMARK_HORIZON_NS)

    @staticmethod
    def _record(cls, ident: Identity, item: tuple):
        fn, kind, ts, dur, step, extra, in_flight = item
        kw: dict[str, Any] = {}
        if extra is not None:
            nbytes, op, group, stack, stream = extra
            if nbytes is not None:
                kw["bytes"] = int(nbytes)
            if op is not None:
                kw["op"] = op
            if group is not None:
                kw["group"] = group[:MAX_STR]
            if stack:
                kw["stack"] = stack
            if stream is not None:
                kw["stream"] = stream
        if in_flight:
            kw["in_flight"] = True
        return cls(job=ident.job, node=ident.node, rank=ident.rank, step=max(0, step), fn=fn[:MAX_STR], kind=kind,
                   ts_ns=ts, dur_ns=max(0, dur), **kw)

    def _watch_hangs(self) -> None:
        """Dump spans open longer than the hang limit as in_flight, once each."""
        if not self._open:
            return
        now = time_ns()
        limit = int(self.hang_s * 1e9)
        spans = self._open.copy()
        for tok, s in spans.items():
            if tok not in self._dumped and now - s[2] >= limit:
                self._dumped.add(tok)
                self.emit(s[0], s[1], s[2], now - s[2], s[3], s[4], in_flight=True)
        self._dumped &= spans.keys()

    def dump_in_flight(self) -> int:
        """Queue an in_flight record for every span still open; returns how many."""
        now = time_ns()
        spans = list(self._open.copy().values())
        for s in spans:
            self.emit(s[0], s[1], s[2], max(0, now - s[2]), s[3], s[4], in_flight=True)
        return len(spans)

    def close(self, *, in_flight: bool = True) -> None:
        """Stop the writer, dump open spans (``in_flight``), flush and close the sink. Idempotent."""
        if self._closed or os.getpid() != self._pid:
            return
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5.0)
        if in_flight:
            self.dump_in_flight()
        try:
            self.flush(final=True)
        except Exception as exc:
            self._warn_once(f"tracer final flush failed: {type(exc).__name__}: {exc}")
        self._closed = True
        self.enabled = False
        if self.dropped:
            print(f"eroica: tracer dropped {self.dropped} records (queue full)", file=sys.stderr, flush=True)
        if self._sink is not None:
            try:
                self._sink.close()
            except Exception:
                pass

    def _atexit(self) -> None:
        self.close(in_flight=True)

    _warned: set = set()

    def _warn_once(self, msg: str) -> None:
        if msg not in self._warned:
            self._warned.add(msg)
            print(f"eroica: {msg}", file=sys.stderr, flush=True)

    # -- SIGTERM --------------------------------------------------------------

    def install_sigterm(self) -> bool:
        """On SIGTERM, dump open spans as in_flight and flush, then die of SIGTERM as before.

        Only where SIGTERM still has its default action and we are on the main
        thread (a handler the program installs itself replaces ours). A rank
        blocked in C++ (a hung collective) runs Python handlers late, so the
        writer thread also watches the signal wake-up fd and does the dump
        itself; whichever comes first ends the process.
        """
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return False
            signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError):
            return False
        self._install_wakeup()
        return True

    def _install_wakeup(self) -> None:
        try:
            r, w = socket.socketpair()
            r.setblocking(False)
            w.setblocking(False)
            old = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):
            return
        if old != -1:  # someone (asyncio...) owns it: leave theirs, rely on the Python handler
            signal.set_wakeup_fd(old)
            r.close()
            w.close()
            return
        self._wake = (r, w)
        threading.Thread(target=self._watch_wakeup, args=(r,), name="eroica-sigterm", daemon=True).start()

    def _watch_wakeup(self, r: socket.socket) -> None:
        import select

        while not self._closed:
            try:
                ready, _, _ = select.select([r], [], [], 1.0)
                if not ready:
                    continue
                data = r.recv(64)
            except (OSError, ValueError):
                return
            if signal.SIGTERM in data:
                if signal.getsignal(signal.SIGTERM) != self._on_sigterm:
                    return  # the program installed its own handler: SIGTERM is its business now
                self._terminate(from_main=False)
                return

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._terminate(from_main=True)

    _term_lock = threading.Lock()

    def _terminate(self, *, from_main: bool) -> None:
        with self._term_lock:
            self.close(in_flight=True)
            if from_main:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            else:
                import ctypes

                ctypes.CDLL(None).signal(int(signal.SIGTERM), 0)  # SIG_DFL, from any thread
            os.kill(os.getpid(), signal.SIGTERM)


_tracer: Tracer | None = None
_tracer_lock = threading.Lock()


def get_tracer(**kwargs: Any) -> Tracer:
    """The process's tracer (created on first use; ``kwargs`` only count then)."""
    global _tracer
    if _tracer is None:
        with _tracer_lock:
            if _tracer is None:
                _tracer = Tracer(**kwargs)
    return _tracer


def current_tracer() -> Tracer | None:
    return _tracer
