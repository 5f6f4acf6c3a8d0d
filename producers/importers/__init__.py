"""Importers of real traces into telemetry-v1 JSON Lines.

- :mod:`.kineto`: PyTorch profiler (Kineto) Chrome traces, one rank per file.
- :mod:`.optable`: per-operation tables (rank, stage, step, optype, start,
  duration), the format of the OSDI'25 straggler study.

Each module's docstring states its mapping; :mod:`.common` holds the shared
string bounds and the time-ordered writer.
"""

from .common import ImportFailed, ImportStats
from .kineto import import_kineto
from .optable import import_optable

__all__ = ["ImportFailed", "ImportStats", "import_kineto", "import_optable"]
