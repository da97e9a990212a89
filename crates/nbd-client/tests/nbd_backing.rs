//! `NbdDevice` against real NBD servers: nbdkit (memory plugin, filters) and qemu-nbd.
//!
//! The servers come from Debian packages that `scripts/setup.sh` installs; a missing one fails
//! the test with a message saying so, rather than skipping it. Every server runs as a child
//! process owned by a guard that kills it on every path, panics included.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use logcache_io::{Allocation, BlockDevice};
use logcache_nbd::consts::{
    CLIENT_FLAGS_BYTES, EINVAL, EXPORT_NAME_REPLY_BYTES, FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES,
    GREETING_BYTES, OPT_EXPORT_NAME, REQUEST_HEADER_BYTES, SIMPLE_REPLY_HEADER_BYTES,
};
use logcache_nbd::handshake::{decode_greeting, OptionHeader};
use logcache_nbd::reply::SimpleReply;
use logcache_nbd::request::{Command as NbdCommand, Request};
use logcache_nbd_client::NbdDevice;

const MIB: u64 = 1 << 20;

/// How long a server may take to start listening. Only a guard against a server that never
/// comes up; no test asserts anything about time.
const STARTUP_LIMIT: Duration = Duration::from_secs(30);

// --- Fixtures ----------------------------------------------------------------------------------

/// A unique directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let unique = format!(
            "logcache-nbd-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(unique);
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("creating a temp dir");
        TempDir(path)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A server child process, killed and reaped when dropped.
struct Server {
    child: Option<Child>,
    stderr_path: PathBuf,
    description: String,
}

impl Server {
    /// Starts `program args...` with its stderr captured to a file in `dir`.
    fn spawn(program: &str, args: &[&str], dir: &TempDir) -> Server {
        require_tool(program);
        let stderr_path = dir.join(&format!("{program}.stderr"));
        let stderr = File::create(&stderr_path).expect("creating the server's stderr file");
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {program}: {e}"));
        Server {
            child: Some(child),
            stderr_path,
            description: format!("{program} {}", args.join(" ")),
        }
    }

    /// Waits until `probe` connects. Returns false if the server exited first (e.g. its port
    /// was taken); panics if it neither exits nor listens within the startup limit.
    fn wait_until(&mut self, mut probe: impl FnMut() -> io::Result<()>) -> bool {
        let deadline = Instant::now() + STARTUP_LIMIT;
        loop {
            if probe().is_ok() {
                return true;
            }
            let child = self.child.as_mut().expect("server already stopped");
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not start listening; stderr:\n{}",
                self.description,
                self.stderr()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_for_socket(&mut self, socket: &Path) {
        if !self.wait_until(|| UnixStream::connect(socket).map(drop)) {
            panic!(
                "{} exited before listening; stderr:\n{}",
                self.description,
                self.stderr()
            );
        }
    }

    fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Fails loudly (no skipping) when a server binary is missing.
fn require_tool(program: &str) {
    match Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => panic!(
            "{program} is not installed; run scripts/setup.sh to install the test dependencies \
             (nbdkit, qemu-utils, libnbd-bin)"
        ),
        Err(e) => panic!("cannot run {program}: {e}"),
    }
}

/// nbdkit on a Unix socket in `dir`, with `args` after the socket options (filters, plugin,
/// plugin parameters). Returns the guard and the URI of the default export.
fn nbdkit_unix(dir: &TempDir, args: &[&str]) -> (Server, String) {
    let socket = dir.join("nbdkit.sock");
    let socket_text = socket.to_str().expect("temp paths are UTF-8").to_owned();
    let mut all = vec!["--exit-with-parent", "-f", "-U", socket_text.as_str()];
    all.extend_from_slice(args);
    let mut server = Server::spawn("nbdkit", &all, dir);
    server.wait_for_socket(&socket);
    (server, format!("nbd+unix:///?socket={socket_text}"))
}

/// nbdkit on a free loopback TCP port. The port is found by binding port 0 and releasing it,
/// so another process can grab it in between; then nbdkit exits and we try another.
fn nbdkit_tcp(dir: &TempDir, args: &[&str]) -> (Server, String) {
    for _ in 0..5 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("finding a free port")
            .port()
            .to_string();
        let mut all = vec![
            "--exit-with-parent",
            "-f",
            "-p",
            port.as_str(),
            "-i",
            "127.0.0.1",
        ];
        all.extend_from_slice(args);
        let mut server = Server::spawn("nbdkit", &all, dir);
        let address = format!("127.0.0.1:{port}");
        if server.wait_until(|| TcpStream::connect(&address).map(drop)) {
            return (server, format!("nbd://127.0.0.1:{port}/"));
        }
    }
    panic!("nbdkit could not listen on a free TCP port in 5 attempts");
}

/// qemu-nbd serving `image` as export `disk`, persistent (-t) and accepting several clients
/// (one for the readiness probe, some for the tests).
fn qemu_nbd(dir: &TempDir, image: &Path) -> (Server, PathBuf) {
    qemu_nbd_shared(dir, image, 8)
}

/// [`qemu_nbd`] taking at most `clients` clients at once (`--shared`).
fn qemu_nbd_shared(dir: &TempDir, image: &Path, clients: usize) -> (Server, PathBuf) {
    let socket = dir.join("qemu-nbd.sock");
    let shared = format!("--shared={clients}");
    let args = [
        "-t",
        shared.as_str(),
        "-k",
        socket.to_str().unwrap(),
        "-x",
        "disk",
        "-f",
        "raw",
        image.to_str().unwrap(),
    ];
    let mut server = Server::spawn("qemu-nbd", &args, dir);
    server.wait_for_socket(&socket);
    (server, socket)
}

/// Deterministic bytes for a (seed, offset) so any range can be recomputed for checking.
fn pattern(len_bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len_bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn assert_same(actual: &[u8], expected: &[u8], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    if let Some(index) = actual.iter().zip(expected).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {index}: {} != {}",
            actual[index], expected[index]
        );
    }
}

