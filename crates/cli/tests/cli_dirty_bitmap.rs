//! `qemu:dirty-bitmap:NAME` over NBD for every checkpoint, read by real clients: nbdinfo's
//! `--map` and `--list`-style context listing, and `qemu-img map` with qemu's `x-dirty-bitmap`
//! (which reports changed extents as `"data": false`), and libnbd's `block_status`; backup
//! loops that copy only the dirty extents, also across SIGKILLs of serve.

mod common;

use common::*;
use serde_json::Value;

const KIB: u64 = 1024;

/// (offset, length) of the changed extents nbdinfo maps for `context`, merged.
fn nbdinfo_changed(uri: &str, context: &str) -> Vec<(u64, u64)> {
    let out = run(tool("nbdinfo").args(["--json", &format!("--map={context}"), uri]));
    assert_ok(&out, "nbdinfo --map");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("nbdinfo --map --json ({e}): {}", text(&out.stdout)));
    let extents = v.as_array().expect("an array of extents");
    let mut changed: Vec<(u64, u64)> = Vec::new();
    let mut covered = 0;
    for e in extents {
        let (off, len, kind) = (
            e["offset"].as_u64().unwrap(),
            e["length"].as_u64().unwrap(),
            e["type"].as_u64().unwrap(),
        );
        assert_eq!(off, covered, "extents are contiguous: {v}");
        covered += len;
        assert!(kind <= 1, "one flag: {v}");
        if kind == 1 {
            match changed.last_mut() {
                Some(last) if last.0 + last.1 == off => last.1 += len,
                _ => changed.push((off, len)),
            }
        }
    }
    changed
}

/// (offset, length) of the extents `qemu-img map` reports as `"data": false` through
/// `x-dirty-bitmap=qemu:dirty-bitmap:NAME` (qemu's reading of the dirty flag), merged.
fn qemu_img_changed(socket: &str, name: &str) -> Vec<(u64, u64)> {
    let opts = format!(
        "driver=nbd,server.type=unix,server.path={socket},x-dirty-bitmap=qemu:dirty-bitmap:{name}"
    );
    let out = run(tool("qemu-img").args(["map", "--output=json", "--image-opts", &opts]));
    assert_ok(&out, "qemu-img map");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("qemu-img map --output=json ({e}): {}", text(&out.stdout)));
    let mut changed: Vec<(u64, u64)> = Vec::new();
    for e in v.as_array().expect("an array") {
        if e["data"] == Value::Bool(false) {
            let (off, len) = (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap());
            match changed.last_mut() {
                Some(last) if last.0 + last.1 == off => last.1 += len,
                _ => changed.push((off, len)),
            }
        }
    }
    changed
}

fn socket_of(uri: &str) -> String {
    let (_, p) = uri.split_once("socket=").expect("a unix URI");
    percent_decode(p.split('&').next().unwrap_or(p))
}

#[test]
fn dirty_bitmaps_agree_with_what_was_written() {
    let dir = TestDir::new("ckpt-map");
    let (cache, backing) = formatted_pair(&dir, 64 * MIB, 64 * MIB);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    let ctl = served.control().to_string_lossy().into_owned();
    let uri = served.unix_uri();
    qemu_io_ok(&uri, &["write -P 1 0 4M"]);
    logcache_ok(&["checkpoint", "create", "mon", "--control", &ctl]);
    // 64 KiB at 1 MiB, 512 bytes at 3 MiB + 100 KiB (its 4 KiB block), zeros at 8 MiB, a TRIM.
    qemu_io_ok(
        &uri,
        &[
            "write -P 2 1M 64K",
            "write -P 3 3172K 512",
            "write -z 8M 12K",
            "discard 16M 1M",
        ],
    );
    logcache_ok(&["checkpoint", "create", "tue", "--control", &ctl]);
    qemu_io_ok(&uri, &["write -P 4 1M 4K", "write -P 5 20M 8K"]);

    let mon = vec![
        (MIB, 64 * KIB),
        (3172 * KIB, 4 * KIB),
        (8 * MIB, 12 * KIB),
        (16 * MIB, MIB),
        (20 * MIB, 8 * KIB),
    ];
    let tue = vec![(MIB, 4 * KIB), (20 * MIB, 8 * KIB)];
    assert_eq!(nbdinfo_changed(&uri, "qemu:dirty-bitmap:mon"), mon);
    assert_eq!(nbdinfo_changed(&uri, "qemu:dirty-bitmap:tue"), tue);
    let socket = socket_of(&uri);
    assert_eq!(qemu_img_changed(&socket, "mon"), mon);
    assert_eq!(qemu_img_changed(&socket, "tue"), tue);

    // Listing offers base:allocation and one context per checkpoint.
    let out = run(tool("nbdinfo").args(["--json", &uri]));
    assert_ok(&out, "nbdinfo --json");
    let info = text(&out.stdout);
    for name in [
        "base:allocation",
        "qemu:dirty-bitmap:mon",
        "qemu:dirty-bitmap:tue",
    ] {
        assert!(info.contains(name), "nbdinfo lists {name}: {info}");
    }
    // A deleted checkpoint is no longer offered.
    logcache_ok(&["checkpoint", "delete", "mon", "--control", &ctl]);
    let out = run(tool("nbdinfo").args(["--json", &uri]));
    assert!(!text(&out.stdout).contains("qemu:dirty-bitmap:mon"));
    let out = run(tool("nbdinfo").args(["--map=qemu:dirty-bitmap:mon", &uri]));
    assert!(!out.status.success(), "mapping a deleted checkpoint fails");
}

