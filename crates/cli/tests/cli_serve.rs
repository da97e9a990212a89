//! `format` + `serve` on files, driven by real NBD clients (nbdinfo, qemu-io, nbdcopy, nbdsh,
//! fio) and the admin commands (`status`, `set`, `drain`, `check`, `dump`, metrics).

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;

const CACHE_BYTES: u64 = 64 * MIB;
const BACKING_BYTES: u64 = 256 * MIB;

/// A formatted cache/backing pair in its own directory, being served. The server is dropped
/// (stopped) before the directory.
struct Disk {
    served: Option<Served>,
    cache: String,
    backing: String,
    dir: TestDir,
}

impl Disk {
    fn new(name: &str, extra: &[&str]) -> Disk {
        Disk::sized(name, CACHE_BYTES, BACKING_BYTES, extra)
    }

    fn sized(name: &str, cache_bytes: u64, backing_bytes: u64, extra: &[&str]) -> Disk {
        let dir = TestDir::new(name);
        let (cache, backing) = formatted_pair(&dir, cache_bytes, backing_bytes);
        let mut disk = Disk {
            served: None,
            cache,
            backing,
            dir,
        };
        disk.start(extra);
        disk
    }

    fn args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut a = vec!["--cache", &self.cache, "--backing", &self.backing];
        a.extend_from_slice(extra);
        a
    }

    fn start(&mut self, extra: &[&str]) {
        assert!(self.served.is_none());
        let served = Served::start(&self.args(extra));
        self.served = Some(served);
    }

    fn served(&self) -> &Served {
        self.served.as_ref().expect("not serving")
    }

    fn uri(&self) -> String {
        self.served().unix_uri()
    }

    fn ctl(&self) -> String {
        self.served().control().to_string_lossy().into_owned()
    }

    fn stop(&mut self) -> Stopped {
        let stopped = self.served.take().expect("not serving").stop();
        assert!(
            stopped.status.success(),
            "serve exited with {} after SIGTERM\nstderr:\n{}",
            stopped.status,
            stopped.stderr
        );
        stopped
    }

    fn kill(&mut self) -> Stopped {
        self.served.take().expect("not serving").kill()
    }
}

fn u64_of(status: &Value, key: &str) -> u64 {
    status[key]
        .as_u64()
        .unwrap_or_else(|| panic!("status key {key:?} is not a number: {status}"))
}

#[test]
fn nbdinfo_shows_size_and_flags() {
    let disk = Disk::new("s-info", &[]);
    let out = run(tool("nbdinfo").args(["--json", &disk.uri()]));
    assert_ok(&out, "nbdinfo --json");
    let info: Value = serde_json::from_slice(&out.stdout).expect("nbdinfo --json output");
    let export = &info["exports"][0];
    assert_eq!(
        export["export-size"].as_u64(),
        Some(BACKING_BYTES - 4096),
        "{info}"
    );
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
    ] {
        assert_eq!(export[flag], Value::Bool(true), "{flag} in {info}");
    }
    assert_eq!(export["is_read_only"], Value::Bool(false), "{info}");
    // The named export works as well as the default one.
    let name = export["export-name"].as_str().unwrap().to_string();
    let named = disk
        .uri()
        .replacen("nbd+unix:///", &format!("nbd+unix:///{name}"), 1);
    assert_ok(
        &run(tool("nbdinfo").arg(&named)),
        "nbdinfo on the named export",
    );
    // An unknown export name is refused.
    let wrong = disk
        .uri()
        .replacen("nbd+unix:///", "nbd+unix:///no-such-export", 1);
    let out = run(tool("nbdinfo").arg(&wrong));
    assert!(!out.status.success(), "nbdinfo {wrong} succeeded");
}

