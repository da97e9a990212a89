//! `logcache checkpoint create|list|delete --control PATH` against a real serve: the changed
//! bytes follow real NBD clients' writes, and checkpoints survive a clean stop and SIGKILL.

mod common;

use common::*;
use serde_json::Value;

fn list(ctl: &str) -> Vec<Value> {
    let out = logcache_ok(&["checkpoint", "list", "--json", "--control", ctl]);
    serde_json::from_str::<Value>(&out)
        .unwrap_or_else(|e| panic!("checkpoint list --json is not JSON ({e}): {out}"))
        .as_array()
        .expect("an array")
        .clone()
}

fn changed(ctl: &str, name: &str) -> u64 {
    let all = list(ctl);
    let c = all
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no checkpoint {name} in {all:?}"));
    c["changed_bytes"].as_u64().expect("changed_bytes")
}

#[test]
fn checkpoints_track_writes_and_survive_restarts() {
    let dir = TestDir::new("ckpt-cli");
    let (cache, backing) = formatted_pair(&dir, 64 * MIB, 256 * MIB);
    let args = ["--cache", cache.as_str(), "--backing", backing.as_str()];
    let served = Served::start(&args);
    let ctl = served.control().to_string_lossy().into_owned();
    let uri = served.unix_uri();

    assert!(list(&ctl).is_empty());
    assert!(logcache_ok(&["checkpoint", "list", "--control", &ctl]).contains("no checkpoints"));
    qemu_io_ok(&uri, &["write -P 1 0 1M"]);
    let out = logcache_ok(&["checkpoint", "create", "daily", "--control", &ctl]);
    assert!(out.contains("created checkpoint daily"), "{out}");
    assert_eq!(
        changed(&ctl, "daily"),
        0,
        "writes before the checkpoint do not count"
    );
    // 64 KiB at 1 MiB, a 512-byte write (its whole 4 KiB block), and a zeroed 8 KiB.
    qemu_io_ok(
        &uri,
        &["write -P 2 1M 64K", "write -P 3 4M 512", "write -z 8M 8K"],
    );
    assert_eq!(changed(&ctl, "daily"), 64 * 1024 + 4096 + 8192);
    logcache_ok(&["checkpoint", "create", "second", "--control", &ctl]);
    let human = logcache_ok(&["checkpoint", "list", "--control", &ctl]);
    let lines: Vec<&str> = human.lines().collect();
    assert_eq!(lines.len(), 3, "{human}");
    assert!(
        lines[1].starts_with("daily ") && lines[1].contains("77824 (76.0 KiB)"),
        "{human}"
    );
    assert!(
        lines[2].starts_with("second ") && lines[2].ends_with(" 0 (0 bytes)"),
        "{human}"
    );

    fails_with(
        1,
        &["checkpoint", "create", "daily", "--control", &ctl],
        &["exists", "checkpoint delete daily"],
    );
    fails_with(
        1,
        &["checkpoint", "delete", "weekly", "--control", &ctl],
        &["no checkpoint named \"weekly\"", "daily, second"],
    );
    fails_with(
        1,
        &["checkpoint", "create", "a:b", "--control", &ctl],
        &["may not contain"],
    );

    // A clean stop and restart keeps both, with their counts.
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
    let served = Served::start(&args);
    let ctl = served.control().to_string_lossy().into_owned();
    assert_eq!(changed(&ctl, "daily"), 77824);
    assert_eq!(changed(&ctl, "second"), 0);

    // SIGKILL after a flushed write (qemu-io flushes as it closes): nothing is under-reported.
    qemu_io_ok(&served.unix_uri(), &["write -P 4 16M 12K"]);
    served.kill();
    let served = Served::start(&args);
    let ctl = served.control().to_string_lossy().into_owned();
    assert!(changed(&ctl, "daily") >= 77824 + 12288);
    assert!(changed(&ctl, "second") >= 12288);

    logcache_ok(&["checkpoint", "delete", "daily", "--control", &ctl]);
    let names: Vec<String> = list(&ctl)
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["second"]);
    drop(served);
    // Without a serve: the usual one line.
    fails_with(
        1,
        &["checkpoint", "list", "--control", &ctl],
        &["--control"],
    );
}
