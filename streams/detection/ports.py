"""Which NIC ports carry the job's collectives: compare like with like.

A real node reports more than its RDMA rails: a front-end Ethernet port
(``eth0``, 100-200 Gb/s, data / logging / checkpoint traffic), management
ports (a 1 Gb/s BMC link that counts a few hundred ``rx_errors`` a window and
always has), bonds, IPoIB devices (a rail's speed, hardly any traffic), and
virtual devices (``lo``, ``docker0``, ``veth*``). Comparing every port with
the median of all of them makes each front-end port look like a degraded rail.

Ports are therefore classified from the data of the window, names only
supporting the decision:

* **rail**: carries the job's collectives. Rails of a node carry the same
  bytes per step (one ring per rail, every ring moves the same buffers), so
  they sit together at the top of the node's traffic; the same port name is a
  rail on (a strict majority of) the nodes that report it.
* **frontend**: a physical port (it reports a link speed) that does not carry
  the collectives: front-end, management, storage, IPoIB, a RoCE netdev.
* **idle**: a port named like a rail elsewhere that carries nothing here and
  shows no link trouble that would explain it (a different node type).
* **virtual**: loopback, bridges, veths, tunnels: a virtual name, or no link
  speed where the node's other ports report one (unless the name is a rail on
  the other nodes: a link that went down may stop reporting its speed). A
  virtual-named device is never a rail: what it sends off the host also
  crosses a physical port.

Comparable ports are rails of the same name on other nodes (the switch ports of
one rail are configured alike), confirmed by the other rails of the same node
(so that a node type with slower rails does not look degraded by itself). A
front-end port is never compared with a rail, and never blamed.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .counters import CounterSummary

RAIL = "rail"
FRONTEND = "frontend"
IDLE = "idle"
VIRTUAL = "virtual"

# Linux names of virtual devices: loopback, container / VM bridges and veths,
# overlay and CNI devices, tunnels. Such a device is never a rail, whatever its
# traffic: what it carries off the host also crosses a physical port (which the
# data then classifies), and what stays on the host crosses no link at all.
VIRTUAL_NAME = re.compile(
    r"^(lo$|docker|veth|virbr|br-|br\d|cni|flannel|cali|tun|tap|vxlan|weave|kube-|cilium|lxc|vnet|"
    r"podman|ovs-|genev|dummy|tailscale|wg\d|nodelocaldns|kube-ipvs)", re.I)

# A port is "busy" on its node when it moves at least this share of the node's
# busiest port's bytes. Rails of one node carry equal bytes per step (one ring
# per rail, identical buffers); pipeline send/recv on some ranks, or a flaky
# rail's retransmissions, move that by well under 2x. 0.25 leaves another 2x of
# margin, while front-end, management and IPoIB traffic is one to three orders
# of magnitude below a rail's in a training job.
BUSY_SHARE = 0.25

# A rail name must be busy on a strict majority of the nodes that report it:
# one node's checkpoint burst on eth0 cannot turn eth0 into a rail, while a
# rail that is slow or flaky on a minority of nodes still carries its share there.
RAIL_MAJORITY = 0.5

# Link speeds come in grades a factor of 2 apart (100, 200, 400, 800 Gb/s Ethernet; HDR 200
# and NDR 400 InfiniBand): a port at least one grade faster than the ports that carry the
# collectives is a faster path, not a spread of one grade's speeds.
FASTER_GRADE = 2.0


@dataclass
class Port:
    """One (node, nic) port of a window, with the class the data gave it."""

    node: str
    nic: str
    cls: str
    throughput_Bps: float
    link_gbps: float
    reason: str = ""


@dataclass
class PortMap:
    """The ports of a window by class; rails grouped by name (the rail) and by node."""

    ports: dict[tuple[str, str], Port] = field(default_factory=dict)
    # The rails by name and by node, indexed on first query (classify returns a complete
    # map): the link tests ask for each port's rail mates, which a scan makes quadratic
    # in the ports of a fleet (8 per node, 1,024 ranks: 0.6 s a window).
    _index: tuple[list[Port], dict[str, list[Port]], dict[str, list[Port]]] | None = field(
        default=None, init=False, repr=False, compare=False)

    def of_class(self, cls: str) -> list[Port]:
        return [p for p in self.ports.values() if p.cls == cls]

    def _rails_indexed(self) -> tuple[list[Port], dict[str, list[Port]], dict[str, list[Port]]]:
        if self._index is None:
            rails = self.of_class(RAIL)
            by_nic: dict[str, list[Port]] = {}
            by_node: dict[str, list[Port]] = {}
            for p in rails:
                by_nic.setdefault(p.nic, []).append(p)
                by_node.setdefault(p.node, []).append(p)
            self._index = (rails, by_nic, by_node)
        return self._index

    @property
    def rails(self) -> list[Port]:
        return list(self._rails_indexed()[0])

    def is_rail(self, node: str, nic: str) -> bool:
        p = self.ports.get((node, nic))
        return p is not None and p.cls == RAIL

    def same_rail(self, port: Port) -> list[Port]:
        """The same rail (port name) on the other nodes."""
        return [p for p in self._rails_indexed()[1].get(port.nic, []) if p.node != port.node]

    def node_rails(self, node: str, exclude: str | None = None) -> list[Port]:
        """The other rails of a node."""
        return [p for p in self._rails_indexed()[2].get(node, []) if p.nic != exclude]

    def node_capacity_gbps(self, node: str) -> float:
        """Sum of a node's rail link speeds (NaN without any known speed)."""
        speeds = [p.link_gbps for p in self.node_rails(node) if np.isfinite(p.link_gbps) and p.link_gbps > 0]
        return float(sum(speeds)) if speeds else float("nan")

    def summary(self) -> dict[str, list[str]]:
        """Evidence: the port names of each class (one entry per name, the nodes collapsed)."""
        out: dict[str, set[str]] = {}
        for p in self.ports.values():
            out.setdefault(p.cls, set()).add(p.nic)
        return {k: sorted(v) for k, v in sorted(out.items())}