#[test]
fn qemu_io_writes_reads_and_zeroes() {
    let disk = Disk::new("s-qemuio", &[]);
    let uri = disk.uri();
    qemu_io_ok(&uri, &["write -P 0x5a 1M 2M", "read -P 0x5a 1M 2M"]);
    // A new connection sees it, unaligned reads and writes work, zeroing works.
    qemu_io_ok(
        &uri,
        &[
            "read -P 0x5a 1M 2M",
            "read -P 0 0 1M",
            "write -P 0x11 1000 3000",
            "read -P 0x11 1000 3000",
            "read -P 0 0 1000",
            "write -z 2M 64k",
            "read -P 0 2M 64k",
            "read -P 0x5a 1M 1M",
            "read -P 0x5a 2162688 960k",
            "write -f -P 0x22 8M 64k",
            "read -P 0x22 8M 64k",
            "flush",
        ],
    );
    // The last sector of the disk.
    let last = BACKING_BYTES - 4096 - 512;
    qemu_io_ok(
        &uri,
        &[
            &format!("write -P 0x33 {last} 512"),
            &format!("read -P 0x33 {last} 512"),
        ],
    );
    // Past the end is refused by the server (libnbd's own checks off), and the connection
    // goes on working.
    let script = r#"
import nbd
h.set_strict_mode(0)
h.connect_uri(URI)
size = h.get_size()
for name, op in [("write", lambda: h.pwrite(b"x" * 4096, size - 512)),
                 ("read", lambda: h.pread(4096, size)),
                 ("zero", lambda: h.zero(4096, size))]:
    try:
        op()
        print(name, "accepted")
    except nbd.Error as e:
        assert e.errno in ("EINVAL", "ENOSPC"), (name, e.errno)
assert h.pread(512, size - 512) == b"\x33" * 512
print("ok")
"#
    .replace("URI", &format!("{uri:?}"));
    let out = run(nbdsh().args(["-c", &script]));
    assert_ok(&out, "nbdsh requests past the end");
    assert_eq!(text(&out.stdout).trim(), "ok");
}

#[test]
fn nbdcopy_round_trip() {
    // A disk of exactly 16 MiB: the backing file is 16 MiB plus the 4 KiB label.
    let disk = Disk::sized("s-nbdcopy", 16 * MIB, 16 * MIB + 4096, &[]);
    let input = disk.dir.join("in.img");
    let data = Rng::new(7).bytes(8 * MIB as usize);
    std::fs::write(&input, &data).unwrap();
    let out = run(tool("nbdcopy").arg(&input).arg(disk.uri()));
    assert_ok(&out, "nbdcopy in.img URI");
    let output = disk.dir.join("out.img");
    let out = run(tool("nbdcopy").arg(disk.uri()).arg(&output));
    assert_ok(&out, "nbdcopy URI out.img");
    let copied = std::fs::read(&output).unwrap();
    assert_eq!(copied.len() as u64, 16 * MIB);
    assert!(copied[..data.len()] == data[..], "the first 8 MiB differ");
    assert!(
        copied[data.len()..].iter().all(|&b| b == 0),
        "the unwritten second half is not zero"
    );
}

#[test]
fn second_connection_sees_a_flushed_write() {
    let disk = Disk::new("s-nbdsh", &[]);
    let uri = disk.uri();
    let script = format!(
        r#"
import nbd
data = bytes(range(256)) * 256
h.pwrite(data, 10 * 1024 * 1024)
h.flush()
h2 = nbd.NBD()
h2.connect_uri({uri:?})
assert h2.pread(len(data), 10 * 1024 * 1024) == data, "h2 does not see h1's write"
h2.pwrite(b"\x77" * 4096, 12 * 1024 * 1024, nbd.CMD_FLAG_FUA)
assert h.pread(4096, 12 * 1024 * 1024) == b"\x77" * 4096, "h1 does not see h2's FUA write"
assert h.can_multi_conn() and h2.can_multi_conn()
h2.shutdown()
print("ok")
"#
    );
    let out = run(nbdsh().args(["-u", &uri, "-c", &script]));
    assert_ok(&out, "nbdsh two connections");
    assert_eq!(text(&out.stdout).trim(), "ok");
}

#[test]
fn fio_random_writes_verify() {
    let disk = Disk::new("s-fio", &[]);
    let out = run(tool("fio").args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={}", disk.uri()),
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        "--size=16m",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_state_save=0",
    ]));
    assert_ok(&out, "fio randwrite + verify");
    let s = disk.served().status();
    assert!(u64_of(&s, "writes") >= 4096, "{s}");
    assert_eq!(u64_of(&s, "checksum_errors"), 0, "{s}");
    assert_eq!(u64_of(&s, "io_errors"), 0, "{s}");
}

