"""Instrument torch inside a training process without touching the user's code.

What is recorded (contract ``fn`` records, via :class:`~.runtime.Tracer`):

``DataLoader.__next__`` (kind ``dataloader``)
    ``_BaseDataLoaderIter.__next__`` wrapped at class level; the call that
    ends an epoch (StopIteration) is not a fetch and is not recorded.
``<Optimizer>.step`` (kind ``optimizer``)
    torch's global optimizer step pre / post hooks. Each step's end closes
    the training step: the next loader fetch or forward opens step + 1 (so
    several optimizers stepping back to back stay in one step, and a loss
    all-reduce after the step still belongs to it).
``<Model>.forward`` / ``<Model>.backward`` (kind ``python``)
    The *top-level* modules: for the first ``LEARN_STEPS`` optimizer steps
    global module hooks watch which modules are called at nesting depth 0 and
    own parameters (a loss module has none); then the global hooks go and
    each such root gets its own forward pre / post hooks, so steady-state
    cost is two hook calls per step, not two per sub-module. DDP / FSDP /
    compiled wrappers are named after the module they wrap. Backward runs
    from the gradient of the forward's output (a tensor hook) to the end of
    the autograd pass (an engine callback queued from that hook, which runs
    before DDP's own end-of-backward wait).
    On a GPU the forward is host code that launches kernels; with no CUDA it
    *is* the compute, on the host, and stays kind ``python`` either way: the
    detector then reads one rank's slow forward as slow host code
    (``python`` / ``host_cpu``) rather than as a GPU.
torch.distributed collectives (kind ``collective``)
    all_reduce, all_gather(_into_tensor), reduce_scatter(_tensor), broadcast,
    barrier, plus reduce / gather / scatter / all_to_all(_single)
    (no ``op`` in the contract's vocabulary for those): ``op``, ``bytes`` of
    the payload, ``group`` = the id of the process group derived from its
    sorted global ranks (``ranks:0-7``, the same on every member, no
    collective needed: :mod:`.groups`). ``async_op=True`` calls are timed from
    the wait on their ``Work`` (see :mod:`.p2p`). Inside an FSDP unit they are
    ``FSDP.all_gather`` / ``FSDP.reduce_scatter`` with the unit in their stack
    (:mod:`.fsdp`).
Point-to-point (kind ``collective``, op ``send`` / ``recv``)
    send, recv, isend, irecv, batch_isend_irecv, timed to completion (the
    ``Work``'s wait, not the launch), group ``p2p:<a>,<b>`` of the two ranks:
    :mod:`.p2p`.
DDP gradient all-reduces (``DDP.all_reduce``, kind ``collective``)
    They never pass through Python: DDP's reducer issues them from C++. So
    ``DistributedDataParallel.__init__`` is wrapped to register, just before
    the first forward, a communication hook: the default all-reduce hook
    wrapped with timing up to its future's completion, from the bucket being
    ready or, when the rank was still computing its backward then, from the
    end of that backward (the exposed part only: see :func:`_end_exposed`,
    so a slow backward that overlapping all-reduces hide stays visible). A
    hook the user registers is wrapped instead; a built-in C++ hook
    (``_register_builtin_comm_hook``) is left alone, untimed. DDP's
    per-forward buffer broadcast (``broadcast_buffers=True`` with BatchNorm
    statistics...) is another hidden collective inside the forward: timed as
    ``DDP.broadcast_buffers`` (op ``broadcast``).
CUDA (where torch uses it)
    Once CUDA is initialised, the same regions also get CUDA-event timings
    (``<name>[gpu]``, kind ``kernel``; collectives keep kind ``collective``
    and are timed on the GPU only, since an NCCL call returns before it runs)
    and host <-> device copies through ``Tensor.to / .cuda / .cpu`` become
    ``memcpy HtoD`` / ``memcpy DtoH`` records (kind ``memcpy``, bytes).

Everything here is defensive: a patch that fails is reported once on stderr
and skipped; a hook that raises is never allowed to reach the training code.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import weakref
from typing import Any

from . import groups as _groups
from .runtime import Tracer, time_ns

LOADER_FN = "DataLoader.__next__"
LEARN_STEPS = 3          # optimizer steps during which global module hooks look for top-level modules
LEARN_CALLS = 500        # ... or this many top-level calls without an optimizer (inference loops)
_WRAPPERS = {"DistributedDataParallel", "FullyShardedDataParallel", "DataParallel", "OptimizedModule"}

_tls = threading.local()   # .suppress: inside a timed collective / comm hook; .depth: module nesting
_installed: set[str] = set()
_state: dict[str, Any] = {}


def _warn(tracer: Tracer, what: str, exc: BaseException) -> None:
    tracer._warn_once(f"could not instrument {what}: {type(exc).__name__}: {exc}")


def install(tracer: Tracer) -> None:
    """Patch everything (``eroica trace``, or ``instrument()`` with no arguments). Idempotent."""
    for name, fn in (("DataLoader", patch_dataloader), ("optimizers", patch_optimizer),
                     ("modules", patch_modules), ("torch.distributed", patch_distributed),
                     ("point-to-point", patch_p2p), ("FSDP", patch_fsdp),
                     ("DistributedDataParallel", patch_ddp), ("memory copies", patch_memcpy)):
        if name in _installed:
            continue
        try:
            fn(tracer)
            _installed.add(name)
        except Exception as exc:
            _warn(tracer, name, exc)


def _never() -> bool:
    return False


def _is_compiling_fn():
    try:
        import torch

        return torch.compiler.is_compiling  # torch.compile treats it as a constant True while tracing
    except Exception:
        return _never


_compiling = _is_compiling_fn()


# --- GPU timing -------------------------------------------------------------------

def _gpu(tracer: Tracer):
    """The CUDA timer once this process uses CUDA (never initialises CUDA itself)."""
    timer = tracer.gpu_timer
    if timer is not None or _state.get("no_cuda"):
        return timer
    torch = sys.modules.get("torch")
    try:
        if torch is None or torch.version.cuda is None:
            _state["no_cuda"] = True
            return None
        if not torch.cuda.is_initialized():
            return None
        from .cuda_timing import CudaTimer

        tracer.gpu_timer = timer = CudaTimer(torch)
    except Exception as exc:
        _state["no_cuda"] = True
        _warn(tracer, "CUDA timing", exc)
        return None
    return timer


class _Region:
    """A host span plus, where CUDA is in use, a GPU-timed twin (``name[gpu]``, kind kernel)."""

    __slots__ = ("tok", "ev", "name", "step", "stack")

    def __init__(self, tracer: Tracer, name: str, kind: str, stack: str | None = None) -> None:
        extra = (None, None, None, stack, None) if stack else None
        self.step = tracer.step
        self.tok = tracer.begin(name, kind, extra, self.step)
        self.name = name
        self.stack = stack
        gpu = _gpu(tracer)
        self.ev = gpu.start() if gpu is not None else None

    def end(self, tracer: Tracer) -> None:
        tracer.end(self.tok)
        if self.ev is not None and tracer.gpu_timer is not None:
            tracer.gpu_timer.stop(self.ev, self.name, "kernel", self.step)


# --- DataLoader ---------------------------------------------------------------------

def _timed_next(tracer: Tracer, orig):
    def __next__(self):
        if not tracer.enabled:
            return orig(self)
        tracer.maybe_advance()
        tok = tracer.begin(LOADER_FN, "dataloader")
        try:
            out = orig(self)
        except StopIteration:
            tracer.discard(tok)
            raise
        except BaseException:
            tracer.end(tok)
            raise
        tracer.end(tok)
        return out

    __next__._eroica = True  # type: ignore[attr-defined]
    return functools.wraps(orig)(__next__)


def patch_dataloader(tracer: Tracer) -> None:
    from torch.utils.data import dataloader as dl

    cls = dl._BaseDataLoaderIter
    if not getattr(cls.__next__, "_eroica", False):
        cls.__next__ = _timed_next(tracer, cls.__next__)


class _TracedIter:
    """An explicitly instrumented loader's iterator (when the class-level patch is off)."""

    def __init__(self, tracer: Tracer, it: Any) -> None:
        self._it = it
        self._next = _timed_next(tracer, type(it).__next__)

    def __iter__(self):
        return self

    def __next__(self):
        return self._next(self._it)

    def __len__(self):
        return len(self._it)

    def __getattr__(self, name: str):
        return getattr(self._it, name)


