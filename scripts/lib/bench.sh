# Shell functions the benchmark scripts share. Sourced, never run:
#   . "$root/scripts/lib/bench.sh"
# Each takes what it needs as arguments (lc_serve_fresh and start_sim_hdd set the one variable
# they name); what waits for a server exits the calling script, its log on stderr, when the
# server is gone or never comes.

# wait_nbd URI PID LOG...: returns once an NBD server answers at URI; exits with the LOGs if
# process PID (the server) is gone first.
wait_nbd() {
    local uri=$1 pid=$2
    shift 2
    until nbdinfo --size "$uri" >/dev/null 2>&1; do
        kill -0 "$pid" 2>/dev/null || { cat "$@" >&2; exit 1; }
        sleep 0.05
    done
}

# wait_socket_file SOCKET LOG: returns once SOCKET exists; exits with LOG after 30 s without.
wait_socket_file() {
    for _ in $(seq 1 300); do [ -S "$1" ] && return 0; sleep 0.1; done
    echo "$(basename "$0" .sh): $1 never appeared:" >&2
    cat "$2" >&2
    exit 1
}

# kill_and_remove DIR PID...: SIGKILLs the PIDs (scratch servers: nothing of theirs is kept),
# waits for the script's children, removes DIR. For an EXIT trap.
kill_and_remove() {
    local dir=$1 p
    shift
    for p in "$@"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}

# lc_bins ROOT: sets bin (LOGCACHE_BIN, else ROOT's release logcache) and bench_bin (the
# logcache-bench beside it), building both in ROOT when either is missing.
lc_bins() {
    bin=${LOGCACHE_BIN:-$1/target/release/logcache}
    bench_bin=$(dirname "$bin")/logcache-bench
    [ -x "$bin" ] && [ -x "$bench_bin" ] ||
        (cd "$1" && cargo build --release -q -p logcache -p logcache-bench)
}

# The dev_t of the file system holding $1 as the kernel's block tracepoints give it:
# (major << 20) | minor (stat's %d is the user-space (major << 8) | minor).
block_tracepoint_dev() {
    local major minor
    read -r major minor < <(stat -c '%d' "$1" | awk '{printf "%d %d\n", int($1 / 256) % 4096, $1 % 256}')
    echo $(((major << 20) | minor))
}

# tracer_workdirs PREFIX BASE: the bpftrace tracers' set-up: a work directory under BASE (the
# cache device's file system: sets dir, and dev, its dev_t as the block tracepoints give it),
# the emulated HDD's under /dev/shm (hdd_dir), an empty pids array, and an EXIT trap that kills
# those pids and removes both.
tracer_workdirs() {
    dir=$(mktemp -d "$2/$1.XXXXXX")
    hdd_dir=$(mktemp -d "/dev/shm/$1-hdd.XXXXXX")
    pids=()
    trap 'kill_and_remove "$dir" "${pids[@]}"; rm -rf "$hdd_dir"' EXIT
    dev=$(block_tracepoint_dev "$dir")
}

# start_sim_hdd BENCH_BIN FILE SIZE SOCKET LOG: an EMULATED 7200 rpm disk (`logcache-bench
# sim-hdd` over the sparse FILE of SIZE) served at SOCKET in the background; sets sim_hdd_pid
# and returns once it answers.
start_sim_hdd() {
    "$1" sim-hdd --file "$2" --size "$3" --socket "$4" >"$5" 2>&1 &
    sim_hdd_pid=$!
    wait_nbd "nbd+unix:///?socket=$4" "$sim_hdd_pid" "$5"
}

# lc_serve_fresh BIN DIR NAME SPEC [SET...]: formats a 4 GiB (sparse) cache DIR/NAME.img anew
# over backing SPEC and serves it with BIN at DIR/NAME.sock (control DIR/NAME.ctl, log
# DIR/NAME.log, appended), the SETs given to serve; sets lc_NAME to its pid once the socket is
# there.
lc_serve_fresh() {
    local bin=$1 dir=$2 name=$3 spec=$4 pid
    shift 4
    rm -f "$dir/$name.img" "$dir/$name.sock"
    truncate -s 4G "$dir/$name.img"
    "$bin" format --force --cache "$dir/$name.img" --backing "$spec" >/dev/null
    "$bin" serve --cache "$dir/$name.img" --backing "$spec" --socket "$dir/$name.sock" \
        --control "$dir/$name.ctl" "$@" >>"$dir/$name.log" 2>&1 &
    pid=$!
    wait_socket_file "$dir/$name.sock" "$dir/$name.log"
    printf -v "lc_$name" '%s' "$pid"
}

# rotate N WORD...: the words from the N-th (mod their count) on, then the rest, one a line:
# round N's order, so no config always goes first.
rotate() {
    local n=$1
    shift
    local words=("$@")
    local i k=${#words[@]}
    for ((i = 0; i < k; i++)); do echo "${words[$(((n + i) % k))]}"; done
}

# rbd_images CONF SIZE IMAGE...: creates each IMAGE of SIZE in pool rbd and writes its first
# 512 MiB once (RBD's first write to an object allocates it; the benchmarks' regions lie there).
rbd_images() {
    local conf=$1 size=$2 img
    shift 2
    for img in "$@"; do
        rbd -c "$conf" create --size "$size" "rbd/$img"
        rbd -c "$conf" bench --io-type write --io-size 4M --io-threads 4 --io-total 512M \
            --io-pattern seq "rbd/$img" >/dev/null
    done
}

# rbd_client_conf CONF OUT LINES: OUT is the cluster's CONF with a [client] section of LINES
# added (fio's rbd engine reads $CEPH_CONF: one file per librbd cache setting).
rbd_client_conf() {
    cp "$1" "$2"
    printf '[client]\n%s\n' "$3" >>"$2"
}
