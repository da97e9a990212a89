//! `logcache detach --force --backing SPEC [--cache PATH]` for a cache device that is lost:
//! a cache file deleted, one truncated, and a cache device that returns EIO. The EIO device is
//! an emulation of a failing SSD: the cache file served by nbdkit's file plugin behind its
//! error filter (every request fails with EIO while a trigger file exists), exposed to
//! logcache as a file by nbdfuse. The same device also starts failing while serve runs (a
//! flush fails promptly, status names the error, serve stops on SIGTERM). In each case the
//! serve is stopped with data flushed to the cache but not written back; detach must then say which past disk the backing device
//! holds (the drained state), mark it so the old cache is refused, and let `format` give it a
//! new cache without `--force`.

mod common;

use std::fs;
use std::path::Path;

use common::attached::{preflight, Fused};
use common::*;

const CACHE_BYTES: u64 = 16 * MIB;
const BACKING_BYTES: u64 = 32 * MIB;

/// Serves `cache` (a path) for `backing`, writes 1 MiB of 0xaa and drains it, then writes
/// 2 MiB of 0xbb after it and flushes (durable in the cache only: writeback is off), and
/// SIGKILLs the serve. Its sockets go in `dir` (a FUSE directory cannot hold them).
fn lose_newest_writes(dir: &TestDir, cache: &str, backing: &str) {
    let killed = serve_with_unwritten_data(dir, cache, backing).kill();
    assert!(!killed.status.success());
}

/// The serve of [`lose_newest_writes`], still running.
fn serve_with_unwritten_data(dir: &TestDir, cache: &str, backing: &str) -> Served {
    let (socket, control) = (dir.s("serve.sock"), dir.s("serve.ctl"));
    let served = Served::start(&[
        "--cache",
        cache,
        "--backing",
        backing,
        "--socket",
        &socket,
        "--control",
        &control,
        "--set",
        "writeback_idle_ms=0",
        "--set",
        "writeback_threshold_percent=100",
    ]);
    let uri = served.unix_uri();
    qemu_io_ok(&uri, &["write -P 0xaa 0 1M", "flush"]);
    let control = served.control();
    logcache_ok(&["drain".as_ref(), "--control".as_ref(), control.as_os_str()]);
    qemu_io_ok(&uri, &["write -P 0xbb 1M 2M", "flush"]);
    let s = served.status();
    assert_eq!(s["writeback_lag_bytes"].as_u64(), Some(2 * MIB), "{s}");
    served
}

/// An emulated failing SSD: a cache file behind nbdkit's error filter (every request fails
/// with EIO while `trigger` exists), seen as a file through nbdfuse.
struct EioCache {
    _nbdkit: Daemon,
    fused: Fused,
    trigger: std::path::PathBuf,
}

impl EioCache {
    fn start(dir: &TestDir) -> EioCache {
        let raw = dir.s("cache-raw.img");
        sparse(Path::new(&raw), CACHE_BYTES);
        let trigger = dir.join("fail-now");
        let sock = dir.join("nbdkit.sock");
        let nbdkit = Daemon::start(
            tool("nbdkit")
                .args(["--foreground", "--exit-with-parent", "--unix"])
                .arg(&sock)
                .args(["--filter=error", "file"])
                .arg(&raw)
                .args(["error=EIO", "error-rate=100%"])
                .arg(format!("error-file={}", trigger.display())),
            &sock,
            &dir.join("nbdkit.log"),
        );
        let fused = Fused::start(
            dir,
            "cache",
            &format!("nbd+unix:///?socket={}", sock.display()),
        );
        EioCache {
            _nbdkit: nbdkit,
            fused,
            trigger,
        }
    }

    /// A failing-SSD cache formatted for a new backing file: (it, cache path, backing path).
    fn formatted(dir: &TestDir) -> (EioCache, String, String) {
        let eio = EioCache::start(dir);
        let cache = eio.path();
        let backing = dir.s("backing.img");
        sparse(Path::new(&backing), BACKING_BYTES);
        format_256k(&cache, &backing);
        (eio, cache, backing)
    }

    fn path(&self) -> String {
        self.fused.file().to_string_lossy().into_owned()
    }

    /// From now on every request fails with EIO.
    fn fail(&self) {
        fs::write(&self.trigger, b"").unwrap();
    }

    fn heal(&self) {
        fs::remove_file(&self.trigger).unwrap();
    }
}

/// The backing device holds the drained disk: the first write, not the lost one.
fn assert_backing_holds_the_drained_disk(backing: &str) {
    assert_backing_holds_the_drained_disk_and(backing, 0);
}