/// The RAM cache: on by default; repeated 4 KiB reads of blocks on the cache device are served
/// from it (status counts them); `ram_cache_mib` resizes it online and 0 turns it off.
#[test]
fn the_ram_cache_serves_repeated_small_reads_and_resizes_online() {
    let disk = Disk::new("s-ramcache", &[]);
    let ctl = disk.ctl();
    let s = status_json(Path::new(&ctl));
    assert!(u64_of(&s, "ram_cache_bytes") >= MIB, "{s}");
    assert_eq!(u64_of(&s, "ram_cache_blocks"), 0, "{s}");
    assert_eq!(u64_of(&s, "read_hits_ram_cache"), 0, "{s}");
    // Written and flushed: the first MiB's segments are full and on the cache device.
    qemu_io_ok(&disk.uri(), &["write -P 0x5a 0 4M", "flush"]);
    let reads: Vec<String> = (0..2)
        .flat_map(|_| (0..64).map(|i| format!("read -P 0x5a {} 4k", i * 4096)))
        .collect();
    let reads: Vec<&str> = reads.iter().map(String::as_str).collect();
    qemu_io_ok(&disk.uri(), &reads);
    let s = status_json(Path::new(&ctl));
    assert!(u64_of(&s, "ram_cache_blocks") > 0, "{s}");
    let hits = u64_of(&s, "read_hits_ram_cache");
    assert!(hits > 0 && hits <= 64, "{s}");
    // A read over 64 KiB stores its blocks on its second touch, and the third is served
    // from the RAM cache.
    assert_eq!(u64_of(&s, "read_hits_ram_cache_large"), 0, "{s}");
    qemu_io_ok(&disk.uri(), &["read -P 0x5a 1M 1M"; 3]);
    let s = status_json(Path::new(&ctl));
    assert!(u64_of(&s, "ram_cache_first_touch_blocks") > 0, "{s}");
    assert!(u64_of(&s, "ram_cache_second_touch_blocks") > 0, "{s}");
    let large_hits = u64_of(&s, "read_hits_ram_cache_large");
    assert!(large_hits > 0, "{s}");
    let hits = u64_of(&s, "read_hits_ram_cache");
    assert!(hits >= large_hits, "{s}");
    let human = logcache_ok(&["status", "--control", &ctl]);
    assert!(
        human.contains("block reads served from it") && human.contains("RAM cache:"),
        "{human}"
    );
    assert!(
        human.contains(&format!("({large_hits} by reads over 64 KiB;")),
        "{human}"
    );
    logcache_ok(&["set", "--control", &ctl, "ram_cache_mib=0"]);
    let s = status_json(Path::new(&ctl));
    assert_eq!(u64_of(&s, "ram_cache_bytes"), 0, "{s}");
    assert_eq!(u64_of(&s, "ram_cache_blocks"), 0, "{s}");
    assert_eq!(s["tunables"]["ram_cache_mib"], 0, "{s}");
    qemu_io_ok(&disk.uri(), &reads);
    let s = status_json(Path::new(&ctl));
    assert_eq!(u64_of(&s, "read_hits_ram_cache"), hits, "{s}");
}

