"""Starting, watching and stopping the processes a benchmark needs.

Every child is started in its own session (so a Ctrl-C typed at the terminal reaches only the
harness, which then stops the children in order) and with PR_SET_PDEATHSIG=SIGKILL (so a child
never outlives a harness that was itself killed). `Procs.stop_all()` runs on normal exit, on an
exception and on SIGINT/SIGTERM (see harness.main).
"""

import ctypes
import os
import shlex
import signal
import subprocess
import time

_PR_SET_PDEATHSIG = 1
try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover
    _libc = None


def _child_setup():
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ProcError(RuntimeError):
    pass


class Proc:
    def __init__(self, name, argv, popen, log_path, socket_path=None):
        self.name = name
        self.argv = argv
        self.popen = popen
        self.log_path = log_path
        self.socket = socket_path

    @property
    def pid(self):
        return self.popen.pid

    @property
    def uri(self):
        return f"nbd+unix:///?socket={self.socket}"

    def alive(self):
        return self.popen.poll() is None

    def log_tail(self, n=20):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def command(self):
        return shlex.join(self.argv)


class Procs:
    """The set of long-running children (servers) of one harness run."""

    def __init__(self, logdir, log=print):
        self.logdir = logdir
        self.log = log
        self.procs = []
        self.counter = 0
        os.makedirs(logdir, exist_ok=True)

    def start(self, name, argv, socket_path=None, env=None, timeout=60):
        """Starts argv; if socket_path is given, waits until it accepts a connection."""
        self.counter += 1
        log_path = os.path.join(self.logdir, f"{self.counter:03d}-{name}.log")
        if socket_path and os.path.exists(socket_path):
            os.unlink(socket_path)
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        logf = open(log_path, "wb")
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
            preexec_fn=_child_setup,
        )
        logf.close()
        p = Proc(name, list(argv), popen, log_path, socket_path)
        self.procs.append(p)
        if socket_path:
            self.wait_socket(p, timeout)
        return p

    def wait_socket(self, p, timeout):
        deadline = time.monotonic() + timeout
        while True:
            if not p.alive():
                raise ProcError(
                    f"{p.name} exited with {p.popen.returncode} before listening on {p.socket}:\n"
                    f"$ {p.command()}\n{p.log_tail()}"
                )
            if os.path.exists(p.socket):
                try:
                    # A full NBD handshake, so the server is really serving.
                    r = subprocess.run(
                        ["nbdinfo", "--size", p.uri],
                        capture_output=True,
                        text=True,
                        timeout=max(5, deadline - time.monotonic()),
                    )
                    if r.returncode == 0:
                        return int(r.stdout.strip())
                except (OSError, subprocess.TimeoutExpired):
                    pass
            if time.monotonic() > deadline:
                self.stop(p)
                raise ProcError(f"{p.name} did not listen on {p.socket} within {timeout}s:\n{p.log_tail()}")
            time.sleep(0.05)

    def stop(self, p, sig=signal.SIGTERM, timeout=30):
        """Stops p (SIGTERM, then SIGKILL after timeout); returns its exit code."""
        if p.alive():
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                p.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.log(f"  {p.name} (pid {p.pid}) still running {timeout}s after {sig!s}; SIGKILL")
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.popen.wait()
        if p in self.procs:
            self.procs.remove(p)
        if p.socket and os.path.exists(p.socket):
            try:
                os.unlink(p.socket)
            except OSError:
                pass
        return p.popen.returncode

    def kill(self, p):
        return self.stop(p, sig=signal.SIGKILL, timeout=10)

    def stop_all(self):
        # Newest first: a cache in front of a disk stops before the disk.
        for p in list(reversed(self.procs)):
            try:
                self.stop(p, timeout=10)
            except Exception as e:  # keep stopping the others
                self.log(f"  stopping {p.name}: {e}")


def run_tracked(argv, timeout=None, env=None, capture=True):
    """Runs a short-lived command in its own session; on KeyboardInterrupt it is killed.

    Returns (returncode, stdout, stderr)."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    popen = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.PIPE if capture else subprocess.DEVNULL,
        env=full_env,
        start_new_session=True,
        preexec_fn=_child_setup,
        text=True,
    )
    try:
        out, err = popen.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        popen.wait()
        raise
    return popen.returncode, out or "", err or ""
