//! Helpers shared by the command-line tests: temporary directories, sparse files, running the
//! `logcache` binary and the real NBD clients with a time limit, and [`Served`], a guard around
//! a running `logcache serve`.
//!
//! The tests use real clients from Debian packages (`scripts/setup.sh` installs them). A
//! missing tool fails the test with a message saying so: these tests never skip.

// Each test file compiles this module on its own and uses a different part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod attached;
pub mod cache_loss;

/// The binary under test: `logcache`, or `logcache-bench` for the bench crate's tests, which
/// include this module too.
pub const BIN: &str = match (
    option_env!("CARGO_BIN_EXE_logcache"),
    option_env!("CARGO_BIN_EXE_logcache-bench"),
) {
    (Some(bin), _) | (None, Some(bin)) => bin,
    (None, None) => panic!("no logcache binary in this package"),
};

/// The name the binary under test starts its one-line errors with.
pub fn program_name() -> String {
    Path::new(BIN)
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// How long any one command may run before the test calls it hung.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(90);
/// How long `serve` may take to start listening.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `serve` may take to stop after SIGTERM.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

pub const MIB: u64 = 1 << 20;

/// The numeric contract keys of `status --json` (README; `mode` is the string one): scripts
/// rely on their names and types.
pub const STATUS_CONTRACT_NUMBERS: [&str; 8] = [
    "cache_blocks",
    "dirty_blocks",
    "segment_size_bytes",
    "read_hits",
    "read_misses",
    "write_hits",
    "write_misses",
    "writeback_blocks",
];

// ---------------------------------------------------------------------------------------------
// Temporary directories and files

/// A fresh directory under the system temp dir, unique per test and process. Removed when the
/// test passes; kept (and its path printed) when it fails, for a post-mortem.
pub struct TestDir {
    path: PathBuf,
}

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        // Short: Unix socket paths inside it must stay under 108 bytes.
        let path = std::env::temp_dir().join(format!("lc-{name}-{}-{n}", std::process::id()));
        if path.exists() {
            fs::remove_dir_all(&path).unwrap_or_else(|e| panic!("clearing {path:?}: {e}"));
        }
        fs::create_dir_all(&path).unwrap_or_else(|e| panic!("creating {path:?}: {e}"));
        TestDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }

    /// `self.join(name)` as a string, for command lines.
    pub fn s(&self, name: impl AsRef<Path>) -> String {
        self.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test files kept in {}", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// Creates (or truncates) a sparse file of `size` bytes.
pub fn sparse(path: &Path, size: u64) {
    let f = File::create(path).unwrap_or_else(|e| panic!("creating {path:?}: {e}"));
    f.set_len(size)
        .unwrap_or_else(|e| panic!("sizing {path:?} to {size}: {e}"));
}

/// Bytes of `path` actually allocated on disk.
pub fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {path:?}: {e}"))
        .blocks()
        * 512
}

/// Reads `len` bytes at `offset` of a file.
pub fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = File::open(path).unwrap_or_else(|e| panic!("opening {path:?}: {e}"));
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset)
        .unwrap_or_else(|e| panic!("reading {len} bytes at {offset} of {path:?}: {e}"));
    buf
}

/// Deterministic pseudo-random bytes (xorshift64*), so failures replay.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(len);
        v
    }
}

// ---------------------------------------------------------------------------------------------
// Tools

/// The full path of an installed tool, or a panic saying how to install it. Looks in PATH and
/// in the sbin directories (a non-root PATH may lack them).
pub fn require(tool: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from));
    for dir in dirs {
        let candidate = dir.join(tool);
        if is_executable(&candidate) {
            return candidate;
        }
    }
    panic!("{tool} is missing: run scripts/setup.sh");
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A Command for `tool` (which must be installed).
pub fn tool(name: &str) -> Command {
    Command::new(require(name))
}

/// A Command for `nbdsh`. nbdsh runs `python3 -m nbd` with whatever python3 comes first in
/// PATH; the `nbd` module (python3-libnbd) belongs to the system python, so /usr/bin goes
/// first (a pyenv or venv python earlier in PATH lacks it).
pub fn nbdsh() -> Command {
    static CHECKED: OnceLock<()> = OnceLock::new();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![PathBuf::from("/usr/bin"), PathBuf::from("/bin")];
    dirs.extend(std::env::split_paths(&path));
    let joined = std::env::join_paths(dirs).expect("PATH");
    let make = || {
        let mut c = tool("nbdsh");
        c.env("PATH", &joined);
        c
    };
    CHECKED.get_or_init(|| {
        let out = run(make().args(["-c", "import nbd"]));
        if !out.status.success() {
            panic!(
                "nbdsh cannot import the nbd module (python3-libnbd is missing): run scripts/setup.sh\n{}",
                text(&out.stderr)
            );
        }
    });
    make()
}

