"""NIC counters from sysfs: InfiniBand / RoCE ports and network interfaces.

InfiniBand (``<root>/sys/class/infiniband/<dev>/ports/<port>/``):

==================  =====================================================
contract field      source
==================  =====================================================
tx_Bps, rx_Bps      rate of ``counters/port_xmit_data`` / ``port_rcv_data``
                    (counted in 4-byte words, per the IBTA spec)
link_gbps           ``rate`` ("200 Gb/sec (4X HDR)")
link_up             ``state`` is ACTIVE
tx_discards         ``counters/port_xmit_discards``
rx_errors           ``counters/port_rcv_errors``
symbol_errors       ``counters/symbol_error``
link_downed         ``counters/link_downed``
xmit_wait           ``counters/port_xmit_wait``
cnp_sent            ``hw_counters/np_cnp_sent`` (RoCE congestion notifications)
retransmits         sum of the requester's retransmission triggers in
                    ``hw_counters`` (``local_ack_timeout_err``,
                    ``packet_seq_err``, ``implied_nak_seq_err``,
                    ``roce_adp_retrans``) that the driver exposes
==================  =====================================================

Network interfaces (``<root>/sys/class/net/<if>/``): rates of
``statistics/tx_bytes`` / ``rx_bytes``, ``speed`` (Mb/s, absent or -1 when
unknown), ``operstate``, ``statistics/tx_dropped`` as tx_discards and
``statistics/rx_errors``. Loopback is skipped, and so are virtual interfaces
(bridges, veths, tunnels: no ``device`` link) unless the node has no
physical one.

Error counters stay cumulative, as the contract wants; a counter that went
backwards (driver reload, wrap) gives no rate for that interval.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

IB_DATA_WORD_BYTES = 4

_IB_COUNTERS = {
    "tx_discards": "port_xmit_discards",
    "rx_errors": "port_rcv_errors",
    "symbol_errors": "symbol_error",
    "link_downed": "link_downed",
    "xmit_wait": "port_xmit_wait",
}
_IB_HW_CNP = "np_cnp_sent"
_IB_HW_RETRANSMITS = ("local_ack_timeout_err", "packet_seq_err", "implied_nak_seq_err", "roce_adp_retrans")


@dataclass
class PortReading:
    """One port's cumulative counters and link state at one instant."""

    nic: str
    port: int | None
    tx_bytes: int | None = None
    rx_bytes: int | None = None
    link_gbps: float | None = None
    link_up: bool | None = None
    errors: dict[str, int] = field(default_factory=dict)  # contract name -> cumulative count

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.nic, self.port)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # absent, or EINVAL (speed of a down link)
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def parse_ib_rate(text: str | None) -> float | None:
    """``"200 Gb/sec (4X HDR)"`` -> 200.0."""
    if not text:
        return None
    m = re.match(r"\s*([0-9.]+)\s*Gb", text)
    return float(m.group(1)) if m else None


def parse_ib_state(text: str | None) -> bool | None:
    """``"4: ACTIVE"`` -> True; any other known state -> False."""
    if not text:
        return None
    return "ACTIVE" in text.upper()


def read_ib_ports(root: str | Path = "/") -> list[PortReading]:
    """Every InfiniBand / RoCE port under ``<root>/sys/class/infiniband``."""
    base = Path(root) / "sys/class/infiniband"
    out: list[PortReading] = []
    try:
        devices = sorted(p for p in base.iterdir())
    except OSError:
        return out
    for dev in devices:
        try:
            ports = sorted((p for p in (dev / "ports").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        except OSError:
            continue
        for port in ports:
            counters, hw = port / "counters", port / "hw_counters"
            xmit = _read_int(counters / "port_xmit_data")
            rcv = _read_int(counters / "port_rcv_data")
            errors = {}
            for name, file in _IB_COUNTERS.items():
                v = _read_int(counters / file)
                if v is not None:
                    errors[name] = v
            cnp = _read_int(hw / _IB_HW_CNP)
            if cnp is not None:
                errors["cnp_sent"] = cnp
            retrans = [v for v in (_read_int(hw / f) for f in _IB_HW_RETRANSMITS) if v is not None]
            if retrans:
                errors["retransmits"] = sum(retrans)
            out.append(PortReading(
                nic=dev.name, port=int(port.name),
                tx_bytes=None if xmit is None else xmit * IB_DATA_WORD_BYTES,
                rx_bytes=None if rcv is None else rcv * IB_DATA_WORD_BYTES,
                link_gbps=parse_ib_rate(_read_text(port / "rate")),
                link_up=parse_ib_state(_read_text(port / "state")),
                errors=errors,
            ))
    return out


def read_net_ifaces(root: str | Path = "/", include_virtual: bool | None = None) -> list[PortReading]:
    """Network interfaces under ``<root>/sys/class/net`` (see the module doc for which)."""
    base = Path(root) / "sys/class/net"
    try:
        ifaces = sorted(p for p in base.iterdir() if p.name != "lo")
    except OSError:
        return []
    physical = [p for p in ifaces if (p / "device").exists()]
    if include_virtual is None:
        chosen = physical or ifaces
    else:
        chosen = ifaces if include_virtual else physical
    out: list[PortReading] = []
    for iface in chosen:
        stats = iface / "statistics"
        speed = _read_int(iface / "speed")
        oper = _read_text(iface / "operstate")
        errors = {}
        for name, file in (("tx_discards", "tx_dropped"), ("rx_errors", "rx_errors")):
            v = _read_int(stats / file)
            if v is not None:
                errors[name] = v
        out.append(PortReading(
            nic=iface.name, port=None,
            tx_bytes=_read_int(stats / "tx_bytes"), rx_bytes=_read_int(stats / "rx_bytes"),
            link_gbps=speed / 1000.0 if speed is not None and speed > 0 else None,
            link_up=None if oper in (None, "unknown") else oper == "up",
            errors=errors,
        ))
    return out


def _rate(prev: int | None, cur: int | None, dt_s: float) -> float | None:
    if prev is None or cur is None or dt_s <= 0 or cur < prev:
        return None
    return round((cur - prev) / dt_s, 1)


class NicSampler:
    """Contract ``nic`` fields per port, with byte rates from consecutive readings."""

    def __init__(self, root: str | Path = "/", include_virtual: bool | None = None) -> None:
        self.root = root
        self.include_virtual = include_virtual
        self._prev: dict[tuple[str, int | None], tuple[int, PortReading]] = {}

    def read(self) -> list[PortReading]:
        return read_ib_ports(self.root) + read_net_ifaces(self.root, self.include_virtual)

    def sample(self, ts_ns: int) -> list[dict]:
        """One dict of contract fields per port (``nic``, ``port``, rates, link, errors)."""
        out = []
        for r in self.read():
            fields: dict = {"nic": r.nic[:256]}
            if r.port is not None:
                fields["port"] = r.port
            prev = self._prev.get(r.key)
            if prev is not None:
                dt = (ts_ns - prev[0]) / 1e9
                tx, rx = _rate(prev[1].tx_bytes, r.tx_bytes, dt), _rate(prev[1].rx_bytes, r.rx_bytes, dt)
                if tx is not None:
                    fields["tx_Bps"] = tx
                if rx is not None:
                    fields["rx_Bps"] = rx
            self._prev[r.key] = (ts_ns, r)
            if r.link_gbps is not None:
                fields["link_gbps"] = r.link_gbps
            if r.link_up is not None:
                fields["link_up"] = r.link_up
            fields.update(r.errors)
            out.append(fields)
        return out
