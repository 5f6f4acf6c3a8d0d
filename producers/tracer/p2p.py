"""Point-to-point transfers (pipeline parallelism) timed to completion, with peer and bytes.

A pipeline stage's send or receive is where one stage waits for another, so
the detector (and ``eroica whatif``, which pairs each receive with the send
of the same channel and step) needs it timed until the data has moved, not
until the call returned: ``isend`` / ``irecv`` return at once and the rank
blocks later, in ``Work.wait()``.

* ``send`` / ``recv`` (blocking): timed around the call (they wait inside).
* ``isend`` / ``irecv``: timed from the call that blocks on the returned
  ``Work`` (``wait()``, or the first ``is_completed()`` poll) until it is
  seen complete. Not from the launch: a pipeline schedule launches a
  transfer and computes while it runs, and a span over that compute would
  count it as waiting (the detector reads a collective's time beyond its
  fastest member as waiting, and the straggler is the rank that waits
  least). A rank that never blocks on a transfer records a short span;
  one that blocks for ever leaves an open span, dumped as ``in_flight``.
  ``Work.wait`` / ``Work.is_completed`` are patched on the class (the caller
  keeps torch's own ``Work``; a dict lookup per call finds the few that are
  timed). A ``Work`` dropped without being waited for records nothing.
* ``batch_isend_irecv``: each op is timed as its ``isend`` / ``irecv``; a
  backend that coalesces the batch into fewer ``Work`` objects (NCCL) closes
  every op of the batch when one of them completes.

Records: ``torch.distributed.<fn>``, kind ``collective``, op ``send`` /
``recv``, ``bytes`` of the tensor, ``group`` = ``p2p:<a>,<b>`` of the two
global ranks (see :mod:`.groups`): the peer is the other rank of the pair, and
both ends name the channel alike. A receive from any source learns its peer
at completion. On CUDA tensors the transfer is timed with CUDA events on the
current stream (``wait()`` makes that stream wait for the transfer, so an
event recorded after it marks the end), the host span is dropped, as for
other collectives.
Nothing here calls torch.distributed itself beyond local look-ups (own rank,
group ranks): the tracer never issues a collective or a transfer.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from . import groups
from .runtime import Tracer

P2P_FUNCS = {"send": "send", "recv": "recv", "isend": "send", "irecv": "recv"}

# id(work) -> (weakref to the work, [_Entry]): launched transfers not yet seen complete
_pending: dict[int, tuple[Any, list]] = {}
_me: list[int] = []


def my_rank() -> int | None:
    """This process's global rank (a local look-up, cached once the default group exists)."""
    if _me:
        return _me[0]
    try:
        from torch.distributed import distributed_c10d as c10d

        if not c10d.is_initialized():
            return None
        _me.append(int(c10d.get_rank()))
        return _me[0]
    except Exception:
        return None


def _channel(peer: int | None) -> str | None:
    me = my_rank()
    if peer is None or me is None or peer < 0:
        return None
    return groups.pair_id(me, peer)


def _source_global(work: Any, group: Any) -> int | None:
    """The global rank a receive from any source got its data from."""
    try:
        src = work._source_rank() if hasattr(work, "_source_rank") else work.source_rank()
        return groups.global_peer(group, None, int(src))
    except Exception:
        return None


class _Entry:
    """One launched ``isend`` / ``irecv`` waiting to be seen complete."""

    __slots__ = ("fn", "extra", "step", "ev", "group", "tok", "done")

    def __init__(self, fn: str, extra: tuple, step: int, ev: Any, group: Any) -> None:
        self.fn, self.extra, self.step, self.ev, self.group = fn, extra, step, ev, group
        self.tok: int | None = None    # the host span, open while the rank blocks on it
        self.done = False


def _open(tracer: Tracer, entries: list) -> None:
    for e in entries:
        if not e.done and e.tok is None:
            e.tok = tracer.begin(e.fn, "collective", e.extra, e.step)


def _finish(tracer: Tracer, work: Any, entries: list) -> None:
    for e in entries:
        if e.done:
            continue
        e.done = True
        extra = e.extra
        if extra[2] is None:  # a receive from any source: the sender is known now
            extra = (extra[0], extra[1], _channel(_source_global(work, e.group)), None, None)
        if e.ev is not None and tracer.gpu_timer is not None:
            tracer.discard(e.tok)
            tracer.gpu_timer.stop(e.ev, e.fn, "collective", e.step, extra, suffix=False)
        else:
            tracer.end(e.tok, extra)


def _watch(tracer: Tracer, work: Any, entries: list) -> None:
    key = id(work)

    def forget(ref: Any, key: int = key) -> None:
        held = _pending.get(key)
        if held is not None and held[0] is ref:
            del _pending[key]
            for e in held[1]:
                if not e.done:
                    e.done = True
                    tracer.discard(e.tok)

    try:
        ref = weakref.ref(work, forget)
    except TypeError:  # not weak-referenceable: we could not tell when it is dropped; time nothing
        return
    _pending[key] = (ref, entries)


def _held(work: Any) -> list | None:
    held = _pending.get(id(work))
    if held is None or held[0]() is not work:
        return None
    return held[1]


def _take(work: Any) -> list | None:
    entries = _held(work)
    if entries is not None:
        del _pending[id(work)]
    return entries


def watch_work(tracer: Tracer, work: Any, fn: str, extra: tuple, step: int) -> None:
    """Time an async collective on host tensors as a transfer: from the wait on its ``Work``."""
    _watch(tracer, work, [_Entry(fn, extra, step, None, None)])


