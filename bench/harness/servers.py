"""The servers the experiments measure, each on a Unix socket in the run's temp dir.

- logcache serve (after logcache format), its cache file on /var/tmp or /dev/shm;
- the emulated hard disk: `logcache-bench sim-hdd`;
- nbdkit: null, memory, file, and the cache filter in write-back mode over the nbd plugin;
- qemu-nbd serving a file with O_DIRECT (`--cache=none`).
"""

import json
import os
import re
import subprocess

from .procs import run_tracked

GiB = 1 << 30
MiB = 1 << 20


def parse_size(s):
    if isinstance(s, int):
        return s
    m = re.fullmatch(r"(\d+)([KMGT]?)i?B?", str(s).strip(), re.I)
    if not m:
        raise ValueError(f"bad size {s!r}")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(m.group(1)) * mult


def make_file(path, size, allocate=False):
    """A file of `size` bytes: sparse, or with its blocks allocated (fallocate)."""
    if os.path.exists(path):
        os.unlink(path)
    with open(path, "wb") as f:
        f.truncate(size)
    if allocate:
        subprocess.run(["fallocate", "-l", str(size), path], check=True)


# ---------------------------------------------------------------------------------------------
# The emulated hard disk


def _sim_hdd_help(ctx):
    if not hasattr(ctx, "_sim_hdd_help"):
        rc, out, err = run_tracked([ctx.bench_bin, "sim-hdd", "--help"], timeout=30)
        if rc != 0:
            raise RuntimeError(f"{ctx.bench_bin} has no sim-hdd command (rebuild it): {err.strip()}")
        ctx._sim_hdd_help = out
    return ctx._sim_hdd_help


def hdd_model(ctx):
    """What the emulated disk is, for the report: its parameters (defaults read from
    `logcache-bench sim-hdd --help`, overridden by what the harness passes)."""
    params = {}
    # Clap's help: an option line, then possibly wrapped continuation lines.
    blocks, cur = [], None
    for line in _sim_hdd_help(ctx).splitlines():
        m = re.match(r"\s+(?:-\w, )?--([a-z0-9-]+)\b(.*)", line)
        if m:
            cur = [m.group(1), m.group(2)]
            blocks.append(cur)
        elif cur is not None:
            cur[1] += " " + line.strip()
    for name, text in blocks:
        m = re.search(r"\[default: ([^\],]+)", text)
        if m and name not in ("file", "size", "socket", "listen", "help"):
            params[name] = m.group(1).strip()
    params.update({k: str(v) for k, v in ctx.hdd_options.items()})
    return {"kind": "logcache-bench sim-hdd", "params": params}


def start_sim_hdd(ctx, name, size, path=None):
    """Starts the emulated hard disk (`logcache-bench sim-hdd`) over a sparse file of `size` bytes."""
    size = parse_size(size)
    path = path or os.path.join(ctx.tmp, f"{name}.img")
    sock = os.path.join(ctx.tmp, f"{name}.sock")
    make_file(path, size)
    argv = [ctx.bench_bin, "sim-hdd", "--file", path, "--size", str(size), "--socket", sock]
    for k, v in ctx.hdd_options.items():
        argv += [f"--{k}", str(v)]
    return ctx.start(name, argv, sock)


# ---------------------------------------------------------------------------------------------
# nbdkit


def start_nbdkit(ctx, name, plugin_args, filters=(), env=None):
    sock = os.path.join(ctx.tmp, f"{name}.sock")
    argv = ["nbdkit", "--exit-with-parent", "-f", "-U", sock]
    argv += [f"--filter={f}" for f in filters]
    argv += list(plugin_args)
    return ctx.start(name, argv, sock, env=env)


def start_null(ctx, name, size):
    return start_nbdkit(ctx, name, ["null", str(parse_size(size))])


def start_memory(ctx, name, size):
    return start_nbdkit(ctx, name, ["memory", str(parse_size(size))])


def start_file(ctx, name, path, cache_none=True):
    """nbdkit's file plugin. cache=none keeps the data out of the page cache (each write goes to
    the device), the nearest nbdkit has to fio's direct=1."""
    args = ["file", path]
    if cache_none:
        args.append("cache=none")
    return start_nbdkit(ctx, name, args)