def instrument_dataloader(tracer: Tracer, loader: Any) -> None:
    if "DataLoader" in _installed or getattr(loader, "_eroica_traced", False):
        return
    cls = type(loader)
    orig_iter = cls.__iter__

    def __iter__(self):
        return _TracedIter(tracer, orig_iter(self))

    loader.__class__ = type(f"Traced{cls.__name__}", (cls,), {"__iter__": __iter__, "_eroica_traced": True})


# --- optimizers -------------------------------------------------------------------------

def _step_hooks(tracer: Tracer, skip_instrumented: bool):
    open_: dict[int, _Region] = {}

    def pre(opt, args, kwargs):
        if skip_instrumented and opt.__dict__.get("_eroica_hooked"):
            return None
        if tracer.enabled:
            open_[id(opt)] = _Region(tracer, f"{type(opt).__name__}.step", "optimizer")
        return None

    def post(opt, args, kwargs):
        if skip_instrumented and opt.__dict__.get("_eroica_hooked"):
            return None
        region = open_.pop(id(opt), None)
        if region is not None:
            region.end(tracer)
        _backward["open"] = 0  # no backward runs across an optimizer step (one that raised never ended)
        tracer.step_done()
        _modules(tracer).on_step()
        return None

    return pre, post


def patch_optimizer(tracer: Tracer) -> None:
    from torch.optim import optimizer as om

    pre, post = _step_hooks(tracer, skip_instrumented=True)
    om.register_optimizer_step_pre_hook(pre)
    om.register_optimizer_step_post_hook(post)


