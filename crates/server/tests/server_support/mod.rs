//! Shared helpers for the server's integration tests: an in-process server on a RAM-backed
//! engine, runners for the real NBD clients (with timeouts, killing children on every path),
//! and a raw protocol client built on the codec crate for what no real client will send.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, Engine, FormatOptions, OpenOptions};
use logcache_nbd::consts::{
    FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES, GREETING_BYTES, OPTION_REPLY_HEADER_BYTES, OPT_GO,
    OPT_SET_META_CONTEXT, OPT_STRUCTURED_REPLY, REP_ACK, SIMPLE_REPLY_HEADER_BYTES,
    STRUCTURED_REPLY_HEADER_BYTES,
};
use logcache_nbd::handshake::{decode_greeting, InfoRequest, MetaContextRequest, OptionHeader};
use logcache_nbd::option_reply::OptionReplyHeader;
use logcache_nbd::reply::{ChunkHeader, SimpleReply};
use logcache_nbd::request::Request;
use logcache_server::{Server, ServerConfig};

mod gated;
#[allow(unused_imports)]
pub use gated::*;

pub const MIB: u64 = 1 << 20;
/// Backing device size; the export is this minus the 4 KiB label.
pub const BACKING_BYTES: u64 = 64 * MIB;
pub const CACHE_BYTES: u64 = 128 * MIB;
/// Generous bound for any one client command; tests assert behaviour, this only stops hangs.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// A unique directory under the system temp dir, removed on drop.
pub struct TestDir {
    pub path: PathBuf,
}

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "lc-srv-{}-{}-{name}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("creating the test directory");
        TestDir { path }
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// RAM devices formatted as a cache, shared so an engine can be reopened on the same data.
pub struct Devices {
    pub cache: Arc<dyn BlockDevice>,
    pub backing: Arc<dyn BlockDevice>,
}

impl Devices {
    pub fn formatted() -> Devices {
        let devices = Devices {
            cache: Arc::new(MemDevice::new(CACHE_BYTES)),
            backing: Arc::new(MemDevice::new(BACKING_BYTES)),
        };
        format_cache(
            &*devices.cache,
            &*devices.backing,
            &FormatOptions::default(),
        )
        .expect("format");
        devices
    }

    pub fn open(&self) -> Engine {
        let options = OpenOptions {
            ram_buffer_bytes: 8 * MIB,
            ..OpenOptions::default()
        };
        Engine::open(self.cache.clone(), self.backing.clone(), options).expect("open engine")
    }
}

/// Opens an engine on formatted `cache` and `backing` (8 MiB of RAM buffers) and serves it on
/// `nbd.sock` in `dir`.
pub fn serve_engine(
    dir: &TestDir,
    cache: Arc<dyn BlockDevice>,
    backing: Arc<dyn BlockDevice>,
) -> (Engine, Server, PathBuf) {
    let options = OpenOptions {
        ram_buffer_bytes: 8 * MIB,
        ..OpenOptions::default()
    };
    let engine = Engine::open(cache, backing, options).expect("open engine");
    let server = Server::new(engine.clone(), ServerConfig::default());
    let socket = dir.path.join("nbd.sock");
    server.listen_unix(&socket).expect("listen");
    (engine, server, socket)
}

/// A server on a fresh engine, listening on `socket` in its own directory.
pub struct Fixture {
    pub dir: TestDir,
    pub devices: Devices,
    pub engine: Engine,
    pub server: Server,
    pub socket: PathBuf,
}

impl Fixture {
    pub fn start(name: &str) -> Fixture {
        Fixture::start_with(name, ServerConfig::default())
    }

    pub fn start_with(name: &str, config: ServerConfig) -> Fixture {
        let dir = TestDir::new(name);
        let devices = Devices::formatted();
        let engine = devices.open();
        let server = Server::new(engine.clone(), config);
        let socket = dir.path.join("nbd.sock");
        server
            .listen_unix(&socket)
            .expect("listen on the unix socket");
        Fixture {
            dir,
            devices,
            engine,
            server,
            socket,
        }
    }

    pub fn uri(&self) -> String {
        unix_uri(&self.socket)
    }

    pub fn export_size_bytes(&self) -> u64 {
        self.engine.size_bytes()
    }

    /// Reads straight from the engine, bypassing NBD.
    pub fn engine_bytes(&self, offset_bytes: u64, length_bytes: usize) -> Vec<u8> {
        let start = offset_bytes - offset_bytes % 512;
        let end = (offset_bytes + length_bytes as u64).next_multiple_of(512);
        let mut buf = vec![0u8; (end - start) as usize];
        self.engine.read(start, &mut buf).expect("engine read");
        let head = (offset_bytes - start) as usize;
        buf[head..head + length_bytes].to_vec()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.server.shutdown();
    }
}