#[test]
fn status_counters_and_drain_to_the_backing_file() {
    // No idle writeback: the data stays dirty until drained.
    let disk = Disk::new("s-drain", &["--set", "writeback_idle_ms=0"]);
    let ctl = disk.ctl();
    let s = status_json(Path::new(&ctl));
    for key in STATUS_CONTRACT_NUMBERS {
        u64_of(&s, key);
    }
    assert_eq!(s["mode"], "write-back", "{s}");
    assert_eq!(u64_of(&s, "segment_size_bytes"), 256 * 1024);
    assert!(u64_of(&s, "cache_blocks") > 0);
    assert_eq!(u64_of(&s, "dirty_blocks"), 0);

    qemu_io_ok(&disk.uri(), &["write -P 0x5a 1M 2M", "read -P 0x5a 1M 2M"]);
    let s = status_json(Path::new(&ctl));
    let blocks = 2 * MIB / 4096;
    assert!(
        u64_of(&s, "write_hits") + u64_of(&s, "write_misses") >= blocks,
        "{s}"
    );
    assert!(u64_of(&s, "write_misses") > 0, "{s}");
    assert!(u64_of(&s, "read_hits") >= blocks, "{s}");
    assert_eq!(u64_of(&s, "dirty_blocks"), blocks, "{s}");

    // The human form too.
    let human = logcache_ok(&["status", "--control", &ctl]);
    assert!(human.contains("2.0 MiB dirty"), "{human}");
    assert!(human.contains("label at byte"), "{human}");

    let out = logcache(&["drain", "--control", &ctl]);
    assert_ok(&out, "logcache drain");
    assert!(
        text(&out.stdout).contains("drained"),
        "{}",
        text(&out.stdout)
    );
    let s = status_json(Path::new(&ctl));
    assert_eq!(u64_of(&s, "dirty_blocks"), 0, "{s}");
    assert!(u64_of(&s, "writeback_blocks") >= blocks, "{s}");
    // The backing file itself holds the data, at the same offset.
    let on_disk = read_at(Path::new(&disk.backing), MIB, 2 * MIB as usize);
    assert!(
        on_disk.iter().all(|&b| b == 0x5a),
        "the backing file lacks the drained data"
    );
    assert!(read_at(Path::new(&disk.backing), 0, MIB as usize)
        .iter()
        .all(|&b| b == 0));
    // A second drain has nothing to do and succeeds.
    assert_ok(&logcache(&["drain", "--control", &ctl]), "second drain");
}

#[test]
fn set_tunable_persists_across_restart() {
    let mut disk = Disk::new("s-set", &[]);
    let ctl = disk.ctl();
    let out = logcache_ok(&["set", "--control", &ctl, "writeback_threshold_percent=5"]);
    assert_eq!(out.trim(), "writeback_threshold_percent=5");
    let s = status_json(Path::new(&ctl));
    assert_eq!(s["tunables"]["writeback_threshold_percent"], 5, "{s}");
    // `set` alone lists the tunables with their values.
    let list = logcache_ok(&["set", "--control", &ctl]);
    assert!(
        list.lines()
            .any(|l| l.starts_with("writeback_threshold_percent=5 ")),
        "{list}"
    );
    disk.stop();
    disk.start(&[]);
    let s = status_json(Path::new(&disk.ctl()));
    assert_eq!(s["tunables"]["writeback_threshold_percent"], 5, "{s}");
    // --set at start persists as well.
    disk.stop();
    disk.start(&["--set", "writeback_threshold_percent=7"]);
    disk.stop();
    disk.start(&[]);
    let s = status_json(Path::new(&disk.ctl()));
    assert_eq!(s["tunables"]["writeback_threshold_percent"], 7, "{s}");
}

#[test]
fn cache_modes_switch_online_drain_first_and_persist() {
    let mut disk = Disk::new("s-modes", &["--set", "writeback_idle_ms=0"]);
    let ctl = disk.ctl();
    qemu_io_ok(&disk.uri(), &["write -P 0x5a 1M 2M"]);
    assert!(u64_of(&status_json(Path::new(&ctl)), "dirty_blocks") > 0);
    // Leaving write-back drains first: when `set` returns, the backing file holds the data.
    let out = logcache_ok(&["set", "--control", &ctl, "cache_mode=write-through"]);
    assert_eq!(out.trim(), "cache_mode=write-through");
    let s = status_json(Path::new(&ctl));
    assert_eq!(s["mode"], "write-through", "{s}");
    assert_eq!(u64_of(&s, "dirty_blocks"), 0, "{s}");
    let backing = Path::new(&disk.backing);
    assert!(read_at(backing, MIB, 2 * MIB as usize)
        .iter()
        .all(|&b| b == 0x5a));
    // Write-through: acknowledged once on the backing device too, and cached.
    qemu_io_ok(&disk.uri(), &["write -P 0x66 4M 256k"]);
    assert!(read_at(backing, 4 * MIB, 256 << 10)
        .iter()
        .all(|&b| b == 0x66));
    let s = status_json(Path::new(&ctl));
    assert_eq!(u64_of(&s, "dirty_blocks"), 0, "{s}");
    assert!(u64_of(&s, "write_through_writes") > 0, "{s}");
    // Write-around: the backing device only; the cached copies are dropped.
    logcache_ok(&["set", "--control", &ctl, "cache_mode=write-around"]);
    let cached_before = u64_of(&status_json(Path::new(&ctl)), "cached_blocks");
    qemu_io_ok(
        &disk.uri(),
        &["write -P 0x77 4M 256k", "read -P 0x77 4M 256k"],
    );
    assert!(read_at(backing, 4 * MIB, 256 << 10)
        .iter()
        .all(|&b| b == 0x77));
    let s = status_json(Path::new(&ctl));
    assert!(u64_of(&s, "write_around_writes") > 0, "{s}");
    assert!(u64_of(&s, "blocks_invalidated") >= 64, "{s}");
    assert!(u64_of(&s, "cached_blocks") <= cached_before, "{s}");
    // TRIM passes a discard on to the backing file: a hole there, which reads as zeros.
    qemu_io_ok(&disk.uri(), &["discard 1M 1M", "read -P 0 1M 1M"]);
    assert!(read_at(backing, MIB, MIB as usize).iter().all(|&b| b == 0));
    assert!(read_at(backing, 2 * MIB, MIB as usize)
        .iter()
        .all(|&b| b == 0x5a));
    // The mode is a persisted tunable.
    disk.stop();
    disk.start(&[]);
    let s = status_json(Path::new(&disk.ctl()));
    assert_eq!(s["mode"], "write-around", "{s}");
    qemu_io_ok(&disk.uri(), &["read -P 0x77 4M 256k", "read -P 0 1M 1M"]);
}

