"""Shared test configuration.

Fixtures that start real servers live in their own modules beside this file
(one per service) and are loaded as plugins here. A server fixture never skips
silently in CI: when ``CI`` is set and the server cannot be started, it fails.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

pytest_plugins = ["kafka_fixtures", "clickhouse_fixtures"]

SHARED = Path(__file__).resolve().parents[2] / "shared"
