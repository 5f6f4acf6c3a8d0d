"""numba's ``njit`` as every Eroica kernel is compiled with, or None where numba is not wanted or not there.

numba is optional (the ``fast`` extra): each kernel is a plain Python
function over numpy arrays that runs interpreted in tests, and the code
that uses it keeps a numpy or Python path for when this returns None.
"""

from __future__ import annotations

import os
from typing import Callable


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
