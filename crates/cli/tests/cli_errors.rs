//! User errors on the command line: each gives one clear line on stderr that starts with
//! "logcache:" and names what is wrong, a non-zero exit, and never a panic.

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

#[test]
fn serve_with_missing_cache_file() {
    let dir = TestDir::new("e-nocache");
    let backing = dir.s("backing.img");
    sparse(Path::new(&backing), 64 * MIB);
    let cache = dir.s("missing.img");
    fails_with(
        1,
        &["serve", "--cache", &cache, "--backing", &backing],
        &[&cache, "does not exist"],
    );
    fails_with(
        1,
        &["format", "--cache", &cache, "--backing", &backing],
        &[&cache, "does not exist"],
    );
    fails_with(
        1,
        &["check", "--cache", &cache],
        &[&cache, "does not exist"],
    );
    fails_with(1, &["dump", "--cache", &cache], &[&cache, "does not exist"]);
}

#[test]
fn serve_with_missing_backing_file() {
    let dir = TestDir::new("e-noback");
    let (cache, _) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    let missing = dir.s("missing-backing.img");
    let line = fails_with(
        1,
        &["serve", "--cache", &cache, "--backing", &missing],
        &[&missing, "does not exist"],
    );
    assert!(line.contains("backing"), "{line}");
    fails_with(
        1,
        &["format", "--cache", &cache, "--backing", &missing],
        &[&missing],
    );
}

#[test]
fn serve_of_a_never_formatted_cache_says_to_format() {
    let dir = TestDir::new("e-unfmt");
    let cache = dir.s("cache.img");
    let backing = dir.s("backing.img");
    sparse(Path::new(&cache), 16 * MIB);
    sparse(Path::new(&backing), 64 * MIB);
    fails_with(
        1,
        &["serve", "--cache", &cache, "--backing", &backing],
        &[&cache, "logcache format"],
    );
    // The offline tools say the same.
    fails_with(1, &["check", "--cache", &cache], &[&cache, "format"]);
    // Nothing was left behind: no socket files beside the cache.
    assert!(!dir.join("cache.img.sock").exists());
    assert!(!dir.join("cache.img.ctl").exists());
}

#[test]
fn serve_with_the_wrong_backing_device() {
    let dir = TestDir::new("e-wrongback");
    let (cache, _) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    // Same size, never labelled.
    let other = dir.s("other.img");
    sparse(Path::new(&other), 64 * MIB);
    fails_with(
        1,
        &["serve", "--cache", &cache, "--backing", &other],
        &["backing", &other],
    );
    // Labelled by another cache: still the wrong one.
    let cache2 = dir.s("cache2.img");
    sparse(Path::new(&cache2), 16 * MIB);
    logcache_ok(&["format", "--cache", &cache2, "--backing", &other]);
    fails_with(
        1,
        &["serve", "--cache", &cache, "--backing", &other],
        &["backing", &other],
    );
    // check with the wrong backing reports it and fails.
    let out = logcache(&["check", "--cache", &cache, "--backing", &other]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(!text(&out.stderr).contains("panicked"));
}

#[test]
fn format_of_a_cache_that_is_too_small() {
    let dir = TestDir::new("e-small");
    let cache = dir.s("cache.img");
    let backing = dir.s("backing.img");
    sparse(Path::new(&cache), MIB);
    sparse(Path::new(&backing), 64 * MIB);
    fails_with(
        1,
        &["format", "--cache", &cache, "--backing", &backing],
        &[&cache, "needs at least"],
    );
    // An empty cache file too.
    sparse(Path::new(&cache), 0);
    fails_with(
        1,
        &["format", "--cache", &cache, "--backing", &backing],
        &[&cache],
    );
}

#[test]
fn format_with_a_bad_segment_size() {
    let dir = TestDir::new("e-segsize");
    let cache = dir.s("cache.img");
    let backing = dir.s("backing.img");
    sparse(Path::new(&cache), 16 * MIB);
    sparse(Path::new(&backing), 64 * MIB);
    // Not a multiple of 4 KiB / out of range: the engine's check.
    fails_with(
        1,
        &[
            "format",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--segment-size",
            "5K",
        ],
        &["segment size"],
    );
    fails_with(
        1,
        &[
            "format",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--segment-size",
            "32M",
        ],
        &["segment size"],
    );
}

/// A size with an unknown suffix is a user error like any other: one "logcache:" line.
/// (Today clap reports it: "error: invalid value '12Q' for '--segment-size <SEGMENT_SIZE>': ...",
/// a blank line and "For more information, try '--help'.", exit code 2.)
#[test]
fn format_with_a_bad_size_suffix() {
    let dir = TestDir::new("e-suffix");
    let cache = dir.s("cache.img");
    let backing = dir.s("backing.img");
    sparse(Path::new(&cache), 16 * MIB);
    sparse(Path::new(&backing), 64 * MIB);
    let args = [
        "format",
        "--cache",
        &cache,
        "--backing",
        &backing,
        "--segment-size",
        "12Q",
    ];
    let out = run_timeout(Command::new(BIN).args(args), Duration::from_secs(30));
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "accepted --segment-size 12Q");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("12Q"), "{stderr}");
    // The cache was left alone.
    assert_eq!(allocated_bytes(Path::new(&cache)), 0);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("logcache: "),
        "expected one line starting with \"logcache: \", got exit {} and:\n{stderr}",
        out.status
    );
}

