#!/usr/bin/env bash
# Install Debian's Prometheus server and promtool (2.42 on bookworm) when absent.
#
# Why: tests/test_prometheus.py checks the shipped rules with `promtool check rules`
# and `promtool test rules` (deploy/prometheus/), and runs a real Prometheus against
# a running `eroica up` stack through the file_sd targets file the stack writes.
# Under CI=1 those tests fail, not skip, without the binaries.
#
# Idempotent: does nothing when both binaries are present.
# Never starts the system service (policy-rc.d forbids it during the install):
# the test launches its own Prometheus on a free port with a temporary TSDB.
set -euo pipefail

have_prometheus() {
    command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1
}

if have_prometheus; then
    echo "prometheus already installed"
    exit 0
fi

source "$(dirname "$0")/apt-install.sh"
apt_install prometheus

if ! have_prometheus; then
    echo "prometheus or promtool was not found after installation" >&2
    exit 1
fi
echo "installed: $(dpkg-query -W -f='${Package} ${Version}' prometheus 2>/dev/null || echo prometheus)"