def instrument_optimizer(tracer: Tracer, opt: Any) -> None:
    if "optimizers" in _installed or opt.__dict__.get("_eroica_hooked"):
        return
    pre, post = _step_hooks(tracer, skip_instrumented=False)
    opt.register_step_pre_hook(pre)
    opt.register_step_post_hook(post)
    opt.__dict__["_eroica_hooked"] = True


# --- top-level modules ------------------------------------------------------------------

def root_name(mod: Any) -> str:
    """The name of a top-level module: the wrapped module's class for DDP / FSDP / compiled wrappers."""
    mro = type(mod).__mro__
    if len(mro) > 2 and mro[1].__name__ == "FSDPModule":
        return mro[2].__name__  # fully_shard's FSDP<Name>(FSDPModule, <Name>) class
    inner = mod
    for _ in range(4):
        if type(inner).__name__ not in _WRAPPERS:
            break
        nxt = getattr(inner, "module", None) or getattr(inner, "_orig_mod", None)
        if nxt is None:
            break
        inner = nxt
    return type(inner).__name__


def _first_grad_tensor(out: Any, depth: int = 0):
    torch = sys.modules["torch"]
    if isinstance(out, torch.Tensor):
        return out if out.requires_grad else None
    if depth >= 2:
        return None
    if isinstance(out, dict):
        items = out.values()
    elif isinstance(out, (list, tuple)):
        items = out
    else:
        return None
    for item in items:
        t = _first_grad_tensor(item, depth + 1)
        if t is not None:
            return t
    return None