#[test]
fn serve_with_only_one_of_cache_and_backing() {
    let dir = TestDir::new("e-onlyone");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    fails_with(1, &["serve", "--cache", &cache], &["--cache", "--backing"]);
    fails_with(
        1,
        &["serve", "--backing", &backing],
        &["--cache", "--backing"],
    );
}

#[test]
fn serve_on_a_tcp_port_in_use() {
    let dir = TestDir::new("e-port");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    fails_with(
        1,
        &[
            "serve",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--listen",
            &addr,
        ],
        &[&addr, "in use"],
    );
    // Metrics on a port in use too.
    fails_with(
        1,
        &[
            "serve",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--metrics",
            &addr,
        ],
        &[&addr],
    );
    // Nothing was left behind, and the cache is not locked: it serves now.
    assert!(!dir.join("cache.img.sock").exists());
    assert!(!dir.join("cache.img.ctl").exists());
    drop(taken);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    assert!(served.stop().status.success());
}

#[test]
fn serve_with_a_bad_listen_address() {
    let dir = TestDir::new("e-badaddr");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    fails_with(
        1,
        &[
            "serve",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--listen",
            "no-such-host.invalid:1",
        ],
        &["no-such-host.invalid:1"],
    );
    fails_with(
        1,
        &[
            "serve",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--metrics",
            "nonsense",
        ],
        &["nonsense", "--metrics"],
    );
    let sock = dir.s("no/such/dir/nbd.sock");
    fails_with(
        1,
        &[
            "serve",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--socket",
            &sock,
        ],
        &[&sock],
    );
}

/// NBD has no authentication: a non-loopback TCP address needs --allow-remote.
#[test]
fn serve_on_a_non_loopback_address_needs_allow_remote() {
    let dir = TestDir::new("e-remote");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    let args = [
        "serve",
        "--cache",
        &cache,
        "--backing",
        &backing,
        "--listen",
        "0.0.0.0:0",
    ];
    let line = fails_with(1, &args, &["0.0.0.0:0", "loopback", "--allow-remote"]);
    assert!(line.contains("authentication"), "{line}");
    let served = Served::start(&[
        "--cache",
        &cache,
        "--backing",
        &backing,
        "--listen",
        "0.0.0.0:0",
        "--allow-remote",
    ]);
    let log = served.stderr_with("without requiring TLS");
    assert!(
        log.contains("warning: serving NBD on 0.0.0.0:0 without requiring TLS"),
        "{log}"
    );
    assert!(served.stop().status.success());
}

/// A cache file cut short (a failed copy, a wrong `truncate`) is refused, saying so.
#[test]
fn serve_of_a_truncated_cache_file() {
    let dir = TestDir::new("e-truncated");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&cache)
        .unwrap()
        .set_len(4 * MIB)
        .unwrap();
    fails_with(
        1,
        &["serve", "--cache", &cache, "--backing", &backing],
        &[&cache, "truncated"],
    );
}