pub fn unix_uri(socket: &Path) -> String {
    format!("nbd+unix:///?socket={}", socket.display())
}

/// The path of an installed client, or a loud failure saying how to install it.
pub fn require_tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} is not installed, and this test runs it as a real NBD client; \
                 run scripts/setup.sh (installs libnbd-bin, python3-libnbd, qemu-utils, fio, nbdkit)"
            )
        })
}

/// Output of a finished client.
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn describe(&self) -> String {
        format!(
            "exit status {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }

    /// Panics with the output unless the client succeeded.
    pub fn expect_success(self, what: &str) -> Run {
        assert!(self.status.success(), "{what} failed: {}", self.describe());
        self
    }
}

/// Kills and reaps the child unless it was waited for (also when a test panics).
pub struct ChildGuard {
    pub child: Option<Child>,
}

impl ChildGuard {
    pub fn spawn(command: &mut Command) -> ChildGuard {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("starting {command:?}: {error}"));
        ChildGuard { child: Some(child) }
    }

    /// Waits up to `timeout`; on timeout kills the child and panics with its output.
    pub fn wait(mut self, timeout: Duration) -> Run {
        let mut child = self.child.take().expect("child already waited for");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let read_all = |mut pipe: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                String::from_utf8_lossy(&bytes).into_owned()
            })
        };
        let stdout = read_all(Box::new(stdout));
        let stderr = read_all(Box::new(stderr));
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for a client") {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let stdout = stdout.join().unwrap_or_default();
        let stderr = stderr.join().unwrap_or_default();
        match status {
            Some(status) => Run {
                status,
                stdout,
                stderr,
            },
            None => panic!(
                "client did not finish within {timeout:?}; killed it\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
            ),
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs a client to completion (bounded by `COMMAND_TIMEOUT`).
pub fn run(program: &str, args: &[&str]) -> Run {
    let program = require_tool(program);
    ChildGuard::spawn(Command::new(program).args(args)).wait(COMMAND_TIMEOUT)
}

/// Like [`run`], in `dir` (for clients that leave files in their working directory).
pub fn run_in(dir: &Path, program: &str, args: &[&str]) -> Run {
    let program = require_tool(program);
    ChildGuard::spawn(Command::new(program).current_dir(dir).args(args)).wait(COMMAND_TIMEOUT)
}

/// Runs `nbdsh -u URI [extra args] -c SCRIPT`. The script sees `h` connected to the export.
pub fn nbdsh(uri: &str, extra_args: &[&str], script: &str) -> Run {
    let program = require_tool("nbdsh");
    let mut command = Command::new(program);
    command.env("PATH", nbdsh_path()).args(extra_args);
    command.args(["-u", uri, "-c", script]);
    ChildGuard::spawn(&mut command).wait(COMMAND_TIMEOUT)
}

/// `nbdsh` runs whichever `python3` comes first in PATH, but the libnbd bindings are
/// installed for the system Python; put that first if the default one lacks them.
fn nbdsh_path() -> String {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = std::env::var("PATH").unwrap_or_default();
        let has_bindings = |path: &str| {
            Command::new("python3")
                .env("PATH", path)
                .args(["-c", "import nbd"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
        };
        if has_bindings(&path) {
            return path;
        }
        let system_first = format!("/usr/bin:{path}");
        assert!(
            has_bindings(&system_first),
            "no python3 with the libnbd bindings (module nbd); run scripts/setup.sh (python3-libnbd)"
        );
        system_first
    })
    .clone()
}

/// Parses `nbdinfo --json` output and returns its first export.
pub fn nbdinfo_export(uri: &str) -> serde_json::Value {
    let run = run("nbdinfo", &["--json", uri]).expect_success("nbdinfo");
    let info: serde_json::Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|error| panic!("nbdinfo printed invalid JSON ({error}): {}", run.stdout));
    info["exports"][0].clone()
}

/// A hand-driven NBD client for protocol corner cases.
pub struct RawClient {
    pub stream: UnixStream,
}

impl RawClient {
    pub fn connect(socket: &Path) -> RawClient {
        let stream = UnixStream::connect(socket).expect("connect to the server");
        // Only so a broken server fails the test instead of hanging it.
        stream
            .set_read_timeout(Some(COMMAND_TIMEOUT))
            .expect("read timeout");
        RawClient { stream }
    }

    /// Reads the greeting and sends the given client flags.
    pub fn start(socket: &Path, client_flags: u32) -> RawClient {
        let mut client = RawClient::connect(socket);
        let mut greeting = [0u8; GREETING_BYTES];
        client.stream.read_exact(&mut greeting).expect("greeting");
        decode_greeting(&greeting).expect("valid greeting");
        client.send(&client_flags.to_be_bytes());
        client
    }