class ModuleTracker:
    """Finds the top-level modules, times their forward and backward (see the module doc)."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.learning = False
        self.steps = 0
        self.calls = 0
        self.roots: list[weakref.ref] = []
        self._global_handles: list = []

    # classification, cached on the module (``_eroica_root``: name, or False)
    def classify(self, mod: Any) -> str | bool:
        name = mod.__dict__.get("_eroica_root")
        if name is None:
            try:
                has_params = next(mod.parameters(), None) is not None
            except Exception:
                has_params = False
            name = root_name(mod) if has_params else False
            mod.__dict__["_eroica_root"] = name
            if name:
                self.roots.append(weakref.ref(mod))
                # a DDP model built before instrument(): time its gradient all-reduces from this
                # forward on (we run before its forward body, so the hook is in place for this backward)
                if type(mod).__name__ == "DistributedDataParallel" and "_eroica_comm" not in mod.__dict__:
                    _adopt_ddp(self.tracer, mod)
                    _register_default_hook(self.tracer, mod)
        return name

    # -- learning phase: global hooks ------------------------------------------------
    def start_learning(self) -> None:
        from torch.nn.modules import module as mm

        def gpre(mod, args):
            if _compiling():
                return None
            d = getattr(_tls, "depth", 0)
            _tls.depth = d + 1
            if d == 0:
                self.calls += 1
                name = self.classify(mod)
                if name and not mod.__dict__.get("_eroica_instance"):
                    self._enter(mod, name, "g")
            return None

        def gpost(mod, args, out):
            if _compiling():
                return None
            d = getattr(_tls, "depth", 1) - 1
            _tls.depth = max(d, 0)
            if d == 0:
                self._exit(mod, out, "g")
                if self.calls >= LEARN_CALLS:
                    self.finish_learning()
            return None

        try:
            post = mm.register_module_forward_hook(gpost, always_call=True)
        except TypeError:  # torch without always_call
            post = mm.register_module_forward_hook(gpost)
        self._global_handles = [mm.register_module_forward_pre_hook(gpre), post]
        self.learning = True

    def on_step(self) -> None:
        if self.learning:
            self.steps += 1
            if self.steps >= LEARN_STEPS:
                self.finish_learning()

    def finish_learning(self) -> None:
        if not self.learning:
            return
        self.learning = False
        for h in self._global_handles:
            h.remove()
        self._global_handles = []
        _tls.depth = 0
        for ref in self.roots:
            mod = ref()
            if mod is not None and mod.__dict__.get("_eroica_root"):
                self.hook_instance(mod)

    # -- steady state: per-instance hooks -------------------------------------------
    def hook_instance(self, mod: Any, name: str | None = None) -> None:
        if mod.__dict__.get("_eroica_instance"):
            return
        name = name or self.classify(mod) or root_name(mod)
        mod.__dict__["_eroica_root"] = name

        def ipre(m, args):
            if m.__dict__.get("_eroica_root") and not _compiling():
                self._enter(m, name, "i")
            return None

        def ipost(m, args, out):
            if m.__dict__.get("_eroica_root") and not _compiling():
                self._exit(m, out, "i")
            return None

        try:  # first: before a wrapper's own pre-hooks (FSDP's unit forward nests inside ours)
            mod.register_forward_pre_hook(ipre, prepend=True)
        except TypeError:
            mod.register_forward_pre_hook(ipre)
        try:
            mod.register_forward_hook(ipost, always_call=True)
        except TypeError:
            mod.register_forward_hook(ipost)
        mod.__dict__["_eroica_instance"] = True

    def adopt(self, mod: Any) -> None:
        """A module known to be top-level (a DDP wrapper, ``instrument(model=...)``)."""
        name = root_name(mod)
        mod.__dict__["_eroica_root"] = name
        if not any(r() is mod for r in self.roots):
            self.roots.append(weakref.ref(mod))
        if not self.learning:
            self.hook_instance(mod, name)

    # -- spans --------------------------------------------------------------------------
    def _stack(self, path: str) -> list:
        st = getattr(_tls, path, None)
        if st is None:
            st = []
            setattr(_tls, path, st)
        return st

    def _enter(self, mod: Any, name: str, path: str) -> None:
        t = self.tracer
        st = self._stack(path)
        if not t.enabled:
            st.append(None)
            return
        t.maybe_advance()
        fwd = name + ".forward"
        region = _Region(t, fwd, "python", t.stack_of(fwd))
        t.names().append(fwd)
        st.append(region)

    def _exit(self, mod: Any, out: Any, path: str) -> None:
        st = self._stack(path)
        if not st:
            return
        region = st.pop()
        if region is None:
            return
        t = self.tracer
        names = t.names()
        if names:
            names.pop()
        region.end(t)
        try:
            torch = sys.modules["torch"]
            if torch.is_grad_enabled():
                tensor = _first_grad_tensor(out)
                if tensor is not None:
                    self._hook_backward(tensor, region.name[: -len(".forward")] + ".backward")
        except Exception as exc:
            _warn(t, "backward", exc)

    def _hook_backward(self, tensor: Any, name: str) -> None:
        t = self.tracer

        def on_grad(grad):
            try:
                region = _Region(t, name, "python")
                from torch.autograd import Variable

                _backward["open"] += 1

                def done() -> None:
                    region.end(t)
                    _backward["open"] -= 1
                    _backward["end_ns"] = time_ns()

                Variable._execution_engine.queue_callback(done)
            except Exception:
                pass
            return None

        tensor.register_hook(on_grad)


def _modules(tracer: Tracer) -> ModuleTracker:
    m = _state.get("modules")
    if m is None:
        m = _state["modules"] = ModuleTracker(tracer)
    return m


def patch_modules(tracer: Tracer) -> None:
    _modules(tracer).start_learning()


def instrument_model(tracer: Tracer, model: Any) -> None:
    _modules(tracer).adopt(model)
    _adopt_ddp(tracer, model)


# --- torch.distributed --------------------------------------------------------------------

# function -> (contract op or None, argument holding the payload)
COLLECTIVES: dict[str, tuple[str | None, str | None]] = {
    "all_reduce": ("all_reduce", "tensor"),
    "all_gather": ("all_gather", "tensor_list"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "broadcast": ("broadcast", "tensor"),
    "barrier": ("barrier", None),
    "reduce": (None, "tensor"),
    "gather": (None, "tensor"),
    "scatter": (None, "tensor"),
    "all_to_all": (None, "input_tensor_list"),
    "all_to_all_single": (None, "input"),
    # what both FSDP APIs call (torch >= 2.6)
    "all_gather_single": ("all_gather", "output_tensor"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
}

def group_name(group: Any) -> str | None:
    """The process group's id from its sorted global ranks, the same on every member (see :mod:`.groups`)."""
    return _groups.group_name(group)


