//! A real filesystem on the served disk: nbdfuse exposes the NBD export as a file, a loop
//! device makes it a block device, XFS goes on top. Files written and synced before the
//! server is SIGKILLed must all be there, byte for byte, after it restarts; xfs_repair finds
//! nothing to repair.
//!
//! Needs root (losetup, mount), /dev/fuse and loop devices; fails (never skips) without them.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::attached::{preflight as preflight_tools, run_ok, Attached};
use common::*;

const CACHE_BYTES: u64 = 128 * MIB;
// mkfs.xfs refuses filesystems smaller than 300 MiB.
const BACKING_BYTES: u64 = 512 * MIB;
const FILES: usize = 200;
const MAX_FILE_BYTES: u64 = 256 * 1024;

fn preflight() {
    preflight_tools(&["mkfs.xfs", "xfs_repair", "fstrim"]);
}

/// A tree of files with seeded sizes and contents, some in nested directories.
fn tree(seed: u64) -> Vec<(PathBuf, Vec<u8>)> {
    let mut rng = Rng::new(seed);
    (0..FILES)
        .map(|i| {
            let depth = rng.below(4);
            let mut p = PathBuf::new();
            for d in 0..depth {
                p.push(format!("d{d}-{}", rng.below(3)));
            }
            p.push(format!("file-{i:03}.bin"));
            let len = rng.below(MAX_FILE_BYTES + 1) as usize;
            (p, rng.bytes(len))
        })
        .collect()
}

#[test]
fn xfs_on_the_served_disk_survives_a_server_crash() {
    preflight();
    let dir = TestDir::new("fs");
    let (cache, backing) = formatted_pair(&dir, CACHE_BYTES, BACKING_BYTES);
    // No periodic seal: only flushes make writes durable, so the files survive only if sync
    // reaches logcache as NBD flushes through XFS, the loop device and nbdfuse.
    let args = [
        "--cache",
        cache.as_str(),
        "--backing",
        backing.as_str(),
        "--set",
        "seal_interval_ms=0",
    ];
    let served = Served::start(&args);
    let uri = served.unix_uri();
    let fs_dir = dir.join("fs");

    let files = tree(2024);
    {
        let mut att = Attached::new(&dir, &uri, BACKING_BYTES - 4096);
        run_ok(tool("mkfs.xfs").args(["-f", "-q", att.dev()]), "mkfs.xfs");
        att.mount(&fs_dir, "");
        for (p, data) in &files {
            let path = fs_dir.join(p);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, data).unwrap_or_else(|e| panic!("writing {path:?}: {e}"));
        }
        // SAFETY: sync(2) has no preconditions.
        unsafe { libc::sync() };
        let s = served.status();
        assert!(
            s["flushes"].as_u64().unwrap() > 0,
            "sync did not reach logcache as a flush: {s}"
        );
        // Crash the server under the mounted filesystem.
        let killed = served.kill();
        assert!(!killed.status.success());
        att.abandon();
    }

    let served = Served::start(&args);
    let stderr = served.stderr_with("recovered after an unclean stop");
    assert!(
        stderr.contains("recovered after an unclean stop"),
        "{stderr}"
    );
    {
        let mut att = Attached::new(&dir, &served.unix_uri(), BACKING_BYTES - 4096);
        // Mounting replays the XFS log (the crash left it dirty, and xfs_repair -n refuses a
        // dirty log); then the filesystem must be consistent. nouuid: the crashed instance
        // may not be gone from the kernel yet.
        att.mount(&fs_dir, "nouuid");
        att.umount();
        let out = run(tool("xfs_repair").args(["-n", att.dev()]));
        assert_ok(&out, "xfs_repair -n");
        att.mount(&fs_dir, "nouuid");
        for (p, data) in &files {
            let path = fs_dir.join(p);
            let got = fs::read(&path).unwrap_or_else(|e| panic!("reading {path:?}: {e}"));
            assert_eq!(got.len(), data.len(), "{p:?} has the wrong size");
            assert!(got == *data, "{p:?} has the wrong contents");
        }
        let count = count_files(&fs_dir);
        assert_eq!(count, FILES, "files in the filesystem");
        // TRIM end to end: delete every other file, fstrim, and the rest must be intact
        // after a remount and a repair check.
        let discards_before = served.status()["discards"].as_u64().unwrap();
        for (p, _) in files.iter().step_by(2) {
            fs::remove_file(fs_dir.join(p)).unwrap();
        }
        // SAFETY: sync(2) has no preconditions.
        unsafe { libc::sync() };
        run_ok(tool("fstrim").arg(&fs_dir), "fstrim");
        let s = served.status();
        assert!(
            s["discards"].as_u64().unwrap() > discards_before,
            "fstrim did not reach logcache as TRIM: {s}"
        );
        att.umount();
        let out = run(tool("xfs_repair").args(["-n", att.dev()]));
        assert_ok(&out, "xfs_repair -n after fstrim");
        att.mount(&fs_dir, "nouuid");
        for (p, data) in files.iter().skip(1).step_by(2) {
            let got = fs::read(fs_dir.join(p)).unwrap_or_else(|e| panic!("reading {p:?}: {e}"));
            assert!(got == *data, "{p:?} changed after fstrim");
        }
        att.umount();
    }
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
    let out = logcache(&["check", "--cache", &cache, "--backing", &backing]);
    assert_ok(&out, "logcache check");
}

fn count_files(dir: &Path) -> usize {
    let mut n = 0;
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            n += count_files(&e.path());
        } else if t.is_file() {
            n += 1;
        }
    }
    n
}
