# Sourced by the .ci/install-*.sh scripts: apt_install PACKAGE... installs Debian packages
# without letting their postinst start a system service (policy-rc.d exit 101, "action forbidden";
# no systemd in CI containers anyway): the tests start their own servers on free ports.
apt_install() {
    local sudo="" policy=/usr/sbin/policy-rc.d created=0
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
        $sudo chmod +x "$policy"
        created=1
    fi
    local rc=0
    $sudo apt-get update && $sudo env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "$@" || rc=$?
    if [ "$created" = 1 ]; then
        $sudo rm -f "$policy"
    fi
    return "$rc"
}