# A fleet repeats a few port names on every node: each distinct name is matched once. Bounded all
# the same (a long-running detector sees many jobs): far more names than any fleet's NIC models.
@functools.lru_cache(maxsize=4096)
def is_virtual_name(nic: str) -> bool:
    return bool(VIRTUAL_NAME.match(nic))


def _f(m: dict[str, float], key: str) -> float:
    v = m.get(key, np.nan)
    return float(v) if v is not None else float("nan")


def link_trouble(m: dict[str, float]) -> bool:
    """The link went down or flapped during the window (then it may carry less than its share)."""
    up = _f(m, "link_up_min")
    downed = _f(m, "link_downed_inc")
    return (np.isfinite(up) and up < 1.0) or (np.isfinite(downed) and downed > 0)


def link_trouble_of(ms: Sequence[dict[str, float]]) -> np.ndarray:
    """:func:`link_trouble` of every port summary of ``ms``, as one boolean array."""
    up = np.array([_f(m, "link_up_min") for m in ms], dtype=np.float64)
    downed = np.array([_f(m, "link_downed_inc") for m in ms], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out: np.ndarray = (np.isfinite(up) & (up < 1.0)) | (np.isfinite(downed) & (downed > 0))
    return out


def classify(counters: CounterSummary) -> PortMap:
    """Classify every (node, nic) port of the window: rail, frontend, idle or virtual.

    Pure and cheap (a few ports per node); every consumer of NIC counters calls it.
    """
    nodes: dict[str, list[tuple[str, dict[str, float]]]] = {}
    for (node, nic), m in sorted(counters.nic.items()):
        nodes.setdefault(node, []).append((nic, m))
    out = PortMap()
    busy: dict[tuple[str, str], bool] = {}
    speedless: set[tuple[str, str]] = set()
    for node, ports in nodes.items():
        speeds = {nic: _f(m, "link_gbps") for nic, m in ports}
        # A collector that reports no speed at all (the field is optional) says nothing by
        # omission; otherwise a port without one is virtual, unless its name is a rail on the
        # other nodes (a link that went down may stop reporting its speed).
        node_reports_speed = any(math.isfinite(s) for s in speeds.values())
        phys: list[tuple[str, dict[str, float]]] = []
        for nic, m in ports:
            if is_virtual_name(nic):
                out.ports[(node, nic)] = Port(node, nic, VIRTUAL, _f(m, "throughput_Bps"), speeds[nic], "virtual name")
                continue
            if node_reports_speed and not np.isfinite(speeds[nic]):
                speedless.add((node, nic))
            phys.append((nic, m))
            out.ports[(node, nic)] = Port(node, nic, FRONTEND, _f(m, "throughput_Bps"), speeds[nic])
        # In Python floats (a node has a few ports: numpy's per-call cost would be most of the work)
        tput = [_f(m, "throughput_Bps") for _, m in phys]
        ranked = [t for (nic, _), t in zip(phys, tput) if (node, nic) not in speedless and not math.isnan(t)]
        if any(math.isfinite(t) for t in ranked) and max(ranked) > 0:
            top = max(ranked)  # np.nanmax of the ranked ports' throughputs
            for (nic, _), t in zip(phys, tput):
                busy[(node, nic)] = math.isfinite(t) and t >= BUSY_SHARE * top
        else:
            # No traffic reported on this node: the RDMA rails are the node's fastest links.
            fin = [speeds[nic] for nic, _ in phys if np.isfinite(speeds[nic])]
            fastest = max(fin) if fin else np.nan
            for nic, _ in phys:
                busy[(node, nic)] = bool(np.isfinite(fastest) and speeds[nic] >= fastest)
    # Consensus per name across nodes (ports without a speed do not vote).
    reporting: dict[str, int] = {}
    busy_on: dict[str, int] = {}
    for (node, nic), b in busy.items():
        if (node, nic) in speedless:
            continue
        reporting[nic] = reporting.get(nic, 0) + 1
        busy_on[nic] = busy_on.get(nic, 0) + int(b)
    rail_names = {nic for nic, n in reporting.items() if busy_on[nic] > RAIL_MAJORITY * n}
    for key, b in busy.items():
        port = out.ports[key]
        if key in speedless and port.nic not in rail_names:
            port.cls, port.reason = VIRTUAL, "no link speed"
        elif port.nic not in rail_names:
            port.reason = "busy on a minority of nodes" if b else "little traffic"
        elif b:
            port.cls, port.reason = RAIL, "carries the node's collective traffic"
        elif link_trouble(counters.nic[key]) or key in speedless:
            port.cls, port.reason = RAIL, "a rail elsewhere; its link went down here"
        else:
            port.cls, port.reason = IDLE, "a rail elsewhere, idle here"
    return out


def bypassed_ports(ports: PortMap, counters: CounterSummary) -> dict[str, list[Port]]:
    """Per node, its idle physical ports at least one speed grade faster than every port carrying the collectives.

    The classes come from traffic, so when NCCL falls back to TCP sockets the
    front-end port that now carries the rings *is* the node's rail, and the
    RDMA ports sit idle as front-end ones. Comparing the collectives with that
    port's speed then finds nothing wrong: what is wrong is the path. A port
    whose link went down or flapped is not a path the job could have taken.
    """
    # The ports that carry nothing, by node: one pass over the map, not one per node (a fleet's
    # ports number in the thousands, and every window asks).
    spare: dict[str, list[Port]] = {}
    for p in ports.ports.values():
        if p.cls in (FRONTEND, IDLE) and np.isfinite(p.link_gbps):
            spare.setdefault(p.node, []).append(p)
    out: dict[str, list[Port]] = {}
    for node, rails in ports._rails_indexed()[2].items():
        speeds = [p.link_gbps for p in rails if np.isfinite(p.link_gbps) and p.link_gbps > 0]
        if not speeds:
            continue
        fast = [p for p in spare.get(node, []) if p.link_gbps >= FASTER_GRADE * max(speeds)
                and not link_trouble(counters.nic.get((node, p.nic), {}))]
        if fast:
            out[node] = fast
    return out


def secondary_ports(ports: PortMap) -> list[Port]:
    """Physical ports of a rail's speed grade that do not carry the collectives.

    NCCL's rings cross the network only at node boundaries: with tensor-parallel
    groups on NVLink, the NICs of the GPUs between carry little or none of the
    rings, only pipeline send / recv (an order of magnitude less than a rail,
    below :data:`BUSY_SHARE`). Such a port is one whose name runs at the
    rails' speed on most nodes (the median over the nodes that report it, so
    that its own lowered speed does not hide it); front-end and management
    ports run a grade or more slower.
    """
    rail_speeds = [p.link_gbps for p in ports.rails if np.isfinite(p.link_gbps) and p.link_gbps > 0]
    if not rail_speeds:
        return []
    floor = float(np.median(rail_speeds)) / FASTER_GRADE  # at least the rails' grade: above half their speed
    spare = [p for p in ports.ports.values() if p.cls in (FRONTEND, IDLE)]
    by_name: dict[str, list[float]] = {}
    for p in spare:
        if np.isfinite(p.link_gbps):
            by_name.setdefault(p.nic, []).append(p.link_gbps)
    fast = {nic for nic, v in by_name.items() if float(np.median(v)) > floor}
    return [p for p in spare if p.nic in fast]


def rail_counters(counters: CounterSummary, ports: PortMap | None = None) -> dict[tuple[str, str], dict[str, float]]:
    """The NIC summaries of the rail ports only."""
    ports = ports if ports is not None else classify(counters)
    return {k: m for k, m in counters.nic.items() if ports.is_rail(*k)}
