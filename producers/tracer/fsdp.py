"""FSDP units: forward / backward per wrapped module, and their all-gathers and reduce-scatters.

Both FSDP APIs keep per-unit hooks of their own, and those are what is
wrapped (at class or module level, so no user object is touched):

``fully_shard`` (FSDP2)
    ``FSDPParamGroup.pre_forward`` .. ``post_forward`` is the unit's forward,
    ``pre_backward`` .. ``post_backward`` its backward; ``unshard`` issues its
    all-gather and ``post_backward`` its reduce-scatter.
``FullyShardedDataParallel`` (FSDP1)
    ``_runtime_utils._pre_forward`` .. ``_post_forward`` (also imported into
    ``fully_sharded_data_parallel``), ``_pre_backward_hook`` ..
    ``_post_backward_hook``; ``_unshard`` and ``_reduce_grad`` issue the
    collectives.

Records (``unit`` = the wrapped module's path in the model, ``blocks.3``, or
the root's class name for the root unit; the same on every rank):

* ``FSDP[unit].forward`` / ``FSDP[unit].backward``, kind ``python``, with the
  enclosing spans' stack (on a CPU job this *is* the unit's compute; the
  unit's all-gather wait is inside its forward, as it is for the job);
* the collectives issued for a unit are named ``FSDP.all_gather`` /
  ``FSDP.reduce_scatter`` with stack ``FSDP[unit];FSDP.<op>`` (the detector
  tells functions apart by their stack), with ``bytes``, ``op`` and ``group``
  as any collective (:mod:`.torch_hooks`): a prefetched all-gather is
  credited to the unit it gathers for, not to the one running.

FSDP is imported lazily by jobs (it takes half a second), so the patches go
in when ``torch.distributed.fsdp`` finishes importing, or at once if it has.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from .bootstrap import on_import
from .runtime import Tracer

FSDP_PACKAGE = "torch.distributed.fsdp"
_names: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def _tls():
    from .torch_hooks import _tls as tls

    return tls


def current_unit() -> str | None:
    """The FSDP unit whose collectives are being issued on this thread, if any."""
    return getattr(_tls(), "fsdp_unit", None)


def unit_name(mod: Any) -> str:
    """The unit's path in its top-level model (FSDP1's wrapper layers left out), the same on every rank."""
    try:
        return _names[mod]
    except (KeyError, TypeError):
        pass
    from .torch_hooks import _modules

    name = None
    for ref in list(_modules(_tracer()).roots):
        root = ref()
        if root is None:
            continue
        for path, m in root.named_modules():
            clean = ".".join(p for p in path.split(".") if p not in ("_fsdp_wrapped_module", "module", "_orig_mod"))
            if m is mod or getattr(m, "_fsdp_wrapped_module", None) is mod:
                name = clean or type(mod).__name__
                break
        if name is not None:
            break
    if name is None:
        fqn = getattr(mod, "_eroica_fsdp_fqn", None)
        name = fqn or type(mod).__name__
    name = name.replace("FSDP", "", 1) if name.startswith("FSDP") and name[4:5].isupper() else name
    try:
        _names[mod] = name
    except TypeError:
        pass
    return name


_state: dict[str, Any] = {}


def _tracer() -> Tracer:
    return _state["tracer"]


class _UnitContext:
    """``with _UnitContext(name):`` credits the collectives issued inside to that unit."""

    __slots__ = ("name", "prev")

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        tls = _tls()
        self.prev = getattr(tls, "fsdp_unit", None)
        tls.fsdp_unit = f"FSDP[{self.name}]"

    def __exit__(self, *exc: Any) -> None:
        _tls().fsdp_unit = self.prev


def _open_span(key: Any, fn: str, kind: str = "python") -> None:
    t = _tracer()
    if not t.enabled:
        return
    spans = _state.setdefault("open", {})
    if key in spans:
        return
    t.maybe_advance()
    spans[key] = t.begin(fn, kind, (None, None, None, t.stack_of(fn), None) if t.names() else None)


def _close_span(key: Any) -> None:
    tok = _state.get("open", {}).pop(key, None)
    if tok is not None:
        _tracer().end(tok)


def _wrap(owner: Any, attr: str, make) -> None:
    orig = getattr(owner, attr, None)
    if orig is None or getattr(orig, "_eroica", False):
        return
    new = functools.wraps(orig)(make(orig))
    new._eroica = True
    setattr(owner, attr, new)


# --- FSDP2 (fully_shard) ------------------------------------------------------------

def _patch_fsdp2() -> None:
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup as G

    def unit(group: Any) -> str:
        mods = getattr(group, "modules", None) or ()
        if mods:
            m = mods[0]
            if getattr(group, "_module_fqn", None) and "_eroica_fsdp_fqn" not in m.__dict__:
                m.__dict__["_eroica_fsdp_fqn"] = group._module_fqn
            return unit_name(m)
        return getattr(group, "_module_fqn", None) or "?"

    def fwd_pre(orig):
        def pre_forward(self, *args, **kwargs):
            try:
                _open_span(("f", id(self)), f"FSDP[{unit(self)}].forward")
            except Exception:
                pass
            with _UnitContext(unit(self)):
                return orig(self, *args, **kwargs)
        return pre_forward

    def fwd_post(orig):
        def post_forward(self, *args, **kwargs):
            try:
                return orig(self, *args, **kwargs)
            finally:
                _close_span(("f", id(self)))
        return post_forward

    def bwd_pre(orig):
        def pre_backward(self, *args, **kwargs):
            try:
                _open_span(("b", id(self)), f"FSDP[{unit(self)}].backward")
            except Exception:
                pass
            with _UnitContext(unit(self)):
                return orig(self, *args, **kwargs)
        return pre_backward

    def bwd_post(orig):
        def post_backward(self, *args, **kwargs):
            try:
                with _UnitContext(unit(self)):
                    return orig(self, *args, **kwargs)
            finally:
                _close_span(("b", id(self)))
        return post_backward

    def in_unit(orig):
        def method(self, *args, **kwargs):
            with _UnitContext(unit(self)):
                return orig(self, *args, **kwargs)
        return method

    _wrap(G, "pre_forward", fwd_pre)
    _wrap(G, "post_forward", fwd_post)
    _wrap(G, "pre_backward", bwd_pre)
    _wrap(G, "post_backward", bwd_post)
    _wrap(G, "unshard", in_unit)


# --- FSDP1 (FullyShardedDataParallel) -------------------------------------------------

def _patch_fsdp1() -> None:
    from torch.distributed.fsdp import _runtime_utils as ru
    from torch.distributed.fsdp import fully_sharded_data_parallel as fsdp_mod

    def unit_of(handle: Any) -> str | None:
        mod = getattr(handle, "_fully_sharded_module", None) if handle is not None else None
        return unit_name(mod) if mod is not None else None

    def pre_fwd(orig):
        def _pre_forward(state, handle, *args, **kwargs):
            name = unit_of(handle)
            if name is None:
                return orig(state, handle, *args, **kwargs)
            try:
                _open_span(("f", id(handle)), f"FSDP[{name}].forward")
            except Exception:
                pass
            with _UnitContext(name):
                return orig(state, handle, *args, **kwargs)
        return _pre_forward

    def post_fwd(orig):
        def _post_forward(state, handle, *args, **kwargs):
            try:
                return orig(state, handle, *args, **kwargs)
            finally:
                _close_span(("f", id(handle)))
        return _post_forward

    def pre_bwd(orig):
        def _pre_backward_hook(state, module, handle, *args, **kwargs):
            name = unit_of(handle)
            if name is None:
                return orig(state, module, handle, *args, **kwargs)
            try:
                _open_span(("b", id(handle)), f"FSDP[{name}].backward")
            except Exception:
                pass
            with _UnitContext(name):
                return orig(state, module, handle, *args, **kwargs)
        return _pre_backward_hook

    def post_bwd(orig):
        def _post_backward_hook(state, handle, *args, **kwargs):
            name = unit_of(handle)
            try:
                if name is None:
                    return orig(state, handle, *args, **kwargs)
                with _UnitContext(name):
                    return orig(state, handle, *args, **kwargs)
            finally:
                _close_span(("b", id(handle)))
        return _post_backward_hook

    def in_unit(orig):
        def fn(state, handle, *args, **kwargs):
            name = unit_of(handle)
            if name is None:
                return orig(state, handle, *args, **kwargs)
            with _UnitContext(name):
                return orig(state, handle, *args, **kwargs)
        return fn

    for owner in (ru, fsdp_mod):
        _wrap(owner, "_pre_forward", pre_fwd)
        _wrap(owner, "_post_forward", post_fwd)
    _wrap(ru, "_pre_backward_hook", pre_bwd)
    _wrap(ru, "_post_backward_hook", post_bwd)
    _wrap(ru, "_unshard", in_unit)
    _wrap(ru, "_reduce_grad", in_unit)


def _patch_all() -> None:
    tracer = _tracer()
    for name, fn in (("FSDP (fully_shard)", _patch_fsdp2), ("FSDP (FullyShardedDataParallel)", _patch_fsdp1)):
        try:
            fn()
        except Exception as exc:
            tracer._warn_once(f"could not instrument {name}: {type(exc).__name__}: {exc}")


def patch_fsdp(tracer: Tracer) -> None:
    """Instrument FSDP now if it is imported, else as soon as it is."""
    _state["tracer"] = tracer
    on_import(FSDP_PACKAGE, _patch_all)
