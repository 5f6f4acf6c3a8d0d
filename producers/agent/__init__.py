"""The node agent: samples a node's GPU, NIC and host counters and publishes them."""

from .agent import NodeAgent

__all__ = ["NodeAgent"]
