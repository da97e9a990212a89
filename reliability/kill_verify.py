#!/usr/bin/python3
"""Process crashes, verified: SIGKILL `logcache serve` at random moments, restart it with the
same command, and check every flushed write.

Each cycle drives load through NBD with libnbd's async API (many requests in flight on one or
more connections, 4 KiB block writes of 1-16 blocks, some unaligned 512-byte-sector writes,
some FUA writes, TRIM and write-zeroes of blocks or sectors, flushes now and then, reads that
are checked on the fly), sometimes runs `logcache drain`, a mode switch (`set
cache_mode=write-through` and/or `=write-around`, then back to `write-back`) or
`set writeback_threshold_percent=0` at the same time, then SIGKILLs the server: during writes,
with a flush in flight, during writeback (idle or forced), during drain or a mode switch. In
some cycles the restarted server is killed again while it recovers (before or just after its
socket appears). Then it restarts with the same command, and every block of the region is read
and checked:

* Every 512-byte sector written carries a stamp: (sector number, unique write id) and a CRC of
  the rest, plus filler derived from both, so a sector's content names exactly the write that
  produced it (block number = sector number / 8).
* A sector must hold one of the versions written to it at or after its newest *durable* version
  (a write acknowledged before a flush that then completed was issued, on any connection, or a
  FUA write that was acknowledged), the durable version included. If no version is durable: the
  baseline (what the previous verification read; zeros at first) or any version written since.
* A write is atomic within each 4 KiB block it touches (the engine's durability unit is the
  block): if one sector of a block shows write W, every other sector of that block W covered
  shows W or a later write to that sector, never older data.
* Blocks not written in the cycle must read exactly as before.
* Never data from another sector or block, never a write not issued to that sector, never
  garbage.
* A write-zeroes is a version that reads as zeros. A TRIM is a hint: as a version it allows
  zeros or any data written to that sector before it; a sector verified as a value only a TRIM
  allowed stays trimmed (across cycles) until a later version is read there.

The content read becomes the next cycle's baseline. Exit status: 0 when every cycle verified
without a violation, 1 on a violation, an I/O error while the server was healthy, a server that
failed to restart, or a failed final check.

Run it with /usr/bin/python3: the `nbd` module (Debian's python3-libnbd) exists only for the
system interpreter. Seeded: the seed and parameters are printed first; `--seed N` with the same
parameters replays the same sequence of decisions (kill timing still depends on the machine).
"""

import argparse
import array
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
import zlib

try:
    import nbd
except ImportError:
    sys.exit(
        "kill_verify: cannot import the nbd module (python3-libnbd); run scripts/setup.sh "
        "and run this script with /usr/bin/python3"
    )

SECTOR = 512
BLOCK = 4096
SPB = BLOCK // SECTOR  # sectors per block
MAGIC = b"LCkv"
FILL = SECTOR - 24  # magic(4) crc(4) sector(8) write id(8), then filler
POOL = 1 << 16
ZERO_SECTOR = bytes(SECTOR)
ZERO_BLOCK = bytes(BLOCK)
MIB = 1 << 20

# serve's line after recovering from an unclean stop.
RECOVERED = re.compile(
    r"recovered after an unclean stop in ([0-9.]+) s: (\d+) chunks replayed, (\d+) discarded"
)

SCENARIOS = {
    # name: weight
    "load": 3,  # kill during writes, reads and flushes
    "flush": 2,  # kill right after issuing a flush (and FUA writes)
    "idle-writeback": 1,  # stop the load, kill while idle writeback runs at full speed
    "force-writeback": 2,  # set writeback_threshold_percent=0 during load, then kill
    "drain": 2,  # logcache drain during (or after) load, kill while it runs
    "mode-switch": 2,  # set cache_mode=write-through then write-back during load, kill
}


class Failure(Exception):
    """The run cannot go on: the server did not restart, exited on its own, or similar."""


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return 0


def log(msg):
    print(msg, flush=True)


# ------------------------------------------------------------------------------------------
# Stamped content


class Stamps:
    """Generates and recognises stamped sectors; content depends only on (sector, write id)."""

    def __init__(self, seed):
        self.pool = random.Random(seed ^ 0x5EED5EED).randbytes(POOL + SECTOR)

    def sector(self, s, wid):
        off = (wid * 2654435761 + s * 40503) % POOL
        rest = struct.pack("<QQ", s, wid) + self.pool[off : off + FILL]
        return MAGIC + struct.pack("<I", zlib.crc32(rest)) + rest

    def data(self, start, n, wid):
        return b"".join(self.sector(s, wid) for s in range(start, start + n))

    def identify(self, buf, off, s):
        """What the sector at buf[off:off+512] holds, expected to be sector `s`: (write id, None)
        for a valid stamp of s (0 for zeros), else (None, description)."""
        raw = bytes(buf[off : off + SECTOR])
        if raw[:4] == MAGIC:
            _crc, s2, wid = struct.unpack_from("<IQQ", raw, 4)
            if raw == self.sector(s2, wid):
                if s2 == s:
                    return wid, None
                return None, f"sector {s2} (block {s2 // SPB}) of write {wid}: misplaced"
            return None, f"a stamp naming sector {s2} write {wid} with a bad checksum (torn)"
        if raw == ZERO_SECTOR:
            return 0, None
        return None, "unstamped non-zero data (garbage)"


# ------------------------------------------------------------------------------------------
# The server process


