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
# load, xfsprogs and fuse3 for the filesystem test; python3-matplotlib
# draws the benchmark charts (bench/run runs on Debian's /usr/bin/python3, never pip as root).
APT_PACKAGES=(nbdkit libnbd-bin python3-libnbd fio qemu-utils xfsprogs fuse3 util-linux python3-matplotlib)
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi

# bench/run runs on /usr/bin/python3, whose packages come from Debian (above).
if [ ! -x /usr/bin/python3 ]; then
    echo "setup: /usr/bin/python3 is not installed; bench/run needs it (apt-get install python3)" >&2
    exit 1
fi
