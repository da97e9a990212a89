//! The two mistakes that destroy a cache with one command, refused before anything is written:
//! the same storage as cache and backing (through symlinks, other spellings, hard links and a
//! loop device over the other file), and a backing device another process is serving (a local
//! one by its lock, an NBD one by the owner record in its label). Each refusal is checked for
//! its message and for the cache and backing bytes being unchanged.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// Every byte of a file (test files are a few MiB; sparse holes read as zeros).
fn bytes(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// Runs each command, which must fail with one line mentioning `mentions`, and checks that
/// none of them changed a byte of `files`.
fn refused_unchanged(files: &[&str], commands: &[Vec<String>], mentions: &[&str]) {
    let before: Vec<Vec<u8>> = files.iter().map(|f| bytes(f)).collect();
    for args in commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(1, &args, mentions);
    }
    for (f, b) in files.iter().zip(&before) {
        assert!(bytes(f) == *b, "a refused command changed {f}");
    }
}

/// format (with and without --force), serve and check, all given CACHE and BACKING.
fn every_command(dir: &TestDir, cache: &str, backing: &str) -> Vec<Vec<String>> {
    let sock = dir.s("x.sock");
    let pair = ["--cache", cache, "--backing", backing];
    let with = |head: &str, tail: &[&str]| -> Vec<String> {
        [head]
            .iter()
            .chain(&pair)
            .chain(tail)
            .map(|a| a.to_string())
            .collect()
    };
    vec![
        with("format", &[]),
        with("format", &["--force"]),
        with("serve", &["--socket", &sock]),
        with("check", &[]),
    ]
}

#[test]
fn the_same_file_as_cache_and_backing_is_refused_under_every_spelling() {
    let dir = TestDir::new("r-same");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    let link = dir.s("link.img");
    std::os::unix::fs::symlink(&cache, &link).unwrap();
    let hard = dir.s("hard.img");
    std::fs::hard_link(&cache, &hard).unwrap();
    let dotted = format!("{}/./sub/../cache.img", dir.path().display());
    std::fs::create_dir(dir.join("sub")).unwrap();
    for other in [cache.as_str(), &link, &hard, &dotted] {
        refused_unchanged(
            &[&cache, &backing],
            &every_command(&dir, &cache, other),
            &["same file", "nothing was written"],
        );
    }
    // A relative spelling from another directory.
    let out = run(Command::new(BIN)
        .args([
            "format",
            "--cache",
            "cache.img",
            "--backing",
            &link,
            "--force",
        ])
        .current_dir(dir.path()));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("same file"),
        "{}",
        text(&out.stderr)
    );
    // The pair is intact: it still serves.
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    assert!(served.stop().status.success());
}

/// A loop device over a file, detached when dropped.
struct Loop(String);