/// The pull-mode backup loop of libvirt-style tools, with real clients: a full copy at
/// checkpoint day0 (`nbdcopy`), then each day changes (qemu-io writes, write-zeroes and TRIMs;
/// fio random writes at iodepth 8 and random TRIMs), a new checkpoint, the previous one's dirty
/// extents from `nbdinfo --map=qemu:dirty-bitmap:NAME`, each copied alone by `qemu-img convert`
/// (a raw window of `offset`/`size` over the NBD export onto the same window of the backup
/// file), and the previous checkpoint deleted. After each day the backup equals the disk, and
/// only the dirty extents were read.
#[test]
fn a_backup_loop_copying_only_the_dirty_extents_reproduces_the_disk() {
    let dir = TestDir::new("backup-loop");
    let (cache, backing) = formatted_pair(&dir, 64 * MIB, 64 * MIB);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    let ctl = served.control().to_string_lossy().into_owned();
    let uri = served.unix_uri();
    let socket = socket_of(&uri);
    let size = 64 * MIB - 4096;
    qemu_io_ok(&uri, &["write -P 1 0 20M", "write -P 2 40M 4M"]);
    logcache_ok(&["checkpoint", "create", "day0", "--control", &ctl]);
    let backup = dir.s("backup.img");
    sparse(std::path::Path::new(&backup), size);
    assert_ok(&run(tool("nbdcopy").args([&uri, &backup])), "nbdcopy");
    let mut rng = Rng::new(2103);
    for day in 1..=3u64 {
        // A day's changes: writes of 512 B to 1 MiB, write-zeroes and TRIM.
        let mut cmds = Vec::new();
        for _ in 0..12 {
            let len = [512, 4096, 64 * KIB, MIB][rng.below(4) as usize];
            let off = rng.below((size - len) / 512) * 512;
            cmds.push(match rng.below(6) {
                0 => format!("write -z {off} {len}"),
                1 => format!("discard {off} {len}"),
                _ => format!("write -P {} {off} {len}", 10 + day),
            });
        }
        let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
        qemu_io_ok(&uri, &cmds);
        // And fio over NBD: 8 writes in flight, 512 B to 1 MiB, then random TRIMs.
        for job in [
            [
                "--rw=randwrite",
                "--bssplit=512/20:4k/40:64k/30:1m/10",
                "--io_size=2m",
            ],
            ["--rw=randtrim", "--bs=64k", "--io_size=512k"],
        ] {
            let out = run(tool("fio")
                .args([
                    "--name=day",
                    "--ioengine=nbd",
                    &format!("--uri={uri}"),
                    "--iodepth=8",
                    "--randrepeat=0",
                    &format!("--randseed={day}"),
                    "--refill_buffers",
                    "--output-format=terse",
                ])
                .args(job)
                .current_dir(dir.path()));
            assert_ok(&out, "fio");
        }
        let (prev, next) = (format!("day{}", day - 1), format!("day{day}"));
        logcache_ok(&["checkpoint", "create", &next, "--control", &ctl]);
        let dirty = nbdinfo_changed(&uri, &format!("qemu:dirty-bitmap:{prev}"));
        let read: u64 = dirty.iter().map(|e| e.1).sum();
        assert!(!dirty.is_empty() && read < size / 3, "day {day}: {dirty:?}");
        for (off, len) in dirty {
            let src = format!(
                "driver=raw,offset={off},size={len},file.driver=nbd,file.server.type=unix,file.server.path={socket}"
            );
            let dst = format!(
                "driver=raw,offset={off},size={len},file.driver=file,file.filename={backup}"
            );
            let out = run(tool("qemu-img").args([
                "convert",
                "--image-opts",
                "-n",
                "--target-image-opts",
                &src,
                &dst,
            ]));
            assert_ok(&out, "qemu-img convert of a dirty extent");
        }
        logcache_ok(&["checkpoint", "delete", &prev, "--control", &ctl]);
        let now = dir.s(format!("now-{day}.img"));
        sparse(std::path::Path::new(&now), size);
        assert_ok(&run(tool("nbdcopy").args([&uri, &now])), "nbdcopy");
        assert!(
            std::fs::read(&backup).unwrap() == std::fs::read(&now).unwrap(),
            "day {day}: the backup ({read} bytes copied) differs from the disk"
        );
        std::fs::remove_file(now).unwrap();
    }
}

