"""Build hook: component tests, job fixtures and bench scripts stay out of the wheel.

All configuration is in pyproject.toml. Tests sit beside their code (README,
"Layers"), and setuptools has no setting that drops modules from a listed
package (``exclude-package-data`` filters data files only), so this filters the
module list of ``build_py``. An editable install maps the folders themselves, so
a checkout still runs every test. tests/test_packaging.py builds the wheel and
checks what it holds.
"""

from __future__ import annotations

import fnmatch
import os

from setuptools import setup
from setuptools.command.build_py import build_py

# What never ships: tests, the tracer's training-job fixtures, benchmark scripts.
DEV_ONLY = ("test_*.py", "*_test.py", "conftest.py", "*_job.py", "bench_*.py")


def dev_only(filename: str) -> bool:
    name = os.path.basename(filename)
    if name == "bench_cmd.py":  # `eroica bench` itself: every command module is cli/<name>_cmd.py
        return False
    return any(fnmatch.fnmatch(name, p) for p in DEV_ONLY)


class BuildPyWithoutDevModules(build_py):
    def find_package_modules(self, package, package_dir):  # type: ignore[no-untyped-def]
        return [m for m in super().find_package_modules(package, package_dir) if not dev_only(m[2])]


setup(cmdclass={"build_py": BuildPyWithoutDevModules})
