"""A bounded atheris run over every decoder (``models/fuzz_decoders.py``), in a subprocess.

Skipped where atheris is not installed (``pip install eroica[fuzz]``), except in CI (``CI`` set),
where ``make setup`` installs it and a missing install fails;
``EROICA_FUZZ_RUNS`` sets the number of inputs (default 5000: ~15 s, most of it importing).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def test_atheris_finds_nothing_in_a_bounded_run(tmp_path) -> None:
    if os.environ.get("CI"):
        import atheris  # noqa: F401  (CI installs the fuzz extra: fail, never skip)
    else:
        pytest.importorskip("atheris")
    runs = int(os.environ.get("EROICA_FUZZ_RUNS", "5000"))
    proc = subprocess.run([sys.executable, "-m", "eroica.models.fuzz_decoders", f"-runs={runs}", "-max_len=4096",
                           "-len_control=0", "-rss_limit_mb=2048", "-timeout=20", f"-artifact_prefix={tmp_path}/"],
                          capture_output=True, text=True, timeout=120)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert f"Done {runs} runs" in tail, tail
