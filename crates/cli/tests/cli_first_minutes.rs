//! What a new user meets in the first minutes: help that describes every flag and lists the
//! tunables, negative numbers answered with what is allowed, the embedded default's port
//! checked before anything is created, a warning for a cache larger than its disk, and the
//! exact exported size.

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

use common::*;

#[test]
fn help_describes_every_flag_and_set_lists_the_tunables() {
    for cmd in [
        "format",
        "serve",
        "status",
        "set",
        "drain",
        "check",
        "dump",
        "import-diff",
    ] {
        let help = logcache_ok(&[cmd, "--help"]);
        let lines: Vec<&str> = help.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let flag = line.trim_start();
            if flag.starts_with("--") && !flag.starts_with("--help") {
                // "  --flag <VALUE>  Description": a description after the flag's spelling, or
                // on the next line when clap lays the help out long (a value with documented
                // possible values makes it do so for the whole command).
                let same_line = flag.split("  ").filter(|p| !p.trim().is_empty()).count() > 1;
                let next_line = lines.get(i + 1).is_some_and(|next| {
                    let text = next.trim_start();
                    !text.is_empty() && !text.starts_with('-') && next.len() > text.len()
                });
                let described = same_line || next_line;
                assert!(
                    described,
                    "logcache {cmd} --help: {flag:?} has no description"
                );
            }
        }
    }
    let help = logcache_ok(&["set", "--help"]);
    for key in [
        "seal_interval_ms",
        "writeback_threshold_percent",
        "cache_mode",
        "read_cache",
        "writeback_io_depth",
    ] {
        assert!(
            help.contains(key),
            "set --help does not list {key}:\n{help}"
        );
    }
}

#[test]
fn negative_numbers_get_a_range_message() {
    let dir = TestDir::new("f-neg");
    let cache = dir.s("c.img");
    let backing = dir.s("b.img");
    sparse(Path::new(&cache), 16 * MIB);
    sparse(Path::new(&backing), 64 * MIB);
    fails_with(
        2,
        &["dump", "--cache", &cache, "--segment", "-1"],
        &["--segment", "0 or more"],
    );
    fails_with(
        2,
        &[
            "format",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--segment-size",
            "-1",
        ],
        &["--segment-size", "negative"],
    );
    fails_with(
        1,
        &[
            "serve",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--backing-timeout",
            "-1",
        ],
        &["--backing-timeout", "above 0"],
    );
    // Nothing was written: the cache is still unformatted.
    assert!(std::fs::read(&cache).unwrap().iter().all(|&b| b == 0));
}

#[test]
fn a_cache_larger_than_its_disk_is_formatted_with_a_warning_and_the_exact_size() {
    let dir = TestDir::new("f-big");
    let cache = dir.s("c.img");
    let backing = dir.s("b.img");
    sparse(Path::new(&cache), 64 * MIB);
    sparse(Path::new(&backing), 16 * MIB);
    let out = logcache(&["format", "--cache", &cache, "--backing", &backing]);
    assert_ok(&out, "format");
    let err = text(&out.stderr);
    assert!(
        err.contains("warning") && err.contains("larger than the backing device"),
        "{err}"
    );
    let exported = 16 * MIB - 4096;
    assert!(
        text(&out.stdout).contains(&format!("{exported} bytes exported")),
        "{}",
        text(&out.stdout)
    );
    // The usual way round says nothing.
    let out = logcache(&[
        "format",
        "--cache",
        &backing,
        "--backing",
        &cache,
        "--force",
    ]);
    assert_ok(&out, "format");
    assert!(text(&out.stderr).is_empty(), "{}", text(&out.stderr));
}

#[test]
fn the_embedded_default_checks_its_port_before_creating_anything() {
    let dir = TestDir::new("f-port");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = run(Command::new(BIN)
        .args(["serve", "--listen", &addr])
        .env("XDG_RUNTIME_DIR", dir.path())
        .current_dir(dir.path()));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(&addr) && err.contains("in use") && err.contains("--listen"),
        "{err}"
    );
    assert!(
        !dir.join("logcache-data").exists(),
        "a refused start created logcache-data"
    );
}
