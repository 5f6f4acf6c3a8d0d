#!/usr/bin/env bash
# Install Debian's ClickHouse server and client (18.16 on bookworm) when absent.
#
# Why Debian's package: it is the one server build reachable from CI without
# Docker or a third-party apt repository. The SQL in eroica.sinks.clickhouse is
# kept to the subset that this old server and current ClickHouse (chdb) share.
#
# Idempotent: does nothing when both the server and the client are present.
# Never starts the system service (policy-rc.d forbids it during the install):
# tests launch their own server with eroica.stack.clickhouse_server.ClickHouseServer.
set -euo pipefail

# Debian puts the server in /usr/sbin, which is not on a normal user's PATH.
have_server() {
    command -v clickhouse-server >/dev/null 2>&1 \
        || [ -x /usr/sbin/clickhouse-server ] || [ -x /usr/bin/clickhouse-server ] || [ -x /usr/bin/clickhouse ]
}

have_client() {
    command -v clickhouse-client >/dev/null 2>&1 || [ -x /usr/bin/clickhouse ]
}

if have_server && have_client; then
    echo "clickhouse-server and clickhouse-client already installed"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

# Keep the package's postinst from starting a system-wide server (no systemd
# in CI containers anyway); policy-rc.d exit code 101 means "action forbidden".
POLICY=/usr/sbin/policy-rc.d
CREATED_POLICY=0
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod +x "$POLICY"
    CREATED_POLICY=1
fi
cleanup() {
    if [ "$CREATED_POLICY" = 1 ]; then
        $SUDO rm -f "$POLICY"
    fi
}
trap cleanup EXIT

$SUDO apt-get update
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    clickhouse-server clickhouse-client

if ! have_server; then
    echo "clickhouse-server was not found after installation" >&2
    exit 1
fi
echo "installed: $(dpkg-query -W -f='${Package} ${Version}' clickhouse-server 2>/dev/null || echo clickhouse-server)"
