"""numba's ``njit`` as every Eroica kernel is compiled with, or None where numba is not wanted or not there.

numba is optional (the ``fast`` extra): each kernel is a plain Python
function over numpy arrays that runs interpreted in tests, and the code
that uses it keeps a numpy or Python path for when this returns None.
"""

from __future__ import annotations

import os
from typing import Callable, Generic, TypeVar


def compiler(switch: str) -> Callable[[Callable[..., object]], Callable[..., object]] | None:
    """``numba.njit`` with machine code cached on disk (later processes load it, ~0.1-0.3 CPU-s, instead of
    compiling), the GIL released and no bounds checks (the kernels check their own indices); None when the
    environment variable ``switch`` is ``"0"`` or numba is not installed."""
    if os.environ.get(switch, "1") == "0":
        return None
    try:
        import numba  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        return None
    jit: Callable[[Callable[..., object]], Callable[..., object]] = numba.njit(cache=True, nogil=True,
                                                                              boundscheck=False)
    return jit


K = TypeVar("K")


class LazyKernels(Generic[K]):
    """Compiled kernels loaded once per process, when first asked for or once enough work has been fed to repay
    loading them; None where numba is switched off or missing, or the loaded code fails its smoke test.

    One mechanism for every optional kernel set (the summariser's, the decoders' depth walk): loading costs
    a fixed ~0.1-0.7 CPU-s and up to ~110 MB, so short tools never pay it, and a cache that cannot be loaded
    is found at load time, never inside a later call.
    """

    def __init__(self, switch: str, build: Callable[[Callable[[Callable[..., object]], Callable[..., object]]], K],
                 smoke: Callable[[K], bool], interpreted: K) -> None:
        self.switch = switch          # environment variable that turns them off with "0"
        self.build = build            # jit -> the compiled kernels
        self.smoke = smoke            # whether the loaded kernels give the right answers on tiny inputs
        self.interpreted = interpreted  # the same sources, uncompiled (tests)
        self.value: K | None = None
        self.failed = False
        self.seen = 0                 # work fed while not loaded (records, bytes: the caller's unit)

    def get(self) -> K | None:
        """The kernels, loading (and the first time compiling) them now."""
        if self.value is None and not self.failed:
            jit = compiler(self.switch)
            value = None if jit is None else self.build(jit)
            try:  # compiled or loaded here, once: a cache that cannot be loaded must not fail a call later
                ok = value is not None and self.smoke(value)
            except Exception:  # noqa: BLE001  (numba's errors have no common base: the fallback then)
                ok = False
            if ok:
                self.value = value
            else:
                self.failed = True
        return self.value

    def worth_it(self, amount: int, after: int) -> K | None:
        """The kernels to do ``amount`` more work with, loading them once ``after`` has been fed, or None."""
        if self.value is not None or self.failed:
            return self.value
        self.seen += amount
        return self.get() if self.seen >= after else None

    def use(self, kind: str | None, off: str) -> None:
        """For tests: ``"numba"`` (compiled), ``"python"`` (the sources interpreted), ``off`` (none: the
        caller's fallback), or None (back to loading them on demand)."""
        self.value, self.failed, self.seen = None, False, 0
        if kind == "python":
            self.value = self.interpreted
        elif kind == off:
            self.failed = True
        elif kind == "numba" and self.get() is None:
            raise RuntimeError("numba is not installed")
