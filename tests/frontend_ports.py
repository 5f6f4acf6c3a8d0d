"""Front-end, management and virtual NIC ports, as real nodes report them beside the RDMA rails.

The simulator reports only the rails (``mlx5_0..7``, 400 Gb/s, carrying the
job's collectives). A real node also reports its front-end Ethernet (``eth0``,
100 or 200 Gb/s depending on the node type, little and bursty traffic: data,
logging, checkpoints), a management port (``eno1``, 1 Gb/s, with the few
hundred rx_errors per window such ports commonly count), a bond, an IPoIB
device (``ib0``: the rails' speed, but hardly any traffic), and virtual devices
(``lo``, ``docker0``, ``veth*``: no link speed, or a nominal one). This helper
appends such records to a contract file, at the timestamps of its NIC samples.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# name -> (link_gbps per node parity or None, median B/s, lognormal sigma, burst probability, burst B/s)
FRONTEND: dict[str, tuple[tuple[float | None, float | None], float, float, float, float]] = {
    "eth0": ((100.0, 200.0), 2e6, 1.2, 0.05, 4e8),      # mixed node types: 100 Gb/s on even nodes, 200 on odd
    "eno1": ((1.0, 1.0), 2e4, 0.8, 0.0, 0.0),           # BMC / management
    "bond0": ((50.0, 50.0), 1e7, 1.0, 0.02, 1e8),
    "ib0": ((400.0, 200.0), 1e6, 1.0, 0.01, 5e7),       # IPoIB: a rail's speed, no collective traffic
    "lo": ((None, None), 2e7, 0.7, 0.0, 0.0),
    "docker0": ((None, None), 1e3, 1.0, 0.0, 0.0),
    "veth3f2a": ((10.0, 10.0), 5e3, 1.0, 0.0, 0.0),
}
MGMT_RX_ERRORS_PER_SAMPLE = 4.0  # ~ 240 rx_errors per 30 s window at 0.5 s samples


def frontend_records(nic_samples: list[dict], seed: int = 0) -> list[dict]:
    """Records for the extra ports of every (job, node) at the timestamps of its rail samples."""
    rng = np.random.default_rng(seed)
    times: dict[tuple[str, str], set[int]] = {}
    for r in nic_samples:
        times.setdefault((r["job"], r["node"]), set()).add(int(r["ts_ns"]))
    out: list[dict] = []
    for ni, ((job, node), ts_set) in enumerate(sorted(times.items())):
        cum = {name: {"rx_errors": 0, "tx_discards": 0} for name in FRONTEND}
        for ts in sorted(ts_set):
            for name, (speeds, med, sig, burst_p, burst) in FRONTEND.items():
                tx, rx = med * rng.lognormal(0.0, sig, 2)
                if burst_p and rng.random() < burst_p:
                    tx += burst * rng.uniform(0.5, 2.0)
                c = cum[name]
                if name == "eno1" or (name == "eth0" and ni % 2 == 1):
                    c["rx_errors"] += int(rng.poisson(MGMT_RX_ERRORS_PER_SAMPLE))
                    c["tx_discards"] += int(rng.poisson(0.3))
                rec = {"type": "nic", "job": job, "node": node, "nic": name, "ts_ns": ts,
                       "tx_Bps": round(float(tx)), "rx_Bps": round(float(rx)), **c}
                speed = speeds[ni % 2]
                if speed is not None:
                    rec["link_gbps"] = speed
                if name != "lo":
                    rec["link_up"] = name != "docker0"
                out.append(rec)
    return out


def add_frontend_ports(src: Path, dst: Path, seed: int = 0) -> int:
    """Copy contract file ``src`` to ``dst`` with the front-end ports of each node written beside
    its rail samples (same timestamps, in file order, as an agent would); returns records added."""
    with open(src) as f:
        nic = [json.loads(line) for line in f if '"type": "nic"' in line or '"type":"nic"' in line]
    pending: dict[tuple[str, str, int], list[dict]] = {}
    for r in frontend_records(nic, seed):
        pending.setdefault((r["job"], r["node"], r["ts_ns"]), []).append(r)
    added = 0
    with open(src) as f, open(dst, "w") as g:
        for line in f:
            g.write(line)
            if '"type": "nic"' in line or '"type":"nic"' in line:
                r = json.loads(line)
                for e in pending.pop((r["job"], r["node"], int(r["ts_ns"])), []):
                    g.write(json.dumps(e) + "\n")
                    added += 1
    return added
