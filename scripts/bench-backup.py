#!/usr/bin/python3
"""Issue 21's measurements (docs/BENCHMARKS.md, "Incremental backup"): each prints one JSON
object per measurement and a summary. Run with Debian's /usr/bin/python3 (python3-libnbd).

  daily      A disk of GIB GiB full of data (a plain file on DIR as backing, 2 GiB cache file),
             PERCENT% of it rewritten between backups (random 4 KiB-1 MiB writes, seeded), then
             three ways to back it up, alternated each round: a full backup (`nbdcopy URI null:`),
             `logcache export-diff --since PREV --checkpoint NEW -`, and a pull of the dirty
             extents of `qemu:dirty-bitmap:PREV` with libnbd (what virtnbdbackup does).
             Bytes shipped and wall time of each.
  memory     A sparse disk of TIB TiB; RSS of `logcache serve` with N checkpoints after a restart
             (the restart loads every bitmap page, so all of it is resident), and the bitmap
             area's size on the cache device (from the format, and as allocated in the file).
  overreport PREFILL MiB written (a pattern) and flushed, then `checkpoint create c`, then random
             writes (4-64 KiB, 16 in flight), SIGKILL of the
             serve at a seeded 3-6 s (128 MiB cache: the log wraps); after a restart, the blocks `qemu:dirty-bitmap:c` reports
             against the blocks any write was sent to (over-report), and every block sent to but
             not reported must still read as before (under-report: must be none).
  writecost  fio's nbd engine, 4 KiB random writes, with two checkpoints active vs none,
             alternated ROUNDS times, each on a fresh cache (256 MiB, so the log wraps and every
             reclaim folds the bitmaps) over a 16 GiB sparse backing.
  holdcost   Writes while export-diff runs: a checkpoint, DIFF MiB of random 64 KiB-1 MiB writes
             over the first SPAN GiB, then fio's 4 KiB random writes over that span for SECONDS,
             once with `export-diff --since c0 FILE` run back to back the whole time (the export
             hold active throughout) and once without, alternated ROUNDS times. Write IOPS
             each way, and per export its time, size and the bytes the hold kept in RAM
             (the blocks fio rewrote before the export had read them; bound 256 MiB).

usage: /usr/bin/python3 scripts/bench-backup.py daily|memory|overreport|writecost|holdcost [options]
(LOGCACHE_BIN picks the binary; default target/release/logcache.)
"""

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import nbd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("LOGCACHE_BIN", os.path.join(ROOT, "target/release/logcache"))
BLOCK = 4096
MIB = 1 << 20
GIB = 1 << 30
# format::checkpoints: 4080 bytes of bits in each 4 KiB page, two copies of each page.
BLOCKS_PER_PAGE = 4080 * 8
# Every serve started, so that one left running by a failed measurement is killed at exit.
SERVES = []


def log(obj):
    print(json.dumps(obj), flush=True)


class Serve:
    """One cache + backing pair and the `logcache serve` over it."""

    def __init__(self, dir, backing, cache_bytes, checkpoints=4, name="cache", bin=None):
        self.bin = bin or BIN
        self.dir = dir
        self.backing = backing
        self.cache = os.path.join(dir, name + ".img")
        self.sock = os.path.join(dir, name + ".sock")
        self.ctl = self.cache + ".ctl"
        self.uri = "nbd+unix:///?socket=" + self.sock
        self.proc = None
        with open(self.cache, "wb") as f:
            f.truncate(cache_bytes)
        subprocess.run([self.bin, "format", "--cache", self.cache, "--backing", backing,
                        "--checkpoints", str(checkpoints), "--force"],
                       check=True, stdout=subprocess.DEVNULL)

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        t0 = time.monotonic()
        logf = open(os.path.join(self.dir, "serve.log"), "ab")
        SERVES.append(self)
        self.proc = subprocess.Popen([self.bin, "serve", "--cache", self.cache, "--backing",
                                      self.backing, "--socket", self.sock],
                                     stdout=logf, stderr=logf)
        while True:
            if self.proc.poll() is not None:
                sys.exit("serve exited: see " + os.path.join(self.dir, "serve.log"))
            if os.path.exists(self.sock):
                try:
                    h = nbd.NBD()
                    h.connect_uri(self.uri)
                    h.shutdown()
                    break
                except nbd.Error:
                    pass
            time.sleep(0.02)
        return time.monotonic() - t0

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait()
        self.proc = None

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def ctl_run(self, *args, capture=False):
        r = subprocess.run([self.bin, *args, "--control", self.ctl], check=True,
                           stdout=subprocess.PIPE if capture else subprocess.DEVNULL)
        return r.stdout

    def status(self):
        return json.loads(self.ctl_run("status", "--json", capture=True))

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS")