// ---------------------------------------------------------------------------------------------
// Running commands

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs a command to completion with stdin closed, capturing its output. Panics if it runs
/// longer than [`COMMAND_TIMEOUT`] (after killing it).
pub fn run(cmd: &mut Command) -> Output {
    run_timeout(cmd, COMMAND_TIMEOUT)
}

pub fn run_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    let what = describe(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let out = collect(child.stdout.take().unwrap());
    let err = collect(child.stderr.take().unwrap());
    let status = match wait_timeout(&mut child, timeout) {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not finish within {timeout:?}; stderr so far:\n{}",
                text(&err.join_now())
            );
        }
    };
    Output {
        status,
        stdout: out.join_now(),
        stderr: err.join_now(),
    }
}

/// A thread reading a pipe to its end.
struct Collector(JoinHandle<Vec<u8>>);

impl Collector {
    fn join_now(self) -> Vec<u8> {
        self.0.join().unwrap_or_default()
    }
}

fn collect(mut r: impl Read + Send + 'static) -> Collector {
    Collector(std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        v
    }))
}

/// Waits for a child to exit; `None` if it is still running after `timeout`.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() >= deadline => return None,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("waiting for a child: {e}"),
        }
    }
}

/// Runs `logcache ARGS...`.
pub fn logcache<S: AsRef<OsStr>>(args: &[S]) -> Output {
    run(Command::new(BIN).args(args))
}

/// Runs `logcache ARGS...` in directory `cwd`.
pub fn logcache_in<S: AsRef<OsStr>>(cwd: &Path, args: &[S]) -> Output {
    run(Command::new(BIN).args(args).current_dir(cwd))
}

/// Panics, showing everything the command said, unless it exited 0.
pub fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed with {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// Runs `logcache ARGS...`, which must fail (with exit code `code`) saying one line on stderr
/// that starts with "logcache:" (the program's name) and contains every string of `mentions`. Returns that line.
pub fn fails_with(code: i32, args: &[&str], mentions: &[&str]) -> String {
    let out = run_timeout(Command::new(BIN).args(args), Duration::from_secs(30));
    let stderr = text(&out.stderr);
    let what = format!("logcache {}", args.join(" "));
    assert!(!stderr.contains("panicked"), "{what} panicked:\n{stderr}");
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: expected exit code {code}, got {}\nstdout:\n{}\nstderr:\n{stderr}",
        out.status,
        text(&out.stdout)
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{what}: expected exactly one line on stderr, got {}:\n{stderr}",
        lines.len()
    );
    let line = lines[0];
    let prefix = format!("{}: ", program_name());
    assert!(
        line.starts_with(&prefix),
        "{what}: the error line does not start with {prefix:?}: {line:?}"
    );
    for m in mentions {
        assert!(
            line.contains(m),
            "{what}: the error line does not mention {m:?}: {line:?}"
        );
    }
    line.to_string()
}

/// Runs `logcache ARGS...` and requires success; returns stdout.
pub fn logcache_ok<S: AsRef<OsStr>>(args: &[S]) -> String {
    let out = logcache(args);
    let what: Vec<String> = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    assert_ok(&out, &format!("logcache {}", what.join(" ")));
    text(&out.stdout)
}

/// Creates sparse cache and backing files of the given sizes in `dir` and formats the cache
/// with 256 KiB segments. Returns (cache, backing).
pub fn formatted_pair(dir: &TestDir, cache_bytes: u64, backing_bytes: u64) -> (String, String) {
    let cache = dir.s("cache.img");
    let backing = dir.s("backing.img");
    sparse(Path::new(&cache), cache_bytes);
    sparse(Path::new(&backing), backing_bytes);
    format_256k(&cache, &backing);
    (cache, backing)
}

/// `logcache format` of `cache` for `backing` with 256 KiB segments.
pub fn format_256k(cache: &str, backing: &str) {
    logcache_ok(&[
        "format",
        "--cache",
        cache,
        "--backing",
        backing,
        "--segment-size",
        "256K",
    ]);
}

/// `logcache status --json --control PATH`, parsed.
pub fn status_json(control: &Path) -> Value {
    let out = logcache(&[
        "status".as_ref(),
        "--json".as_ref(),
        "--control".as_ref(),
        control.as_os_str(),
    ]);
    assert_ok(&out, "logcache status --json");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}):\n{}", text(&out.stdout)))
}

/// `qemu-io -f raw URI -c CMD...`; panics unless it exits 0 without a pattern mismatch.
pub fn qemu_io_ok(uri: &str, cmds: &[&str]) -> String {
    qemu_io_flags_ok(uri, &[], cmds)
}