    /// Full fixed-newstyle handshake ending in GO, optionally with structured replies and
    /// `base:allocation`.
    pub fn go(socket: &Path, structured: bool, base_allocation: bool) -> RawClient {
        let mut client = RawClient::start(socket, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        if structured {
            client.send_option(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(client.read_option_reply().0.reply_type, REP_ACK);
        }
        if base_allocation {
            let request = MetaContextRequest {
                export_name: String::new(),
                queries: vec!["base:allocation".to_owned()],
            };
            client.send_option(OPT_SET_META_CONTEXT, &request.encode().unwrap());
            client.read_replies_until_ack();
        }
        let request = InfoRequest::default();
        client.send_option(OPT_GO, &request.encode().unwrap());
        client.read_replies_until_ack();
        client
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send to the server");
    }

    pub fn send_option(&mut self, option: u32, payload: &[u8]) {
        let header = OptionHeader {
            option,
            length_bytes: payload.len() as u32,
        };
        self.send(&header.encode());
        self.send(payload);
    }

    pub fn read_exact(&mut self, length_bytes: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; length_bytes];
        self.stream
            .read_exact(&mut bytes)
            .expect("read from the server");
        bytes
    }

    pub fn read_option_reply(&mut self) -> (OptionReplyHeader, Vec<u8>) {
        let header_bytes = self.read_exact(OPTION_REPLY_HEADER_BYTES);
        let header = OptionReplyHeader::decode(header_bytes.as_slice().try_into().unwrap())
            .expect("valid option reply header");
        let data = self.read_exact(header.length_bytes as usize);
        (header, data)
    }

    /// Reads option replies up to and including the ACK; returns the ones before it.
    pub fn read_replies_until_ack(&mut self) -> Vec<(OptionReplyHeader, Vec<u8>)> {
        let mut replies = Vec::new();
        loop {
            let (header, data) = self.read_option_reply();
            assert!(!header.is_error(), "option failed: {header:?} {data:?}");
            if header.reply_type == REP_ACK {
                return replies;
            }
            replies.push((header, data));
        }
    }

    pub fn send_request(&mut self, request: &Request, payload: &[u8]) {
        let mut bytes = request.encode().to_vec();
        bytes.extend_from_slice(payload);
        self.send(&bytes);
    }

    pub fn read_simple_reply(&mut self) -> SimpleReply {
        let bytes = self.read_exact(SIMPLE_REPLY_HEADER_BYTES);
        SimpleReply::decode(bytes.as_slice().try_into().unwrap()).expect("valid simple reply")
    }

    pub fn read_chunk(&mut self) -> (ChunkHeader, Vec<u8>) {
        let bytes = self.read_exact(STRUCTURED_REPLY_HEADER_BYTES);
        let header =
            ChunkHeader::decode(bytes.as_slice().try_into().unwrap()).expect("valid chunk");
        let payload = self.read_exact(header.length_bytes as usize);
        (header, payload)
    }

    /// Whether the server closed the connection (end of stream or reset) before sending
    /// anything more.
    pub fn is_closed_by_server(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(error) => matches!(
                error.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
        }
    }
}

/// Keeps every dirty block dirty and on the cache device: no writeback reads it meanwhile.
pub fn no_writeback(engine: &logcache_engine::Engine) {
    engine.set_tunable("writeback_idle_ms", "0").unwrap();
    engine
        .set_tunable("writeback_threshold_percent", "100")
        .unwrap();
}

/// Threads of this process whose name says they serve a connection (a test that counts them
/// must not run beside another that starts connections).
pub fn connection_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("nbd-conn-"))
        .count()
}

/// Held by a test that counts this process's connection threads (`connection_threads`): such
/// tests run one at a time within their test binary.
pub fn serial_thread_counting() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Waits (bounded) until the server has no connection and this process no connection thread
/// left, and fails the test if either outlived `COMMAND_TIMEOUT`.
pub fn wait_for_no_connection_thread(server: &Server) {
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    while (server.stats().connections_active > 0 || connection_threads() > 0)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(
        server.stats().connections_active,
        0,
        "a connection outlived its client"
    );
    assert_eq!(connection_threads(), 0, "a connection's thread outlived it");
}

/// Deterministic bytes for `length` bytes tagged by `seed`.
pub fn pattern(seed: u64, length_bytes: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length_bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 32) as u8
        })
        .collect()
}

impl ChildGuard {
    /// Waits for a child expected to exit on its own soon; kills it (and says so) otherwise.
    pub fn wait_or_kill(&mut self) -> Run {
        let guard = ChildGuard {
            child: self.child.take(),
        };
        guard.wait(COMMAND_TIMEOUT)
    }
}