#[test]
fn metrics_endpoint() {
    let disk = Disk::new("s-metrics", &["--metrics", "127.0.0.1:0"]);
    qemu_io_ok(&disk.uri(), &["write -P 0x12 0 1M"]);
    let addr = disk.served().metrics_addr();
    assert!(!addr.ends_with(":0"), "metrics line shows port 0: {addr}");
    let (status, body) = http_get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.0 200 OK");
    assert!(body.contains("logcache_dirty_blocks"), "{body}");
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let (name, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad metrics line {line:?}"));
        assert!(name.starts_with("logcache_"), "{line:?}");
        value
            .parse::<f64>()
            .unwrap_or_else(|_| panic!("bad metrics value in {line:?}"));
    }
    let writes: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("logcache_writes "))
        .expect("logcache_writes")
        .parse()
        .unwrap();
    assert!(writes > 0.0, "{body}");
    let (status, body) = http_get(&addr, "/status");
    assert_eq!(status, "HTTP/1.0 200 OK");
    let s: Value = serde_json::from_str(&body).expect("/status is JSON");
    assert!(s["dirty_blocks"].is_u64(), "{s}");
    assert_eq!(s["mode"], "write-back");
    let (status, _) = http_get(&addr, "/nothing-here");
    assert!(status.contains("404"), "{status}");
}

#[test]
fn sigterm_stops_cleanly_then_check_and_dump() {
    let mut disk = Disk::new("s-sigterm", &[]);
    qemu_io_ok(&disk.uri(), &["write -P 0x44 0 1M"]);
    let ctl = disk.ctl();
    let stopped = disk.stop();
    assert!(
        stopped.stderr.contains("stopped cleanly"),
        "{}",
        stopped.stderr
    );
    assert!(!stopped.stderr.contains("panicked"), "{}", stopped.stderr);
    // It removes its socket files.
    assert!(!Path::new(&ctl).exists(), "control socket left behind");
    assert!(
        !disk.dir.join("cache.img.sock").exists(),
        "NBD socket left behind"
    );
    let out = logcache(&["check", "--cache", &disk.cache, "--backing", &disk.backing]);
    assert_ok(&out, "logcache check");
    let report = text(&out.stdout);
    assert!(report.contains("0 errors"), "{report}");
    assert!(report.contains("closed cleanly"), "{report}");
    let out = logcache(&["dump", "--cache", &disk.cache]);
    assert_ok(&out, "logcache dump");
    let dump = text(&out.stdout);
    assert!(dump.contains("segment"), "{dump}");
    assert!(dump.lines().count() > 10, "{dump}");
    // SIGINT stops it cleanly too, and the data is still there.
    disk.start(&[]);
    qemu_io_ok(&disk.uri(), &["read -P 0x44 0 1M"]);
    let stopped = disk.served.take().unwrap().stop_with(libc::SIGINT);
    assert!(stopped.status.success(), "{}", stopped.stderr);
    assert!(stopped.stderr.contains("SIGINT"), "{}", stopped.stderr);
    assert!(
        stopped.stderr.contains("stopped cleanly"),
        "{}",
        stopped.stderr
    );
}

