"""What an experiment gets: the mode, the logcache binary, temp dirs, process control, logging,
and the list of exact commands it ran."""

import os
import shlex
import shutil
import sys
import tempfile
import time

from .procs import Procs, run_tracked


class CommandFailed(RuntimeError):
    pass


class Context:
    def __init__(self, mode, bin_path, log_file=None):
        self.mode = mode
        self.bin = bin_path
        # The benchmark tool (sim-hdd, engine, drain) is built beside the logcache binary.
        self.bench_bin = os.path.join(os.path.dirname(bin_path), "logcache-bench")
        # Scratch space: files that stand for disks go to /var/tmp (the local disk), memory
        # devices to /dev/shm.
        self.tmp = tempfile.mkdtemp(prefix="lcbench.", dir="/var/tmp")
        self.shm = tempfile.mkdtemp(prefix="lcbench.", dir="/dev/shm")
        self.log_file = log_file
        self.procs = Procs(os.path.join(self.tmp, "logs"), log=self.log)
        self.fio_count = 0
        self.commands = []
        # Options passed to every `logcache-bench sim-hdd` (empty: its defaults, the model in
        # crates/testkit/src/hdd.rs).
        self.hdd_options = {}
        self.t0 = time.monotonic()

    # -- logging ---------------------------------------------------------------------------
    def log(self, msg):
        line = f"[{time.monotonic() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        if self.log_file:
            with open(self.log_file, "a") as f:
                f.write(line + "\n")

    # -- commands --------------------------------------------------------------------------
    def redact(self, text):
        """Temp dir paths replaced by $TMP (on /var/tmp) and $SHM (on /dev/shm), the binary by
        its path relative to the repository, so commands read the same from run to run."""
        text = text.replace(self.tmp, "$TMP").replace(self.shm, "$SHM")
        text = text.replace(self.bench_bin, "logcache-bench")
        return text.replace(self.bin, "logcache")

    def record_command(self, argv):
        self.commands.append(self.redact(shlex.join(argv)))

    def begin_experiment(self):
        self.commands = []
        self.fio_count = 0

    def start(self, name, argv, sock, env=None, timeout=120):
        self.record_command(argv)
        return self.procs.start(name, argv, socket_path=sock, env=env, timeout=timeout)

    def run_checked(self, argv, timeout=600, env=None):
        """Runs a short command; returns its wall time in seconds; raises if it fails."""
        self.record_command(argv)
        t = time.monotonic()
        rc, out, err = run_tracked(argv, timeout=timeout, env=env)
        dt = time.monotonic() - t
        if rc != 0:
            raise CommandFailed(f"{shlex.join(argv)} exited {rc}:\n{err[-2000:]}{out[-500:]}")
        self.last_stdout = out
        return dt

    def run_output(self, argv, timeout=600):
        self.record_command(argv)
        rc, out, err = run_tracked(argv, timeout=timeout)
        return rc, out, err

    # -- cleanup ---------------------------------------------------------------------------
    def remove_scratch(self):
        """Deletes an experiment's files (disk images, fio output), keeping the server logs."""
        for d in (self.tmp, self.shm):
            for name in os.listdir(d):
                path = os.path.join(d, name)
                if name == "logs":
                    continue
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass

    def cleanup(self):
        self.procs.stop_all()
        for d in (self.tmp, self.shm):
            shutil.rmtree(d, ignore_errors=True)


def pick(ctx, table):
    """table: {"smoke": x, "quick": y, "full": z} -> the mode's value."""
    return table[ctx.mode]


def eprint(*a):
    print(*a, file=sys.stderr, flush=True)


__all__ = ["Context", "pick", "CommandFailed", "run_tracked", "eprint"]
