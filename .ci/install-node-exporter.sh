#!/usr/bin/env bash
# Install Debian's Prometheus node_exporter (1.5 on bookworm) when absent.
#
# Why: producers/counters/test_exporter.py runs the exporter bridge
# (eroica agent --from-exporter node=URL) against the real binary, started by
# the test on 127.0.0.1 over a fake /proc and /sys tree. Under CI=1 that test
# fails, not skips, without the binary.
#
# Idempotent: does nothing when the binary is present.
# Never starts the system service (policy-rc.d forbids it during the install):
# the test launches its own exporter on a free port.
set -euo pipefail

have_exporter() {
    command -v prometheus-node-exporter >/dev/null 2>&1 || command -v node_exporter >/dev/null 2>&1 \
        || [ -x /usr/bin/prometheus-node-exporter ]
}

if have_exporter; then
    echo "prometheus-node-exporter already installed"
    exit 0
fi

source "$(dirname "$0")/apt-install.sh"
apt_install prometheus-node-exporter

if ! have_exporter; then
    echo "prometheus-node-exporter was not found after installation" >&2
    exit 1
fi
echo "installed: $(dpkg-query -W -f='${Package} ${Version}' prometheus-node-exporter 2>/dev/null || echo prometheus-node-exporter)"
