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

source "$(dirname "$0")/apt-install.sh"
apt_install clickhouse-server clickhouse-client

if ! have_server; then
    echo "clickhouse-server was not found after installation" >&2
    exit 1
fi
echo "installed: $(dpkg-query -W -f='${Package} ${Version}' clickhouse-server 2>/dev/null || echo clickhouse-server)"
