"""Trace a PyTorch training job: contract ``fn`` records from every rank, no code change needed.

``eroica trace -- COMMAND`` runs a job with this tracer active in every Python
process that imports torch (see :mod:`.bootstrap`). Users who want control
use the API instead::

    from eroica.producers import tracer

    tracer.instrument()                         # everything, as eroica trace does
    tracer.instrument(model=ddp_model, optimizer=opt, dataloader=loader)  # just these

    with tracer.span("tokenize"):               # a custom span (kind python)
        ...

    @tracer.span("load_shard", kind="io")       # or a decorator
    def load_shard(path): ...

Records go to ``$EROICA_TRACE_DIR`` (default ``./eroica-trace``), one JSON
Lines file per process, or to Kafka with ``$EROICA_TRACE_KAFKA`` (or the
``out_dir`` / ``kafka`` arguments of the first :func:`instrument` call).
Importing this package does not import torch.
"""

from __future__ import annotations

import functools
from typing import Any

from .runtime import Tracer, current_tracer, get_tracer

__all__ = ["Tracer", "current_tracer", "flush", "get_tracer", "instrument", "next_step", "span"]


def instrument(model: Any = None, optimizer: Any = None, dataloader: Any = None, *,
               out_dir: str | None = None, kafka: str | None = None, job: str | None = None) -> Tracer:
    """Instrument torch in this process; returns the process's :class:`Tracer`.

    With no object: everything (loaders, optimizers, top-level modules,
    collectives, DDP gradient all-reduces), exactly as ``eroica trace`` does.
    With objects: the collectives and DDP all-reduces, plus only the given
    model (its forward / backward), optimizer (its steps, which end the
    training steps) and data loader (its fetches).
    """
    import os

    if job:
        os.environ["EROICA_JOB"] = job
    tracer = get_tracer(out_dir=out_dir, kafka=kafka)
    from . import torch_hooks as th

    if model is None and optimizer is None and dataloader is None:
        th.install(tracer)
        return tracer
    for name, fn in (("torch.distributed", th.patch_distributed), ("point-to-point", th.patch_p2p), ("FSDP", th.patch_fsdp),
                     ("DistributedDataParallel", th.patch_ddp)):
        if name not in th._installed:
            try:
                fn(tracer)
                th._installed.add(name)
            except Exception as exc:
                th._warn(tracer, name, exc)
    if model is not None:
        th.instrument_model(tracer, model)
    if optimizer is not None:
        th.instrument_optimizer(tracer, optimizer)
    if dataloader is not None:
        th.instrument_dataloader(tracer, dataloader)
    return tracer


class span:
    """A custom span: ``with span("name"):`` or ``@span("name", kind="io")``.

    Nested inside a forward or another span, its record carries the stack of
    enclosing spans (so the detector credits the innermost one). Kind
    ``dataloader`` also opens a new step after an optimizer step, as
    ``DataLoader.__next__`` does.
    """

    __slots__ = ("name", "kind", "_tok")

    def __init__(self, name: str, kind: str = "python") -> None:
        from eroica.models.records import FN_KINDS

        if kind not in FN_KINDS:
            raise ValueError(f"kind must be one of {', '.join(FN_KINDS)}, got {kind!r}")
        self.name = str(name)[:256]
        self.kind = kind
        self._tok: int | None = None

    def __enter__(self) -> "span":
        t = get_tracer()
        if self.kind == "dataloader":
            t.maybe_advance()
        stack = t.stack_of(self.name)
        self._tok = t.begin(self.name, self.kind, (None, None, None, stack, None) if stack else None)
        t.names().append(self.name)
        return self

    def __exit__(self, *exc: Any) -> None:
        t = get_tracer()
        names = t.names()
        if names:
            names.pop()
        t.end(self._tok)
        self._tok = None

    def __call__(self, fn: Any) -> Any:
        name, kind = self.name, self.kind

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with span(name, kind):
                return fn(*args, **kwargs)

        return wrapper


def next_step() -> int:
    """Start a new training step now (loops without an optimizer); returns its index."""
    return get_tracer().next_step()


def flush() -> int:
    """Write what is queued now (normally the background thread does, every half second)."""
    return get_tracer().flush()