/// Applies `ops` over NBD with libnbd (Debian's python3-libnbd): `("w", off, len, byte)`
/// writes `len` bytes of `byte`, `("t", off, len, 0)` trims, `("z", off, len, 0)` writes
/// zeros; then flushes, unless `flush` is false (the writes may then be lost by a crash).
/// With a fourth argument READY, the operations go out asynchronously, 16 in flight, READY is
/// created once 10 have completed, and no flush is sent: the caller kills the server with
/// requests in flight.
const APPLY_OPS: &str = r#"
import nbd, os, sys
uri, ops, flush = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
ready = sys.argv[4] if len(sys.argv) > 4 else None
h = nbd.NBD()
h.connect_uri(uri)
lines = [l.split() for l in open(ops)]
if ready is None:
    for kind, off, n, byte in lines:
        off, n = int(off), int(n)
        if kind == "w":
            h.pwrite(bytes([int(byte)]) * n, off)
        elif kind == "t":
            h.trim(n, off)
        else:
            h.zero(n, off)
    if flush:
        h.flush()
    h.shutdown()
    sys.exit(0)
issued, done, pending = 0, 0, []
while done < len(lines):
    while issued < len(lines) and h.aio_in_flight() < 16:
        kind, off, n, byte = lines[issued]
        off, n = int(off), int(n)
        if kind == "w":
            buf = nbd.Buffer.from_bytearray(bytearray([int(byte)]) * n)
            pending.append(h.aio_pwrite(buf, off))
        elif kind == "t":
            pending.append(h.aio_trim(n, off))
        else:
            pending.append(h.aio_zero(n, off))
        issued += 1
    h.poll(-1)
    for c in [c for c in pending if h.aio_command_completed(c)]:
        pending.remove(c)
        done += 1
    if done >= 10 and not os.path.exists(ready):
        open(ready, "w").close()
"#;

/// A pull-mode incremental backup with libnbd: the extents flagged in `context` by
/// `NBD_CMD_BLOCK_STATUS` (all of the disk asked, in as many requests as the server needs),
/// each read with `pread` and written at the same offset of the backup file. Prints
/// "offset length" per dirty extent.
const PULL_DIRTY: &str = r#"
import nbd, sys
uri, context, backup = sys.argv[1:4]
h = nbd.NBD()
h.add_meta_context(context)
h.connect_uri(uri)
assert h.can_meta_context(context), "the server did not agree to " + context
size = h.get_size()
dirty, off = [], 0
while off < size:
    got = []
    def extents(meta, start, entries, err):
        if meta == context:
            got.extend(entries)
        return 0
    h.block_status(size - off, off, extents)
    at = off
    for i in range(0, len(got), 2):
        n = min(got[i], size - at)
        if got[i + 1] & 1:
            if dirty and dirty[-1][0] + dirty[-1][1] == at:
                dirty[-1][1] += n
            else:
                dirty.append([at, n])
        at += n
    assert at > off, "block status made no progress at %d" % off
    off = at