/// Writes patterns at assorted offsets and sizes (several over 64 KiB, one over 2 MiB), reads
/// them back, flushes, trims, and checks the alignment and bounds errors.
fn exercise(dev: &NbdDevice) {
    let size_bytes = dev.size_bytes();
    let cases: [(u64, usize); 7] = [
        (0, 512),
        (4096, 4096),
        (MIB + 512, 65536 + 512),
        (3 * MIB, 2 * MIB as usize + 4096),
        (7 * MIB - 1024, 2048),
        (9 * MIB, 128 * 1024),
        (size_bytes - 8192, 8192),
    ];
    for (index, &(offset, len_bytes)) in cases.iter().enumerate() {
        dev.write_at(&pattern(len_bytes, index as u64), offset)
            .unwrap_or_else(|e| panic!("write {len_bytes} at {offset}: {e}"));
    }
    dev.flush().expect("flush");
    for (index, &(offset, len_bytes)) in cases.iter().enumerate() {
        let mut buf = vec![0u8; len_bytes];
        dev.read_at(&mut buf, offset)
            .unwrap_or_else(|e| panic!("read {len_bytes} at {offset}: {e}"));
        assert_same(
            &buf,
            &pattern(len_bytes, index as u64),
            &format!("case {index}"),
        );
    }

    // Trim the middle of case 3; what it reads as afterwards is unspecified, but its
    // neighbours must be untouched.
    dev.discard(3 * MIB + 4096, MIB).expect("discard");
    let mut head = vec![0u8; 4096];
    dev.read_at(&mut head, 3 * MIB).unwrap();
    assert_same(
        &head,
        &pattern(2 * MIB as usize + 4096, 3)[..4096],
        "before the trim",
    );
    let mut tail = vec![0u8; 4096];
    dev.read_at(&mut tail, 5 * MIB).unwrap();
    assert_same(
        &tail,
        &pattern(2 * MIB as usize + 4096, 3)[2 * MIB as usize..],
        "after the trim",
    );
    dev.flush().expect("flush after trim");

    // Write zeroes inside case 5 (sent as NBD_CMD_WRITE_ZEROES where the server has it, split
    // when over its maximum): zeros there, the pattern on both sides.
    let (z_offset, z_len) = (9 * MIB + 4096, 65536 + 4096);
    dev.write_zeroes(z_offset, z_len).expect("write zeroes");
    let mut all = vec![0u8; 128 * 1024];
    dev.read_at(&mut all, 9 * MIB).unwrap();
    let mut want = pattern(128 * 1024, 5);
    want[4096..4096 + z_len as usize].fill(0);
    assert_same(&all, &want, "after write zeroes");

    let mut buf = [0u8; 512];
    for e in [
        dev.read_at(&mut buf, 100).unwrap_err(),
        dev.read_at(&mut buf[..100], 0).unwrap_err(),
        dev.read_at(&mut buf, size_bytes).unwrap_err(),
        dev.write_at(&buf, size_bytes - 256).unwrap_err(),
        dev.discard(u64::MAX - 511, 512).unwrap_err(),
        dev.write_zeroes(size_bytes, 512).unwrap_err(),
    ] {
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }
    assert!(!dev.has_failed());
}