/// The socket files removed under a running serve (a tmp cleaner, an operator): SIGTERM still
/// stops it cleanly. Before, the control socket's accept loop was woken by connecting to its
/// path, so the stop waited out its deadline and exited without a clean checkpoint, blaming the
/// backing device.
#[test]
fn sigterm_stops_cleanly_after_its_socket_files_were_removed() {
    let mut disk = Disk::new("s-unlinked", &[]);
    qemu_io_ok(&disk.uri(), &["write -P 0x45 0 1M"]);
    std::fs::remove_file(disk.ctl()).unwrap();
    std::fs::remove_file(disk.dir.join("cache.img.sock")).unwrap();
    let stopped = disk.stop();
    assert!(
        stopped.stderr.contains("stopped cleanly"),
        "{}",
        stopped.stderr
    );
    disk.start(&[]);
    qemu_io_ok(&disk.uri(), &["read -P 0x45 0 1M"]);
}

#[test]
fn sigterm_with_idle_clients_connected() {
    let mut disk = Disk::new("s-idle", &[]);
    // Two clients hold connections open and do nothing.
    let mut clients: Vec<std::process::Child> = (0..2)
        .map(|_| {
            nbdsh()
                .args([
                    "-u",
                    &disk.uri(),
                    "-c",
                    "import sys; h.pread(4096, 0); sys.stdin.read()",
                ])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    // Wait until both are connected.
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    while u64_of(&disk.served().status(), "nbd_connections_active") < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "clients never connected"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let stopped = disk.stop();
    assert!(
        stopped.stderr.contains("stopped cleanly"),
        "{}",
        stopped.stderr
    );
    for c in &mut clients {
        drop(c.stdin.take());
        let _ = c.kill();
        let _ = c.wait();
    }
}

#[test]
fn tcp_listen() {
    let dir = TestDir::new("s-tcp");
    let (cache, backing) = formatted_pair(&dir, CACHE_BYTES, BACKING_BYTES);
    // Port 0: the kernel picks a free port, and serve prints the one it got.
    let served = Served::start(&[
        "--cache",
        &cache,
        "--backing",
        &backing,
        "--listen",
        "127.0.0.1:0",
    ]);
    let uris = served.uris();
    assert_eq!(uris.len(), 1, "--listen alone serves only TCP: {uris:?}");
    let uri = served.tcp_uri();
    assert!(uri.starts_with("nbd://127.0.0.1:"), "{uri}");
    assert!(!uri.ends_with(":0"), "{uri}");
    let out = run(tool("nbdinfo").args(["--json", &uri]));
    assert_ok(&out, "nbdinfo over TCP");
    let info: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        info["exports"][0]["export-size"].as_u64(),
        Some(BACKING_BYTES - 4096)
    );
    qemu_io_ok(&uri, &["write -P 0x61 4M 1M", "read -P 0x61 4M 1M"]);
    assert!(!dir.join("cache.img.sock").exists());
    // Both at once, on a port given explicitly (picked free by binding port 0 and letting go).
    drop(served);
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let sock = dir.s("both.sock");
    let served = Served::start(&[
        "--cache",
        &cache,
        "--backing",
        &backing,
        "--listen",
        &addr,
        "--socket",
        &sock,
    ]);
    assert_eq!(served.uris().len(), 2, "{:?}", served.uris());
    assert_eq!(served.tcp_uri(), format!("nbd://{addr}"));
    assert_ok(
        &run(tool("nbdinfo").arg(format!("nbd://{addr}"))),
        "nbdinfo on the explicit port",
    );
    qemu_io_ok(&served.tcp_uri(), &["read -P 0x61 4M 1M"]);
    qemu_io_ok(&served.unix_uri(), &["read -P 0x61 4M 1M"]);
    assert!(served.unix_uri().ends_with("both.sock"));
}

#[test]
fn read_only_serve_rejects_writes() {
    let mut disk = Disk::new("s-ro", &[]);
    qemu_io_ok(&disk.uri(), &["write -P 0x3c 0 1M"]);
    disk.stop();
    disk.start(&["--read-only"]);
    let uri = disk.uri();
    let out = qemu_io(&uri, &[], &["write -P 0x99 0 4k"]);
    assert!(
        !out.status.success(),
        "qemu-io wrote to a --read-only serve:\n{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains("Permission denied"),
        "{}",
        text(&out.stderr)
    );
    qemu_io_flags_ok(&uri, &["-r"], &["read -P 0x3c 0 1M"]);
    let out = run(tool("nbdinfo").args(["--json", &uri]));
    let info: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["exports"][0]["is_read_only"], Value::Bool(true));
    // A client that ignores the read-only flag gets EPERM for every kind of write.
    let script = format!(
        r#"
import nbd
h.set_strict_mode(0)
h.connect_uri({uri:?})
for name, op in [("pwrite", lambda: h.pwrite(b"x" * 4096, 0)),
                 ("trim", lambda: h.trim(4096, 0)),
                 ("zero", lambda: h.zero(4096, 0))]:
    try:
        op()
        print(name, "succeeded")
    except nbd.Error as e:
        print(name, "failed", e.errno)
"#
    );
    let out = run(nbdsh().args(["-c", &script]));
    assert_ok(&out, "nbdsh against the read-only serve");
    assert_eq!(
        text(&out.stdout),
        "pwrite failed EPERM\ntrim failed EPERM\nzero failed EPERM\n"
    );
    qemu_io_flags_ok(&uri, &["-r"], &["read -P 0x3c 0 1M"]);
    let s = disk.served().status();
    assert_eq!(u64_of(&s, "writes"), 0, "{s}");
}