/// `qemu-io -f raw FLAGS URI -c CMD...` (e.g. `-r` for read-only); as [`qemu_io_ok`].
pub fn qemu_io_flags_ok(uri: &str, flags: &[&str], cmds: &[&str]) -> String {
    let out = qemu_io(uri, flags, cmds);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success() && !stdout.contains("Pattern verification failed"),
        "qemu-io {uri} {cmds:?} failed with {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        text(&out.stderr)
    );
    stdout
}

/// `qemu-io -f raw [FLAGS] URI -c CMD...`.
pub fn qemu_io(uri: &str, flags: &[&str], cmds: &[&str]) -> Output {
    let mut c = tool("qemu-io");
    c.args(["-f", "raw"]).args(flags).arg(uri);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    run(&mut c)
}

/// Sends one HTTP/1.0 GET and returns (status line, body).
pub fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp)
        .unwrap_or_else(|e| panic!("reading the reply to GET {path}: {e}"));
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in the reply to GET {path}: {resp:?}"));
    let status = head.lines().next().unwrap_or("").to_string();
    (status, body.to_string())
}

/// Decodes %XX escapes (as in a URI's query).
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

// ---------------------------------------------------------------------------------------------
// A running `logcache serve`

/// What a stopped `serve` left behind.
pub struct Stopped {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// A running `logcache serve`, started by [`Served::start`] and ready (its listeners accept)
/// when that returns. Dropping it sends SIGTERM, then SIGKILL if it has not exited after 10 s.
pub struct Served {
    child: Option<Child>,
    cwd: PathBuf,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    args: Vec<String>,
}

fn pump(mut r: impl Read + Send + 'static, into: Arc<Mutex<String>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => into
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
    })
}

impl Served {
    /// Starts `logcache serve ARGS...` in the current directory.
    pub fn start(args: &[&str]) -> Served {
        Served::start_in(&std::env::current_dir().unwrap(), args)
    }

