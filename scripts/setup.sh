#!/usr/bin/env bash
# Installs what logcache's build, tests and benchmarks need and the machine lacks.
# Safe to run again: it installs only what is missing.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is not installed; install the Rust toolchain (rustup) first" >&2
    exit 1
fi
for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        echo "setup: cargo $component is missing; run: rustup component add $component" >&2
        exit 1
    fi
done

# Debian packages used by tests and benchmarks: real NBD clients and servers (libnbd-bin has
# nbdinfo, nbdcopy, nbdsh and nbdfuse; qemu-utils has qemu-img, qemu-io and qemu-nbd), fio for
# load, xfsprogs, e2fsprogs and fuse3 for the filesystem tests; python3-matplotlib
# draws the benchmark charts (bench/run runs on Debian's /usr/bin/python3, never pip as root);
# gnutls-bin has certtool and psktool, which the TLS tests use to make certificates and keys;
# libssl-dev and pkg-config build the openssl crate (the TLS stack of the server and client).
APT_PACKAGES=(nbdkit libnbd-bin python3-libnbd fio qemu-utils xfsprogs e2fsprogs fuse3 util-linux python3-matplotlib gnutls-bin libssl-dev pkg-config)
# apt_install [APT-GET OPTIONS...] -- PACKAGES...: installs those of PACKAGES not installed yet.
apt_install() {
    local opts=() missing=() p
    while [ "$1" != "--" ]; do opts+=("$1"); shift; done
    shift
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        local sudo_cmd=""
        [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
        $sudo_cmd apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${opts[@]}" "${missing[@]}"
    fi
}
apt_install -- "${APT_PACKAGES[@]}"

# Ceph, for the RBD backing's integration test (scripts/ceph-up.sh runs a one-node cluster): the
# monitor, the OSD, the command-line clients, and librbd's headers (the logcache-rbd crate links
# librbd). Without recommends: 46 packages instead of several hundred. qemu-block-extra (qemu's
# rbd driver) is not installed: it must match qemu-nbd's version exactly, and Debian stable's
# does not match a qemu-utils from backports (this machine's); the tests use the native route.
apt_install --no-install-recommends -- ceph-mon ceph-osd ceph-common librbd-dev librados-dev

# bench/run runs on /usr/bin/python3, whose packages come from Debian (above).
if [ ! -x /usr/bin/python3 ]; then
    echo "setup: /usr/bin/python3 is not installed; bench/run needs it (apt-get install python3)" >&2
    exit 1
fi