#[test]
fn restart_after_sigkill_keeps_flushed_data() {
    // Only flushes make writes durable: no periodic seal.
    let mut disk = Disk::new("s-sigkill", &["--set", "seal_interval_ms=0"]);
    let uri = disk.uri();
    qemu_io_ok(&uri, &["write -P 0x77 4M 1M", "flush"]);
    qemu_io_ok(&uri, &["write -P 0x78 6M 64k", "write -f -P 0x79 7M 64k"]);
    let ctl = disk.ctl();
    let killed = disk.kill();
    assert!(!killed.status.success());
    // The socket files are left behind, stale.
    assert!(Path::new(&ctl).exists());
    assert!(disk.dir.join("cache.img.sock").exists());
    disk.start(&[]);
    let stderr = disk.served().stderr_with("recovered after an unclean stop");
    assert!(
        stderr.contains("recovered after an unclean stop"),
        "{stderr}"
    );
    qemu_io_ok(&disk.uri(), &["read -P 0x77 4M 1M", "read -P 0x79 7M 64k"]);
    let s = disk.served().status();
    assert_eq!(u64_of(&s, "recovery_clean"), 0, "{s}");
    // A second crash right after recovery, then a clean stop and a clean check.
    disk.kill();
    disk.start(&[]);
    qemu_io_ok(&disk.uri(), &["read -P 0x77 4M 1M", "read -P 0x79 7M 64k"]);
    disk.stop();
    let out = logcache(&["check", "--cache", &disk.cache, "--backing", &disk.backing]);
    assert_ok(&out, "logcache check after recovery");
}