/// 1 MiB of 0xaa, then 2 MiB of `next`.
fn assert_backing_holds_the_drained_disk_and(backing: &str, next: u8) {
    let p = Path::new(backing);
    assert!(read_at(p, 0, MIB as usize).iter().all(|&b| b == 0xaa));
    assert!(read_at(p, MIB, 2 * MIB as usize).iter().all(|&b| b == next));
}

/// Runs `detach --force`, which must succeed and say what the backing device holds; returns
/// (stdout, stderr).
fn detach_ok(args: &[&str]) -> (String, String) {
    let mut all = vec!["detach", "--force"];
    all.extend_from_slice(args);
    let out = logcache(&all);
    assert_ok(&out, &format!("logcache {}", all.join(" ")));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("the disk as of ") && stdout.contains(" UTC"),
        "detach does not say which disk the backing device holds:\n{stdout}"
    );
    assert!(stdout.contains("logcache format --cache NEW"), "{stdout}");
    (stdout, text(&out.stderr))
}

/// After a detach: the old cache is refused, a second detach says it is done, and a new cache
/// is formatted without --force and serves the drained disk.
fn assert_usable_after_detach(dir: &TestDir, backing: &str) {
    let again = logcache_ok(&["detach", "--force", "--backing", backing]);
    assert!(again.contains("already detached"), "{again}");
    let fresh = dir.s("fresh.img");
    sparse(Path::new(&fresh), CACHE_BYTES);
    // Format says what the label records: the previous cache's writes were given up.
    let formatted = logcache_ok(&["format", "--cache", &fresh, "--backing", backing]);
    assert!(
        formatted.contains("was detached from its previous cache at ")
            && formatted.contains("giving up that cache's writes not yet written back"),
        "{formatted}"
    );
    let served = Served::start(&["--cache", &fresh, "--backing", backing]);
    let got = qemu_io_ok(
        &served.unix_uri(),
        &["read -P 0xaa 0 1M", "read -P 0 1M 2M"],
    );
    assert!(!got.contains("fail"), "{got}");
    served.stop();
}

#[test]
fn detach_without_force_or_label_is_one_line() {
    let dir = TestDir::new("detach-refuse");
    let (_cache, backing) = formatted_pair(&dir, CACHE_BYTES, BACKING_BYTES);
    fails_with(
        1,
        &["detach", "--backing", &backing],
        &["logcache drain", "--force"],
    );
    let plain = dir.s("plain.img");
    sparse(Path::new(&plain), BACKING_BYTES);
    fails_with(
        1,
        &["detach", "--force", "--backing", &plain],
        &["no logcache label", "nothing to detach"],
    );
    // A served backing device is in use: nothing is written.
    let served = Served::start(&["--cache", &_cache, "--backing", &backing]);
    fails_with(
        1,
        &["detach", "--force", "--backing", &backing],
        &["in use"],
    );
    served.stop();
}

#[test]
fn detach_force_after_the_cache_file_was_deleted() {
    let dir = TestDir::new("detach-deleted");
    let (cache, backing) = formatted_pair(&dir, CACHE_BYTES, BACKING_BYTES);
    lose_newest_writes(&dir, &cache, &backing);
    // While it still reads whole, detach with --cache refuses: drain would keep its data.
    fails_with(
        1,
        &[
            "detach",
            "--force",
            "--backing",
            &backing,
            "--cache",
            &cache,
        ],
        &["still reads whole", "logcache drain"],
    );
    // `check` shows what detach would report.
    let checked = text(&logcache(&["check", "--cache", &cache, "--backing", &backing]).stdout);
    assert!(
        checked.contains("writeback record: alone, the backing device holds the disk as of"),
        "{checked}"
    );
    fs::remove_file(&cache).unwrap();
    let (stdout, stderr) = detach_ok(&["--backing", &backing, "--cache", &cache]);
    assert!(stderr.contains("is gone"), "{stderr}");
    assert!(stdout.contains("when writeback had caught up"), "{stdout}");
    assert_backing_holds_the_drained_disk(&backing);
    assert_usable_after_detach(&dir, &backing);
}