def read_bytes(s):
    d = s.status()
    return d["engine"]["read_bytes"] if "engine" in d else d["read_bytes"]


def dirty_extents(uri, name, size_bytes):
    """The (offset, length) runs `qemu:dirty-bitmap:NAME` flags as changed."""
    ctx = "qemu:dirty-bitmap:" + name
    h = nbd.NBD()
    h.add_meta_context(ctx)
    h.connect_uri(uri)
    assert h.can_meta_context(ctx), ctx + " not negotiated"
    runs = []
    pos = 0
    while pos < size_bytes:
        got = []

        def cb(metacontext, offset, entries, err):
            if metacontext == ctx:
                got.append((offset, list(entries)))
            return 0

        h.block_status(min(size_bytes - pos, GIB), pos, cb)
        offset, entries = got[0]
        assert offset == pos
        for i in range(0, len(entries), 2):
            length, flags = entries[i], entries[i + 1]
            if flags & 1:
                if runs and runs[-1][0] + runs[-1][1] == pos:
                    runs[-1] = (runs[-1][0], runs[-1][1] + length)
                else:
                    runs.append((pos, length))
            pos += length
    h.shutdown()
    return runs


def blocks_of(runs):
    out = set()
    for off, length in runs:
        out.update(range(off // BLOCK, (off + length) // BLOCK))
    return out


# ---------------------------------------------------------------------------------------------
# daily


def fill(path, size_bytes):
    """Writes data (random, each MiB stamped with its index) over the whole file."""
    base = bytearray(os.urandom(MIB))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        for i in range(size_bytes // MIB):
            base[:8] = i.to_bytes(8, "little")
            base[8:16] = (i ^ 0x5A5A5A5A5A5A5A5A).to_bytes(8, "little")
            os.pwrite(fd, base, i * MIB)
        os.fsync(fd)
    finally:
        os.close(fd)


def rewrite(uri, size_bytes, target_bytes, rng, changed):
    """Random writes of 4 KiB-1 MiB (4 KiB aligned) until `target_bytes` were written; marks
    their blocks in `changed` (a bytearray, one byte per block). Returns bytes written."""
    h = nbd.NBD()
    h.connect_uri(uri)
    blocks = size_bytes // BLOCK
    data = os.urandom(MIB)
    written = 0
    while written < target_bytes:
        n = rng.randint(1, MIB // BLOCK)
        lba = rng.randrange(0, blocks - n + 1)
        h.pwrite(data[: n * BLOCK], lba * BLOCK)
        changed[lba : lba + n] = b"\x01" * n
        written += n * BLOCK
    h.flush()
    h.shutdown()
    return written


def full_backup(s, size_bytes):
    before = read_bytes(s)
    t0 = time.monotonic()
    subprocess.run(["nbdcopy", s.uri, "null:"], check=True)
    wall = time.monotonic() - t0
    return {"way": "full nbdcopy", "wall_s": round(wall, 3), "shipped_bytes": read_bytes(s) - before}


def diff_backup(s, since, new):
    t0 = time.monotonic()
    p = subprocess.Popen([BIN, "export-diff", "--since", since, "--checkpoint", new,
                          "--control", s.ctl, "-"], stdout=subprocess.PIPE)
    shipped = 0
    while True:
        b = p.stdout.read(MIB)
        if not b:
            break
        shipped += len(b)
    assert p.wait() == 0, "export-diff failed"
    wall = time.monotonic() - t0
    return {"way": "export-diff", "wall_s": round(wall, 3), "shipped_bytes": shipped}


def pull_backup(s, since, size_bytes):
    t0 = time.monotonic()
    runs = dirty_extents(s.uri, since, size_bytes)
    h = nbd.NBD()
    h.connect_uri(s.uri)
    shipped = 0
    piece = 4 * MIB
    for off, length in runs:
        pos = off
        while pos < off + length:
            n = min(piece, off + length - pos)
            shipped += len(h.pread(n, pos))
            pos += n
    h.shutdown()
    wall = time.monotonic() - t0
    return {"way": "dirty-bitmap pull", "wall_s": round(wall, 3), "shipped_bytes": shipped,
            "bitmap_bytes": sum(r[1] for r in runs)}


def export_size(uri):
    h = nbd.NBD()
    h.connect_uri(uri)
    size = h.get_size()
    h.shutdown()
    return size


def daily(a):
    dir = tempfile.mkdtemp(prefix="lcbackup.", dir=a.dir)
    try:
        backing = a.backing or os.path.join(dir, "backing.img")
        if not (os.path.exists(backing) and os.path.getsize(backing) == a.gib * GIB):
            t0 = time.monotonic()
            fill(backing, a.gib * GIB)
            log({"step": "fill", "bytes": a.gib * GIB, "wall_s": round(time.monotonic() - t0, 1)})
        s = Serve(dir, backing, 2 * GIB)
        s.start()
        # The disk is the backing file less logcache's label block.
        size = export_size(s.uri)
        s.ctl_run("checkpoint", "create", "d0")
        rng = random.Random(a.seed)
        rows = []
        for r in range(1, a.rounds + 1):
            changed = bytearray(size // BLOCK)
            t0 = time.monotonic()
            written = rewrite(s.uri, size, size * a.percent // 100, rng, changed)
            changed_bytes = changed.count(1) * BLOCK
            log({"round": r, "step": "rewrite", "written_bytes": written,
                 "changed_bytes": changed_bytes, "wall_s": round(time.monotonic() - t0, 2)})
            prev, new = f"d{r - 1}", f"d{r}"
            ways = [lambda: full_backup(s, size), lambda: diff_backup(s, prev, new),
                    lambda: pull_backup(s, prev, size)]
            if r % 2 == 0:
                ways.reverse()
            for w in ways:
                row = w()
                row.update(round=r, changed_bytes=changed_bytes)
                log(row)
                rows.append(row)
            s.ctl_run("checkpoint", "delete", prev)
        s.stop()
        summary = {}
        for way in ["full nbdcopy", "export-diff", "dirty-bitmap pull"]:
            rs = [x for x in rows if x["way"] == way]
            summary[way] = {"median_wall_s": statistics.median(x["wall_s"] for x in rs),
                            "median_shipped_bytes": statistics.median(x["shipped_bytes"] for x in rs)}
        full = summary["full nbdcopy"]
        for way in ["export-diff", "dirty-bitmap pull"]:
            summary[way]["time_vs_full"] = round(summary[way]["median_wall_s"] / full["median_wall_s"], 4)
            summary[way]["bytes_vs_full"] = round(
                summary[way]["median_shipped_bytes"] / full["median_shipped_bytes"], 4)
        log({"summary": summary})
    finally:
        shutil.rmtree(dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# memory


def memory(a):
    size = a.tib << 40
    counts = [int(x) for x in a.checkpoints.split(",")]
    dir = tempfile.mkdtemp(prefix="lcbitmap.", dir=a.dir)
    try:
        backing = os.path.join(dir, "backing.img")
        with open(backing, "wb") as f:
            f.truncate(size)
        slots = max(counts)
        s = Serve(dir, backing, 4 * GIB, checkpoints=slots)
        pages = -(-(size // BLOCK) // BLOCKS_PER_PAGE)
        area = slots * pages * 2 * 4096
        log({"disk_bytes": size, "slots": slots, "pages_per_checkpoint": pages,
             "format_area_bytes": area, "per_checkpoint_per_tib_on_disk_bytes": area * (1 << 40) // size // slots,
             "per_checkpoint_per_tib_bits_bytes": pages * 4080 * (1 << 40) // size})
        s.start()
        made = 0
        base = None
        for n in counts:
            while made < n:
                s.ctl_run("checkpoint", "create", f"c{made}")
                made += 1
            s.stop()
            open_s = s.start()
            rss = s.rss_kib()
            # What the cache file holds allocated (the area's pages are written at create).
            alloc = os.stat(s.cache).st_blocks * 512
            if base is None:
                base = rss
            row = {"checkpoints": n, "rss_kib": rss, "open_s": round(open_s, 3),
                   "cache_allocated_bytes": alloc}
            if n:
                row["rss_per_checkpoint_per_tib_mib"] = round((rss - base) / n / 1024 / a.tib, 2)
            log(row)
        s.stop()
    finally:
        shutil.rmtree(dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# overreport


def overreport_run(a, seed):
    size = a.disk_gib * GIB
    rng = random.Random(seed)
    dir = tempfile.mkdtemp(prefix="lcover.", dir=a.dir)
    try:
        backing = os.path.join(dir, "backing.img")
        with open(backing, "wb") as f:
            f.truncate(size)
        s = Serve(dir, backing, a.cache_mib * MIB)
        s.start()
        size = export_size(s.uri)
        blocks = size // BLOCK
        h = nbd.NBD()
        h.connect_uri(s.uri)
        # Data from before the checkpoint (a pattern), so that writeback and relocation of
        # unchanged blocks happen after it: those must not count as changes.
        pattern = b"\xa5" * BLOCK
        before = bytearray(blocks)
        for _ in range(a.prefill_mib * MIB // (64 * 1024)):
            lba = rng.randrange(0, blocks - 16 + 1)
            h.pwrite(pattern * 16, lba * BLOCK)
            before[lba : lba + 16] = b"\x01" * 16
        h.flush()
        s.ctl_run("checkpoint", "create", "c")
        sizes = [1, 2, 4, 8, 16]
        # Reused buffers (libnbd 1.14's binding keeps a reference to every aio buffer).
        pool = {n: [] for n in sizes}
        sent = bytearray(blocks)
        kill_at = time.monotonic() + rng.uniform(3.0, 6.0)
        sent_writes = acked = 0
        killed = False
        while True:
            try:
                while h.aio_in_flight() < 16 and not killed:
                    n = rng.choice(sizes)
                    lba = rng.randrange(0, blocks - n + 1)
                    buf = pool[n].pop() if pool[n] else nbd.Buffer.from_bytearray(
                        bytearray(os.urandom(n * BLOCK)))
                    sent[lba : lba + n] = b"\x01" * n

                    def done(err, n=n, buf=buf):
                        nonlocal acked
                        pool[n].append(buf)
                        if getattr(err, "value", err) == 0:
                            acked += 1
                        return 1

                    h.aio_pwrite(buf, lba * BLOCK, completion=done)
                    sent_writes += 1
                if not killed and time.monotonic() >= kill_at:
                    s.kill()
                    killed = True
                h.poll(100)
            except nbd.Error:
                break
            if killed and h.aio_in_flight() == 0:
                break
        del h
        s.start()
        runs = dirty_extents(s.uri, "c", size)
        reported = bytearray(blocks)
        for off, length in runs:
            reported[off // BLOCK : (off + length) // BLOCK] = b"\x01" * (length // BLOCK)
        n_sent = sent.count(1)
        n_reported = reported.count(1)
        over = sum(1 for i in range(blocks) if reported[i] and not sent[i])
        # Sent but not reported: the write must have been lost (the block reads as before).
        missing = [i for i in range(blocks) if sent[i] and not reported[i]]
        h = nbd.NBD()
        h.connect_uri(s.uri)
        zero = bytes(BLOCK)
        under = sum(1 for i in missing
                    if h.pread(BLOCK, i * BLOCK) != (pattern if before[i] else zero))
        h.shutdown()
        st = s.status()
        s.stop()
        row = {"seed": seed, "prefill_blocks": before.count(1), "kill_after_writes": sent_writes, "acked_writes": acked,
               "sent_blocks": n_sent, "reported_blocks": n_reported, "over_blocks": over,
               "over_percent": round(100 * over / max(n_reported, 1), 3),
               "sent_not_reported_blocks": len(missing), "under_blocks": under,
               "recovery": {k: v for k, v in st.items() if k.startswith("recovery_checkpoint")}}
        log(row)
        return row
    finally:
        shutil.rmtree(dir, ignore_errors=True)


def overreport(a):
    rows = [overreport_run(a, a.seed + i) for i in range(a.runs)]
    tot_over = sum(r["over_blocks"] for r in rows)
    tot_rep = sum(r["reported_blocks"] for r in rows)
    log({"summary": {"runs": len(rows), "over_percent_each": [r["over_percent"] for r in rows],
                     "over_percent_all": round(100 * tot_over / max(tot_rep, 1), 3),
                     "under_blocks": sum(r["under_blocks"] for r in rows)}})


# ---------------------------------------------------------------------------------------------
# writecost


def fio(uri, a):
    r = subprocess.run(["fio", "--name=w", "--ioengine=nbd", f"--uri={uri}", "--rw=randwrite",
                        "--bs=4k", f"--iodepth={a.iodepth}", "--size=16g", f"--runtime={a.seconds}",
                        "--time_based", "--ramp_time=1", "--norandommap", "--randrepeat=0",
                        "--output-format=json"], check=True, stdout=subprocess.PIPE)
    out = r.stdout.decode()  # fio's nbd engine prints a line before the JSON
    return json.loads(out[out.index("{"):])["jobs"][0]["write"]["iops"]


def writecost(a):
    dir = tempfile.mkdtemp(prefix="lcwcost.", dir=a.dir)
    bins = [("this", BIN)] + ([("compare", a.compare_bin)] if a.compare_bin else [])
    contenders = [(label, b, n) for label, b in bins for n in (0, 2)]
    rows = []
    try:
        for r in range(1, a.rounds + 1):
            # Rotate the order each round so no contender always runs first.
            k = (r - 1) % len(contenders)
            for label, b, n in contenders[k:] + contenders[:k]:
                backing = os.path.join(dir, "backing.img")
                with open(backing, "wb") as f:
                    f.truncate(16 * GIB)
                s = Serve(dir, backing, a.cache_mib * MIB, bin=b)
                s.start()
                for i in range(n):
                    s.ctl_run("checkpoint", "create", f"k{i}")
                iops = fio(s.uri, a)
                st = s.status()
                s.stop()
                row = {"round": r, "binary": label, "checkpoints": n, "iops": round(iops),
                       "checkpoint_pages_written": st["checkpoint_pages_written"],
                       "segments_reclaimed": st["segments_reclaimed"],
                       "load1": os.getloadavg()[0]}
                log(row)
                rows.append(row)
                os.unlink(backing)
                os.unlink(s.cache)
        summary = {}
        for label, _ in bins:
            ratios = []
            for r in range(1, a.rounds + 1):
                by = {x["checkpoints"]: x["iops"] for x in rows
                      if x["round"] == r and x["binary"] == label}
                ratios.append(round(by[2] / by[0], 4))
            summary[label] = {"two_over_none_each_round": ratios, "median": statistics.median(ratios)}
        log({"summary": summary})
    finally:
        shutil.rmtree(dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# holdcost

UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def kept_bytes(line):
    """The bytes export-diff's last line says it kept ("...; 12 MiB rewritten meanwhile kept")."""
    import re
    m = re.search(r"; ([\d.]+) (bytes|KiB|MiB|GiB) rewritten meanwhile kept", line)
    assert m, "no kept figure in: " + line
    return round(float(m.group(1)) * UNITS[m.group(2)])


def export_loop(s, out_path, stop, results):
    """Runs export-diff --since c0 to a file again and again until `stop` is set; a failure
    is appended to `results` as {"error": ...}."""
    try:
        export_loop_inner(s, out_path, stop, results)
    except Exception as e:  # reported by the caller, which owns the measurement
        results.append({"error": repr(e)})


def export_loop_inner(s, out_path, stop, results):
    while not stop.is_set():
        t0 = time.monotonic()
        r = subprocess.run([BIN, "export-diff", "--since", "c0", "--control", s.ctl, out_path],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wall = time.monotonic() - t0
        said = r.stderr.decode().strip()
        assert r.returncode == 0, "export-diff failed: " + said
        results.append({"wall_s": round(wall, 3), "stream_bytes": os.path.getsize(out_path),
                        "kept_bytes": kept_bytes(said)})
        os.unlink(out_path)


def holdcost(a):
    import threading
    dir = tempfile.mkdtemp(prefix="lchold.", dir=a.dir)
    shm = tempfile.mkdtemp(prefix="lchold.", dir="/dev/shm")
    rows = []
    try:
        for r in range(1, a.rounds + 1):
            ways = ["none", "exports"] if r % 2 else ["exports", "none"]
            for way in ways:
                backing = os.path.join(dir, "backing.img")
                with open(backing, "wb") as f:
                    f.truncate(16 * GIB)
                s = Serve(dir, backing, a.cache_mib * MIB)
                s.start()
                s.ctl_run("checkpoint", "create", "c0")
                span = a.span_gib * GIB
                rewrite(s.uri, span, a.diff_mib * MIB, random.Random(a.seed + r), bytearray(span // BLOCK))
                stop, exports = threading.Event(), []
                t = None
                if way == "exports":
                    t = threading.Thread(target=export_loop,
                                         args=(s, os.path.join(shm, "x.diff"), stop, exports))
                    t.start()
                r_fio = subprocess.run(
                    ["fio", "--name=w", "--ioengine=nbd", f"--uri={s.uri}", "--rw=randwrite",
                     "--bs=4k", f"--iodepth={a.iodepth}", f"--size={a.span_gib}g",
                     f"--runtime={a.seconds}", "--time_based", "--norandommap",
                     "--randrepeat=0", "--output-format=json"], check=True, stdout=subprocess.PIPE)
                stop.set()
                if t:
                    t.join()
                errors = [x["error"] for x in exports if "error" in x]
                if errors:
                    sys.exit("export-diff during the writes failed: " + errors[0])
                out = r_fio.stdout.decode()
                iops = json.loads(out[out.index("{"):])["jobs"][0]["write"]["iops"]
                s.stop()
                row = {"round": r, "way": way, "iops": round(iops), "exports": len(exports),
                       "export_wall_s": [x["wall_s"] for x in exports],
                       "stream_bytes": [x["stream_bytes"] for x in exports],
                       "kept_bytes": [x["kept_bytes"] for x in exports],
                       "load1": os.getloadavg()[0]}
                log(row)
                rows.append(row)
                os.unlink(backing)
                os.unlink(s.cache)
        ratios = []
        for r in range(1, a.rounds + 1):
            by = {x["way"]: x["iops"] for x in rows if x["round"] == r}
            ratios.append(round(by["exports"] / by["none"], 4))
        kept = [k for x in rows for k in x["kept_bytes"]]
        log({"summary": {"exports_over_none_each_round": ratios, "median": statistics.median(ratios),
                         "exports": len(kept), "kept_bytes_max": max(kept, default=0),
                         "kept_bytes_median": statistics.median(kept) if kept else 0}})
    finally:
        shutil.rmtree(dir, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("daily")
    d.add_argument("--gib", type=int, default=16)
    d.add_argument("--percent", type=int, default=2)
    d.add_argument("--rounds", type=int, default=3)
    d.add_argument("--seed", type=int, default=21)
    d.add_argument("--backing", help="a data-filled backing file to reuse (filled if missing)")
    m = sub.add_parser("memory")
    m.add_argument("--tib", type=int, default=1)
    m.add_argument("--checkpoints", default="0,1,2,4,8,16")
    o = sub.add_parser("overreport")
    o.add_argument("--runs", type=int, default=5)
    o.add_argument("--seed", type=int, default=2101)
    o.add_argument("--disk-gib", type=int, default=4)
    o.add_argument("--cache-mib", type=int, default=128)
    o.add_argument("--prefill-mib", type=int, default=96)
    w = sub.add_parser("writecost")
    w.add_argument("--rounds", type=int, default=3)
    w.add_argument("--seconds", type=int, default=10)
    w.add_argument("--iodepth", type=int, default=32)
    w.add_argument("--cache-mib", type=int, default=256)
    w.add_argument("--compare-bin", help="a second logcache binary measured the same way, alternated")
    h = sub.add_parser("holdcost")
    h.add_argument("--rounds", type=int, default=3)
    h.add_argument("--seconds", type=int, default=10)
    h.add_argument("--iodepth", type=int, default=32)
    h.add_argument("--cache-mib", type=int, default=1024)
    h.add_argument("--span-gib", type=int, default=2)
    h.add_argument("--diff-mib", type=int, default=512)
    h.add_argument("--seed", type=int, default=2121)
    for x in (d, m, o, w, h):
        x.add_argument("--dir", default="/var/tmp")
    a = p.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit(f"{BIN} missing: cargo build --release -p logcache")
    log({"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
         "binary": BIN, "load": os.getloadavg()})
    try:
        {"daily": daily, "memory": memory, "overreport": overreport, "writecost": writecost,
         "holdcost": holdcost}[a.cmd](a)
    finally:
        for s in SERVES:
            if s.proc is not None:
                s.kill()


if __name__ == "__main__":
    main()