def _nbytes(x: Any) -> int | None:
    torch = sys.modules["torch"]
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        total = 0
        for t in x:
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
        return total
    return None


def _is_cuda(x: Any) -> bool:
    torch = sys.modules["torch"]
    if isinstance(x, torch.Tensor):
        return x.is_cuda
    if isinstance(x, (list, tuple)) and x:
        return _is_cuda(x[0])
    return False


class CallArgs:
    """Reads a wrapped torch function's arguments by name, passed by position or by keyword."""

    def __init__(self, fn: Any) -> None:
        self.pos = {p: i for i, p in enumerate(inspect.signature(fn).parameters)}

    def get(self, args: tuple, kwargs: dict, key: str) -> Any:
        i = self.pos.get(key)
        return args[i] if i is not None and i < len(args) else kwargs.get(key)


def _timed_collective(tracer: Tracer, name: str, op: str | None, payload_arg: str | None, orig):
    call = CallArgs(orig)
    fn_name = f"torch.distributed.{name}"

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        if getattr(_tls, "suppress", False) or not tracer.enabled or _compiling():
            return orig(*args, **kwargs)
        payload = call.get(args, kwargs, payload_arg) if payload_arg else None
        unit = getattr(_tls, "fsdp_unit", None)
        name, stack = (f"FSDP.{op}", f"{unit};FSDP.{op}") if unit and op else (fn_name, None)
        extra = (_nbytes(payload), op, group_name(call.get(args, kwargs, "group")), stack, None)
        gpu = _gpu(tracer) if _is_cuda(payload) else None
        tok = tracer.begin(name, "collective", extra)
        ev = gpu.start() if gpu is not None else None
        step = tracer.step
        _tls.suppress = True
        try:
            work = orig(*args, **kwargs)
        except BaseException:
            tracer.end(tok)
            raise
        finally:
            _tls.suppress = False
        if ev is not None:  # NCCL returns before the GPU runs it: GPU time only
            tracer.discard(tok)
            gpu.stop(ev, name, "collective", step, extra, suffix=False)
            return work
        if work is not None and call.get(args, kwargs, "async_op"):
            # timed from the wait on its Work, as a transfer is (p2p's doc says why); a Work
            # never waited for records nothing
            tracer.discard(tok)
            from .p2p import watch_work

            watch_work(tracer, work, name, extra, step)
            return work
        tracer.end(tok)
        return work

    wrapper._eroica = True  # type: ignore[attr-defined]
    return wrapper


def patch_fsdp(tracer: Tracer) -> None:
    from .fsdp import patch_fsdp as patch

    patch(tracer)


def patch_p2p(tracer: Tracer) -> None:
    from .p2p import patch_p2p as patch

    patch(tracer)


