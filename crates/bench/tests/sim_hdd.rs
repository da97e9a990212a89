//! `logcache-bench sim-hdd`: the emulated hard disk served for real on a Unix socket (and TCP), driven
//! by nbdsh and nbdinfo, with a fast model so the tests run quickly; and its option errors.

// The `logcache` command tests' helpers; `BIN` is this crate's binary, `logcache-bench`.
#[path = "../../cli/tests/common/mod.rs"]
mod common;

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Model options that keep every IO in the microseconds (a 100 µs revolution).
const FAST: &[&str] = &[
    "--rpm",
    "600000",
    "--settle-us",
    "1",
    "--full-stroke-us",
    "2",
];

/// A running `logcache-bench sim-hdd`, ready when `start` returns; SIGTERM (then SIGKILL) on drop.
struct SimHdd {
    child: Option<Child>,
    stdout: PathBuf,
    stderr: PathBuf,
}

/// What a stopped `sim-hdd` left behind.
struct Exit {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl SimHdd {
    /// Starts `logcache-bench sim-hdd ARGS...` with its output in files under `dir`, and waits for
    /// its startup line (printed once it listens).
    fn start(dir: &TestDir, args: &[&str]) -> SimHdd {
        let stdout = dir.join("sim-hdd.out");
        let stderr = dir.join("sim-hdd.err");
        let child = Command::new(BIN)
            .arg("sim-hdd")
            .args(args)
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).unwrap())
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN} sim-hdd: {e}"));
        let mut sim = SimHdd {
            child: Some(child),
            stdout,
            stderr,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        while sim.uri().is_none() {
            if let Some(status) = sim.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "sim-hdd {args:?} exited early ({status})\nstdout:\n{}\nstderr:\n{}",
                    sim.stdout(),
                    sim.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "sim-hdd {args:?} did not start within {START_TIMEOUT:?}\nstderr:\n{}",
                sim.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        sim
    }

    fn stdout(&self) -> String {
        fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The endpoint from the complete startup line "logcache-bench: serving ... on URI".
    fn uri(&self) -> Option<String> {
        let out = self.stdout();
        let line = out
            .lines()
            .find(|l| l.starts_with("logcache-bench: serving "))
            .filter(|_| out.contains('\n'))?;
        Some(line.rsplit_once(" on ")?.1.to_string())
    }

    fn stop_with(mut self, sig: libc::c_int) -> Exit {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe {
            libc::kill(child.id() as libc::pid_t, sig);
        }
        let status = wait_timeout(&mut child, STOP_TIMEOUT).unwrap_or_else(|| {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "sim-hdd did not stop within {STOP_TIMEOUT:?} of signal {sig}\nstderr:\n{}",
                self.stderr()
            )
        });
        Exit {
            status,
            stdout: self.stdout(),
            stderr: self.stderr(),
        }
    }
}

