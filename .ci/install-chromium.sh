#!/usr/bin/env bash
# Install Debian's Chromium when absent: tests/test_report.py renders the HTML
# report in it (headless) to check it loads without console errors and to
# take the screenshot kept under artifacts/.
#
# Idempotent: does nothing when a chromium binary is already on PATH.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    echo "chromium already installed"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

$SUDO apt-get update
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium fonts-dejavu-core

if ! command -v chromium >/dev/null 2>&1; then
    echo "chromium was not found after installation" >&2
    exit 1
fi
echo "installed: $(chromium --version 2>/dev/null || echo chromium)"