def patch_distributed(tracer: Tracer) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    for name, (op, payload) in COLLECTIVES.items():
        orig = getattr(c10d, name, None)
        if orig is None or getattr(orig, "_eroica", False):
            continue
        wrapped = _timed_collective(tracer, name, op, payload, orig)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is orig:
            setattr(dist, name, wrapped)


# --- DDP: gradient all-reduces through a communication hook ---------------------------------

def _timed_comm_hook(tracer: Tracer, ddp: Any, hook):
    group = group_name(getattr(ddp, "process_group", None))

    def eroica_timed_hook(state, bucket):
        if not tracer.enabled:
            return hook(state, bucket)
        buf = bucket.buffer()
        extra = (buf.numel() * buf.element_size(), "all_reduce", group, None, None)
        gpu = _gpu(tracer) if buf.is_cuda else None
        tok = tracer.begin("DDP.all_reduce", "collective", extra)
        ev = gpu.start() if gpu is not None else None
        step = tracer.step
        _tls.suppress = True
        try:
            fut = hook(state, bucket)
        except BaseException:
            tracer.end(tok)
            raise
        finally:
            _tls.suppress = False
        if ev is not None:
            tracer.discard(tok)

            def done(f):
                gpu.stop(ev, "DDP.all_reduce", "collective", step, extra, suffix=False)
                return f.value()

            return fut.then(done)
        fut.add_done_callback(lambda f: _end_exposed(tracer, tok))
        return fut

    eroica_timed_hook.__qualname__ = f"eroica_timed({getattr(hook, '__qualname__', 'hook')})"
    return eroica_timed_hook


# The training thread's backward passes: open ones, and when the last one ended. DDP's gradient
# all-reduces run beside the backward that produces their buckets; what the rank waits for is only
# the part after its own backward compute has ended.
_backward: dict[str, int] = {"open": 0, "end_ns": 0}


def _end_exposed(tracer: Tracer, tok: int) -> None:
    """End an overlapped all-reduce's span, keeping only the time the rank was not computing.

    A bucket's all-reduce starts when the bucket is ready, mid-backward. Recorded from there, the
    backward compute it overlaps would read as time in a collective, and the detector (which
    charges a host span only for its time outside collectives) would not see that compute: a rank
    whose slow backward makes everyone's all-reduce late would look like it computed little and
    waited. So the span starts where the rank stops computing: at the end of its backward, or (the
    backward still running) it is an empty span at the completion. Without a known backward (no
    top-level module found), the span is the whole all-reduce, as before.
    """
    now = time_ns()
    if _backward["open"] > 0:
        tracer.end(tok, start_ns=now, end_ns=now)
    elif _backward["end_ns"]:
        tracer.end(tok, start_ns=_backward["end_ns"], end_ns=now)
    else:
        tracer.end(tok, end_ns=now)


def _register_default_hook(tracer: Tracer, ddp: Any) -> None:
    if ddp.__dict__.get("_eroica_comm") != "pending":
        return
    try:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(ddp.process_group, default_hooks.allreduce_hook)
    except Exception as exc:
        ddp.__dict__["_eroica_comm"] = "failed"
        _warn(tracer, "DDP gradient all-reduces", exc)


def _adopt_ddp(tracer: Tracer, ddp: Any) -> None:
    """Time a DDP instance's gradient all-reduces (hook registered just before its first forward)."""
    if type(ddp).__name__ != "DistributedDataParallel" or "_eroica_comm" in ddp.__dict__:
        return
    _patch_ddp_class(tracer, type(ddp))
    ddp.__dict__["_eroica_comm"] = "pending"
    handle = None

    def first_forward(mod, args):
        if handle is not None:
            handle.remove()
        _register_default_hook(tracer, mod)
        return None

    handle = ddp.register_forward_pre_hook(first_forward, prepend=True)