impl Drop for SimHdd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: as in `stop_with`.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            if wait_timeout(&mut child, Duration::from_secs(10)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Runs an nbdsh script against `uri` (the script sees `h`, connected); panics unless it
/// succeeds.
fn nbdsh_ok(uri: &str, script: &str) {
    let out = run(nbdsh().args(["-u", uri, "-c", script]));
    assert_ok(&out, "nbdsh");
}

#[test]
fn serves_the_file_through_the_emulated_disk_and_keeps_the_bytes() {
    let dir = TestDir::new("simhdd");
    let file = dir.join("disk.img");
    let socket = dir.s("disk.sock");
    // An existing, shorter file is extended, and its data is the disk's.
    fs::write(&file, vec![0x5au8; MIB as usize]).unwrap();
    let file_arg = file.to_string_lossy().into_owned();
    let mut args = vec!["--file", &file_arg, "--size", "64M", "--socket", &socket];
    args.extend_from_slice(FAST);
    let sim = SimHdd::start(&dir, &args);
    let startup = sim.stdout();
    assert!(startup.contains("EMULATED"), "{startup}");
    assert!(startup.contains("64 MiB"), "{startup}");
    assert_eq!(fs::metadata(&file).unwrap().len(), 64 * MIB);
    let uri = sim.uri().unwrap();

    let script = r#"
M = 1 << 20
assert h.get_size() == 64 * M, h.get_size()
assert h.pread(4096, 0) == b"\x5a" * 4096
h.pwrite(b"\xa1" * 65536, 8 * M)
h.pwrite(b"\xb2" * 1000, 9 * M + 100)
h.pwrite(b"\xc3" * 4096, 10 * M, nbd.CMD_FLAG_FUA)
# 64 writes in flight at once, then their reads.
cookies = [h.aio_pwrite(bytes([i + 1]) * 4096, 16 * M + i * 65536) for i in range(64)]
while h.aio_in_flight() > 0:
    h.poll(-1)
assert all(h.aio_command_completed(c) for c in cookies)
h.flush()
assert h.pread(65536, 8 * M) == b"\xa1" * 65536
assert h.pread(1200, 9 * M) == bytes(100) + b"\xb2" * 1000 + bytes(100)
for i in range(64):
    assert h.pread(4096, 16 * M + i * 65536) == bytes([i + 1]) * 4096, i
h.pwrite(b"\xd4" * (2 * M), 32 * M)
h.trim(M, 32 * M)
h.zero(512 * 1024, 33 * M)
h.flush()
assert h.pread(M, 32 * M) == bytes(M)
assert h.pread(M, 33 * M) == bytes(512 * 1024) + b"\xd4" * (512 * 1024)
"#;
    nbdsh_ok(&uri, script);

    // The file is in use: a second sim-hdd on it fails at once.
    let other_socket = dir.s("other.sock");
    let mut other = vec![
        "sim-hdd",
        "--file",
        &file_arg,
        "--size",
        "64M",
        "--socket",
        &other_socket,
    ];
    other.extend_from_slice(FAST);
    fails_with(1, &other, &[&file_arg, "in use"]);

    let exit = sim.stop_with(libc::SIGINT);
    assert!(
        exit.status.success(),
        "sim-hdd exited with {}\nstderr:\n{}",
        exit.status,
        exit.stderr
    );
    let last = exit.stdout.lines().last().unwrap_or_default().to_string();
    assert!(last.contains("SIGINT"), "{last}");
    let ios: u64 = last
        .split_once("served ")
        .and_then(|(_, rest)| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no IO count in the exit line {last:?}"));
    // At least the 2 + 1 + 64 writes, their reads and the flushes above.
    assert!(ios >= 130, "{last}");
    assert!(last.contains("busy "), "{last}");

    // The bytes are in the file.
    assert_eq!(read_at(&file, 0, 4096), vec![0x5a; 4096]);
    assert_eq!(read_at(&file, 8 * MIB, 65536), vec![0xa1; 65536]);
    assert_eq!(read_at(&file, 9 * MIB + 100, 1000), vec![0xb2; 1000]);
    assert_eq!(read_at(&file, 10 * MIB, 4096), vec![0xc3; 4096]);
    for i in 0..64u64 {
        assert_eq!(
            read_at(&file, 16 * MIB + i * 65536, 4096),
            vec![i as u8 + 1; 4096]
        );
    }
    assert_eq!(
        read_at(&file, 32 * MIB, MIB as usize),
        vec![0; MIB as usize]
    );
    assert_eq!(read_at(&file, 33 * MIB, 512 << 10), vec![0; 512 << 10]);
    assert_eq!(
        read_at(&file, 33 * MIB + (512 << 10), 4096),
        vec![0xd4; 4096]
    );
}

#[test]
fn serves_on_tcp_and_stops_on_sigterm() {
    let dir = TestDir::new("simhdd-tcp");
    let file = dir.s("disk.img");
    let mut args = vec!["--file", &file, "--size", "1M", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(FAST);
    let sim = SimHdd::start(&dir, &args);
    let uri = sim.uri().unwrap();
    assert!(uri.starts_with("nbd://127.0.0.1:"), "{uri}");
    nbdsh_ok(
        &uri,
        "assert h.get_size() == 1 << 20\nh.pwrite(b'x' * 512, 512)\nassert h.pread(512, 512) == b'x' * 512",
    );
    let exit = sim.stop_with(libc::SIGTERM);
    assert!(exit.status.success(), "{}", exit.stderr);
    assert!(exit.stdout.contains("SIGTERM: stopped"), "{}", exit.stdout);
    assert_eq!(read_at(Path::new(&file), 512, 512), vec![b'x'; 512]);
}

#[test]
fn bad_options_give_one_clear_line() {
    let dir = TestDir::new("simhdd-err");
    let file = dir.s("disk.img");
    let socket = dir.s("disk.sock");
    let with = |extra: &[&'static str]| {
        let mut args = vec!["sim-hdd", "--file", &file, "--socket", &socket];
        args.extend_from_slice(extra);
        args.iter().map(|s| s.to_string()).collect::<Vec<String>>()
    };
    let fails = |code, args: Vec<String>, mentions: &[&str]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(code, &args, mentions)
    };
    fails(1, with(&["--size", "0"]), &["--size 0", "multiple of 512"]);
    fails(
        1,
        with(&["--size", "1000"]),
        &["--size 1000", "multiple of 512"],
    );
    fails(2, with(&["--size", "12Q"]), &["12Q", "not a size"]);
    fails(
        1,
        with(&["--size", "1M", "--ncq-depth", "0"]),
        &["queue depth"],
    );
    fails(
        1,
        with(&["--size", "1M", "--settle-us", "20000"]),
        &["settle"],
    );
    fails(
        1,
        with(&["--size", "1M", "--platter-gib", "0"]),
        &["platter"],
    );
    // Nothing is created when the options are wrong.
    assert!(!Path::new(&file).exists());

    // Neither, or both, of --socket and --listen.
    fails_with(
        1,
        &["sim-hdd", "--file", &file, "--size", "1M"],
        &["--socket", "--listen"],
    );
    fails_with(
        1,
        &[
            "sim-hdd",
            "--file",
            &file,
            "--size",
            "1M",
            "--socket",
            &socket,
            "--listen",
            "127.0.0.1:0",
        ],
        &["not both"],
    );
    fails_with(
        1,
        &[
            "sim-hdd",
            "--file",
            &file,
            "--size",
            "1M",
            "--listen",
            "0.0.0.0:0",
        ],
        &["--allow-remote"],
    );

    // Paths it cannot use: in a missing directory, a directory, a longer file.
    let unwritable = dir.s("missing-dir/disk.img");
    fails_with(
        1,
        &[
            "sim-hdd",
            "--file",
            &unwritable,
            "--size",
            "1M",
            "--socket",
            &socket,
        ],
        &[&unwritable],
    );
    let a_dir = dir.s("");
    fails_with(
        1,
        &[
            "sim-hdd", "--file", &a_dir, "--size", "1M", "--socket", &socket,
        ],
        &["not a regular file"],
    );
    sparse(Path::new(&file), 2 * MIB);
    fails_with(
        1,
        &[
            "sim-hdd", "--file", &file, "--size", "1M", "--socket", &socket,
        ],
        &[&file, "2097152 bytes", "never shortens"],
    );
    assert_eq!(fs::metadata(&file).unwrap().len(), 2 * MIB);
}