impl Loop {
    fn over(file: &str) -> Loop {
        let out = run(tool("losetup").args(["-f", "--show", file]));
        assert_ok(&out, "losetup -f --show");
        Loop(text(&out.stdout).trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = run(tool("losetup").args(["-d", &self.0]));
    }
}

#[test]
fn a_loop_device_over_the_other_file_and_one_device_twice_are_refused() {
    let dir = TestDir::new("r-loop");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    let lo = Loop::over(&backing);
    // The backing file as cache, its loop device as backing (and the other way round).
    refused_unchanged(
        &[&cache, &backing],
        &every_command(&dir, &backing, &lo.0),
        &["loop device over", "nothing was written"],
    );
    refused_unchanged(
        &[&cache, &backing],
        &every_command(&dir, &lo.0, &backing),
        &["loop device over"],
    );
    // One block device under two names.
    let link = dir.s("dev-link");
    std::os::unix::fs::symlink(&lo.0, &link).unwrap();
    refused_unchanged(
        &[&cache, &backing],
        &every_command(&dir, &lo.0, &link),
        &["same block device"],
    );
    // Nothing wrong with the real pair.
    assert!(
        logcache(&["check", "--cache", &cache, "--backing", &backing])
            .status
            .success()
    );
}

#[test]
fn a_backing_device_served_by_another_process_is_refused_naming_it() {
    let dir = TestDir::new("r-lock");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    // Idle: no client, no writeback, so the served pair's bytes stay put while we look.
    let served = Served::start(&[
        "--cache",
        &cache,
        "--backing",
        &backing,
        "--set",
        "writeback_idle_ms=0",
    ]);
    let pid = served.pid().to_string();
    let second = dir.s("second.img");
    sparse(Path::new(&second), 16 * MIB);
    let via_link = dir.s("backing-link");
    std::os::unix::fs::symlink(&backing, &via_link).unwrap();
    for spelling in [backing.as_str(), &via_link] {
        refused_unchanged(
            &[&second, &backing, &cache],
            &every_command(&dir, &second, spelling),
            &[spelling, "in use by process", &pid, "logcache serve"],
        );
    }
    // The first serve is unharmed and still owns its backing device.
    assert_eq!(served.status()["state"], "serving");
    qemu_io_ok(
        &served.unix_uri(),
        &["write -P 0x5a 0 64k", "read -P 0x5a 0 64k"],
    );
    assert!(served.stop().status.success());
    // Once it stopped, the same format goes through.
    logcache_ok(&[
        "format",
        "--cache",
        &second,
        "--backing",
        &backing,
        "--force",
    ]);
}

#[test]
fn the_cache_lock_names_its_holder() {
    let dir = TestDir::new("r-cache-lock");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    let pid = served.pid().to_string();
    fails_with(
        1,
        &["dump", "--cache", &cache],
        &[&cache, "in use by process", &pid],
    );
    assert!(served.stop().status.success());
}

/// The backing file's bytes without the owner record (bytes 512..1024 of the label block),
/// which a serving process renews every few seconds.
fn backing_bytes_but_owner(path: &str) -> Vec<u8> {
    let mut b = bytes(path);
    let label = b.len() - 4096;
    b[label + 512..label + 1024].fill(0);
    b
}

#[test]
fn an_nbd_backing_served_by_another_process_is_refused_even_with_force() {
    let dir = TestDir::new("r-nbd");
    let file = dir.s("backing.img");
    sparse(Path::new(&file), 64 * MIB);
    let sock = dir.join("kit.sock");
    let _kit = Daemon::start(
        tool("nbdkit")
            .args(["-f", "-U"])
            .arg(&sock)
            .arg("file")
            .arg(&file),
        &sock,
        &dir.join("nbdkit.log"),
    );
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let first = dir.s("first.img");
    sparse(Path::new(&first), 16 * MIB);
    logcache_ok(&["format", "--cache", &first, "--backing", &uri]);
    let served = Served::start(&["--cache", &first, "--backing", &uri]);
    let pid = served.pid().to_string();
    let second = dir.s("second.img");
    sparse(Path::new(&second), 16 * MIB);
    let (second_before, backing_before) = (bytes(&second), backing_bytes_but_owner(&file));
    for args in every_command(&dir, &second, &uri) {
        if args[0] == "check" {
            continue; // read-only: checking a served backing device's label harms nothing
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(
            1,
            &args,
            &[
                "being served by logcache process",
                &pid,
                "nothing was written",
            ],
        );
    }
    assert!(
        bytes(&second) == second_before,
        "a refused command wrote the cache"
    );
    assert!(
        backing_bytes_but_owner(&file) == backing_before,
        "a refused command wrote the backing device"
    );
    assert_eq!(served.status()["state"], "serving");
    assert!(served.stop().status.success());

    // Stopped cleanly: --force takes over, saying what that costs the first cache.
    let out = logcache(&["format", "--cache", &second, "--backing", &uri, "--force"]);
    assert_ok(&out, "format --force after the first serve stopped");
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("process {pid}"))
            && err.contains("stopped cleanly")
            && err.contains("lost"),
        "{err}"
    );

    // A killed serve is no live owner: the same serve starts again at once.
    let served = Served::start(&["--cache", &second, "--backing", &uri]);
    served.kill();
    let served = Served::start(&["--cache", &second, "--backing", &uri]);
    assert!(served.stop().status.success());
}