def _patch_ddp_class(tracer: Tracer, DDP: type) -> None:
    if getattr(DDP.register_comm_hook, "_eroica", False):
        return
    orig_register = DDP.register_comm_hook
    orig_builtin = DDP._register_builtin_comm_hook

    @functools.wraps(orig_register)
    def register_comm_hook(self, state, hook):
        if self.__dict__.get("_eroica_comm") == "pending":
            self.__dict__["_eroica_comm"] = "timed"
            hook = _timed_comm_hook(tracer, self, hook)
        return orig_register(self, state, hook)

    @functools.wraps(orig_builtin)
    def _register_builtin_comm_hook(self, comm_hook_type):
        self.__dict__["_eroica_comm"] = "builtin"
        return orig_builtin(self, comm_hook_type)

    register_comm_hook._eroica = True  # type: ignore[attr-defined]
    DDP.register_comm_hook = register_comm_hook
    DDP._register_builtin_comm_hook = _register_builtin_comm_hook

    orig_sync = getattr(DDP, "_sync_buffers", None)
    if orig_sync is not None:
        @functools.wraps(orig_sync)
        def _sync_buffers(self, *args, **kwargs):
            # broadcast_buffers=True (the default) broadcasts every buffer (BatchNorm statistics...)
            # from rank 0 at the start of each forward, from C++: a collective hidden in the forward.
            if not tracer.enabled or _compiling():
                return orig_sync(self, *args, **kwargs)
            nbytes = self.__dict__.get("_eroica_buffer_bytes")
            if nbytes is None:
                bufs = list(getattr(self, "modules_buffers", None) or [])
                nbytes = self.__dict__["_eroica_buffer_bytes"] = sum(b.numel() * b.element_size() for b in bufs)
            extra = (nbytes, "broadcast", group_name(getattr(self, "process_group", None)), None, None)
            tok = tracer.begin("DDP.broadcast_buffers", "collective", extra)
            try:
                return orig_sync(self, *args, **kwargs)
            finally:
                tracer.end(tok)

        DDP._sync_buffers = _sync_buffers


def patch_ddp(tracer: Tracer) -> None:
    from torch.nn.parallel import distributed as ddp_mod

    DDP = ddp_mod.DistributedDataParallel
    if getattr(DDP.__init__, "_eroica", False):
        return
    _patch_ddp_class(tracer, DDP)
    orig_init = DDP.__init__

    @functools.wraps(orig_init)
    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        try:
            if tracer.enabled:
                _adopt_ddp(tracer, self)
                _modules(tracer).adopt(self)
                inner = getattr(self, "module", None)
                if inner is not None:
                    inner.__dict__["_eroica_root"] = False
        except Exception as exc:
            _warn(tracer, "DistributedDataParallel", exc)

    __init__._eroica = True  # type: ignore[attr-defined]
    DDP.__init__ = __init__


# --- host <-> device copies (CUDA builds only) ------------------------------------------------

def patch_memcpy(tracer: Tracer) -> None:
    import torch

    if torch.version.cuda is None:
        return  # a CPU build never copies to a GPU
    Tensor = torch.Tensor
    for meth in ("to", "cuda", "cpu"):
        orig = getattr(Tensor, meth)
        if getattr(orig, "_eroica", False):
            continue
        setattr(Tensor, meth, _timed_copy(tracer, meth, orig))


def _may_cross(meth: str, self: Any, args: tuple, kwargs: dict) -> bool:
    """Whether a call may copy between host and device (a dtype-only ``.to`` may not)."""
    if meth == "cuda":
        return not self.is_cuda
    if meth == "cpu":
        return self.is_cuda
    if "device" in kwargs:
        return True
    if not args:
        return False
    torch = sys.modules["torch"]
    return isinstance(args[0], (str, int, torch.device, torch.Tensor))


def _timed_copy(tracer: Tracer, meth: str, orig):
    @functools.wraps(orig)
    def copy(self, *args, **kwargs):
        gpu = tracer.gpu_timer
        if gpu is None or not tracer.enabled or _compiling() or not _may_cross(meth, self, args, kwargs):
            return orig(self, *args, **kwargs)
        ev = gpu.start()
        out = orig(self, *args, **kwargs)
        try:
            if out is not self and out.is_cuda != self.is_cuda:
                name = "memcpy HtoD" if out.is_cuda else "memcpy DtoH"
                extra = (out.numel() * out.element_size(), None, None, None, None)
                gpu.stop(ev, name, "memcpy", tracer.step, extra, suffix=False)
        except Exception:
            pass
        return out

    copy._eroica = True  # type: ignore[attr-defined]
    return copy