with open(backup, "r+b") as f:
    for start, n in dirty:
        for at in range(start, start + n, 4 << 20):
            f.seek(at)
            f.write(h.pread(min(4 << 20, start + n - at), at))
for start, n in dirty:
    print(start, n)
h.shutdown()
"#;

/// Random changes of 512 B to 1 MiB at sector offsets (most not 4 KiB aligned): writes,
/// write-zeroes and TRIMs, as `APPLY_OPS` lines. Marks
/// in `touched` every 4 KiB block an operation overlaps, in `must` those a write or
/// write-zeroes overlaps (they change what the block reads). A TRIM is a hint: logcache leaves
/// it out while older dirty data waits for the backing device (`writeback_order=consistent`),
/// and then the checkpoint may forget it after a restart, rightly, since nothing changed; when
/// it does drop and discard, the block's new content must be reported, which the byte-for-byte
/// comparison of the backups checks.
fn random_ops(
    rng: &mut Rng,
    size: u64,
    count: usize,
    pattern: &mut u8,
    touched: &mut [bool],
    must: &mut [bool],
) -> String {
    let mut lines = String::new();
    for _ in 0..count {
        let len = match rng.below(4) {
            0 => 512 * (1 + rng.below(8)),
            1 => 4096 * (1 + rng.below(16)),
            2 => 512 * (1 + rng.below(2048)),
            _ => MIB,
        };
        let off = rng.below((size - len) / 512 + 1) * 512;
        let (first, end) = (off / 4096, (off + len).div_ceil(4096));
        let kind = ["w", "w", "w", "z", "t"][rng.below(5) as usize];
        *pattern = pattern.wrapping_add(1).max(1);
        lines.push_str(&format!("{kind} {off} {len} {pattern}\n"));
        for blk in first..end {
            touched[blk as usize] = true;
        }
        if kind != "t" {
            for blk in first..end {
                must[blk as usize] = true;
            }
        }
    }
    lines
}

fn python_nbd(script: &std::path::Path, args: &[&str]) -> std::process::Output {
    run(std::process::Command::new("/usr/bin/python3")
        .arg(script)
        .args(args))
}

