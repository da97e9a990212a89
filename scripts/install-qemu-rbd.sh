#!/usr/bin/env bash
# Installs qemu's rbd driver (Debian's qemu-block-extra) at exactly the version of the installed
# qemu-utils, which qemu-nbd requires of its modules. This machine's image carries qemu-utils
# from bookworm-backports; Debian stable's qemu-block-extra (7.2) does not load into it, so the
# matching one is taken from bookworm-backports (added as an apt source when missing).
# Used by the benchmarks of the qemu-nbd route to Ceph RBD; the tests use the native route.
set -euo pipefail

if [ -f /usr/lib/x86_64-linux-gnu/qemu/block-rbd.so ] &&
    [ "$(dpkg-query -W -f='${Version}' qemu-block-extra 2>/dev/null)" = \
        "$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null)" ]; then
    exit 0
fi
version=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null) || {
    echo "install-qemu-rbd: qemu-utils is not installed; run scripts/setup.sh first" >&2
    exit 1
}
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
if [[ $version == *bpo12* ]] && ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo 'deb http://deb.debian.org/debian bookworm-backports main' |
        $sudo_cmd tee /etc/apt/sources.list.d/bookworm-backports.list >/dev/null
fi
$sudo_cmd apt-get update -qq
if ! DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    "qemu-block-extra=$version" >/dev/null; then
    echo "install-qemu-rbd: qemu-block-extra $version (to match qemu-utils) is not available;" \
        "the qemu-nbd route to RBD cannot be measured on this machine" >&2
    exit 1
fi