/// A mark serve began and could not finish (issue 25: the cache device failed, and the
/// backing device took the record but failed the label write, every try): serve refuses the
/// old cache with one line naming `detach --force`, which finishes the mark and says what was
/// lost; then `format` says it again and the disk serves with a new cache.
#[test]
fn detach_force_finishes_a_mark_serve_could_not_finish() {
    use logcache_engine::format::label::{Label, WritebackRecord, RECORD_SERVED_ALONE};
    use std::os::unix::fs::FileExt;
    let dir = TestDir::new("detach-unfinished");
    let (cache, backing) = formatted_pair(&dir, CACHE_BYTES, BACKING_BYTES);
    lose_newest_writes(&dir, &cache, &backing);
    // Serve's mark, begun: the record (detached, served alone, what was lost), not the label.
    let label_at = BACKING_BYTES - 4096;
    let block = read_at(Path::new(&backing), label_at, 4096);
    let label = Label::decode(&block).unwrap().expect("a label");
    let mut r = WritebackRecord::detached_from(
        WritebackRecord::decode_from_label(&block),
        &label,
        1_795_600_000_000,
    );
    r.flags |= RECORD_SERVED_ALONE;
    r.lost_bytes = 2 * MIB;
    fs::OpenOptions::new()
        .write(true)
        .open(&backing)
        .unwrap()
        .write_all_at(&r.encode(), label_at + 1024)
        .unwrap();
    fails_with(
        1,
        &["serve", "--cache", &cache, "--backing", &backing],
        &["only in part", "logcache detach --force --backing"],
    );
    let finished = logcache_ok(&["detach", "--force", "--backing", &backing]);
    assert!(
        finished.contains("finished detaching") && finished.contains("2097152 bytes"),
        "{finished}"
    );
    let again = logcache_ok(&["detach", "--force", "--backing", &backing]);
    assert!(again.contains("already detached"), "{again}");
    let fresh = dir.s("fresh.img");
    sparse(Path::new(&fresh), CACHE_BYTES);
    let formatted = logcache_ok(&["format", "--cache", &fresh, "--backing", &backing]);
    assert!(formatted.contains("lost 2097152 bytes"), "{formatted}");
    let served = Served::start(&["--cache", &fresh, "--backing", &backing]);
    qemu_io_ok(
        &served.unix_uri(),
        &["read -P 0xaa 0 1M", "read -P 0 1M 2M"],
    );
    served.stop();
}

#[test]
fn detach_force_after_the_cache_file_was_truncated() {
    let dir = TestDir::new("detach-truncated");
    let (cache, backing) = formatted_pair(&dir, CACHE_BYTES, BACKING_BYTES);
    lose_newest_writes(&dir, &cache, &backing);
    // Its superblock region survives; the log does not.
    fs::OpenOptions::new()
        .write(true)
        .open(&cache)
        .unwrap()
        .set_len(2 * MIB)
        .unwrap();
    fails_with(
        1,
        &["serve", "--cache", &cache, "--backing", &backing],
        &["truncated"],
    );
    let (_, stderr) = detach_ok(&["--backing", &backing, "--cache", &cache]);
    assert!(stderr.contains("is truncated"), "{stderr}");
    assert_backing_holds_the_drained_disk(&backing);
    assert_usable_after_detach(&dir, &backing);
}

#[test]
fn detach_force_when_the_cache_device_returns_eio() {
    preflight(&["nbdkit"]);
    let dir = TestDir::new("detach-eio");
    let (eio, cache, backing) = EioCache::formatted(&dir);
    lose_newest_writes(&dir, &cache, &backing);
    // The device fails: every read returns EIO.
    eio.fail();
    fails_with(1, &["serve", "--cache", &cache, "--backing", &backing], &[]);
    detach_the_unreadable_cache(&dir, &eio, &backing);
}

/// With `eio` failing: detach --force says the cache is unreadable and leaves the drained
/// disk; when the device comes back with its old log intact, the detached backing device
/// refuses it; a new cache works.
fn detach_the_unreadable_cache(dir: &TestDir, eio: &EioCache, backing: &str) {
    let cache = eio.path();
    let (_, stderr) = detach_ok(&["--backing", backing, "--cache", &cache]);
    assert!(
        stderr.contains("is unreadable") && stderr.contains("Input/output error"),
        "{stderr}"
    );
    assert_backing_holds_the_drained_disk(backing);
    eio.heal();
    fails_with(
        1,
        &["serve", "--cache", &cache, "--backing", backing],
        &["detached", "logcache format"],
    );
    assert_usable_after_detach(dir, backing);
}