/// A format killed after labelling the backing device but before the cache's superblocks
/// reached the disk: serve says the cache is not formatted, and formatting again needs
/// --force because the label could belong to a cache holding data.
#[test]
fn a_format_killed_half_way_is_named_and_redone_with_force() {
    let dir = TestDir::new("e-halfformat");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    // The superblock copies are the cache's first 8 KiB.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&cache)
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 8192], 0).unwrap();
    drop(f);
    fails_with(
        1,
        &["serve", "--cache", &cache, "--backing", &backing],
        &[&cache, "format"],
    );
    fails_with(
        1,
        &["format", "--cache", &cache, "--backing", &backing],
        &[&backing, "another cache", "force"],
    );
    logcache_ok(&[
        "format",
        "--cache",
        &cache,
        "--backing",
        &backing,
        "--force",
    ]);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    assert!(served.stop().status.success());
}

#[test]
fn cache_already_served_by_another_process() {
    let dir = TestDir::new("e-inuse");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    let first = Served::start(&["--cache", &cache, "--backing", &backing]);
    let other_sock = dir.s("other.sock");
    let other_ctl = dir.s("other.ctl");
    fails_with(
        1,
        &[
            "serve",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--socket",
            &other_sock,
            "--control",
            &other_ctl,
        ],
        &[&cache, "in use"],
    );
    // Formatting, checking or dumping a served cache is refused the same way.
    fails_with(
        1,
        &[
            "format",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--force",
        ],
        &[&cache, "in use"],
    );
    fails_with(1, &["check", "--cache", &cache], &[&cache, "in use"]);
    fails_with(1, &["dump", "--cache", &cache], &[&cache, "in use"]);
    assert!(!Path::new(&other_sock).exists());
    // Another cache may not take over the first one's NBD socket or control socket.
    let dir2 = TestDir::new("e-inuse2");
    let (cache2, backing2) = formatted_pair(&dir2, 16 * MIB, 64 * MIB);
    let sock1 = dir.s("cache.img.sock");
    let ctl1 = first.control().to_string_lossy().into_owned();
    fails_with(
        1,
        &[
            "serve",
            "--cache",
            &cache2,
            "--backing",
            &backing2,
            "--socket",
            &sock1,
        ],
        &[&sock1, "in use"],
    );
    fails_with(
        1,
        &[
            "serve",
            "--cache",
            &cache2,
            "--backing",
            &backing2,
            "--control",
            &ctl1,
        ],
        &[&ctl1, "in use"],
    );
    // The first serve is unharmed.
    assert_eq!(first.status()["state"], "serving");
    let info = run(tool("nbdinfo").arg(first.unix_uri()));
    assert_ok(&info, "nbdinfo");
    let stopped = first.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
}

#[test]
fn format_over_a_cache_with_dirty_data_needs_force() {
    let dir = TestDir::new("e-dirty");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    let served = Served::start(&[
        "--cache",
        &cache,
        "--backing",
        &backing,
        "--set",
        "writeback_idle_ms=0",
    ]);
    qemu_io_ok(&served.unix_uri(), &["write -P 0x21 0 256k", "flush"]);
    assert!(served.status()["dirty_blocks"].as_u64().unwrap() > 0);
    assert!(served.stop().status.success());
    fails_with(
        1,
        &["format", "--cache", &cache, "--backing", &backing],
        &[&cache, "force"],
    );
}

#[test]
fn status_set_and_drain_without_a_server() {
    let dir = TestDir::new("e-noserver");
    let ctl = dir.s("nobody.ctl");
    for cmd in ["status", "drain"] {
        fails_with(1, &[cmd, "--control", &ctl], &[&ctl, "--control"]);
    }
    fails_with(
        1,
        &["set", "--control", &ctl, "writeback_threshold_percent=5"],
        &[&ctl],
    );
    // A stale socket file (nobody listening) says the same.
    let stale = dir.join("stale.ctl");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let stale = stale.to_string_lossy().into_owned();
    fails_with(1, &["status", "--control", &stale], &[&stale]);
    // The default control path (the embedded default's), in a directory without one.
    let out = run(Command::new(BIN).arg("status").current_dir(dir.path()));
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("logcache: ") && stderr.contains("logcache-data/cache.img.ctl"),
        "{stderr}"
    );
}

