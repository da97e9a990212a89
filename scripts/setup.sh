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
# load, xfsprogs and fuse3 for the filesystem test.
APT_PACKAGES=(nbdkit libnbd-bin python3-libnbd fio qemu-utils xfsprogs fuse3 util-linux)
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

# Python packages the benchmark harness (bench/run) needs, for the python3 on PATH.
if ! command -v python3 >/dev/null 2>&1; then
    echo "setup: python3 is not installed; bench/run needs it" >&2
    exit 1
fi
if ! python3 -c 'import matplotlib' >/dev/null 2>&1; then
    python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/../bench/requirements.txt" ||
        python3 -m pip install -q --disable-pip-version-check --break-system-packages \
            -r "$(dirname "$0")/../bench/requirements.txt"
fi
