"""Tracing in every process of a job without touching its code: ``sitecustomize`` + an import hook.

``eroica trace`` writes a one-file folder holding :data:`SITECUSTOMIZE` and
puts it first on ``PYTHONPATH``. Every Python process the command starts
(the launcher, each rank, data-loader workers) then runs it at start-up; it
calls :func:`activate`, which

1. adds a meta-path finder that waits for ``import torch``: when torch has
   finished importing, :func:`eroica.producers.tracer.torch_hooks.install`
   patches it (processes that never import torch are left alone), and
2. runs the ``sitecustomize`` that ours shadows, if the environment has one
   (Debian's Python, a conda site...), so nothing the user had is lost.

Any failure is one line on stderr; the user's program runs on untraced.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable

SITECUSTOMIZE = '''\
# Written by `eroica trace`: instruments torch in this process when it is imported,
# then runs the sitecustomize this one shadows. Delete the folder to turn it off.
def _eroica_start(here):
    try:
        import eroica.producers.tracer.bootstrap as boot
    except Exception as exc:  # eroica is not importable from this interpreter
        import sys
        print(f"eroica: tracing off in this process: {exc!r}", file=sys.stderr)
    else:
        return boot.activate(here)
    import importlib.machinery, importlib.util, os, sys
    ours = os.path.realpath(os.path.dirname(os.path.abspath(here)))
    rest = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != ours]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_eroica_start(__file__)
del _eroica_start
'''


def write_site_dir(folder: str | Path) -> Path:
    """Create ``folder/sitecustomize.py``; returns the folder to put first on PYTHONPATH."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return folder


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Finds module ``name`` with the other finders, then calls ``callback`` once its import completes."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        try:
            sys.meta_path.remove(self)  # one shot; also keeps find_spec below from recursing
        except ValueError:
            pass
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        orig, callback = spec.loader.exec_module, self.callback

        def exec_module(module):
            orig(module)
            callback()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def on_import(name: str, callback: Callable[[], None]) -> None:
    """``callback()`` at once if module ``name`` is imported, else as soon as its import completes."""
    if name in sys.modules:
        callback()
    elif not any(isinstance(f, _PostImportHook) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportHook(name, callback))


def _on_torch_imported() -> None:
    try:
        from . import torch_hooks
        from .runtime import get_tracer

        torch_hooks.install(get_tracer())
    except Exception as exc:
        print(f"eroica: tracing off in this process: {type(exc).__name__}: {exc}", file=sys.stderr)


def install_import_hook() -> None:
    """Instrument torch as soon as it is imported (at once if it already is)."""
    on_import("torch", _on_torch_imported)


def chain_sitecustomize(our_file: str | Path) -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` after ours (the one ours shadows)."""
    ours = os.path.realpath(os.path.dirname(os.path.abspath(our_file)))
    rest = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != ours]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def activate(our_file: str | Path) -> None:
    """What ``sitecustomize`` does: hook torch's import, then chain to the shadowed sitecustomize."""
    if not os.environ.get("EROICA_TRACE_OFF"):
        try:
            install_import_hook()
        except Exception as exc:
            print(f"eroica: tracing off in this process: {type(exc).__name__}: {exc}", file=sys.stderr)
    chain_sitecustomize(our_file)  # its own errors are reported by site.py, as without us