// --- Tests -------------------------------------------------------------------------------------

#[test]
fn nbdkit_memory_over_a_unix_socket() {
    let dir = TempDir::new("unix");
    let (_server, uri) = nbdkit_unix(&dir, &["memory", "64M"]);
    let dev = NbdDevice::open(&uri, 4).unwrap();
    assert_eq!(dev.size_bytes(), 64 * MIB);
    assert_eq!(dev.describe(), uri);
    // nbdkit's memory plugin advertises multi-conn, so the whole pool is opened.
    assert!(dev.info().can_multi_conn());
    assert_eq!(dev.connection_count(), 4);
    assert!(dev.info().can_flush() && dev.info().can_trim() && dev.info().can_write_zeroes());
    exercise(&dev);
}

#[test]
fn nbdkit_memory_over_tcp() {
    let dir = TempDir::new("tcp");
    let (_server, uri) = nbdkit_tcp(&dir, &["memory", "64M"]);
    let dev = NbdDevice::open(&uri, 2).unwrap();
    assert_eq!(dev.size_bytes(), 64 * MIB);
    assert_eq!(dev.connection_count(), 2);
    exercise(&dev);
}

#[test]
fn requests_over_the_server_maximum_are_split() {
    let dir = TempDir::new("maxblock");
    let (_server, uri) = nbdkit_unix(
        &dir,
        &[
            "--filter=blocksize-policy",
            "memory",
            "64M",
            "blocksize-maximum=64K",
            "blocksize-error-policy=error",
        ],
    );
    // This server really rejects larger requests: one 128 KiB read sent whole fails with EINVAL.
    let socket = dir.join("nbdkit.sock");
    assert_eq!(raw_read_error(&socket, 128 * 1024), EINVAL);
    assert_eq!(raw_read_error(&socket, 64 * 1024), 0);

    let dev = NbdDevice::open(&uri, 4).unwrap();
    let block_size = dev.info().block_size.expect("the filter advertises limits");
    assert_eq!(block_size.maximum_payload_bytes, 65536);
    assert_eq!(dev.info().max_request_bytes, 65536);
    // Reads, writes and trims well over 64 KiB succeed only because they are split.
    exercise(&dev);
}

/// Sends one unsplit READ of `len_bytes` over a fresh raw connection (handshake by
/// `NBD_OPT_EXPORT_NAME`) and returns the reply's wire error.
fn raw_read_error(socket: &Path, len_bytes: u32) -> u32 {
    let mut s = UnixStream::connect(socket).unwrap();
    let mut greeting = [0u8; GREETING_BYTES];
    s.read_exact(&mut greeting).unwrap();
    decode_greeting(&greeting).unwrap();
    let flags: [u8; CLIENT_FLAGS_BYTES] = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes();
    s.write_all(&flags).unwrap();
    let option = OptionHeader {
        option: OPT_EXPORT_NAME,
        length_bytes: 0,
    };
    s.write_all(&option.encode()).unwrap();
    let mut export = [0u8; EXPORT_NAME_REPLY_BYTES];
    s.read_exact(&mut export).unwrap();
    let request = Request {
        flags: 0,
        command: NbdCommand::Read,
        cookie: 7,
        offset_bytes: 0,
        length_bytes: len_bytes,
    };
    let header: [u8; REQUEST_HEADER_BYTES] = request.encode();
    s.write_all(&header).unwrap();
    let mut reply = [0u8; SIMPLE_REPLY_HEADER_BYTES];
    s.read_exact(&mut reply).unwrap();
    let reply = SimpleReply::decode(&reply).unwrap();
    assert_eq!(reply.cookie, 7);
    reply.error
}