#[test]
fn set_errors_against_a_running_server() {
    let dir = TestDir::new("e-set");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    let ctl = served.control().to_string_lossy().into_owned();
    fails_with(
        1,
        &["set", "--control", &ctl, "no_such_tunable=5"],
        &["no_such_tunable"],
    );
    fails_with(
        1,
        &["set", "--control", &ctl, "writeback_threshold_percent=500"],
        &["writeback_threshold_percent", "500"],
    );
    fails_with(
        1,
        &["set", "--control", &ctl, "writeback_threshold_percent=lots"],
        &["writeback_threshold_percent", "lots"],
    );
    // Malformed assignments are refused before anything is sent, even next to a good one.
    fails_with(
        1,
        &["set", "--control", &ctl, "writeback_threshold_percent"],
        &["writeback_threshold_percent", "KEY=VALUE"],
    );
    fails_with(
        1,
        &[
            "set",
            "--control",
            &ctl,
            "writeback_threshold_percent=7",
            "=3",
        ],
        &["\"=3\"", "KEY=VALUE"],
    );
    // All or none: a good pair next to a bad one is not applied either.
    fails_with(
        1,
        &[
            "set",
            "--control",
            &ctl,
            "writeback_threshold_percent=7",
            "writeback_idle_ms=-1",
        ],
        &["writeback_idle_ms=-1", "nothing was changed"],
    );
    let s = served.status();
    assert_eq!(s["tunables"]["writeback_threshold_percent"], 10, "{s}");
    assert_eq!(s["tunables"]["cache_mode"], "write-back", "{s}");
    assert_eq!(s["read_cache"], "on", "one spelling for read_cache: {s}");
    assert_eq!(s["tunables"]["read_cache"], "on", "{s}");
    // And at serve start.
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
    // A bad value is refused before the cache is opened: it stays closed cleanly, byte for byte.
    let before = std::fs::read(&cache).unwrap();
    fails_with(
        1,
        &[
            "serve",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--set",
            "writeback_threshold_percent=500",
        ],
        &[
            "--set writeback_threshold_percent=500",
            "nothing was changed",
        ],
    );
    assert!(
        std::fs::read(&cache).unwrap() == before,
        "a refused serve wrote the cache"
    );
    let check = logcache_ok(&["check", "--cache", &cache]);
    assert!(
        check.contains("closed cleanly") && !check.contains("NOT closed"),
        "{check}"
    );
    fails_with(
        1,
        &[
            "serve",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--set",
            "no_such_tunable=1",
        ],
        &["no_such_tunable"],
    );
    fails_with(
        1,
        &[
            "serve",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--set",
            "writeback_threshold_percent",
        ],
        &["KEY=VALUE"],
    );
}

#[test]
fn bad_backing_uri_scheme() {
    let dir = TestDir::new("e-scheme");
    let (cache, _) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    fails_with(
        1,
        &[
            "serve",
            "--cache",
            &cache,
            "--backing",
            "http://example.com/disk",
        ],
        &["http://example.com/disk"],
    );
}

/// `logcache dump | head` must not panic when head closes the pipe.
#[test]
fn dump_into_a_closed_pipe_does_not_panic() {
    let dir = TestDir::new("e-pipe");
    let (cache, backing) = formatted_pair(&dir, 64 * MIB, 64 * MIB);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    // Enough entries that dump prints far more than a pipe holds.
    qemu_io_ok(&served.unix_uri(), &["write -P 0x33 0 16M", "flush"]);
    assert!(served.stop().status.success());
    let mut child = Command::new(BIN)
        .args(["dump", "--cache", &cache])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read a little, then hang up, like `head -1`.
    let mut first = [0u8; 64];
    use std::io::Read;
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take());
    let status = wait_timeout(&mut child, Duration::from_secs(30)).expect("dump hung");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        !stderr.contains("panicked"),
        "logcache dump panicked when its stdout was closed (exit {status}):\n{stderr}"
    );
}