#[test]
fn sigkill_under_load_keeps_every_fua_write() {
    // A cache much smaller than the data fio writes: writeback and log reclaim run while the
    // acknowledged FUA writes go in.
    let mut disk = Disk::new("s-load", &[]);
    let uri = disk.uri();
    let mut fio = tool("fio")
        .args([
            "--name=load",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=32",
            "--size=128m",
            "--time_based",
            "--runtime=60",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    while u64_of(&disk.served().status(), "writes") < 2000 {
        assert!(std::time::Instant::now() < deadline, "fio wrote nothing");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // 300 FUA writes of 8 KiB at distinct offsets beyond fio's region, each with its own
    // content; once acknowledged they must survive a crash.
    let script = r#"
import nbd
for i in range(300):
    h.pwrite(i.to_bytes(4, "little") * 2048, (160 << 20) + i * 3 * 8192, nbd.CMD_FLAG_FUA)
print("done")
"#;
    let out = run(nbdsh().args(["-u", &uri, "-c", script]));
    assert_ok(&out, "nbdsh FUA writes");
    assert_eq!(text(&out.stdout).trim(), "done");
    disk.kill();
    let _ = fio.kill();
    let _ = fio.wait();
    disk.start(&[]);
    let check = r#"
bad = []
for i in range(300):
    if h.pread(8192, (160 << 20) + i * 3 * 8192) != i.to_bytes(4, "little") * 2048:
        bad.append(i)
print("lost", bad)
"#;
    let out = run(nbdsh().args(["-u", &disk.uri(), "-c", check]));
    assert_ok(&out, "nbdsh reading back");
    assert_eq!(text(&out.stdout).trim(), "lost []");
    disk.stop();
    let out = logcache(&["check", "--cache", &disk.cache, "--backing", &disk.backing]);
    assert_ok(&out, "logcache check after the crash");
}

/// The endpoint serve prints must be a URI the clients accept, whatever the path: a space in
/// the socket path has to be percent-encoded (libnbd rejects a raw space).
#[test]
fn printed_uri_works_when_the_path_has_a_space() {
    let dir = TestDir::new("s-space");
    let sub = dir.join("a b");
    std::fs::create_dir_all(&sub).unwrap();
    let cache = sub.join("cache.img").to_string_lossy().into_owned();
    let backing = sub.join("backing.img").to_string_lossy().into_owned();
    sparse(Path::new(&cache), 16 * MIB);
    sparse(Path::new(&backing), 64 * MIB);
    logcache_ok(&["format", "--cache", &cache, "--backing", &backing]);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    let uri = served.unix_uri();
    let out = run(tool("nbdinfo").arg(&uri));
    assert_ok(&out, &format!("nbdinfo on the printed URI {uri:?}"));
}

/// `--io-engine`: with each engine, data written in random 4 KiB pieces (scattered in the log:
/// a 1 MiB read of it is many runs, read as one batch) and written sequentially (few runs)
/// reads back exactly after a restart (every read a cache-device hit); a value that is not an
/// engine is refused with one line naming it.
#[test]
fn each_io_engine_serves_cached_reads_exactly() {
    for engine in ["io_uring", "sync", "auto"] {
        let extra = ["--io-engine", engine];
        let mut disk = Disk::new(&format!("s-engine-{engine}"), &extra);
        let uri = disk.uri();
        // 4 KiB pieces of 1..2 MiB in a scattered order, then 4..6 MiB sequentially.
        let mut cmds: Vec<String> = (0..256u64)
            .map(|i| (i * 97) % 256)
            .map(|i| format!("write -P {} {} 4k", 1 + i % 250, MIB + i * 4096))
            .collect();
        cmds.push("write -P 0x6b 4M 2M".into());
        cmds.push("flush".into());
        let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
        qemu_io_ok(&uri, &refs);
        disk.stop();
        disk.start(&extra);
        let mut reads: Vec<String> = (0..256u64)
            .map(|i| format!("read -P {} {} 4k", 1 + i % 250, MIB + i * 4096))
            .collect();
        reads.push("read -P 0x6b 4M 2M".into());
        reads.push("read -P 0 0 1M".into());
        let refs: Vec<&str> = reads.iter().map(String::as_str).collect();
        qemu_io_ok(&disk.uri(), &refs);
        // The 1 MiB of scattered blocks in one request, against the same pattern.
        let script = r#"
h.connect_uri(URI)
data = h.pread(1 << 20, 1 << 20)
for i in range(256):
    assert data[i * 4096:(i + 1) * 4096] == bytes([1 + i % 250]) * 4096, i
print("ok")
"#
        .replace("URI", &format!("{:?}", disk.uri()));
        let out = run(nbdsh().args(["-c", &script]));
        assert_ok(&out, "nbdsh 1 MiB read of scattered blocks");
        assert_eq!(text(&out.stdout).trim(), "ok", "{engine}");
        let status = disk.stop();
        assert!(!status.stderr.contains("panicked"), "{}", status.stderr);
    }
    let out = logcache(&["serve", "--io-engine", "aio"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("'aio'") && err.contains("--io-engine"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