#[test]
fn qemu_nbd_named_export_and_wrong_name() {
    let dir = TempDir::new("qemu");
    let image = dir.join("disk.img");
    let image_size_bytes = 16 * MIB;
    File::create(&image)
        .and_then(|f| f.set_len(image_size_bytes))
        .unwrap();
    let (_server, socket) = qemu_nbd(&dir, &image);
    let socket_text = socket.to_str().unwrap();

    let uri = format!("nbd+unix:///disk?socket={socket_text}");
    let dev = NbdDevice::open(&uri, 4).unwrap();
    assert_eq!(dev.size_bytes(), image_size_bytes);
    // Whether qemu-nbd advertises multi-conn depends on its version and --shared; the pool
    // follows whatever it says.
    let expected_connections = if dev.info().can_multi_conn() { 4 } else { 1 };
    assert_eq!(dev.connection_count(), expected_connections);
    exercise(&dev);

    // After a flush the bytes are in the image file itself.
    let data = pattern(3 * 65536, 99);
    dev.write_at(&data, 2 * MIB).unwrap();
    dev.flush().unwrap();
    let file_bytes = fs::read(&image).unwrap();
    assert_same(
        &file_bytes[2 * MIB as usize..2 * MIB as usize + data.len()],
        &data,
        "image file after flush",
    );

    // qemu-nbd refuses export names it does not serve; the error is one line naming both.
    let wrong = format!("nbd+unix:///nope?socket={socket_text}");
    let e = NbdDevice::open(&wrong, 4).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    let text = e.to_string();
    assert!(text.contains(&wrong), "{text}");
    assert!(text.contains("\"nope\" not found"), "{text}");
    assert!(!text.contains('\n'), "{text}");

    // The refused client did not disturb the open device.
    let mut back = vec![0u8; data.len()];
    dev.read_at(&mut back, 2 * MIB).unwrap();
    assert_same(&back, &data, "read after a refused client");
}

#[test]
fn read_only_export_refuses_writes() {
    let dir = TempDir::new("readonly");
    let (_server, uri) = nbdkit_unix(&dir, &["-r", "memory", "1M"]);
    let dev = NbdDevice::open(&uri, 4).unwrap();
    assert!(dev.info().is_read_only());
    let e = dev.write_at(&[1u8; 512], 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let mut buf = [1u8; 4096];
    dev.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0u8; 4096]);
    dev.discard(0, 4096).unwrap();
    dev.flush().unwrap();
    assert!(!dev.has_failed());
}

#[test]
fn without_write_zeroes_zero_blocks_are_written() {
    let dir = TempDir::new("nozero");
    let (_server, uri) = nbdkit_unix(&dir, &["--filter=nozero", "memory", "64M", "zeromode=none"]);
    let dev = NbdDevice::open(&uri, 1).unwrap();
    assert!(!dev.info().can_write_zeroes());
    exercise(&dev);
}

#[test]
fn without_multi_conn_only_one_connection_is_opened() {
    let dir = TempDir::new("nomulticonn");
    let (_server, uri) = nbdkit_unix(
        &dir,
        &[
            "--filter=multi-conn",
            "memory",
            "64M",
            "multi-conn-mode=disable",
        ],
    );
    let dev = Arc::new(NbdDevice::open(&uri, 4).unwrap());
    assert!(!dev.info().can_multi_conn());
    assert_eq!(dev.connection_count(), 1);
    // Several threads still work: they take turns on the one connection.
    run_threads(&dev, 4, 20);
}

#[test]
fn plain_newstyle_server_is_reached_through_opt_export_name() {
    let dir = TempDir::new("plainnewstyle");
    // --mask-handshake=0 makes nbdkit offer neither fixed newstyle nor NO_ZEROES.
    let (_server, uri) = nbdkit_unix(&dir, &["--mask-handshake=0", "memory", "64M"]);
    let dev = NbdDevice::open(&uri, 4).unwrap();
    assert_eq!(dev.size_bytes(), 64 * MIB);
    assert_eq!(dev.info().block_size, None);
    exercise(&dev);
}

