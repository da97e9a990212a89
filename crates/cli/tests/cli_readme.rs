//! The README's commands, run verbatim (`sh -c LINE`) from a directory other than the one
//! serving the embedded default, with `logcache` on PATH as `make install` puts it: what a new
//! user types must work as written.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

/// The lines of the first ```sh block after the heading `heading` in README.md.
fn readme_block(heading: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let at = readme
        .find(heading)
        .unwrap_or_else(|| panic!("README has no {heading:?}"));
    let rest = &readme[at..];
    let start = rest.find("```sh\n").expect("a ```sh block") + "```sh\n".len();
    let end = start + rest[start..].find("```").expect("the block's end");
    rest[start..end].lines().map(str::to_string).collect()
}

/// Runs one README line with `sh -c` in `cwd`; it must exit 0. Returns stdout.
fn sh(line: &str, cwd: &Path, path_env: &str, runtime: &Path, uri: &str) -> String {
    let out = run(Command::new("/bin/sh")
        .args(["-c", line])
        .current_dir(cwd)
        .env("PATH", path_env)
        .env("XDG_RUNTIME_DIR", runtime)
        .env("URI", uri));
    assert_ok(&out, &format!("the README's `{line}` in {}", cwd.display()));
    text(&out.stdout)
}

#[test]
fn the_readme_commands_work_as_written_from_another_directory() {
    let dir = TestDir::new("readme");
    let checkout = dir.join("checkout");
    let elsewhere = dir.join("elsewhere");
    let bin = dir.join("bin");
    for d in [&checkout, &elsewhere, &bin] {
        std::fs::create_dir_all(d).unwrap();
    }
    // `make install`: logcache on PATH.
    std::os::unix::fs::symlink(BIN, bin.join("logcache")).unwrap();
    let path_env = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // `make run` (off the default port, which another checkout may hold).
    let served = Served::start_in(&checkout, &["--listen", "127.0.0.1:0"]);
    let banner = served.stdout();
    assert!(
        banner.contains("disk of 8589930496 bytes"),
        "the banner does not print the exact disk size:\n{banner}"
    );
    let uri = served.tcp_uri();

    // The banner's status command works from anywhere, even without logcache on PATH.
    let status_line = banner
        .lines()
        .find_map(|l| l.strip_prefix("Status: "))
        .expect("a Status: line")
        .split("   ")
        .next()
        .unwrap()
        .to_string();
    let plain_path = std::env::var("PATH").unwrap_or_default();
    let out = sh(&status_line, &elsewhere, &plain_path, &checkout, &uri);
    assert!(out.contains("serving"), "{status_line}:\n{out}");

    // "Connecting": the client lines, with URI as the README sets it for this serve.
    let connect: Vec<String> = readme_block("## Connecting")
        .into_iter()
        .filter(|l| l.starts_with("nbdinfo") || l.starts_with("qemu-io"))
        .collect();
    assert_eq!(connect.len(), 2, "{connect:?}");
    for line in &connect {
        sh(line, &elsewhere, &path_env, &checkout, &uri);
    }

    // "Operating it": every line, verbatim.
    let lines = readme_block("## Operating it");
    assert!(lines.len() >= 5, "{lines:?}");
    for line in &lines {
        let out = sh(line, &elsewhere, &path_env, &checkout, &uri);
        let cmd = line.split('#').next().unwrap().trim();
        match cmd {
            "logcache status" => assert!(out.contains("serving") && out.contains("MiB"), "{out}"),
            "logcache status --json" => {
                let s: Value = serde_json::from_str(&out).expect("status --json is JSON");
                assert!(s["mode"].is_string(), "{s}");
                for key in STATUS_CONTRACT_NUMBERS {
                    assert!(s[key].is_u64(), "contract key {key} is not a number: {s}");
                }
                assert_eq!(s["exported_size_bytes"], 8589930496u64, "{s}");
                assert!(s["tunables"]["seal_interval_ms"].is_u64(), "{s}");
            }
            "logcache set" => assert!(out.contains("writeback_threshold_percent="), "{out}"),
            "logcache drain" => assert!(out.contains("drained"), "{out}"),
            set if set.starts_with("logcache set ") => {
                for pair in set["logcache set ".len()..].split_whitespace() {
                    assert!(out.lines().any(|l| l == pair), "{pair} not applied:\n{out}");
                }
            }
            other => panic!("a README line this test does not know: {other:?}"),
        }
    }
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
    let link: PathBuf = checkout.join("logcache-default.ctl");
    assert!(
        std::fs::symlink_metadata(&link).is_err(),
        "the announced control socket outlived serve"
    );
}