class Server:
    def __init__(self, args, workdir):
        self.bin = args.bin
        self.cache = os.path.join(workdir, "cache.img")
        self.backing = os.path.join(workdir, "backing.img")
        self.sock = os.path.join(workdir, "nbd.sock")
        self.ctl = os.path.join(workdir, "ctl.sock")
        self.log_path = os.path.join(workdir, "serve.log")
        self.cmd = [
            self.bin,
            "serve",
            "--cache",
            self.cache,
            "--backing",
            self.backing,
            "--socket",
            self.sock,
            "--control",
            self.ctl,
        ]
        for kv in args.set:
            self.cmd += ["--set", kv]
        self.proc = None
        self.log_offset = 0
        self.started_at = 0.0
        self.incarnations = 0

    def format(self, cache_bytes, backing_bytes, segment_size):
        for path, size in ((self.cache, cache_bytes), (self.backing, backing_bytes)):
            with open(path, "wb") as f:
                f.truncate(size)
        out = subprocess.run(
            [
                self.bin,
                "format",
                "--cache",
                self.cache,
                "--backing",
                self.backing,
                "--segment-size",
                segment_size,
            ],
            capture_output=True,
            check=False,
            text=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise Failure(f"logcache format failed: {out.stderr.strip()}")
        return out.stdout.strip()

    def start(self):
        assert self.proc is None
        self.incarnations += 1
        with open(self.log_path, "ab") as logf:
            logf.write(
                f"=== kill_verify: start #{self.incarnations}: {' '.join(self.cmd)}\n".encode()
            )
            logf.flush()
            self.log_offset = logf.tell()
            self.started_at = time.monotonic()
            self.proc = subprocess.Popen(
                self.cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT
            )

    def log_since_start(self):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines=30):
        try:
            with open(self.log_path, "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def announced_ready(self):
        return "logcache: serving" in self.log_since_start()

    def check_alive(self, what):
        if self.proc is not None and self.proc.poll() is not None:
            rc = self.proc.returncode
            self.proc = None
            raise Failure(
                f"logcache serve exited on its own (status {rc}) {what}; log:\n{self.log_tail()}"
            )

    def kill(self):
        """SIGKILL; returns False if it had already exited on its own."""
        assert self.proc is not None
        alive = self.proc.poll() is None
        if alive:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        rc = self.proc.returncode
        self.proc = None
        return alive, rc

    def wait_ready(self, timeout):
        """Connects to the NBD socket as soon as it accepts; returns (handle, seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive("while starting")
            h = nbd.NBD()
            try:
                h.connect_unix(self.sock)
                return h, time.monotonic() - self.started_at
            except nbd.Error:
                del h
            if time.monotonic() > deadline:
                raise Failure(
                    f"logcache serve did not accept NBD connections within {timeout} s; "
                    f"log:\n{self.log_tail()}"
                )
            time.sleep(0.002)

    def connect(self):
        h = nbd.NBD()
        h.connect_unix(self.sock)
        return h

    def stop(self, timeout=60):
        """SIGTERM and wait: a clean stop."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            raise Failure(f"logcache serve did not stop within {timeout} s of SIGTERM")
        rc = self.proc.returncode
        self.proc = None
        return rc

    def control(self, request, timeout=3.0):
        """One request on the control socket (what `logcache status` does); None on failure."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(self.ctl)
                s.sendall(json.dumps(request).encode() + b"\n")
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = s.recv(1 << 16)
                    if not chunk:
                        return None
                    buf += chunk
                return json.loads(buf)
        except (OSError, ValueError):
            return None

    def status(self):
        reply = self.control({"cmd": "status"})
        if reply and reply.get("ok"):
            return reply["status"]
        return None

    def admin(self, argv):
        """Starts `logcache <argv> --control CTL` in the background."""
        return subprocess.Popen(
            [self.bin] + argv[:1] + ["--control", self.ctl] + argv[1:],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )


class Admin:
    """A sequence of admin commands run one after another, polled from the load loop."""

    def __init__(self, server, steps):
        self.server = server
        self.steps = list(steps)
        self.proc = None
        self.current = None
        self.started = 0.0
        self.done = []  # (argv, returncode, stderr, seconds)

    def _finish(self):
        secs = time.monotonic() - self.started
        self.done.append((self.current, self.proc.returncode, self.proc.stderr.read(), secs))
        self.proc.stderr.close()
        self.proc = None

    def step(self):
        if self.proc is not None and self.proc.poll() is not None:
            self._finish()
        if self.proc is None and self.steps:
            self.current = self.steps.pop(0)
            self.started = time.monotonic()
            self.proc = self.server.admin(self.current)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def describe_running(self):
        return " ".join(self.current) if self.running() else None

    def reap(self, timeout=30):
        """After the kill: the commands fail once the control socket closes."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._finish()
        self.steps = []


# ------------------------------------------------------------------------------------------
# What was written, acknowledged and flushed


# Kinds of operation that change the disk. Every one gets a write id, in issue order.
WRITE, ZERO, TRIM = 0, 1, 2
KIND_NAME = {WRITE: "W", ZERO: "Z", TRIM: "T"}


class Write:
    """A write, a write-zeroes (reads as zeros) or a TRIM (a hint: the sector may then read
    zeros or any data written to it before the TRIM, until written again)."""

    __slots__ = ("ack", "failed", "fua", "kind", "n", "start", "wid")

    def __init__(self, wid, start, n, fua, kind=WRITE):
        self.wid = wid
        self.start = start  # first sector
        self.n = n  # sectors
        self.fua = fua
        self.kind = kind
        self.ack = None  # acknowledgement sequence number
        self.failed = None

    def covers(self, s):
        return self.start <= s < self.start + self.n

    def blocks(self):
        return range(self.start // SPB, (self.start + self.n - 1) // SPB + 1)


class BufferPool:
    """Request buffers, reused. libnbd 1.14's Python binding never drops the reference
    aio_pwrite takes on its buffer, nor frees an nbd.Buffer given to aio_pread, so a fresh buffer
    per request leaks all of it (the first soak reached 24 GB and was OOM-killed after 420
    cycles). Buffers are kept by size and reused; one in flight when its connection died
    returns only once that handle is gone (it holds a weak reference to check)."""

    def __init__(self):
        self.free = {}  # size -> [nbd.Buffer]
        self.orphans = []  # (weakref to a dead handle, [buffers it may still name])
        self.allocated = 0

    def get(self, size):
        lst = self.free.get(size)
        if lst:
            return lst.pop()
        if self.orphans:
            self.adopt()
            lst = self.free.get(size)
            if lst:
                return lst.pop()
        self.allocated += size
        return nbd.Buffer.from_buffer(bytearray(size))

    def put(self, buf):
        self.free.setdefault(len(buf), []).append(buf)

    def orphan(self, handle, bufs):
        self.orphans.append((weakref.ref(handle), bufs))

    def adopt(self):
        keep = []
        for ref, bufs in self.orphans:
            if ref() is None:
                for b in bufs:
                    self.put(b)
            else:
                keep.append((ref, bufs))
        self.orphans = keep


class Conn:
    def __init__(self, h, index):
        self.h = h
        self.index = index
        self.inflight = {}  # cookie -> op
        self.alive = True
        self.error = None


class Cycle:
    """Everything one cycle issued, in the order it issued it."""

    def __init__(self, lie=False):
        self.lie = lie
        self.writes = {}  # wid -> Write
        self.versions = {}  # block -> [wid] in issue order (never two in flight per block)
        self.ack_seq = 0
        self.durable_ack = 0  # every write with ack <= this is durable
        self.flushes_issued = 0
        self.flushes_done = 0
        self.reads_checked = 0
        self.errors = []  # I/O errors while the server was healthy

    def durable(self, w):
        if self.lie:  # --self-test: pretend every acknowledged write was flushed
            return w.ack is not None
        return w.ack is not None and (w.fua or w.ack <= self.durable_ack)

    def tag(self, wid):
        w = self.writes[wid]
        state = "durable" if self.durable(w) else ("acked" if w.ack is not None else "unacked")
        fua = ",fua" if w.fua else ""
        return f"{KIND_NAME[w.kind]}{wid}[sectors {w.start}+{w.n},{state}{fua}]"


# ------------------------------------------------------------------------------------------
# The verifier


class Verifier:
    def __init__(self, args):
        self.args = args
        self.seed = args.seed
        self.rng = random.Random(args.seed)
        self.stamps = Stamps(args.seed)
        self.region_blocks = args.region_mib * MIB // BLOCK
        self.region_sectors = self.region_blocks * SPB
        self.baseline = bytearray(self.region_blocks * BLOCK)  # zeros after format
        self.next_wid = 1
        self.forget_ops()
        self.pool = BufferPool()
        # How long these commands have been taking (seconds, moving average), to aim kills.
        self.admin_secs = {"drain": 0.5}
        self.violations = []
        self.problems = []  # not violations of the contract, but a failed run all the same
        self.s = {  # totals
            "cycles": 0,
            "kills": 0,
            "recovery_kills": 0,
            "recovery_kills_before_ready": 0,
            "recovery_kills_after_ready": 0,
            "kills_with_requests_in_flight": 0,
            "kills_with_flush_in_flight": 0,
            "kills_during_writeback": 0,
            "kills_during_admin": {},
            "kills_in_write_through": 0,
            "scenarios": {},
            "writes_issued": 0,
            "writes_acked": 0,
            "writes_durable": 0,
            "writes_unaligned": 0,
            "writes_fua": 0,
            "trims_issued": 0,
            "trims_unaligned": 0,
            "zeroes_issued": 0,
            "zeroes_unaligned": 0,
            "kills_in_write_around": 0,
            "sectors_read_trimmed": 0,
            "writes_verified": 0,
            "durable_writes_verified": 0,
            "flushes_issued": 0,
            "flushes_completed": 0,
            "reads_checked_online": 0,
            "blocks_verified": 0,
            "blocks_written_verified": 0,
            "sectors_checked": 0,
            "sectors_newer_than_durable": 0,
            "recovered_chunks_replayed": 0,
            "recovered_chunks_discarded": 0,
            "restart_seconds_max": 0.0,
            "recovery_seconds_max": 0.0,
            "admin_commands": 0,
            "admin_failed_while_serving": 0,
            "violations": 0,
            "rss_mib_max": 0,
        }

    # --- what every operation of the run did (for the TRIM rule) ---------------------------

    def forget_ops(self):
        # Per write id (compact: a run issues millions): kind, first sector, sectors.
        self.op_kind = array.array("B", [255])
        self.op_start = array.array("I", [0])
        self.op_n = array.array("I", [0])
        self.op_cycle = array.array("I", [0])
        self.op_state = array.array("B", [0])  # 0 unacknowledged, 1 acknowledged, 2 durable
        self.cycle_index = 0
        # Per sector: 0, or the id of the TRIM whose rule still holds there (the sector was
        # trimmed and verification read a value only that rule allowed; cleared once it reads a
        # value written after it).
        self.trimmed = array.array("I", [0]) * self.region_sectors

    def remember(self, w):
        while len(self.op_kind) <= w.wid:
            self.op_kind.append(255)
            self.op_start.append(0)
            self.op_n.append(0)
            self.op_cycle.append(0)
            self.op_state.append(0)
        self.op_kind[w.wid], self.op_start[w.wid], self.op_n[w.wid] = w.kind, w.start, w.n
        self.op_cycle[w.wid] = self.cycle_index

    def run_history(self, s, last=12):
        """The run's last operations that reached sector s (for a violation's report)."""
        out = []
        for wid in range(len(self.op_kind) - 1, 0, -1):
            if self.op_kind[wid] != 255 and self.op_start[wid] <= s < self.op_start[wid] + self.op_n[wid]:
                out.append(
                    f"{KIND_NAME[self.op_kind[wid]]}{wid}[sectors {self.op_start[wid]}+"
                    f"{self.op_n[wid]},cycle {self.op_cycle[wid]},"
                    f"{('unacked', 'acked', 'durable')[self.op_state[wid]]}]"
                )
                if len(out) == last:
                    break
        return out

    def trim_allows(self, s, trim_wid, wid):
        """A sector trimmed by `trim_wid` may read zeros or data written to it before then."""
        if wid == 0:
            return True
        return (
            wid is not None
            and wid < trim_wid
            and wid < len(self.op_kind)
            and self.op_kind[wid] == WRITE
            and self.op_start[wid] <= s < self.op_start[wid] + self.op_n[wid]
        )

    def base_allows(self, s, wid):
        """What a sector no operation of this cycle reached may read: the baseline, or, if a
        TRIM's rule still holds there, what that rule allows."""
        if wid == self.baseline_id(s):
            return True
        t = self.trimmed[s]
        return t != 0 and self.trim_allows(s, t, wid)

    # --- load ---------------------------------------------------------------------------

    def pick_range(self, cyc_params, busy, unaligned):
        rng = self.rng
        hot = rng.random() < cyc_params["p_hot"]
        lo, hi = cyc_params["hot"] if hot else (0, self.region_blocks)
        if unaligned:
            n = rng.randint(1, 24)
            start = rng.randrange(lo * SPB, hi * SPB - n)
            if start % SPB == 0 and n % SPB == 0:
                n -= 1 if n > 1 else 0
                start += 1
            first, last = start // SPB, (start + n - 1) // SPB
        else:
            nb = rng.randint(1, cyc_params["max_blocks"])
            first = rng.randrange(lo, hi - nb)
            last = first + nb - 1
            start, n = first * SPB, nb * SPB
        for b in range(first, last + 1):
            if b in busy:
                return None
        return start, n

    def run_cycle(self, server, conns, index):
        args = self.args
        # The cycle's plan comes from (seed, cycle), so a replay with the same seed makes the
        # same plans even though the number of requests per cycle depends on timing.
        rng = self.rng = random.Random(self.seed * 1_000_003 + index)
        self.cycle_index = index
        t_cycle = time.monotonic()
        cyc = Cycle(lie=args.self_test)
        scenario = rng.choices(list(SCENARIOS), weights=list(SCENARIOS.values()))[0]
        if args.self_test:
            scenario = "load"
        recovery_kills = 0
        if rng.random() < args.recovery_kill_prob:
            recovery_kills = rng.choice((1, 1, 2, 3))
        hot_len = rng.randint(64, 2048)
        hot_start = rng.randrange(0, self.region_blocks - hot_len)
        p = {
            "depth": rng.randint(16, 64),
            "p_flush": rng.choice((0.003, 0.02, 0.05, 0.1)),
            "p_fua": rng.choice((0.0, 0.02, 0.1)),
            "p_unaligned": rng.choice((0.0, 0.1, 0.3)),
            "p_read": rng.choice((0.0, 0.1, 0.3)),
            "p_hot": rng.choice((0.0, 0.5, 0.9)),
            "hot": (hot_start, hot_start + hot_len),
            "max_blocks": rng.choice((1, 4, 16)),
            # TRIM and write-zeroes, of whole blocks or (p_unaligned) any sectors.
            "p_trim": rng.choice((0.0, 0.0, 0.01, 0.05, 0.15)) if args.discards else 0.0,
            "p_zero": rng.choice((0.0, 0.0, 0.01, 0.05, 0.15)) if args.discards else 0.0,
        }
        if args.self_test:  # no flushes, no FUA: what the kill loses was never durable
            p["p_flush"], p["p_fua"], recovery_kills = 0.0, 0.0, 0
            p["p_trim"], p["p_zero"] = 0.0, 0.0
        load_time = rng.uniform(args.load_min, args.load_max)
        kill_after = load_time
        load_stop = load_time
        if args.self_test:  # stop, wait for the acknowledgements, kill (see the load loop)
            kill_after = load_time + 0.5
        admin_steps, admin_at = [], None
        if scenario == "idle-writeback":
            kill_after = load_time + rng.uniform(1.0, 1.8)  # writeback_idle_ms defaults to 1000
        elif scenario == "force-writeback":
            admin_at = rng.uniform(0.0, 0.6) * load_time
            admin_steps = [["set", "writeback_threshold_percent=0"]]
        elif scenario == "drain":
            # Kill within about the time a drain has been taking, so most kills land in one.
            admin_at = rng.uniform(0.0, 0.7) * load_time
            admin_steps = [["drain"]]
            if rng.random() < 0.5:  # let the drain make progress without new writes
                load_stop = admin_at + rng.uniform(0.0, 0.2)
            kill_after = admin_at + rng.uniform(0.0, 1.2) * self.admin_secs["drain"]
        elif scenario == "mode-switch":
            admin_at = rng.uniform(0.0, 0.7) * load_time
            # Leaving write-back drains; write-around sends writes straight to the backing
            # device and drops cached copies.
            modes = rng.choice(
                (
                    ["write-through"],
                    ["write-around"],
                    ["write-through", "write-around"],
                    ["write-around", "write-through"],
                )
                if args.discards
                else (["write-through"],)
            )
            admin_steps = [["set", f"cache_mode={m}"] for m in modes + ["write-back"]]
            est = self.admin_secs.get(" ".join(admin_steps[0]), 0.5)
            if rng.random() < 0.75:  # during the switch to write-through (which drains)
                kill_after = admin_at + rng.uniform(0.0, 1.2) * est
            else:  # in write-through, or while switching back
                kill_after = admin_at + est + rng.uniform(0.0, 1.0)
        s = self.s
        s["scenarios"][scenario] = s["scenarios"].get(scenario, 0) + 1

        # Persisted tunables a killed command may have left behind: put the defaults back
        # unless this cycle's scenario is about them (they stay, for variety, 1 time in 3).
        st = None
        for _ in range(500):  # the control socket comes up just after the NBD socket
            st = server.status()
            if st is not None:
                break
            server.check_alive("before the cycle")
            time.sleep(0.01)
        if st is None:
            raise Failure("the control socket does not answer status")
        tun = st.get("tunables", {})
        fixes = []
        if st.get("mode") != "write-back" and rng.random() < 0.67:
            fixes.append("cache_mode=write-back")
        threshold = str(tun.get("writeback_threshold_percent"))
        if scenario in ("drain", "mode-switch"):
            # Half the time let more dirty data pile up first, so there is more to drain.
            want = rng.choice(("10", "50"))
            if threshold != want:
                fixes.append(f"writeback_threshold_percent={want}")
        elif threshold != "10" and rng.random() < 0.67:
            fixes.append("writeback_threshold_percent=10")
        if fixes:
            out = subprocess.run(
                [args.bin, "set", "--control", server.ctl] + fixes,
                capture_output=True,
                check=False,
                text=True,
                timeout=120,
            )
            if out.returncode != 0:
                self.problems.append(f"cycle {index}: set {fixes} failed: {out.stderr.strip()}")

        if args.verbose:
            log(
                f"cycle {index}: {scenario} load {load_time:.2f}s kill@{kill_after:.2f}s "
                f"recovery kills {recovery_kills} {p}"
            )

        phases = {"prologue": time.monotonic() - t_cycle}
        busy = set()
        admin = Admin(server, admin_steps) if admin_steps else None
        t0 = time.monotonic()
        kill_at = t0 + kill_after
        stop_at = t0 + load_stop
        admin_start = t0 + admin_at if admin_at is not None else None
        pre_sample_at = kill_at - 0.15
        pre_sample = None
        flush_kill_armed = scenario == "flush"

        def issue(conn):
            r = rng.random()
            if r < p["p_flush"]:
                cookie = conn.h.aio_flush()
                conn.inflight[cookie] = ("f", cyc.ack_seq)
                cyc.flushes_issued += 1
                return True
            if r < p["p_flush"] + p["p_read"]:
                rngd = self.pick_range(p, busy, rng.random() < 0.2)
                if rngd is None:
                    return False
                start, n = rngd
                buf = self.pool.get(n * SECTOR)
                cookie = conn.h.aio_pread(buf, start * SECTOR)
                blocks = range(start // SPB, (start + n - 1) // SPB + 1)
                busy.update(blocks)
                conn.inflight[cookie] = ("r", start, n, buf, blocks)
                return True
            r -= p["p_flush"] + p["p_read"]
            kind = WRITE
            if r < p["p_trim"]:
                kind = TRIM
            elif r < p["p_trim"] + p["p_zero"]:
                kind = ZERO
            unaligned = rng.random() < p["p_unaligned"]
            rngd = self.pick_range(p, busy, unaligned)
            if rngd is None:
                return False
            start, n = rngd
            fua = rng.random() < p["p_fua"]
            flags = nbd.CMD_FLAG_FUA if fua else 0
            w = Write(self.next_wid, start, n, fua, kind)
            self.next_wid += 1
            buf = None
            if kind == WRITE:
                buf = self.pool.get(n * SECTOR)
                buf.to_buffer()[:] = self.stamps.data(start, n, w.wid)
                cookie = conn.h.aio_pwrite(buf, start * SECTOR, flags=flags)
            elif kind == TRIM:
                cookie = conn.h.aio_trim(n * SECTOR, start * SECTOR, flags=flags)
            else:
                cookie = conn.h.aio_zero(n * SECTOR, start * SECTOR, flags=flags)
            self.remember(w)
            cyc.writes[w.wid] = w
            for b in w.blocks():
                busy.add(b)
                cyc.versions.setdefault(b, []).append(w.wid)
            conn.inflight[cookie] = ("w", w, buf)
            if kind == TRIM:
                s["trims_issued"] += 1
                s["trims_unaligned"] += 1 if unaligned else 0
            elif kind == ZERO:
                s["zeroes_issued"] += 1
                s["zeroes_unaligned"] += 1 if unaligned else 0
            s["writes_issued"] += 1
            s["writes_unaligned"] += 1 if unaligned else 0
            s["writes_fua"] += 1 if fua else 0
            return True

        def complete(op, ok, err):
            kind = op[0]
            if kind == "w":
                w = op[1]
                if op[2] is not None:
                    self.pool.put(op[2])
                for b in w.blocks():
                    busy.discard(b)
                if ok:
                    cyc.ack_seq += 1
                    w.ack = cyc.ack_seq
                else:
                    w.failed = str(err)
                    cyc.errors.append(f"write {cyc.tag(w.wid)}: {err}")
            elif kind == "f":
                if ok:
                    cyc.durable_ack = max(cyc.durable_ack, op[1])
                    cyc.flushes_done += 1
                else:
                    cyc.errors.append(f"flush: {err}")
            else:
                _, start, n, buf, blocks = op
                busy.difference_update(blocks)
                data = buf.to_bytearray()
                self.pool.put(buf)
                if ok:
                    self.check_read(cyc, index, scenario, start, n, data)
                else:
                    cyc.errors.append(f"read of sectors {start}+{n}: {err}")

        def pump(timeout_ms):
            poller = select.poll()
            by_fd = {}
            for c in conns:
                if not c.alive:
                    continue
                d = c.h.aio_get_direction()
                ev = 0
                if d & nbd.AIO_DIRECTION_READ:
                    ev |= select.POLLIN
                if d & nbd.AIO_DIRECTION_WRITE:
                    ev |= select.POLLOUT
                if ev:
                    fd = c.h.aio_get_fd()
                    poller.register(fd, ev)
                    by_fd[fd] = c
            if by_fd:
                events = poller.poll(timeout_ms)
            else:
                time.sleep(timeout_ms / 1000)
                events = []
            for fd, rev in events:
                c = by_fd[fd]
                try:
                    if rev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                        c.h.aio_notify_read()
                    elif rev & select.POLLOUT:
                        c.h.aio_notify_write()
                except nbd.Error as e:
                    c.alive, c.error = False, str(e)
            for c in conns:
                while c.inflight:
                    try:
                        cookie = c.h.aio_peek_command_completed()
                    except nbd.Error:
                        break
                    if cookie <= 0:
                        break
                    try:
                        c.h.aio_command_completed(cookie)
                        ok, err = True, None
                    except nbd.Error as e:
                        ok, err = False, e
                    complete(c.inflight.pop(cookie), ok, err)

        def inflight():
            return sum(len(c.inflight) for c in conns)

        while True:
            now = time.monotonic()
            if now >= kill_at:
                break
            if args.self_test and now >= stop_at and not inflight():
                break  # everything acknowledged, the newest writes still in RAM: kill now
            if admin is not None:
                if admin_start is not None and now >= admin_start:
                    admin_start = None
                    admin.step()
                elif admin_start is None:
                    admin.step()
            if pre_sample is None and now >= pre_sample_at:
                pre_sample = server.status() or {}
            if now < stop_at:
                misses = 0
                while inflight() < p["depth"] and misses < 4:
                    live = [c for c in conns if c.alive]
                    if not live:
                        break
                    c = rng.choice(live)
                    try:
                        if not issue(c):
                            misses += 1
                    except nbd.Error as e:  # the connection broke: the server may have died
                        c.alive, c.error = False, str(e)
            if not any(c.alive for c in conns):
                server.check_alive("during the load")
                raise Failure(f"every NBD connection failed: {[c.error for c in conns]}")
            pump(max(1, min(20, int((kill_at - now) * 1000))))

        if flush_kill_armed:
            # Put a flush (and a few FUA writes) on the wire, then kill within ~2 ms.
            live = [c for c in conns if c.alive]
            if live:
                c = rng.choice(live)
                try:
                    for _ in range(rng.randint(0, 3)):
                        p["p_fua"], p["p_flush"], p["p_read"] = 1.0, 0.0, 0.0
                        issue(c)
                    cookie = c.h.aio_flush()
                    c.inflight[cookie] = ("f", cyc.ack_seq)
                    cyc.flushes_issued += 1
                    pump(0)
                except nbd.Error as e:
                    c.alive, c.error = False, str(e)
                time.sleep(rng.uniform(0, 0.002))

        # The kill. Note what was going on.
        phases["load"] = time.monotonic() - t0
        t_kill = time.monotonic()
        sample = server.status() or {}
        if admin is not None:
            admin.step()
            admin.steps = []  # start nothing new
            finished_while_serving = list(admin.done)
            for argv, rc, _err, secs in finished_while_serving:
                key = " ".join(argv)
                if rc == 0 and (key in self.admin_secs or key.startswith("set cache_mode=")):
                    old = self.admin_secs.get(key, 0.5)
                    self.admin_secs[key] = 0.7 * old + 0.3 * secs
        admin_running = admin.describe_running() if admin else None
        flush_in_flight = any(op[0] == "f" for c in conns for op in c.inflight.values())
        requests_in_flight = inflight()
        alive, _rc = server.kill()
        if not alive:
            raise Failure(f"logcache serve exited on its own during cycle {index}")
        s["kills"] += 1
        s["kills_with_requests_in_flight"] += 1 if requests_in_flight else 0
        s["kills_with_flush_in_flight"] += 1 if flush_in_flight else 0
        wb_now = sample.get("writeback_blocks")
        wb_before = (pre_sample or {}).get("writeback_blocks")
        if wb_now is not None and wb_before is not None and wb_now > wb_before:
            s["kills_during_writeback"] += 1
        if sample.get("mode") == "write-through":
            s["kills_in_write_through"] += 1
        if sample.get("mode") == "write-around":
            s["kills_in_write_around"] += 1
        if admin_running:
            k = admin_running.replace(f"--control {server.ctl} ", "")
            s["kills_during_admin"][k] = s["kills_during_admin"].get(k, 0) + 1
        for c in conns:
            c.alive = False
            bufs = [op[2] if op[0] == "w" else op[3] for op in c.inflight.values() if op[0] != "f"]
            bufs = [b for b in bufs if b is not None]  # TRIM and write-zeroes carry none
            self.pool.orphan(c.h, bufs)
        conns.clear()
        if admin is not None:
            admin.reap()
            s["admin_commands"] += len(admin.done)
            # Commands interrupted by the kill fail, as they should; one that failed while the
            # server was healthy is a problem.
            for argv, rc, err, _secs in finished_while_serving:
                if rc != 0:
                    s["admin_failed_while_serving"] += 1
                    self.problems.append(
                        f"cycle {index}: logcache {' '.join(argv)} failed: {err.strip()}"
                    )

        phases["kill"] = time.monotonic() - t_kill
        t_rk = time.monotonic()
        # Kills during recovery.
        for _ in range(recovery_kills):
            server.start()
            time.sleep(rng.uniform(0, 1.3 * self.ready_estimate))
            server.check_alive("during recovery")
            ready = server.announced_ready()
            server.kill()
            s["recovery_kills"] += 1
            s["kills"] += 1
            s["recovery_kills_after_ready" if ready else "recovery_kills_before_ready"] += 1

        phases["recovery_kills"] = time.monotonic() - t_rk
        # Restart with the same command and verify.
        server.start()
        h, secs = server.wait_ready(args.restart_timeout)
        self.ready_estimate = 0.7 * self.ready_estimate + 0.3 * secs
        s["restart_seconds_max"] = max(s["restart_seconds_max"], secs)
        m = RECOVERED.search(server.log_since_start())
        rec_secs = 0.0
        if m:
            rec_secs = float(m.group(1))
            s["recovery_seconds_max"] = max(s["recovery_seconds_max"], rec_secs)
            s["recovered_chunks_replayed"] += int(m.group(2))
            s["recovered_chunks_discarded"] += int(m.group(3))
        conns.append(Conn(h, 0))
        for i in range(1, args.connections):
            conns.append(Conn(server.connect(), i))

        for w in cyc.writes.values():
            s["writes_acked"] += 1 if w.ack is not None else 0
            s["writes_durable"] += 1 if cyc.durable(w) else 0
        s["flushes_issued"] += cyc.flushes_issued
        s["flushes_completed"] += cyc.flushes_done
        s["reads_checked_online"] += cyc.reads_checked
        for e in cyc.errors[:5]:
            self.problems.append(f"cycle {index}: I/O error while serving: {e}")

        before = len(self.violations)
        tv = time.monotonic()
        self.verify_region(server, cyc, index, scenario)
        tv = time.monotonic() - tv
        s["cycles"] += 1
        found = len(self.violations) - before
        line = (
            f"cycle {index}: {scenario}{f' +recovery-kill x{recovery_kills}' if recovery_kills else ''}"
            f" writes {len(cyc.writes)} (acked {sum(1 for w in cyc.writes.values() if w.ack)},"
            f" durable {sum(1 for w in cyc.writes.values() if cyc.durable(w))})"
            f" flushes {cyc.flushes_done}/{cyc.flushes_issued}"
            f" in-flight-at-kill {requests_in_flight}"
            f"{' during ' + admin_running if admin_running else ''}"
            f" restart {secs:.2f}s (recovery {rec_secs:.2f}s) verify {tv:.2f}s cycle {time.monotonic() - t_cycle:.2f}s"
            f" violations {found}"
        )
        if args.verbose:
            line += " " + " ".join(f"{k}={v:.2f}" for k, v in phases.items())
        if args.verbose or found or cyc.errors:
            log(line)

    # --- checks -----------------------------------------------------------------------------

    def baseline_id(self, s):
        wid, _ = self.stamps.identify(self.baseline, s * SECTOR, s)
        return wid

    def violation(self, cyc, index, scenario, kind, s, found, allowed, history):
        v = {
            "cycle": index,
            "seed": self.seed,
            "scenario": scenario,
            "kind": kind,
            "block": s // SPB,
            "sector": s,
            "found": found,
            "allowed": allowed,
            "history": history,
            "run_history": self.run_history(s),
            "trimmed_by": self.trimmed[s],
        }
        self.violations.append(v)
        self.s["violations"] += 1
        if len(self.violations) <= self.args.max_reports:
            log(f"VIOLATION {json.dumps(v)}")

    def op_allows(self, s, op, wid):
        """Whether operation `op` of this cycle, if it was the last to reach sector s, lets it
        read `wid` (0 for zeros)."""
        if op.kind == WRITE:
            return wid == op.wid
        if op.kind == ZERO:
            return wid == 0
        return self.trim_allows(s, op.wid, wid)

    def check_read(self, cyc, index, scenario, start, n, data):
        """A read while serving returns exactly the newest version of every sector (for a
        TRIM: zeros or what was written there before it; for write-zeroes: zeros)."""
        cyc.reads_checked += 1
        for i in range(n):
            s = start + i
            newest = None
            for wid in reversed(cyc.versions.get(s // SPB, ())):
                if cyc.writes[wid].covers(s):
                    newest = wid
                    break
            if newest is not None and cyc.writes[newest].failed:
                continue
            got, desc = self.stamps.identify(data, i * SECTOR, s)
            if newest is None:
                ok = self.base_allows(s, got)
                expect = self.baseline_id(s)
            else:
                ok = self.op_allows(s, cyc.writes[newest], got)
                expect = newest if cyc.writes[newest].kind == WRITE else 0
            if not ok:
                self.violation(
                    cyc,
                    index,
                    scenario,
                    "read-while-serving",
                    s,
                    desc or (f"W{got}" if got else "zeros"),
                    [cyc.tag(newest) if newest else (f"W{expect}" if expect else "zeros")],
                    [cyc.tag(w) for w in cyc.versions.get(s // SPB, ())],
                )

    def judge(self, cyc, sec, cov, d, wid):
        """Whether sector `sec` may read `wid` after the restart, given the operations `cov` of
        this cycle that reached it (in issue order) and `d`, the index of the newest durable
        one (None: none durable). Returns (ok, the TRIM whose rule holds there from now on or
        0, whether it holds something newer than the durable version)."""
        ops = [cyc.writes[w] for w in cov]
        first = d if d is not None else 0
        keep = self.trimmed[sec]
        # A value written (data or zeros) by an allowed operation: no TRIM rule holds any more.
        for i in range(first, len(ops)):
            op = ops[i]
            if op.kind != TRIM and self.op_allows(sec, op, wid):
                return True, 0, i > first and d is not None
        if d is None and wid == self.baseline_id(sec):
            return True, keep, False
        trims = [op.wid for op in ops[first:] if op.kind == TRIM]
        matching = [t for t in trims if self.trim_allows(sec, t, wid)]
        if matching:
            return True, max(matching), False
        if d is None and self.base_allows(sec, wid):
            return True, keep, False
        return False, 0, False

    def read_region(self, server):
        """Reads the whole region over several connections at once (the server answers reads
        inline, one at a time per connection)."""
        total = self.region_blocks * BLOCK
        got = bytearray(total)
        chunks = list(range(0, total, MIB))
        errors = []

        def reader(k):
            try:
                h = server.connect()
                for off in chunks[k :: self.args.verify_connections]:
                    got[off : off + MIB] = h.pread(min(MIB, total - off), off)
                h.shutdown()
            except nbd.Error as e:
                errors.append(str(e))

        threads = [
            threading.Thread(target=reader, args=(k,)) for k in range(self.args.verify_connections)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            server.check_alive("while the region was read")
            raise Failure(f"reading the region after restart failed: {errors[0]}")
        return got

    def verify_region(self, server, cyc, index, scenario):
        self.verify_content(self.read_region(server), cyc, index, scenario)

    def verify_content(self, got, cyc, index, scenario):
        s = self.s
        touched = cyc.versions
        # Untouched blocks: exactly as before, compared a MiB at a time.
        per = MIB // BLOCK
        for first in range(0, self.region_blocks, per):
            lo, hi = first * BLOCK, (first + per) * BLOCK
            if got[lo:hi] == self.baseline[lo:hi]:
                continue
            for b in range(first, min(first + per, self.region_blocks)):
                if b in touched:
                    continue
                o = b * BLOCK
                if got[o : o + BLOCK] != self.baseline[o : o + BLOCK]:
                    for j in range(SPB):
                        sec = b * SPB + j
                        wid, desc = self.stamps.identify(got, o + j * SECTOR, sec)
                        base = self.baseline_id(sec)
                        if wid != base and self.base_allows(sec, wid):
                            s["sectors_read_trimmed"] += 1  # a TRIM's rule still holds
                        elif wid != base:
                            self.violation(
                                cyc,
                                index,
                                scenario,
                                "unwritten-block-changed",
                                sec,
                                desc or (f"W{wid}" if wid else "zeros"),
                                [f"W{base}" if base else "zeros"],
                                [],
                            )
        # Written blocks: every sector against its allowed versions, and atomicity per block.
        marks = {}  # sector -> the TRIM whose rule holds there from now on (0: none)
        for b, vers in touched.items():
            o = b * BLOCK
            found = []
            for j in range(SPB):
                sec = b * SPB + j
                wid, desc = self.stamps.identify(got, o + j * SECTOR, sec)
                cov = [w for w in vers if cyc.writes[w].covers(sec)]
                d = None
                for i, w in enumerate(cov):
                    if cyc.durable(cyc.writes[w]):
                        d = i
                if d is not None:
                    allowed = cov[d:]
                else:
                    allowed = [self.baseline_id(sec)] + cov
                s["sectors_checked"] += 1
                found.append(wid)
                ok, trim_mark, newer = self.judge(cyc, sec, cov, d, wid)
                if ok:
                    marks[sec] = trim_mark
                    if trim_mark:
                        s["sectors_read_trimmed"] += 1
                if not ok:
                    self.violation(
                        cyc,
                        index,
                        scenario,
                        "lost-or-foreign" if wid is not None else "corrupt",
                        sec,
                        desc or (f"W{wid}" if wid else "zeros"),
                        [
                            (
                                cyc.tag(w)
                                if w in cyc.writes
                                else (f"W{w} (baseline)" if w else "zeros (baseline)")
                            )
                            for w in allowed
                        ],
                        [cyc.tag(w) for w in vers],
                    )
                elif newer:
                    s["sectors_newer_than_durable"] += 1
            # Atomicity: a write seen in one sector of the block shows in all its sectors there,
            # unless a later write to that sector replaced it.
            order = {w: i for i, w in enumerate(vers)}
            for j, wid in enumerate(found):
                if wid is None or wid not in order or cyc.writes[wid].kind != WRITE:
                    continue
                w = cyc.writes[wid]
                for k in range(SPB):
                    sec = b * SPB + k
                    if k == j or not w.covers(sec):
                        continue
                    other = found[k]
                    if other == wid or other is None:  # None: reported as corrupt already
                        continue
                    # A later operation there may have replaced it (a write, zeros, a TRIM).
                    if any(
                        order[x] > order[wid]
                        and cyc.writes[x].covers(sec)
                        and self.op_allows(sec, cyc.writes[x], other)
                        for x in vers
                    ):
                        continue
                    self.violation(
                        cyc,
                        index,
                        scenario,
                        "torn-block",
                        sec,
                        f"W{other}" if other else ("zeros" if other == 0 else "corrupt"),
                        [f"W{wid} (seen in sector {b * SPB + j} of the same block) or later"],
                        [cyc.tag(x) for x in vers],
                    )
                    break
            s["blocks_written_verified"] += 1
        for sec, mark in marks.items():
            self.trimmed[sec] = mark
        s["blocks_verified"] += self.region_blocks
        for w in cyc.writes.values():
            if w.wid < len(self.op_state):
                self.op_state[w.wid] = 2 if cyc.durable(w) else (1 if w.ack is not None else 0)
            s["writes_verified"] += 1
            s["durable_writes_verified"] += 1 if cyc.durable(w) else 0
        self.baseline = got

    # --- the run ----------------------------------------------------------------------------

    def final_clean_restart(self, server, conns):
        """SIGTERM (a clean stop), `logcache check`, restart: the disk reads as last verified."""
        for c in conns:
            try:
                c.h.shutdown()
            except nbd.Error:
                pass
        conns.clear()
        rc = server.stop()
        if rc != 0:
            self.problems.append(f"clean stop exited with status {rc}: {server.log_tail(10)}")
        out = subprocess.run(
            [self.args.bin, "check", "--cache", server.cache, "--backing", server.backing],
            capture_output=True,
            check=False,
            text=True,
            timeout=300,
        )
        if out.returncode != 0:
            self.problems.append(
                f"logcache check after the clean stop failed ({out.returncode}): "
                f"{(out.stdout + out.stderr).strip()[-2000:]}"
            )
        server.start()
        h, _ = server.wait_ready(self.args.restart_timeout)
        got = self.read_region(server)
        if got != self.baseline:
            bad = next(
                b
                for b in range(self.region_blocks)
                if got[b * BLOCK : (b + 1) * BLOCK] != self.baseline[b * BLOCK : (b + 1) * BLOCK]
            )
            self.problems.append(
                f"after a clean stop and restart block {bad} differs from what was verified"
            )
        h.shutdown()
        del h
        rc = server.stop()
        if rc != 0:
            self.problems.append(f"final clean stop exited with status {rc}")

    def run(self):
        args = self.args
        workdir = tempfile.mkdtemp(prefix="lc-kill-", dir=args.tmpdir)
        server = Server(args, workdir)
        self.ready_estimate = 0.2
        started = time.monotonic()
        ok = False
        failure = None
        try:
            fmt = server.format(args.cache_mib * MIB, args.backing_mib * MIB, args.segment_size)
            log(f"kill_verify: {fmt}")
            server.start()
            h, secs = server.wait_ready(args.restart_timeout)
            self.ready_estimate = secs
            size = h.get_size()
            if self.region_blocks * BLOCK > size:
                raise Failure(f"region {args.region_mib} MiB exceeds the exported {size} bytes")
            conns = [Conn(h, 0)] + [Conn(server.connect(), i) for i in range(1, args.connections)]
            next_report = time.monotonic() + args.progress_seconds
            for i in range(args.cycles):
                self.run_cycle(server, conns, i)
                rss = rss_mib()
                self.s["rss_mib_max"] = max(self.s["rss_mib_max"], rss)
                if rss > args.max_rss_mib:  # never let a leak here starve the machine
                    raise Failure(f"the verifier itself grew to {rss} MiB (--max-rss-mib)")
                if self.violations and (args.stop_on_violation or args.self_test):
                    break
                if time.monotonic() >= next_report:
                    next_report = time.monotonic() + args.progress_seconds
                    s = self.s
                    log(
                        f"kill_verify: progress: {s['cycles']} cycles, {s['kills']} kills, "
                        f"{s['writes_verified']} writes verified "
                        f"({s['durable_writes_verified']} durable), {s['violations']} violations, "
                        f"{time.monotonic() - started:.0f} s, verifier {s['rss_mib_max']} MiB"
                    )
            self.final_clean_restart(server, conns)
            if args.self_test:
                # The verifier pretended every acknowledged write was flushed; the kills lose
                # the unflushed ones, and the checker must say so.
                lost = sum(1 for v in self.violations if v["kind"] == "lost-or-foreign")
                ok = lost > 0 and not self.problems
                log(
                    f"kill_verify: self-test: {lost} sectors of acknowledged, never flushed "
                    f"writes reported lost ({'as they must be' if ok else 'NONE: the checker is blind'})"
                )
            else:
                ok = not self.violations and not self.problems
        except Failure as e:
            failure = str(e)
            self.problems.append(f"FAILURE: {failure}")
        finally:
            if server.proc is not None:
                server.kill()
        elapsed = time.monotonic() - started
        summary = dict(self.s)
        summary.update(
            {
                "seed": self.seed,
                "parameters": self.params(),
                "elapsed_seconds": round(elapsed, 1),
                "passed": ok,
                "problems": self.problems,
                "violation_details": self.violations[: args.max_reports],
                "workdir": workdir,
            }
        )
        for p in self.problems:
            log(f"PROBLEM {p}")
        s = self.s
        log(
            f"kill_verify: {'PASS' if ok else 'FAIL'}{' (self-test)' if args.self_test else ''}"
            f" seed={self.seed} cycles={s['cycles']} "
            f"kills={s['kills']} (recovery {s['recovery_kills']}) "
            f"writes issued={s['writes_issued']} acked={s['writes_acked']} "
            f"durable={s['writes_durable']} verified={s['writes_verified']} "
            f"blocks verified={s['blocks_verified']} violations={s['violations']} "
            f"problems={len(self.problems)} in {elapsed:.0f} s"
        )
        log("kill_verify: summary " + json.dumps(summary, sort_keys=True))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=2, sort_keys=True)
                f.write("\n")
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"kill_verify: files kept in {workdir} (serve.log has every start)")
        return 0 if ok else 1

    def params(self):
        a = self.args
        return {
            "cycles": a.cycles,
            "cache_mib": a.cache_mib,
            "backing_mib": a.backing_mib,
            "segment_size": a.segment_size,
            "region_mib": a.region_mib,
            "connections": a.connections,
            "load_seconds": [a.load_min, a.load_max],
            "recovery_kill_prob": a.recovery_kill_prob,
            "set": a.set,
            "bin": a.bin,
        }


def check_the_checker():
    """Feeds the checker made-up disk contents, no server: each case must produce exactly the
    violations listed (none for the legal outcomes)."""
    args = argparse.Namespace(seed=7, region_mib=1, max_reports=0, self_test=False)
    v = Verifier(args)
    st = v.stamps
    zero = bytes(v.region_blocks * BLOCK)
    failures = []

    def case(name, expect, build):
        cyc = Cycle()
        v.baseline = bytearray(zero)
        v.forget_ops()
        got = bytearray(zero)
        build(cyc, got)
        v.violations = []
        v.verify_content(got, cyc, 0, "checker")
        kinds = sorted({x["kind"] for x in v.violations})
        status = "ok" if kinds == sorted(expect) else "WRONG"
        if status != "ok":
            failures.append(name)
        log(f"check-checker: {status}: {name}: expected {sorted(expect)}, got {kinds}")

    def write(cyc, wid, start, n, ack=True, fua=False, kind=WRITE):
        w = Write(wid, start, n, fua, kind)
        v.remember(w)
        cyc.writes[wid] = w
        for b in w.blocks():
            cyc.versions.setdefault(b, []).append(wid)
        if ack:
            cyc.ack_seq += 1
            w.ack = cyc.ack_seq
        return w

    def flush(cyc):
        cyc.durable_ack = cyc.ack_seq

    def put(got, start, n, wid):
        got[start * SECTOR : (start + n) * SECTOR] = st.data(start, n, wid)

    def durable_present(cyc, got):
        write(cyc, 1, 0, 8)
        flush(cyc)
        put(got, 0, 8, 1)

    def durable_lost(cyc, got):
        write(cyc, 1, 0, 8)
        flush(cyc)

    def fua_lost(cyc, got):
        write(cyc, 1, 0, 8, fua=True)

    def unflushed_lost(cyc, got):
        write(cyc, 1, 0, 8)

    def acked_after_flush_issue_lost(cyc, got):
        write(cyc, 1, 0, 8)
        flush(cyc)
        write(cyc, 2, 0, 8)  # acknowledged after the flush was issued: not covered
        put(got, 0, 8, 1)

    def later_unacked_present(cyc, got):
        write(cyc, 1, 0, 8)
        flush(cyc)
        write(cyc, 2, 0, 8, ack=False)
        put(got, 0, 8, 2)

    def older_than_durable(cyc, got):
        write(cyc, 1, 0, 8)
        write(cyc, 2, 0, 8)
        flush(cyc)
        put(got, 0, 8, 1)

    def torn_full_block(cyc, got):
        write(cyc, 1, 0, 8)
        put(got, 0, 4, 1)

    def sector_write_over_block(cyc, got):
        write(cyc, 1, 0, 8)
        flush(cyc)
        write(cyc, 2, 2, 2)
        put(got, 0, 8, 1)
        put(got, 2, 2, 2)

    def torn_sector_write(cyc, got):
        write(cyc, 1, 0, 8)
        flush(cyc)
        write(cyc, 2, 2, 2)
        put(got, 0, 8, 1)
        put(got, 2, 1, 2)

    def durable_sector_write_lost(cyc, got):
        write(cyc, 1, 8 + 3, 2, fua=True)

    def misplaced(cyc, got):
        write(cyc, 1, 0, 16)
        flush(cyc)
        put(got, 0, 8, 1)
        got[BLOCK : 2 * BLOCK] = got[0:BLOCK]

    def garbage(cyc, got):
        write(cyc, 1, 0, 8)
        got[0:BLOCK] = random.Random(1).randbytes(BLOCK)

    def bit_flip(cyc, got):
        write(cyc, 1, 0, 8)
        flush(cyc)
        put(got, 0, 8, 1)
        got[100] ^= 1

    def foreign_write(cyc, got):
        write(cyc, 1, 0, 8)
        put(got, 0, 8, 999)

    def untouched_changed(cyc, got):
        put(got, 5 * SPB, 8, 1)

    def baseline_kept(cyc, got):
        v.baseline[0:BLOCK] = st.data(0, 8, 500)
        write(cyc, 1, 0, 8)
        put(got, 0, 8, 500)

    def baseline_replaced_by_zeros(cyc, got):
        v.baseline[0:BLOCK] = st.data(0, 8, 500)
        write(cyc, 1, 0, 8)

    def trim_reads_old(cyc, got):
        write(cyc, 1, 0, 8)
        write(cyc, 2, 0, 8, kind=TRIM)
        flush(cyc)
        put(got, 0, 8, 1)

    def trim_reads_zeros(cyc, got):
        write(cyc, 1, 0, 8)
        write(cyc, 2, 0, 8, kind=TRIM)
        flush(cyc)

    def trim_reads_later_overwritten(cyc, got):
        write(cyc, 1, 0, 8, kind=TRIM)
        write(cyc, 2, 0, 8)
        write(cyc, 3, 0, 8)
        flush(cyc)
        put(got, 0, 8, 2)

    def sub_block_trim(cyc, got):
        write(cyc, 1, 0, 8)
        write(cyc, 2, 2, 3, kind=TRIM, fua=True)
        put(got, 0, 8, 1)
        got[2 * SECTOR : 4 * SECTOR] = bytes(2 * SECTOR)

    def zeroes_read_old(cyc, got):
        write(cyc, 1, 0, 8)
        write(cyc, 2, 0, 8, kind=ZERO)
        flush(cyc)
        put(got, 0, 8, 1)

    def zeroes_read_zeros(cyc, got):
        write(cyc, 1, 0, 8)
        flush(cyc)
        write(cyc, 2, 1, 3, kind=ZERO, fua=True)
        put(got, 0, 8, 1)
        got[SECTOR : 4 * SECTOR] = bytes(3 * SECTOR)

    def partial_zeroes_read_old(cyc, got):
        write(cyc, 1, 0, 8)
        flush(cyc)
        write(cyc, 2, 1, 3, kind=ZERO, fua=True)
        put(got, 0, 8, 1)
        got[SECTOR : 3 * SECTOR] = bytes(2 * SECTOR)

    def trimmed_earlier(cyc, got, show):
        # A TRIM (id 6) of a previous cycle whose rule still holds; write 7 came after it and
        # was lost in that cycle's kill. Nothing reaches the block in this cycle.
        for w in (Write(5, 40, 8, False), Write(6, 40, 8, False, TRIM), Write(7, 40, 8, False)):
            v.remember(w)
        for sec in range(40, 48):
            v.trimmed[sec] = 6
        if show:
            put(got, 40, 8, show)

    case("a TRIMmed sector reads the data before it", [], trim_reads_old)
    case("a TRIMmed sector reads zeros", [], trim_reads_zeros)
    case(
        "a TRIMmed sector reads a write after it, later overwritten",
        ["lost-or-foreign"],
        trim_reads_later_overwritten,
    )
    case("a sub-block TRIM: part zeros, part old data", [], sub_block_trim)
    case("a flushed write-zeroes reads old data", ["lost-or-foreign"], zeroes_read_old)
    case("a FUA sub-block write-zeroes reads zeros", [], zeroes_read_zeros)
    case("a FUA sub-block write-zeroes is half applied", ["lost-or-foreign"], partial_zeroes_read_old)
    case("earlier TRIM, untouched: zeros", [], lambda c, g: trimmed_earlier(c, g, 0))
    case("earlier TRIM, untouched: the data before it", [], lambda c, g: trimmed_earlier(c, g, 5))
    case(
        "earlier TRIM, untouched: a write after it, lost",
        ["unwritten-block-changed"],
        lambda c, g: trimmed_earlier(c, g, 7),
    )
    case("a flushed write is there", [], durable_present)
    case("a flushed write is lost", ["lost-or-foreign"], durable_lost)
    case("a FUA write is lost", ["lost-or-foreign"], fua_lost)
    case("an unflushed write is lost", [], unflushed_lost)
    case("a write acked after the flush was issued is lost", [], acked_after_flush_issue_lost)
    case("a later, unacknowledged write is there", [], later_unacked_present)
    case("an older version than the durable one", ["lost-or-foreign"], older_than_durable)
    case("half a 4 KiB write", ["torn-block"], torn_full_block)
    case("a sector write over a block write", [], sector_write_over_block)
    case("half a sector write", ["torn-block"], torn_sector_write)
    case("a FUA sector write is lost", ["lost-or-foreign"], durable_sector_write_lost)
    case("another block's data", ["corrupt"], misplaced)
    case("garbage", ["corrupt"], garbage)
    case("one flipped bit", ["corrupt"], bit_flip)
    case("a write never issued", ["lost-or-foreign"], foreign_write)
    case("a block nobody wrote changed", ["unwritten-block-changed"], untouched_changed)
    case("nothing durable: the baseline stays", [], baseline_kept)
    case(
        "nothing durable: zeros replace the baseline",
        ["lost-or-foreign"],
        baseline_replaced_by_zeros,
    )

    # Reads while serving: exactly the newest version.
    cyc = Cycle()
    v.baseline = bytearray(zero)
    v.violations = []
    write(cyc, 1, 0, 8)
    v.check_read(cyc, 0, "checker", 0, 8, bytearray(st.data(0, 8, 1)))
    v.check_read(cyc, 0, "checker", 0, 8, bytearray(BLOCK))
    kinds = [x["kind"] for x in v.violations]
    good = kinds == ["read-while-serving"] * 8
    if not good:
        failures.append("a stale read while serving")
    log(f"check-checker: {'ok' if good else 'WRONG'}: a stale read while serving: {kinds}")
    # ... zeros after write-zeroes; after a TRIM zeros or older data, never a later write.
    v.violations = []
    w = write(cyc, 2, 0, 8, kind=ZERO)
    v.check_read(cyc, 0, "checker", 0, 8, bytearray(BLOCK))
    v.check_read(cyc, 0, "checker", 0, 8, bytearray(st.data(0, 8, 1)))
    write(cyc, 3, 0, 8, kind=TRIM)
    v.check_read(cyc, 0, "checker", 0, 8, bytearray(BLOCK))
    v.check_read(cyc, 0, "checker", 0, 8, bytearray(st.data(0, 8, 1)))
    write(cyc, 4, 0, 8, ack=False)
    cyc.versions[0].pop()  # write 4 was issued (and lost) but here not yet: never written
    v.check_read(cyc, 0, "checker", 0, 8, bytearray(st.data(0, 8, 4)))
    kinds = [x["kind"] for x in v.violations]
    good = kinds == ["read-while-serving"] * 16
    if not good:
        failures.append("reads after write-zeroes and TRIM")
    log(f"check-checker: {'ok' if good else 'WRONG'}: reads after write-zeroes and TRIM: {kinds}")
    if failures:
        log(f"check-checker: FAIL: {failures}")
        return 1
    log("check-checker: PASS: every made-up violation was caught, every legal outcome accepted")
    return 0


def replay_command(a):
    parts = [
        "/usr/bin/python3 reliability/kill_verify.py",
        f"--bin {a.bin}",
        f"--seed {a.seed}",
        f"--cycles {a.cycles}",
        f"--cache-mib {a.cache_mib}",
        f"--backing-mib {a.backing_mib}",
        f"--segment-size {a.segment_size}",
        f"--region-mib {a.region_mib}",
        f"--connections {a.connections}",
        f"--load-min {a.load_min}",
        f"--load-max {a.load_max}",
        f"--recovery-kill-prob {a.recovery_kill_prob}",
    ] + [f"--set {kv}" for kv in a.set]
    if not a.discards:
        parts.append("--no-discards")
    return " ".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="target/release/logcache", help="the logcache binary")
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    ap.add_argument("--cache-mib", type=int, default=64)
    ap.add_argument("--backing-mib", type=int, default=256)
    ap.add_argument("--segment-size", default="256K", help="passed to logcache format")
    ap.add_argument("--region-mib", type=int, default=128, help="verified region, from 0")
    ap.add_argument("--connections", type=int, default=2, help="NBD connections (multi-conn)")
    ap.add_argument(
        "--verify-connections",
        type=int,
        default=4,
        help="connections reading the region in parallel after each restart",
    )
    ap.add_argument("--load-min", type=float, default=0.2, help="seconds of load per cycle")
    ap.add_argument("--load-max", type=float, default=1.5)
    ap.add_argument("--recovery-kill-prob", type=float, default=0.25)
    ap.add_argument("--restart-timeout", type=float, default=120.0)
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to every logcache serve (repeatable)",
    )
    ap.add_argument(
        "--no-discards",
        dest="discards",
        action="store_false",
        help="send no TRIM or write-zeroes and switch to write-through only (the load before "
        "2026-11-25)",
    )
    ap.add_argument("--json", help="write the JSON summary here")
    ap.add_argument("--tmpdir", default=None, help="where the temporary directory goes")
    ap.add_argument("--keep", action="store_true", help="keep the files even on success")
    ap.add_argument("--stop-on-violation", action="store_true")
    ap.add_argument(
        "--max-rss-mib",
        type=int,
        default=2048,
        help="stop (failed) if this script's own memory grows past this",
    )
    ap.add_argument("--max-reports", type=int, default=50)
    ap.add_argument("--progress-seconds", type=float, default=60.0)
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per cycle")
    ap.add_argument(
        "--self-test",
        action="store_true",
        help="pretend every acknowledged write was flushed (and flush none): the "
        "kills must then show as lost writes; passes only if they do",
    )
    ap.add_argument(
        "--check-checker",
        action="store_true",
        help="run the checker on made-up contents (no server) and exit",
    )
    args = ap.parse_args()
    if args.check_checker:
        sys.exit(check_the_checker())
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little")
    if not os.access(args.bin, os.X_OK):
        sys.exit(
            f"kill_verify: {args.bin} is not an executable; build it: cargo build --release -p logcache"
        )
    args.bin = os.path.abspath(args.bin)
    v = Verifier(args)
    log(f"kill_verify: seed={args.seed} parameters={json.dumps(v.params(), sort_keys=True)}")
    log(f"kill_verify: replay with: {replay_command(args)}")
    sys.exit(v.run())


if __name__ == "__main__":
    main()