#[test]
fn export_size_is_rounded_down_to_whole_sectors() {
    let dir = TempDir::new("oddsize");
    let (_server, uri) = nbdkit_unix(&dir, &["memory", "1000000"]);
    let dev = NbdDevice::open(&uri, 1).unwrap();
    assert_eq!(dev.info().reported_size_bytes, 1_000_000);
    assert_eq!(dev.size_bytes(), 1_000_000 / 512 * 512);
    let data = pattern(512, 5);
    dev.write_at(&data, dev.size_bytes() - 512).unwrap();
    let mut back = [0u8; 512];
    dev.read_at(&mut back, dev.size_bytes() - 512).unwrap();
    assert_same(&back, &data, "last whole sector");
    let e = dev.read_at(&mut back, dev.size_bytes()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
}

/// `threads` threads each own a 1 MiB region and write, read back and re-verify patterns of
/// assorted sizes in it, all at once through `dev`.
fn run_threads(dev: &Arc<NbdDevice>, threads: u64, rounds: u64) {
    let workers: Vec<_> = (0..threads)
        .map(|thread_index| {
            let dev = Arc::clone(dev);
            thread::spawn(move || {
                let region_bytes = MIB;
                let base = thread_index * region_bytes;
                let mut model = vec![0u8; region_bytes as usize];
                let mut state = thread_index + 1;
                for round in 0..rounds {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let sectors = 1 + (state >> 33) % 256;
                    let len_bytes = sectors * 512;
                    let offset = ((state >> 17) % (region_bytes - len_bytes + 1)) / 512 * 512;
                    let data = pattern(len_bytes as usize, thread_index * 1000 + round);
                    dev.write_at(&data, base + offset).unwrap();
                    model[offset as usize..(offset + len_bytes) as usize].copy_from_slice(&data);
                    let mut back = vec![0u8; len_bytes as usize];
                    dev.read_at(&mut back, base + offset).unwrap();
                    assert_same(&back, &data, "read after write");
                    if round % 8 == 7 {
                        dev.flush().unwrap();
                    }
                }
                let mut whole = vec![0u8; region_bytes as usize];
                dev.read_at(&mut whole, base).unwrap();
                assert_same(&whole, &model, "whole region");
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker thread panicked");
    }
}

#[test]
fn threads_do_io_in_parallel_over_multi_conn() {
    let dir = TempDir::new("threads");
    let (_server, uri) = nbdkit_unix(&dir, &["memory", "64M"]);
    let dev = Arc::new(NbdDevice::open(&uri, 4).unwrap());
    assert_eq!(dev.connection_count(), 4);
    run_threads(&dev, 8, 40);
    dev.flush().unwrap();
    assert!(!dev.has_failed());
}

/// One connection (the server does not advertise multi-conn) carries many requests at once:
/// nbdkit's log filter records when each request starts and ends on the server, and with every
/// read delayed the reads of 8 threads are on the server together.
#[test]
fn one_connection_carries_many_requests_at_once() {
    let dir = TempDir::new("pipelined");
    let log = dir.join("requests.log");
    let logfile = format!("logfile={}", log.display());
    let (server, uri) = nbdkit_unix(
        &dir,
        &[
            "--filter=multi-conn",
            "--filter=log",
            "--filter=delay",
            "memory",
            "64M",
            "multi-conn-mode=disable",
            "delay-read=200ms",
            &logfile,
        ],
    );
    let dev = Arc::new(NbdDevice::open(&uri, 4).unwrap());
    assert_eq!(dev.connection_count(), 1);
    assert!(dev.is_pipelined());
    run_threads(&dev, 8, 3);
    drop(dev);
    drop(server);
    let text = fs::read_to_string(&log).unwrap();
    let (mut on_server, mut most_on_server, mut reads) = (0usize, 0usize, 0usize);
    let mut connections = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.split("connection=").nth(1) {
            connections.insert(rest.split(' ').next().unwrap().to_owned());
        }
        if line.contains("...Read id=") {
            on_server -= 1;
        } else if line.contains(" Read id=") {
            reads += 1;
            on_server += 1;
            most_on_server = most_on_server.max(on_server);
        }
    }
    assert_eq!(connections.len(), 1, "one connection: {connections:?}");
    assert!(reads >= 8 * 4, "every read reached the server ({reads})");
    assert!(
        most_on_server >= 2,
        "reads were never on the server together: one request at a time ({most_on_server})"
    );
    eprintln!("at most {most_on_server} reads on the server at once, {reads} reads");
}

/// qemu-nbd advertises multi-conn but takes only 2 clients: the connections it does not greet
/// are given up after a short wait and the device works on those it has, instead of waiting
/// forever for a greeting.
#[test]
fn a_server_taking_fewer_clients_than_asked_keeps_the_connections_it_greeted() {
    let dir = TempDir::new("fewclients");
    let image = dir.join("disk.img");
    File::create(&image)
        .and_then(|f| f.set_len(16 * MIB))
        .unwrap();
    let (_server, socket) = qemu_nbd_shared(&dir, &image, 2);
    let uri = format!("nbd+unix:///disk?socket={}", socket.to_str().unwrap());
    // The readiness probe's client may still count against --shared for a moment.
    let dev = NbdDevice::open(&uri, 4).unwrap();
    assert!(
        dev.info().can_multi_conn(),
        "qemu-nbd --shared=2 offers multi-conn"
    );
    let count = dev.connection_count();
    assert!((1..=2).contains(&count), "{count} connections");
    exercise(&dev);
    if count == 2 {
        // Block status wants a connection of its own, which the server has no room for: the
        // answer is "data" (always true), not a wait for a greeting that never comes.
        let (len_bytes, allocation) = dev.allocation(0, MIB).unwrap();
        assert_eq!((len_bytes, allocation), (MIB, Allocation::Data));
        assert_eq!(dev.allocation(MIB, MIB).unwrap().1, Allocation::Data);
    }
}

#[test]
fn killing_the_server_fails_calls_until_it_returns_then_reconnects() {
    let dir = TempDir::new("kill");
    let (mut server, uri) = nbdkit_unix(&dir, &["memory", "64M"]);
    let dev = Arc::new(NbdDevice::open(&uri, 4).unwrap());
    dev.write_at(&pattern(4096, 1), 0).unwrap();

    // Threads hammer the device until a call fails; the server is killed under them.
    let completed = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..3u64)
        .map(|thread_index| {
            let dev = Arc::clone(&dev);
            let completed = Arc::clone(&completed);
            thread::spawn(move || -> io::Error {
                let mut buf = vec![0u8; 8192];
                let offset = thread_index * MIB;
                loop {
                    let result = dev
                        .write_at(&buf, offset)
                        .and_then(|()| dev.read_at(&mut buf, offset))
                        .and_then(|()| dev.flush());
                    // Once the server is gone every call fails, which ends the loop.
                    match result {
                        Ok(()) => completed.fetch_add(1, Ordering::Relaxed),
                        Err(e) => return e,
                    };
                }
            })
        })
        .collect();
    while completed.load(Ordering::Relaxed) < 30 {
        thread::yield_now();
    }
    server.kill();
    for worker in workers {
        let e = worker.join().expect("worker thread panicked");
        assert!(e.to_string().contains(&uri), "errors name the device: {e}");
    }
    assert!(dev.has_failed());
    assert_eq!(dev.reconnects(), 0);

    // While the server is gone, every call fails at once, saying so, on every connection
    // (once each connection has met the failure itself).
    let mut buf = [0u8; 512];
    for _ in 0..2 * dev.connection_count() {
        assert!(dev.read_at(&mut buf, 0).is_err());
    }
    for _ in 0..8 {
        for e in [
            dev.read_at(&mut buf, 0).unwrap_err(),
            dev.write_at(&buf, 0).unwrap_err(),
            dev.flush().unwrap_err(),
            dev.discard(0, 512).unwrap_err(),
        ] {
            assert_eq!(e.kind(), io::ErrorKind::NotConnected, "{e}");
            let text = e.to_string();
            assert!(text.contains("unreachable"), "{text}");
            assert!(text.contains(&uri), "{text}");
        }
    }

    // The server comes back on the same socket: connections are made again, and counted, so
    // a writer that flushes knows earlier writes may be gone.
    drop(server);
    let _ = fs::remove_file(dir.join("nbdkit.sock"));
    let (back_again, uri2) = nbdkit_unix(&dir, &["memory", "64M"]);
    assert_eq!(uri2, uri);
    for i in 0..8u64 {
        dev.write_at(&pattern(4096, i), i * 4096).unwrap();
    }
    dev.flush().unwrap();
    let mut back = vec![0u8; 4096];
    dev.read_at(&mut back, 4096).unwrap();
    assert_eq!(back, pattern(4096, 1));
    assert!(dev.reconnects() >= 1);
    assert!(!dev.has_failed());

    // A server that comes back with another export (another size) is refused.
    drop(back_again);
    let _ = fs::remove_file(dir.join("nbdkit.sock"));
    let (_other, _) = nbdkit_unix(&dir, &["memory", "32M"]);
    let errors: Vec<String> = (0..8)
        .filter_map(|_| dev.read_at(&mut buf, 0).err().map(|e| e.to_string()))
        .collect();
    assert_eq!(errors.len(), 8, "every read fails: {errors:?}");
    assert!(
        errors.iter().any(|e| e.contains("export changed")),
        "{errors:?}"
    );
}

#[test]
fn open_errors_are_clear() {
    let dir = TempDir::new("openerrors");
    let missing = dir.join("missing.sock");
    let uri = format!("nbd+unix:///?socket={}", missing.display());
    let e = NbdDevice::open(&uri, 4).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().starts_with(&uri), "{e}");

    let e = NbdDevice::open("nbds+vsock://1/x", 4).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("TLS"), "{e}");

    let e = NbdDevice::open("nbd+unix:///x", 4).unwrap_err();
    assert!(e.to_string().contains("socket"), "{e}");

    // Nothing listens on a port we just released (at worst, another process's; then the
    // handshake fails instead, still an error).
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
        .port();
    let uri = format!("nbd://127.0.0.1:{port}/");
    let e = NbdDevice::open(&uri, 4).unwrap_err();
    assert!(e.to_string().starts_with(&uri), "{e}");

    let (_server, uri) = nbdkit_unix(&dir, &["memory", "1M"]);
    // nbds:// to a server without TLS: refused, saying so (never falls back to the clear).
    let socket = uri.split_once("socket=").unwrap().1;
    let tls_uri = format!("nbds+unix:///?socket={socket}&tls-psk-file=/dev/null");
    let e = NbdDevice::open(&tls_uri, 4).unwrap_err();
    assert!(e.to_string().contains("does not offer TLS"), "{e}");
    let e = NbdDevice::open(&uri, 0).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
}