/// The cache device starts failing while serve runs, with 2 MiB of dirty data on it, flushed
/// (issue 25: "IO errors from the cache device while serving"): serve goes on from the backing
/// device alone. Reads of the sectors whose only copy was on the failed device fail with EIO,
/// never with the backing device's older bytes; the dirty data still in RAM (the write the
/// failing flush covered, the open segment's part of the 2 MiB) was written to the backing
/// device and reads exactly, as does every other range; new writes work and read back; a write
/// over part of a lost block makes only that part current; flushes work (nothing lost was
/// never flushed); status says `cache failed: <reason>` and how much is lost; serve stops
/// cleanly; the backing device is marked detached with the loss on record, the old
/// cache is refused with one line that says so, and detach reports it.
#[test]
fn the_cache_device_failing_with_dirty_data_serves_the_rest_from_the_backing_device() {
    preflight(&["nbdkit"]);
    let dir = TestDir::new("detach-eio-serving");
    let (eio, cache, backing) = EioCache::formatted(&dir);
    let served = serve_with_unwritten_data(&dir, &cache, &backing);
    let uri = served.unix_uri();
    eio.fail();
    // Acknowledged into RAM (`-t writeback`: qemu-io's default, writethrough, would send it
    // with FUA), then flushed: the cache device fails under it. (Whether this flush fails
    // depends on the emulation: the FUSE page cache may take the chunk and its sync may reach
    // no device; the engine test
    // `a_cache_device_error_with_dirty_data_serves_the_rest_from_the_backing_device` checks
    // that a flush covering a lost, never-durable write fails.) Every later request meets the
    // dead device, so one more flush decides.
    let out = qemu_io(
        &uri,
        &["-t", "writeback"],
        &["write -P 0xcc 3M 64k", "flush"],
    );
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(said.contains("wrote 65536/65536"), "{said}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while served.status()["state"].as_str() != Some("cache failed") {
        assert!(
            std::time::Instant::now() < deadline,
            "serve did not go on alone: {}",
            served.status()
        );
        qemu_io(&uri, &[], &["flush"]);
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let s = served.status();
    assert_eq!(s["state"].as_str(), Some("cache failed"), "{s}");
    // The 2 MiB on the cache device but the open segment's part (256 KiB segments): that part
    // and the 64 KiB write were still in RAM.
    let lost = s["lost_at_failure_bytes"].as_u64().unwrap_or_default();
    assert!(lost > 3 * MIB / 2 && lost < 2 * MIB, "{s}");
    assert_eq!(s["lost_bytes"].as_u64(), Some(lost), "{s}");
    let why = s["cache_failure"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("cache failed: ")
            && why.contains("Input/output error")
            && why.contains("serving from the backing device alone")
            && why.contains("is lost"),
        "{s}"
    );
    let control = served.control();
    let shown = logcache_ok(&["status".as_ref(), "--control".as_ref(), control.as_os_str()]);
    assert!(
        shown.contains("  cache failed: ")
            && !shown.contains("FAILED")
            && shown.contains(&format!(
                "lost with the cache device: {:.1} MiB when it failed",
                lost as f64 / MIB as f64
            )),
        "{shown}"
    );
    // Lost ranges: EIO, whole or in part, never the backing device's zeros.
    for cmd in ["read 1M 64k", "read 2M 4k", "read 960k 128k"] {
        let out = qemu_io(&uri, &[], &[cmd]);
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(
            said.contains("Input/output error") && !said.contains(" bytes at offset"),
            "{cmd}: {said}"
        );
    }
    // Everything else exact; new writes read back; a partial overwrite of a lost block makes
    // only what it wrote current.
    qemu_io_ok(
        &uri,
        &[
            "read -P 0xaa 0 1M",
            "read -P 0xcc 3M 64k",
            "read -P 0 4M 1M",
            "write -P 0xdd 5M 64k",
            "read -P 0xdd 5M 64k",
            "write -P 0xee 1M 512",
            "read -P 0xee 1M 512",
        ],
    );
    let out = qemu_io(&uri, &[], &["read 1M 4k"]);
    assert!(
        text(&out.stdout).contains("read failed: Input/output error"),
        "{out:?}"
    );
    qemu_io_ok(
        &uri,
        &["write -P 0xcf 3M 64k", "flush", "read -P 0xcf 3M 64k"],
    );
    let s = served.status();
    assert_eq!(s["lost_bytes"].as_u64(), Some(lost - 512), "{s}");
    let shown = logcache_ok(&["status".as_ref(), "--control".as_ref(), control.as_os_str()]);
    assert!(
        shown.contains(&format!("({} bytes) still lost", lost - 512)),
        "{shown}"
    );
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
    let p = Path::new(&backing);
    assert!(read_at(p, 0, MIB as usize).iter().all(|&b| b == 0xaa));
    assert!(read_at(p, MIB, 512).iter().all(|&b| b == 0xee));
    assert!(read_at(p, 3 * MIB, 65536).iter().all(|&b| b == 0xcf));
    assert!(read_at(p, 5 * MIB, 65536).iter().all(|&b| b == 0xdd));
    // After the restart: the old cache is refused, saying the data lost; detach reports it.
    eio.heal();
    let refused = fails_with(
        1,
        &["serve", "--cache", &cache, "--backing", &backing],
        &[
            "detached",
            &format!("{lost} bytes"),
            "were lost",
            "logcache format",
        ],
    );
    eprintln!("serve on the old cache: {refused}");
    let again = logcache_ok(&["detach", "--force", "--backing", &backing]);
    assert!(
        again.contains("already detached") && again.contains(&format!("{lost} bytes")),
        "{again}"
    );
    // A new cache: format says, in one line, what the backing device lost with the old one.
    let fresh = dir.s("fresh.img");
    sparse(Path::new(&fresh), CACHE_BYTES);
    let formatted = logcache_ok(&["format", "--cache", &fresh, "--backing", &backing]);
    assert!(
        formatted.contains(&format!("lost {lost} bytes"))
            && formatted.contains("with its previous cache, whose device failed at "),
        "{formatted}"
    );
}

/// An NBD backing device (nbdkit's file plugin): no local lock, an owner record beside the
/// writeback record in its label block. The killed serve's record names a dead process, so
/// detach goes ahead; the detach mark and the new cache work over NBD as over a file.
#[test]
fn detach_force_over_an_nbd_backing_device() {
    let dir = TestDir::new("detach-nbd");
    let file = dir.s("backing.img");
    sparse(Path::new(&file), BACKING_BYTES);
    let sock = dir.join("backing.sock");
    let _nbdkit = Daemon::start(
        tool("nbdkit")
            .args(["--foreground", "--exit-with-parent", "--unix"])
            .arg(&sock)
            .arg("file")
            .arg(&file),
        &sock,
        &dir.join("nbdkit.log"),
    );
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let cache = dir.s("cache.img");
    sparse(Path::new(&cache), CACHE_BYTES);
    format_256k(&cache, &uri);
    lose_newest_writes(&dir, &cache, &uri);
    fs::remove_file(&cache).unwrap();
    let (stdout, _) = detach_ok(&["--backing", &uri]);
    // The record of the drain, or (on a loaded machine, once the pace allowed) a later one
    // counting the 2 MiB not written back.
    assert!(
        stdout.contains("when writeback had caught up")
            || stdout.contains("2.0 MiB of later writes were in the lost cache"),
        "{stdout}"
    );
    assert_backing_holds_the_drained_disk(&file);
    assert_usable_after_detach(&dir, &uri);
}

/// The cache device fails while serve runs in write-through mode, holding no dirty data (issue
/// 25: "with no dirty data, service goes on from the backing device alone, as bcache does, and
/// status says so"): writes, flushes and reads go on against the backing device, status says
/// `cache failed` with the device's error, serve stops cleanly, the backing device holds every
/// write, and the old cache, once readable again, is refused (it would serve stale copies).
#[test]
fn the_cache_device_failing_with_no_dirty_data_leaves_serve_on_the_backing_device_alone() {
    preflight(&["nbdkit"]);
    let dir = TestDir::new("alone");
    let (eio, cache, backing) = EioCache::formatted(&dir);
    let (socket, control) = (dir.s("serve.sock"), dir.s("serve.ctl"));
    let served = Served::start(&[
        "--cache",
        &cache,
        "--backing",
        &backing,
        "--socket",
        &socket,
        "--control",
        &control,
        "--set",
        "cache_mode=write-through",
    ]);
    let uri = served.unix_uri();
    qemu_io_ok(&uri, &["write -P 0xaa 0 1M", "flush", "read -P 0xaa 0 1M"]);
    eio.fail();
    qemu_io_ok(
        &uri,
        &[
            "write -P 0xbb 1M 2M",
            "flush",
            "read -P 0xaa 0 1M",
            "read -P 0xbb 1M 2M",
        ],
    );
    let s = served.status();
    assert_eq!(s["state"].as_str(), Some("cache failed"), "{s}");
    let why = s["cache_failure"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("cache failed: ")
            && why.contains("Input/output error")
            && why.contains("serving from the backing device alone"),
        "{s}"
    );
    let shown = logcache_ok(&["status", "--control", &control]);
    assert!(shown.contains("  cache failed: "), "{shown}");
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
    assert_backing_holds_the_drained_disk_and(&backing, 0xbb);
    eio.heal();
    fails_with(
        1,
        &["serve", "--cache", &cache, "--backing", &backing],
        &["detached", "logcache format"],
    );
    let fresh = dir.s("fresh.img");
    sparse(Path::new(&fresh), CACHE_BYTES);
    let formatted = logcache_ok(&["format", "--cache", &fresh, "--backing", &backing]);
    assert!(
        !formatted.contains("note:"),
        "nothing was lost: {formatted}"
    );
}