/// The backup loop across SIGKILLs and clean restarts of serve, the cache small enough (16 MiB
/// for a 64 MiB disk) that the log wraps and writeback and reclaim run: a full copy at
/// checkpoint c0 (`nbdcopy`), then rounds of libnbd writes of 512 B to 1 MiB, write-zeroes and
/// TRIMs (flushed; some not flushed, and more in flight, at a SIGKILL), a kill or stop and restart in the
/// middle of most rounds, then `export-diff --since PREV --checkpoint NEXT` and a pull of
/// PREV's dirty extents (libnbd `block_status` on `qemu:dirty-bitmap:PREV`, `pread` of those
/// extents only). Two backups are kept: the pulled one and a copy updated by `import-diff`;
/// after every round both equal the disk byte for byte, every block an operation changed is
/// reported (never an under-report), both channels report the same blocks, and the blocks
/// reported that no operation touched (the over-report) are counted and printed.
#[test]
fn a_dirty_bitmap_backup_and_a_diff_chain_across_sigkills_reproduce_the_disk() {
    let dir = TestDir::new("backup-kill");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    let args = ["--cache", cache.as_str(), "--backing", backing.as_str()];
    let mut served = Some(Served::start(&args));
    let size = 64 * MIB - 4096;
    let blocks = (size / 4096) as usize;
    let apply = dir.join("apply.py");
    let pull = dir.join("pull.py");
    std::fs::write(&apply, APPLY_OPS).unwrap();
    std::fs::write(&pull, PULL_DIRTY).unwrap();
    let ops_file = dir.s("ops.txt");
    let mut rng = Rng::new(2105);
    let mut pattern = 0u8;
    let (mut touched, mut must) = (vec![false; blocks], vec![false; blocks]);
    let run_ops = |uri: &str, ops: &str, flush: bool| {
        std::fs::write(&ops_file, ops).unwrap();
        let flush = if flush { "1" } else { "0" };
        assert_ok(
            &python_nbd(&apply, &[uri, &ops_file, flush]),
            "libnbd writes",
        );
    };
    {
        let s = served.as_ref().unwrap();
        let (mut t, mut m) = (vec![false; blocks], vec![false; blocks]);
        let base = random_ops(&mut rng, size, 40, &mut pattern, &mut t, &mut m);
        run_ops(&s.unix_uri(), &base, true);
        let ctl = s.control().to_string_lossy().into_owned();
        logcache_ok(&["checkpoint", "create", "c0", "--control", &ctl]);
    }
    let pulled = dir.s("pulled.img");
    let chained = dir.s("chained.img");
    for copy in [&pulled, &chained] {
        sparse(std::path::Path::new(copy), size);
        let uri = served.as_ref().unwrap().unix_uri();
        assert_ok(&run(tool("nbdcopy").args([uri.as_str(), copy])), "nbdcopy");
    }
    let (mut kills, mut over_pulled, mut same_total) = (0, 0, 0);
    let (mut reported_total, mut touched_total) = (0, 0);
    let rounds = 6;
    for round in 1..=rounds {
        let prev = format!("c{}", round - 1);
        let next = format!("c{round}");
        let uri = served.as_ref().unwrap().unix_uri();
        let ops = random_ops(&mut rng, size, 12, &mut pattern, &mut touched, &mut must);
        run_ops(&uri, &ops, true);
        match round % 3 {
            1 => {
                // Changes acknowledged but not flushed, then SIGKILL with more in flight (16
                // at a time): they may be lost or kept; either way the backups must follow
                // what the disk reads (so they are touched, not a must: a lost write changed
                // nothing).
                let mut lost_or_kept = vec![false; blocks];
                let mut random = |n| {
                    random_ops(
                        &mut rng,
                        size,
                        n,
                        &mut pattern,
                        &mut touched,
                        &mut lost_or_kept,
                    )
                };
                let ops = random(6);
                run_ops(&uri, &ops, false);
                let in_flight = dir.s("in-flight.txt");
                std::fs::write(&in_flight, random(80)).unwrap();
                let ready = dir.join("ready");
                let _ = std::fs::remove_file(&ready);
                let mut writer = std::process::Command::new("/usr/bin/python3")
                    .arg(&apply)
                    .args([&uri, &in_flight, "0", &ready.to_string_lossy()])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                let start = std::time::Instant::now();
                while !ready.exists() && start.elapsed() < COMMAND_TIMEOUT {
                    assert!(
                        writer.try_wait().unwrap().is_none(),
                        "the writer ended early"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                assert!(ready.exists(), "the writer never got 10 requests done");
                served.take().unwrap().kill();
                // Its connection gone, the writer fails; whatever it had in flight is the
                // crash's to keep or lose.
                assert!(
                    wait_timeout(&mut writer, COMMAND_TIMEOUT).is_some(),
                    "the writer hangs after serve was killed"
                );
                kills += 1;
                served = Some(Served::start(&args));
            }
            2 => {
                assert!(served.take().unwrap().stop().status.success());
                served = Some(Served::start(&args));
            }
            _ => {
                let ctl = served.as_ref().unwrap().control();
                assert_ok(
                    &logcache(&["drain", "--control", &ctl.to_string_lossy()]),
                    "drain",
                );
            }
        }
        let s = served.as_ref().unwrap();
        let (uri, ctl) = (s.unix_uri(), s.control().to_string_lossy().into_owned());
        let ops = random_ops(&mut rng, size, 12, &mut pattern, &mut touched, &mut must);
        run_ops(&uri, &ops, true);

        // The diff chain: PREV's changes as a stream, NEXT created at its moment.
        let diff = dir.s(format!("{prev}-{next}.diff"));
        let out = run(
            std::process::Command::new(env!("CARGO_BIN_EXE_logcache")).args([
                "export-diff",
                "--since",
                &prev,
                "--checkpoint",
                &next,
                "--control",
                &ctl,
                &diff,
            ]),
        );
        assert_ok(&out, "export-diff");
        logcache_ok(&["import-diff", &diff, &chained, "--from", &prev]);
        let mut in_diff = vec![false; blocks];
        let mut d = logcache_diff::Decoder::new(std::io::BufReader::new(
            std::fs::File::open(&diff).unwrap(),
        ))
        .expect("a stream");
        while let Some(p) = d.next_piece().expect("a valid stream") {
            let (off, len) = match p {
                logcache_diff::Piece::Data {
                    offset_bytes,
                    bytes,
                } => (offset_bytes, bytes.len() as u64),
                logcache_diff::Piece::Zero {
                    offset_bytes,
                    length_bytes,
                } => (offset_bytes, length_bytes),
            };
            for blk in off / 4096..(off + len).div_ceil(4096) {
                in_diff[blk as usize] = true;
            }
        }
        std::fs::remove_file(&diff).unwrap();

        let before = std::fs::read(&pulled).unwrap();
        let read_bytes = |s: &Served| s.status()["read_bytes"].as_u64().expect("read_bytes");
        let read_before = read_bytes(s);
        // The pull: PREV's dirty extents only (no client writes since NEXT, so PREV's bitmap
        // now describes the same moment).
        let out = python_nbd(
            &pull,
            &[&uri, &format!("qemu:dirty-bitmap:{prev}"), &pulled],
        );
        assert_ok(&out, "libnbd pull of the dirty extents");
        let mut reported = vec![false; blocks];
        let mut pulled_bytes = 0;
        for line in text(&out.stdout).lines() {
            let (off, len) = line.split_once(' ').unwrap();
            let (off, len): (u64, u64) = (off.parse().unwrap(), len.parse().unwrap());
            pulled_bytes += len;
            for blk in off / 4096..(off + len).div_ceil(4096) {
                reported[blk as usize] = true;
            }
        }
        // Only the dirty extents were read (serve counts the bytes clients read).
        assert_eq!(
            read_bytes(s) - read_before,
            pulled_bytes,
            "round {round}: bytes read by the pull"
        );
        logcache_ok(&["checkpoint", "delete", &prev, "--control", &ctl]);

        let under: Vec<usize> = (0..blocks).filter(|&b| must[b] && !reported[b]).collect();
        assert!(
            under.is_empty(),
            "round {round}: {} changed blocks not in qemu:dirty-bitmap:{prev} (first {:?})",
            under.len(),
            &under[..under.len().min(8)]
        );
        let differ = (0..blocks).filter(|&b| reported[b] != in_diff[b]).count();
        assert_eq!(
            differ, 0,
            "round {round}: the dirty bitmap and export-diff report different blocks"
        );
        let now = dir.s("now.img");
        sparse(std::path::Path::new(&now), size);
        assert_ok(&run(tool("nbdcopy").args([uri.as_str(), &now])), "nbdcopy");
        let now_bytes = std::fs::read(&now).unwrap();

        // Over-report: reported blocks no operation touched, and reported blocks whose bytes
        // did not change (TRIMs left out, unflushed writes the SIGKILL lost, rewrites with the
        // same bytes, the 4 KiB granularity).
        let over = (0..blocks).filter(|&b| reported[b] && !touched[b]).count();
        let same = (0..blocks)
            .filter(|&b| reported[b] && before[b * 4096..][..4096] == now_bytes[b * 4096..][..4096])
            .count();
        let n_reported = reported.iter().filter(|&&r| r).count();
        let n_touched = touched.iter().filter(|&&t| t).count();
        eprintln!(
            "round {round} ({}): {n_reported} blocks reported, {n_touched} touched; \
             over-report {over} untouched, {same} with unchanged bytes",
            ["drain", "SIGKILL", "clean restart"][round % 3]
        );
        over_pulled += over;
        same_total += same;
        reported_total += n_reported;
        touched_total += n_touched;
        for (copy, what) in [(&pulled, "the pulled backup"), (&chained, "the diff chain")] {
            let got = std::fs::read(copy).unwrap();
            if got != now_bytes {
                let blk = (0..blocks)
                    .find(|&b| got[b * 4096..][..4096] != now_bytes[b * 4096..][..4096])
                    .unwrap();
                panic!("round {round}: {what} differs from the disk first in block {blk}");
            }
        }
        std::fs::remove_file(now).unwrap();
        touched.fill(false);
        must.fill(false);
    }
    eprintln!(
        "{rounds} rounds, {kills} SIGKILLs: {reported_total} blocks reported, {touched_total} \
         touched; over-report {over_pulled} untouched ({:.2}%), {same_total} with unchanged \
         bytes ({:.2}%)",
        100.0 * over_pulled as f64 / reported_total.max(1) as f64,
        100.0 * same_total as f64 / reported_total.max(1) as f64
    );
    assert!(kills >= 2);
}
