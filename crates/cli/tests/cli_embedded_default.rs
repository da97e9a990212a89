//! `logcache serve` with neither --cache nor --backing: the embedded default under
//! ./logcache-data (a 1 GiB cache and an 8 GiB backing disk, sparse files), formatted on the
//! first start and reused afterwards. The TCP address is moved off the default port 10809
//! (which may be busy) with --listen, which keeps the embedded default.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

const GIB: u64 = 1 << 30;

#[test]
fn embedded_default_serves_and_restarts() {
    let dir = TestDir::new("emb");
    let data = dir.join("logcache-data");
    let served = Served::start_in(dir.path(), &["--listen", "127.0.0.1:0"]);

    // The files, sparse.
    let cache = data.join("cache.img");
    let backing = data.join("backing.img");
    assert_eq!(std::fs::metadata(&cache).unwrap().len(), GIB);
    assert_eq!(std::fs::metadata(&backing).unwrap().len(), 8 * GIB);
    assert!(
        allocated_bytes(&backing) < 16 * MIB,
        "backing.img is not sparse: {} bytes allocated",
        allocated_bytes(&backing)
    );
    assert!(
        allocated_bytes(&cache) < 64 * MIB,
        "cache.img is not sparse: {} bytes allocated",
        allocated_bytes(&cache)
    );
    assert!(
        served.stderr().contains("formatted the embedded default"),
        "{}",
        served.stderr()
    );

    // How to connect.
    let stdout = served.stdout();
    for client in ["nbdinfo", "nbdfuse", "qemu-io", "fio"] {
        assert!(
            stdout.contains(client),
            "the start banner does not mention {client}:\n{stdout}"
        );
    }
    assert!(stdout.contains("logcache status"), "{stdout}");

    // Both endpoints: ./logcache-data/nbd.sock and the TCP address we asked for.
    let sock = data.join("nbd.sock");
    let unix_uri = served.unix_uri();
    assert_eq!(
        unix_uri,
        format!(
            "nbd+unix:///?socket={}",
            std::fs::canonicalize(&sock).unwrap().display()
        )
    );
    assert!(
        stdout.contains(&format!("nbdinfo '{unix_uri}'")),
        "{stdout}"
    );
    let tcp_uri = served.tcp_uri();
    assert!(tcp_uri.starts_with("nbd://127.0.0.1:"), "{tcp_uri}");
    assert!(!tcp_uri.contains(":10809"), "{tcp_uri}");

    let own_uri = format!("nbd+unix:///?socket={}", sock.display());
    for uri in [&own_uri, &tcp_uri] {
        let out = run(tool("nbdinfo").args(["--json", uri]));
        assert_ok(&out, "nbdinfo");
        let info: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            info["exports"][0]["export-size"].as_u64(),
            Some(8 * GIB - 4096),
            "{info}"
        );
    }
    qemu_io_ok(&own_uri, &["write -P 0xab 0 1M", "read -P 0xab 0 1M"]);
    qemu_io_ok(&tcp_uri, &["write -P 0xcd 7G 1M", "read -P 0xab 0 1M"]);

    // `logcache status` in that directory finds the default control socket by itself.
    let out = run(Command::new(BIN).arg("status").current_dir(dir.path()));
    assert_ok(&out, "logcache status (default control socket)");
    assert!(
        text(&out.stdout).contains("serving"),
        "{}",
        text(&out.stdout)
    );
    let out = run(Command::new(BIN)
        .args(["status", "--json"])
        .current_dir(dir.path()));
    assert_ok(&out, "logcache status --json");
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["exported_size_bytes"].as_u64(), Some(8 * GIB - 4096));
    assert!(s["writes"].as_u64().unwrap() > 0, "{s}");

    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
    assert!(
        stopped.stderr.contains("stopped cleanly"),
        "{}",
        stopped.stderr
    );
    assert!(!Path::new(&sock).exists(), "nbd.sock left behind");

    // The second start reuses the formatted cache: no new format, the data is there.
    let served = Served::start_in(dir.path(), &["--listen", "127.0.0.1:0"]);
    assert!(
        !served.stderr().contains("formatted"),
        "the second start formatted again:\n{}",
        served.stderr()
    );
    qemu_io_ok(&own_uri, &["read -P 0xab 0 1M", "read -P 0xcd 7G 1M"]);
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);

    // The offline tools work on it, from the same directory.
    let out = run(Command::new(BIN)
        .args([
            "check",
            "--cache",
            "logcache-data/cache.img",
            "--backing",
            "logcache-data/backing.img",
        ])
        .current_dir(dir.path()));
    assert_ok(&out, "logcache check of the embedded default");
}

#[test]
fn embedded_default_after_a_crash() {
    let dir = TestDir::new("emb-crash");
    let served = Served::start_in(dir.path(), &["--listen", "127.0.0.1:0"]);
    let uri = served.unix_uri();
    qemu_io_ok(&uri, &["write -P 0x5c 3M 1M", "flush"]);
    served.kill();
    // Restarting with the same command: the stale sockets are replaced, the log recovered.
    let served = Served::start_in(dir.path(), &["--listen", "127.0.0.1:0"]);
    let stderr = served.stderr_with("recovered after an unclean stop");
    assert!(
        stderr.contains("recovered after an unclean stop"),
        "{stderr}"
    );
    assert!(!stderr.contains("formatted"), "{stderr}");
    qemu_io_ok(&served.unix_uri(), &["read -P 0x5c 3M 1M"]);
    let out = run(Command::new(BIN).arg("status").current_dir(dir.path()));
    assert_ok(&out, "logcache status after the restart");
}
