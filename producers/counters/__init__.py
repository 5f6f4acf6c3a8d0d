"""Node counters for the agent: GPU (NVML), NIC (sysfs) and host (/proc).

Each source has pure parsing functions that take a root path (so tests run
them on fake sysfs / proc trees) and a small stateful sampler that turns
cumulative counters into rates between two samples.
"""

from .gpu import GpuSampler
from .host import HostSampler
from .nic import NicSampler
from .sampler import NodeSampler

__all__ = ["GpuSampler", "HostSampler", "NicSampler", "NodeSampler"]