/// Write-zeroes goes to a server that advertises it as `NBD_CMD_WRITE_ZEROES`: nbdkit's log
/// filter shows a Zero request and no Write, so no zeros cross the socket (the fallback for a
/// server without it is `without_write_zeroes_zero_blocks_are_written`).
#[test]
fn write_zeroes_is_the_servers_own_command_where_advertised() {
    let dir = TempDir::new("zero");
    let log = dir.join("nbdkit.log");
    let logfile = format!("logfile={}", log.display());
    let (_server, uri) = nbdkit_unix(&dir, &["--filter=log", "memory", "64M", &logfile]);
    let dev = NbdDevice::open(&uri, 1).unwrap();
    assert!(dev.info().can_write_zeroes());
    let mut expect = pattern(MIB as usize, 7);
    dev.write_at(&expect, 0).unwrap();
    let writes_before = fs::read_to_string(&log).unwrap().matches("Write ").count();
    dev.write_zeroes(4096, 512 * 1024).unwrap();
    expect[4096..4096 + 512 * 1024].fill(0);
    let mut got = vec![0u8; MIB as usize];
    dev.read_at(&mut got, 0).unwrap();
    assert_same(&got, &expect, "after write_zeroes");
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("Zero "),
        "no Zero request in nbdkit's log:\n{text}"
    );
    assert_eq!(
        text.matches("Write ").count(),
        writes_before,
        "zeros were sent as writes:\n{text}"
    );
}