def resident_mib(path):
    """The file's pages in the page cache, MiB (fincore), or None where fincore fails: what of
    nbdkit file's file its reads find in RAM (1.32's `cache=none` reads through the page cache)."""
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return round(int(out.split()[0]) / MiB, 1)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def start_cache_filter(ctx, name, upstream_sock, cache_dir, block_size="4K"):
    """nbdkit's cache filter, cache=writeback, over the nbd plugin connected to upstream_sock.
    Its cache is a temporary file in cache_dir (TMPDIR). Its cache block defaults to 64 KiB (or
    the file system's block), so a 4 KiB write to an uncached block reads the whole block from
    the disk first; block_size (cache-min-block-size) sets it to the 4 KiB the jobs write."""
    os.makedirs(cache_dir, exist_ok=True)
    return start_nbdkit(
        ctx, name, ["nbd", f"socket={upstream_sock}", "cache=writeback",
                    f"cache-min-block-size={block_size}"], filters=["cache"],
        env={"TMPDIR": cache_dir},
    )


def start_qemu_nbd_direct(ctx, name, path):
    """qemu-nbd serving `path` raw with `--cache=none` (O_DIRECT: no page cache) and
    `--aio=io_uring`: the file's own speed through NBD, read the way logcache reads its cache
    device. `-t` keeps it serving after the readiness probe's connection closes; `-e 8` lets
    fio and the probe connect at once."""
    sock = os.path.join(ctx.tmp, f"{name}.sock")
    argv = ["qemu-nbd", "-f", "raw", "-k", sock, "-t", "-e", "8", "--cache=none",
            "--aio=io_uring", path]
    return ctx.start(name, argv, sock)


# ---------------------------------------------------------------------------------------------
# logcache


class Logcache:
    """A formatted cache file and the `logcache serve` process in front of a backing device."""

    def __init__(self, ctx, name, cache_path, cache_size, backing, segment_size=None, sets=(),
                 allocate=False):
        self.ctx = ctx
        self.name = name
        self.cache_path = cache_path
        self.cache_size = parse_size(cache_size)
        self.backing = backing
        self.segment_size = segment_size
        self.sets = list(sets)
        self.allocate = allocate
        self.sock = os.path.join(ctx.tmp, f"{name}.sock")
        self.control = os.path.join(ctx.tmp, f"{name}.ctl")
        self.proc = None
        self.format_seconds = None

    @property
    def uri(self):
        return f"nbd+unix:///?socket={self.sock}"

    def create_cache_file(self):
        make_file(self.cache_path, self.cache_size, allocate=self.allocate)

    def format(self):
        argv = [self.ctx.bin, "format", "--cache", self.cache_path, "--backing", self.backing,
                "--force"]
        if self.segment_size:
            argv += ["--segment-size", str(self.segment_size)]
        self.format_seconds = self.ctx.run_checked(argv, timeout=600)
        return self.format_seconds

    def serve_argv(self):
        argv = [self.ctx.bin, "serve", "--cache", self.cache_path, "--backing", self.backing,
                "--socket", self.sock, "--control", self.control]
        for s in self.sets:
            argv += ["--set", s]
        return argv

    def serve(self, timeout=600):
        self.proc = self.ctx.start(self.name, self.serve_argv(), self.sock, timeout=timeout)
        return self.proc

    def start_fresh(self, recreate_file=False):
        """Ends serve if running (SIGKILL: its contents are thrown away), formats an empty cache
        and serves it."""
        self.stop(kill=True)
        if recreate_file or not os.path.exists(self.cache_path):
            self.create_cache_file()
        self.format()
        return self.serve()

    def stop(self, kill=False):
        if self.proc is not None:
            if kill:
                self.ctx.procs.kill(self.proc)
            else:
                self.ctx.procs.stop(self.proc, timeout=120)
            self.proc = None

    def remove(self):
        self.stop(kill=True)
        if os.path.exists(self.cache_path):
            os.unlink(self.cache_path)

    def status(self):
        rc, out, err = run_tracked([self.ctx.bin, "status", "--control", self.control, "--json"],
                                   timeout=60)
        if rc != 0:
            raise RuntimeError(f"logcache status failed: {err}")
        return json.loads(out)

    def set(self, *kv):
        self.ctx.run_checked([self.ctx.bin, "set", "--control", self.control, *kv], timeout=3600)

    def drain(self):
        return self.ctx.run_checked([self.ctx.bin, "drain", "--control", self.control],
                                    timeout=3600)
