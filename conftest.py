"""Shared test configuration (at the root so that component tests beside their code get it too).

Fixtures that start real servers live in their own modules beside this file
(one per service) and are loaded as plugins here. A server fixture never skips
silently in CI: when ``CI`` is set and the server cannot be started, it fails.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "tests"))

pytest_plugins = ["kafka_fixtures", "clickhouse_fixtures"]

import os  # noqa: E402  (after the sys.path insert above: the fixtures live in tests/)

import pytest  # noqa: E402


def _shared_dir() -> Path:
    """``../shared`` beside the checkout (the project's real data and spec).

    EROICA_SHARED overrides it; a clone elsewhere (CI's clean checkout under
    /tmp) falls back to the workplace's /work/shared.
    """
    env = os.environ.get("EROICA_SHARED")
    if env:
        return Path(env)
    beside = Path(__file__).resolve().parents[1] / "shared"
    return beside if beside.is_dir() else Path("/work/shared")


SHARED = _shared_dir()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The real data folder; absent only outside CI, where its tests skip with a reason."""
    if not (SHARED / "data").is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"real data folder {SHARED / 'data'} is missing in CI")
        pytest.skip(f"real data folder {SHARED / 'data'} not found (set EROICA_SHARED)")
    return SHARED