def patch_work(tracer: Tracer, Work: type) -> None:
    """Time the blocking part of timed transfers: ``Work.wait()`` (or polling ``is_completed()``)."""
    if getattr(Work.wait, "_eroica", False):
        return
    orig_wait, orig_done = Work.wait, Work.is_completed

    @functools.wraps(orig_wait)
    def wait(self, *args, **kwargs):
        entries = _held(self) if _pending else None
        if entries is None:
            return orig_wait(self, *args, **kwargs)
        _open(tracer, entries)
        out = orig_wait(self, *args, **kwargs)   # raises on timeout / abort: the span stays open (a hang)
        _take(self)
        _finish(tracer, self, entries)
        return out

    @functools.wraps(orig_done)
    def is_completed(self, *args, **kwargs):
        entries = _held(self) if _pending else None
        if entries is None:
            return orig_done(self, *args, **kwargs)
        _open(tracer, entries)  # a rank polling for completion blocks from its first poll on
        out = orig_done(self, *args, **kwargs)
        if out:
            _take(self)
            _finish(tracer, self, entries)
        return out

    wait._eroica = True  # type: ignore[attr-defined]
    Work.wait = wait
    Work.is_completed = is_completed


def _timed_p2p(tracer: Tracer, name: str, orig, blocking: bool):
    from .torch_hooks import CallArgs, _compiling, _gpu, _nbytes, _tls

    op = P2P_FUNCS[name]
    call = CallArgs(orig)
    peer_key = "dst" if op == "send" else "src"
    gpeer_key = "group_dst" if op == "send" else "group_src"
    fn_name = f"torch.distributed.{name}"

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        if getattr(_tls, "suppress", False) or not tracer.enabled or _compiling():
            return orig(*args, **kwargs)
        tensor = args[0] if args else kwargs.get("tensor")
        group = call.get(args, kwargs, "group")
        peer = groups.global_peer(group, call.get(args, kwargs, peer_key), call.get(args, kwargs, gpeer_key))
        extra = (_nbytes(tensor), op, _channel(peer), None, None)
        gpu = _gpu(tracer) if getattr(tensor, "is_cuda", False) else None
        step = tracer.step
        tok = tracer.begin(fn_name, "collective", extra, step) if blocking else None
        ev = gpu.start() if gpu is not None else None
        _tls.suppress = True   # send / recv call isend / irecv inside: time the outer call only
        try:
            out = orig(*args, **kwargs)
        except BaseException:
            tracer.end(tok)
            raise
        finally:
            _tls.suppress = False
        if blocking:
            if extra[2] is None and op == "recv" and isinstance(out, int) and out >= 0:
                extra = (extra[0], op, _channel(out), None, None)
            if ev is not None:
                tracer.discard(tok)
                gpu.stop(ev, fn_name, "collective", step, extra, suffix=False)
            else:
                tracer.end(tok, extra)
            return out
        if out is None:  # not a member of the group: nothing was sent
            return out
        entry = _Entry(fn_name, extra, step, ev, group)   # the wait opens its span (see the module doc)
        batch = getattr(_tls, "batch", None)
        if batch is not None:
            batch.append((out, entry))
        else:
            _watch(tracer, out, [entry])
        return out

    wrapper._eroica = True  # type: ignore[attr-defined]
    return wrapper


def _timed_batch(tracer: Tracer, orig, originals: dict, c10d: Any):
    from .torch_hooks import _compiling, _tls

    @functools.wraps(orig)
    def batch_isend_irecv(p2p_op_list):
        # P2POps built with torch's own isend / irecv (captured before we patched) use ours
        for p in p2p_op_list:
            name = originals.get(id(getattr(p, "op", None)))
            if name is not None:
                p.op = getattr(c10d, name)
        if getattr(_tls, "suppress", False) or not tracer.enabled or _compiling():
            return orig(p2p_op_list)
        prev = getattr(_tls, "batch", None)
        collected: list = []
        _tls.batch = collected
        try:
            works = orig(p2p_op_list)
        finally:
            _tls.batch = prev
        wl = list(works or [])
        if len(wl) == len(collected) and all(w is cw for w, (cw, _) in zip(wl, collected)):
            for w, (_, e) in zip(wl, collected):
                _watch(tracer, w, [e])
        elif wl:  # coalesced: any returned work's completion ends the whole batch
            entries = [e for _, e in collected]
            for w in wl:
                _watch(tracer, w, entries)
        return works

    batch_isend_irecv._eroica = True  # type: ignore[attr-defined]
    return batch_isend_irecv


def patch_p2p(tracer: Tracer) -> None:
    """Patch send / recv / isend / irecv / batch_isend_irecv and ``Work`` (see the module doc)."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    patch_work(tracer, c10d.Work)
    originals: dict[int, str] = {}
    for name in P2P_FUNCS:
        orig = getattr(c10d, name, None)
        if orig is None or getattr(orig, "_eroica", False):
            continue
        originals[id(orig)] = name
        wrapped = _timed_p2p(tracer, name, orig, blocking=name in ("send", "recv"))
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is orig:
            setattr(dist, name, wrapped)
    orig_batch = getattr(c10d, "batch_isend_irecv", None)
    if orig_batch is not None and not getattr(orig_batch, "_eroica", False):
        wrapped = _timed_batch(tracer, orig_batch, originals, c10d)
        c10d.batch_isend_irecv = wrapped
        if getattr(dist, "batch_isend_irecv", None) is orig_batch:
            dist.batch_isend_irecv = wrapped