    /// Starts `logcache serve ARGS...` in `cwd` and waits until it serves.
    pub fn start_in(cwd: &Path, args: &[&str]) -> Served {
        let mut cmd = Command::new(BIN);
        if !args.contains(&"--cache") {
            // The embedded default announces its control socket in XDG_RUNTIME_DIR: keep that
            // inside the test's directory, off the user's.
            cmd.env("XDG_RUNTIME_DIR", cwd);
        }
        let mut child = cmd
            .arg("serve")
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN} serve: {e}"));
        let out = Arc::new(Mutex::new(String::new()));
        let err = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            pump(child.stdout.take().unwrap(), out.clone()),
            pump(child.stderr.take().unwrap(), err.clone()),
        ];
        let mut served = Served {
            child: Some(child),
            cwd: cwd.to_path_buf(),
            out,
            err,
            readers,
            args: args.iter().map(|s| s.to_string()).collect(),
        };
        served.wait_ready();
        served
    }

    fn has_arg(&self, a: &str) -> bool {
        self.args.iter().any(|x| x == a)
    }

    /// The first complete line printed so far that starts with `prefix`.
    fn line(&self, prefix: &str) -> Option<String> {
        let out = self.stdout();
        let complete = &out[..out.rfind('\n').map_or(0, |i| i + 1)];
        complete
            .lines()
            .find(|l| l.starts_with(prefix))
            .map(str::to_string)
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let printed = self.line("  control: ").is_some()
                && (!self.has_arg("--metrics") || self.line("  metrics: ").is_some())
                && (self.has_arg("--cache") || self.line("Status:").is_some());
            if printed {
                // The endpoints are printed once listening; check the Unix ones accept.
                let accepting = self
                    .uris()
                    .iter()
                    .filter_map(|u| {
                        u.split_once("socket=")
                            .map(|(_, p)| percent_decode(p.split('&').next().unwrap_or(p)))
                    })
                    .all(|p| UnixStream::connect(&p).is_ok());
                if accepting {
                    return;
                }
            }
            // A serve that exited early failed: show why.
            if let Some(code) = self.child.as_mut().unwrap().try_wait().unwrap() {
                let stopped = self.finish_reaped(code);
                panic!(
                    "logcache serve {:?} exited early ({code})\nstdout:\n{}\nstderr:\n{}",
                    self.args, stopped.stdout, stopped.stderr
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "logcache serve {:?} did not start serving within {START_TIMEOUT:?}\nstdout:\n{}\nstderr:\n{}",
                    self.args,
                    self.stdout(),
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("serve already stopped").id()
    }

    pub fn stdout(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    pub fn stderr(&self) -> String {
        self.err.lock().unwrap().clone()
    }

    /// stderr once it contains `needle`, or as it is after [`START_TIMEOUT`]: serve writes its
    /// startup notes (recovery, format) before the banner on stdout, but the two pipes are read
    /// by different threads, so the banner can arrive first.
    pub fn stderr_with(&self, needle: &str) -> String {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let err = self.stderr();
            if err.contains(needle) || Instant::now() >= deadline {
                return err;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The endpoints from the "logcache: serving ... on URI [and URI]" line.
    pub fn uris(&self) -> Vec<String> {
        let Some(line) = self.line("logcache: serving ") else {
            return Vec::new();
        };
        let (_, eps) = line
            .rsplit_once(" on ")
            .unwrap_or_else(|| panic!("no endpoints in {line:?}"));
        eps.split(" and ").map(str::to_string).collect()
    }

    /// The nbd+unix:// endpoint.
    pub fn unix_uri(&self) -> String {
        self.uris()
            .into_iter()
            .find(|u| u.starts_with("nbd+unix://"))
            .unwrap_or_else(|| panic!("no nbd+unix endpoint in {:?}", self.stdout()))
    }

    /// The nbd:// (TCP) endpoint.
    pub fn tcp_uri(&self) -> String {
        self.uris()
            .into_iter()
            .find(|u| u.starts_with("nbd://"))
            .unwrap_or_else(|| panic!("no nbd:// endpoint in {:?}", self.stdout()))
    }

    /// The control socket, from the "  control: PATH" line.
    pub fn control(&self) -> PathBuf {
        let line = self.line("  control: ").expect("no control line");
        self.cwd.join(line.trim_start_matches("  control: ").trim())
    }

    /// HOST:PORT from the "  metrics: http://HOST:PORT/metrics" line.
    pub fn metrics_addr(&self) -> String {
        let line = self.line("  metrics: ").expect("no metrics line");
        line.trim()
            .trim_start_matches("metrics: http://")
            .trim_end_matches("/metrics")
            .to_string()
    }

    pub fn status(&self) -> Value {
        status_json(&self.control())
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid, which is not reaped yet.
        unsafe {
            libc::kill(self.pid() as libc::pid_t, sig);
        }
    }

    fn finish(&mut self) -> Stopped {
        let status = self
            .child
            .as_mut()
            .expect("serve already stopped")
            .wait()
            .expect("waiting for serve");
        self.finish_reaped(status)
    }

    fn finish_reaped(&mut self, status: ExitStatus) -> Stopped {
        self.child = None;
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        Stopped {
            status,
            stdout: self.stdout(),
            stderr: self.stderr(),
        }
    }

    /// SIGTERM, and wait for the exit (panics if it takes longer than [`STOP_TIMEOUT`]).
    pub fn stop(self) -> Stopped {
        self.stop_with(libc::SIGTERM)
    }

    /// Sends `sig` (SIGTERM or SIGINT) and waits for the exit.
    pub fn stop_with(self, sig: libc::c_int) -> Stopped {
        self.stop_within(sig, STOP_TIMEOUT)
    }

    /// Sends `sig` and waits for the exit; panics (a hang) if it takes longer than `limit`.
    pub fn stop_within(mut self, sig: libc::c_int, limit: Duration) -> Stopped {
        self.signal(sig);
        let child = self.child.as_mut().unwrap();
        if wait_timeout(child, limit).is_none() {
            panic!(
                "logcache serve did not stop within {limit:?} of signal {sig}\nstderr:\n{}",
                self.stderr()
            );
        }
        self.finish()
    }

    /// SIGKILL: a crash.
    pub fn kill(mut self) -> Stopped {
        self.signal(libc::SIGKILL);
        self.finish()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        // SAFETY: as in `signal`.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        if wait_timeout(child, Duration::from_secs(10)).is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Other servers (nbdkit, qemu-nbd)

/// A server process listening on a Unix socket, killed (SIGTERM, then SIGKILL) on drop.
pub struct Daemon {
    child: Option<Child>,
    what: String,
    log: PathBuf,
}

impl Daemon {
    /// Spawns `cmd` with its output going to `log`, and waits until `socket` accepts.
    pub fn start(cmd: &mut Command, socket: &Path, log: &Path) -> Daemon {
        let what = describe(cmd);
        let f = File::create(log).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
        let mut d = Daemon {
            child: Some(child),
            what,
            log: log.to_path_buf(),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        while UnixStream::connect(socket).is_err() {
            if let Some(st) = d.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("{} exited early ({st}):\n{}", d.what, d.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "{} did not listen on {socket:?} within {START_TIMEOUT:?}:\n{}",
                d.what,
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` (SIGSTOP, SIGCONT, ...) to the daemon.
    pub fn signal(&self, signal: libc::c_int) {
        let child = self.child.as_ref().expect("the daemon is running");
        // SAFETY: kill(2) on our own unreaped child.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
    }

    /// SIGTERM (SIGKILL after 10 s) and reap.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own unreaped child.
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

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}
