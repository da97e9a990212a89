//! ENOSPC from a real file system under a file-backed cache (issue 6, device faults): the
//! cache file is sparse on a small tmpfs, so once the tmpfs is full the flusher's writes fail.
//! The client gets an error (never silent loss of flushed data); what was flushed before is
//! intact, and the operator recovers it by copying the cache file to a file system with room
//! and serving the copy.
//!
//! Mounting needs root, which CI has. Elsewhere the test says so and does nothing.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

const MIB: u64 = 1 << 20;

/// A small tmpfs, unmounted on drop (before the test directory is removed).
struct SmallFs {
    path: PathBuf,
}

impl SmallFs {
    fn mount(path: PathBuf, size_mib: u64) -> SmallFs {
        std::fs::create_dir_all(&path).unwrap();
        let out = run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(&path));
        assert_ok(&out, "mount -t tmpfs");
        SmallFs { path }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

#[test]
fn a_full_file_system_under_the_cache_is_an_error_and_flushed_data_survives() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: mounting a small tmpfs needs root (CI runs as root)");
        return;
    }
    let dir = TestDir::new("fs-full");
    let small = SmallFs::mount(dir.join("small"), 12);
    let cache = small.path.join("cache.img");
    let cache_s = cache.to_string_lossy().into_owned();
    sparse(&cache, 64 * MIB); // 64 MiB of cache file on 12 MiB of file system
    let backing = dir.s("backing.img");
    sparse(&dir.join("backing.img"), 256 * MIB);
    assert_ok(
        &logcache(&[
            "format",
            "--cache",
            &cache_s,
            "--backing",
            &backing,
            "--segment-size",
            "256K",
        ]),
        "logcache format",
    );
    let serve_args = [
        "--cache",
        cache_s.as_str(),
        "--backing",
        backing.as_str(),
        "--set",
        "writeback_threshold_percent=100",
        "--set",
        "writeback_idle_ms=0",
    ];
    let served = Served::start(&serve_args);
    let uri = served.unix_uri();
    qemu_io_ok(&uri, &["write -P 0x51 0 4M", "flush"]);

    // More than the file system holds: the client must see an error.
    let out = qemu_io(&uri, &[], &["write -P 0x52 8M 24M", "flush"]);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        !out.status.success() || said.contains("failed"),
        "writes beyond the file system's room reported no error:\n{said}"
    );
    let status = served.status();
    assert_eq!(status["state"], "failed", "status: {status}");
    let failure = status["failure"].as_str().unwrap_or_default().to_string();
    assert!(failure.contains("No space left"), "failure: {failure}");
    let _ = served.stop();

    // The operator's way out: copy the cache file somewhere with room and serve the copy.
    let copy = dir.join("cache-copy.img");
    let cp = run(Command::new("cp")
        .arg("--sparse=always")
        .arg(&cache)
        .arg(&copy));
    assert_ok(&cp, "cp the cache file");
    drop(small);
    let copy_s = copy.to_string_lossy().into_owned();
    let served = Served::start(&["--cache", copy_s.as_str(), "--backing", backing.as_str()]);
    let uri = served.unix_uri();
    qemu_io_ok(&uri, &["read -P 0x51 0 4M"]);
    let ctl = served.control().to_string_lossy().into_owned();
    assert_ok(&logcache(&["drain", "--control", &ctl]), "logcache drain");
    assert!(served.stop().status.success());
    qemu_io_flags_ok(&backing, &["-r"], &["read -P 0x51 0 4M"]);
}
