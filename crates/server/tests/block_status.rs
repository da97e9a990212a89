//! Block status over a sparse file backing device, checked with real clients (`nbdinfo --map`,
//! `qemu-img map`, `nbdcopy`) and a raw client for what they never send.

mod server_support;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use logcache_engine::io::file::{create_sparse, FileDevice, FileOptions};
use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, Engine, FormatOptions};
use logcache_nbd::consts::{
    CMD_FLAG_REQ_ONE, EINVAL, REPLY_TYPE_BLOCK_STATUS, REPLY_TYPE_ERROR, REPLY_TYPE_OFFSET_DATA,
    STATE_HOLE, STATE_ZERO,
};
use logcache_nbd::reply::{decode_block_status_payload, ErrorPayload};
use logcache_nbd::request::{Command as NbdCommand, Request};
use logcache_server::Server;
use server_support::{nbdsh, run, serve_engine, unix_uri, RawClient, TestDir, MIB};

const ZERO_HOLE: u32 = STATE_HOLE | STATE_ZERO;

/// A server on an engine whose backing device is a sparse file.
struct SparseFixture {
    dir: TestDir,
    engine: Engine,
    server: Server,
    socket: std::path::PathBuf,
}

impl SparseFixture {
    /// `prepare` writes to the backing file before the cache is formatted over it.
    fn start(name: &str, backing_bytes: u64, prepare: impl FnOnce(&dyn BlockDevice)) -> Self {
        let dir = TestDir::new(name);
        let path = dir.path.join("backing.img");
        create_sparse(&path, backing_bytes).expect("sparse backing file");
        let backing: Arc<dyn BlockDevice> =
            Arc::new(FileDevice::open(&path, FileOptions::default()).expect("open backing"));
        prepare(&*backing);
        let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(128 * MIB));
        format_cache(&*cache, &*backing, &FormatOptions::default()).expect("format");
        let (engine, server, socket) = serve_engine(&dir, cache, backing);
        SparseFixture {
            dir,
            engine,
            server,
            socket,
        }
    }

    fn uri(&self) -> String {
        unix_uri(&self.socket)
    }

    /// Whether the engine reads `[offset, offset + length)` as zeros.
    fn reads_zeros(&self, offset_bytes: u64, length_bytes: u64) -> bool {
        let mut pos = offset_bytes;
        let mut buf = vec![0u8; MIB as usize];
        while pos < offset_bytes + length_bytes {
            let n = (offset_bytes + length_bytes - pos).min(MIB);
            self.engine.read(pos, &mut buf[..n as usize]).unwrap();
            if buf[..n as usize].iter().any(|&b| b != 0) {
                return false;
            }
            pos += n;
        }
        true
    }
}

impl Drop for SparseFixture {
    fn drop(&mut self) {
        self.server.shutdown();
    }
}

/// (offset, length, zero hole) runs, adjacent equal ones merged.
fn merged(runs: impl IntoIterator<Item = (u64, u64, bool)>) -> Vec<(u64, u64, bool)> {
    let mut out: Vec<(u64, u64, bool)> = Vec::new();
    for (offset, length, hole) in runs {
        match out.last_mut() {
            Some(last) if last.2 == hole && last.0 + last.1 == offset => last.1 += length,
            _ => out.push((offset, length, hole)),
        }
    }
    out
}

fn nbdinfo_map(uri: &str) -> Vec<(u64, u64, bool)> {
    let out = run("nbdinfo", &["--map", "--json", uri]).expect_success("nbdinfo --map");
    let map: serde_json::Value = serde_json::from_str(&out.stdout).expect("nbdinfo JSON");
    merged(
        map.as_array()
            .expect("an array of extents")
            .iter()
            .map(|e| {
                let flags = e["type"].as_u64().unwrap() as u32;
                assert!(flags == 0 || flags == ZERO_HOLE, "unexpected flags: {e}");
                (
                    e["offset"].as_u64().unwrap(),
                    e["length"].as_u64().unwrap(),
                    flags == ZERO_HOLE,
                )
            }),
    )
}

fn qemu_img_map(uri: &str) -> Vec<(u64, u64, bool)> {
    let out =
        run("qemu-img", &["map", "--output=json", "-f", "raw", uri]).expect_success("qemu-img map");
    let map: serde_json::Value = serde_json::from_str(&out.stdout).expect("qemu-img JSON");
    merged(
        map.as_array()
            .expect("an array of extents")
            .iter()
            .map(|e| {
                let data = e["data"].as_bool().unwrap();
                let zero = e["zero"].as_bool().unwrap();
                assert!(
                    data != zero,
                    "data and zero are each other's opposite here: {e}"
                );
                (
                    e["start"].as_u64().unwrap(),
                    e["length"].as_u64().unwrap(),
                    zero,
                )
            }),
    )
}

#[test]
fn maps_show_written_data_and_zeroed_and_trimmed_holes() {
    let fixture = SparseFixture::start("map", 64 * MIB, |backing| {
        // Data already on the backing device when the cache is created.
        backing.write_at(&vec![0x11; MIB as usize], MIB).unwrap();
        backing.flush().unwrap();
    });
    let size = fixture.engine.size_bytes();
    let script = r#"
h.pwrite(b"\x22" * 65536, 8 << 20)
h.pwrite(b"\x33" * (1 << 20), 16 << 20)
h.zero(4 << 20, 16 << 20)
h.trim(256 << 10, (1 << 20) + (256 << 10))
h.flush()
"#;
    nbdsh(&fixture.uri(), &[], script).expect_success("nbdsh writes");
    let expected = merged([
        (0, MIB, true),
        (MIB, 256 << 10, false),
        (MIB + (256 << 10), 256 << 10, true),
        (MIB + (512 << 10), 512 << 10, false),
        (2 * MIB, 6 * MIB, true),
        (8 * MIB, 64 << 10, false),
        (8 * MIB + (64 << 10), size - 8 * MIB - (64 << 10), true),
    ]);
    for (offset, length, hole) in &expected {
        assert_eq!(
            fixture.reads_zeros(*offset, *length),
            *hole,
            "the model is wrong at {offset}+{length}"
        );
    }
    assert_eq!(nbdinfo_map(&fixture.uri()), expected, "nbdinfo --map");
    assert_eq!(qemu_img_map(&fixture.uri()), expected, "qemu-img map");

    // After write-back the same data is on the backing file instead of in the dirty cache.
    fixture.engine.drain(|_| {}).unwrap();
    assert_eq!(nbdinfo_map(&fixture.uri()), expected, "nbdinfo after drain");
    // Overwriting part of a hole makes it data at once (the copy is only in the cache).
    fixture.engine.write(32 * MIB, &[7; 4096], false).unwrap();
    let map = nbdinfo_map(&fixture.uri());
    let covering = map
        .iter()
        .find(|(offset, length, _)| *offset <= 32 * MIB && 32 * MIB < offset + length)
        .unwrap();
    assert!(
        !covering.2,
        "a written block is reported as a hole: {map:?}"
    );
}

/// A Unix-socket relay in front of a server: counts the bytes the server sends on every
/// connection made through it.
struct Relay {
    socket: PathBuf,
    sent_bytes: Arc<AtomicU64>,
    active: Arc<AtomicU64>,
}

impl Relay {
    fn start(dir: &Path, server_socket: &Path) -> Relay {
        let socket = dir.join("relay.sock");
        let listener = UnixListener::bind(&socket).expect("relay socket");
        let sent_bytes = Arc::new(AtomicU64::new(0));
        let active = Arc::new(AtomicU64::new(0));
        let (sent, live, server) = (sent_bytes.clone(), active.clone(), server_socket.to_owned());
        // The accepting thread lives as long as the test process.
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let upstream = UnixStream::connect(&server).expect("relay to the server");
                live.fetch_add(1, Ordering::SeqCst);
                let (sent, live) = (sent.clone(), live.clone());
                std::thread::spawn(move || {
                    let (to_server, from_server) = (upstream.try_clone().unwrap(), upstream);
                    let (from_client, to_client) = (client.try_clone().unwrap(), client);
                    let up = std::thread::spawn(move || pump(from_client, to_server, None));
                    pump(from_server, to_client, Some(&sent));
                    up.join().unwrap();
                    live.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Relay {
            socket,
            sent_bytes,
            active,
        }
    }

    /// The bytes the server sent, once every connection through the relay has closed.
    fn sent_bytes_when_idle(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.active.load(Ordering::SeqCst) > 0 {
            assert!(
                Instant::now() < deadline,
                "relayed connections never closed"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        self.sent_bytes.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to` until EOF or an error (counting into `count`), then shuts both down.
fn pump(mut from: UnixStream, mut to: UnixStream, count: Option<&AtomicU64>) {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                if let Some(count) = count {
                    count.fetch_add(n as u64, Ordering::SeqCst);
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// The issue's case: a 16 GiB disk holding 100 MiB of data. `nbdcopy` skips the holes, so the
/// server sends little more than the data (counted on the wire by a relay), and the engine
/// reads only the data.
#[test]
fn nbdcopy_of_a_sparse_disk_reads_little_more_than_the_data() {
    const DISK_BYTES: u64 = 16 << 30;
    const PIECES: u64 = 100;
    const DATA_BYTES: u64 = PIECES * MIB;
    let fixture = SparseFixture::start("nbdcopy", DISK_BYTES, |backing| {
        // 100 pieces of 1 MiB spread evenly over the disk.
        let stride_bytes = DISK_BYTES / PIECES / MIB * MIB;
        for i in 0..PIECES {
            backing
                .write_at(&vec![i as u8 + 1; MIB as usize], i * stride_bytes)
                .unwrap();
        }
        backing.flush().unwrap();
    });
    let relay = Relay::start(&fixture.dir.path, &fixture.socket);
    let reads_before = fixture.engine.stats().counters.read_bytes;
    run("nbdcopy", &[&unix_uri(&relay.socket), "null:"]).expect_success("nbdcopy");
    let read_bytes = fixture.engine.stats().counters.read_bytes - reads_before;
    let sent_bytes = relay.sent_bytes_when_idle();
    eprintln!(
        "nbdcopy of {DISK_BYTES} bytes: the server sent {sent_bytes}, the engine read {read_bytes}"
    );
    assert!(
        (DATA_BYTES..DATA_BYTES + 8 * MIB).contains(&read_bytes),
        "nbdcopy made the engine read {read_bytes} bytes of a disk holding {DATA_BYTES}"
    );
    assert!(
        (DATA_BYTES..DATA_BYTES + 8 * MIB).contains(&sent_bytes),
        "the server sent {sent_bytes} bytes for a copy of a disk holding {DATA_BYTES}"
    );
}

/// The raw client's view of one block status request.
enum Answer {
    Extents(u32, Vec<(u32, u32)>),
    Error(u32),
}

fn block_status(client: &mut RawClient, flags: u16, offset: u64, length: u32) -> Answer {
    let request = Request {
        flags,
        command: NbdCommand::BlockStatus,
        cookie: 9,
        offset_bytes: offset,
        length_bytes: length,
    };
    client.send_request(&request, &[]);
    let (header, payload) = client.read_chunk();
    assert!(header.is_done() && header.cookie == 9);
    match header.reply_type {
        REPLY_TYPE_BLOCK_STATUS => {
            let (id, extents) = decode_block_status_payload(&payload).unwrap();
            let extents = extents
                .iter()
                .map(|d| (d.length_bytes, d.status_flags))
                .collect();
            Answer::Extents(id, extents)
        }
        REPLY_TYPE_ERROR => Answer::Error(
            ErrorPayload::decode(header.reply_type, &payload)
                .unwrap()
                .error,
        ),
        other => panic!("unexpected reply type {other}"),
    }
}

/// The connection still serves reads after whatever came before.
fn still_serving(client: &mut RawClient) {
    let request = Request {
        flags: 0,
        command: NbdCommand::Read,
        cookie: 10,
        offset_bytes: 0,
        length_bytes: 512,
    };
    client.send_request(&request, &[]);
    let (header, payload) = client.read_chunk();
    assert_eq!(
        (header.reply_type, header.cookie),
        (REPLY_TYPE_OFFSET_DATA, 10)
    );
    assert_eq!(payload.len(), 8 + 512);
}

#[test]
fn hostile_block_status_requests_get_errors_and_the_server_keeps_serving() {
    let fixture = SparseFixture::start("hostile", 64 * MIB, |backing| {
        backing.write_at(&vec![1; 4096], 8192).unwrap();
    });
    let socket: &Path = &fixture.socket;
    let size = fixture.engine.size_bytes();

    // Without SET_META_CONTEXT: no context selected, EINVAL.
    let mut client = RawClient::go(socket, true, false);
    assert!(matches!(
        block_status(&mut client, 0, 0, 4096),
        Answer::Error(EINVAL)
    ));
    still_serving(&mut client);

    let mut client = RawClient::go(socket, true, true);
    assert!(matches!(
        block_status(&mut client, 0, 0, 0),
        Answer::Error(EINVAL)
    ));
    assert!(matches!(
        block_status(&mut client, 0, size - 512, 1024),
        Answer::Error(EINVAL)
    ));
    assert!(matches!(
        block_status(&mut client, 0, u64::MAX - 10, 100),
        Answer::Error(EINVAL)
    ));
    assert!(matches!(
        block_status(&mut client, 0x80, 0, 4096),
        Answer::Error(EINVAL)
    ));
    still_serving(&mut client);

    // REQ_ONE: exactly one extent, never longer than asked.
    let Answer::Extents(id, extents) = block_status(&mut client, CMD_FLAG_REQ_ONE, 100, 1 << 20)
    else {
        panic!("block status failed")
    };
    assert_eq!(id, 1);
    assert_eq!(extents, [(8192 - 100, ZERO_HOLE)]);
    // Without it: the whole range, unaligned ends included.
    let Answer::Extents(_, extents) = block_status(&mut client, 0, 100, 16384) else {
        panic!("block status failed")
    };
    assert_eq!(
        extents,
        [
            (8192 - 100, ZERO_HOLE),
            (4096, 0),
            (16384 + 100 - 12288, ZERO_HOLE)
        ]
    );
    // The last byte of the disk.
    let Answer::Extents(_, extents) = block_status(&mut client, 0, size - 1, 1) else {
        panic!("block status failed")
    };
    assert_eq!(extents, [(1, ZERO_HOLE)]);
    still_serving(&mut client);
}

/// What a 4 KiB block of the model holds, for block status over a backing device that cannot
/// tell holes (a RAM device, as a block device or an RBD image).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    /// Written (a partial write-zeroes writes zeros into the block: data too), or never touched.
    Data,
    /// Covered whole by a write-zeroes and not written or trimmed since: must be called zero.
    Zeroed,
    /// Trimmed whole: either answer, but zero only if it reads as zeros.
    Trimmed,
}

/// `nbdinfo --map --json` or `qemu-img map --output=json` as a zero flag per 4 KiB block.
fn zero_flags_per_block(tool: &str, uri: &str, blocks: usize) -> Vec<bool> {
    let out = if tool == "nbdinfo" {
        run("nbdinfo", &["--map", "--json", uri]).expect_success("nbdinfo --map")
    } else {
        run("qemu-img", &["map", "--output=json", "-f", "raw", uri]).expect_success("qemu-img map")
    };
    let map: serde_json::Value = serde_json::from_str(&out.stdout).expect("map JSON");
    let mut zero = Vec::new();
    for e in map.as_array().expect("an array of extents") {
        let (offset, length, is_zero) = if tool == "nbdinfo" {
            let flags = e["type"].as_u64().unwrap() as u32;
            (
                e["offset"].as_u64(),
                e["length"].as_u64(),
                flags & STATE_ZERO != 0,
            )
        } else {
            (
                e["start"].as_u64(),
                e["length"].as_u64(),
                e["zero"].as_bool().unwrap(),
            )
        };
        let (offset, length) = (offset.unwrap(), length.unwrap());
        assert_eq!(
            offset,
            zero.len() as u64 * 4096,
            "{tool}: extents in order: {e}"
        );
        assert_eq!(length % 4096, 0, "{tool}: whole blocks here: {e}");
        zero.extend(std::iter::repeat_n(is_zero, (length / 4096) as usize));
    }
    assert!(zero.len() >= blocks, "{tool} covered {} blocks", zero.len());
    zero.truncate(blocks);
    zero
}

/// Checks both tools' maps against the model: zeroed blocks zero, data blocks data, trimmed
/// blocks zero only where they read as zeros.
fn check_zero_map(engine: &Engine, uri: &str, model: &[Block], when: &str) {
    for tool in ["nbdinfo", "qemu-img"] {
        let zero = zero_flags_per_block(tool, uri, model.len());
        for (b, (&m, &z)) in model.iter().zip(&zero).enumerate() {
            let ok = match m {
                Block::Data => !z,
                Block::Zeroed => z,
                Block::Trimmed => {
                    let mut buf = vec![0u8; 4096];
                    engine.read(b as u64 * 4096, &mut buf).unwrap();
                    !z || buf.iter().all(|&x| x == 0)
                }
            };
            assert!(ok, "{when}: {tool} calls block {b} ({m:?}) zero={z}");
        }
    }
}

/// Seeded writes, write-zeroes and TRIMs through `nbdsh` over a backing device that has no
/// holes to report: `nbdinfo --map` and `qemu-img map` give exactly the zeroed blocks the zero
/// flag, never a written one; the same after a clean restart and after a crash (the zero
/// ranges are rebuilt from the log, which still holds them).
#[test]
fn zeroed_ranges_over_a_backing_without_holes_map_as_a_model_seeded() {
    const BLOCKS: u64 = 96;
    for seed in 0..6u64 {
        let mut rng = logcache_testkit::rng::Rng::new(seed);
        let dir = TestDir::new(&format!("zero-map-{seed}"));
        let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(128 * MIB));
        // Ops stay in the first BLOCKS blocks; the rest leaves room for what the format keeps.
        let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(BLOCKS * 4096 + MIB));
        backing
            .write_at(&vec![0x5a; (BLOCKS * 4096) as usize], 0)
            .unwrap();
        format_cache(&*cache, &*backing, &FormatOptions::default()).expect("format");
        let mut model = vec![Block::Data; BLOCKS as usize];
        let mut script = String::new();
        for _ in 0..40 {
            // Sector-aligned ranges: whole blocks and partial ones at the ends.
            let first_sector = rng.below(BLOCKS * 8);
            let sectors = rng.range(1, (BLOCKS * 8 - first_sector).min(160));
            let (off, len) = (first_sector * 512, sectors * 512);
            let whole = (off.div_ceil(4096), (off + len) / 4096);
            let touched = (off / 4096, (off + len).div_ceil(4096));
            match rng.below(3) {
                0 => {
                    script += &format!("h.pwrite(b'\\x77' * {len}, {off})\n");
                    model[touched.0 as usize..touched.1 as usize].fill(Block::Data);
                }
                1 => {
                    script += &format!("h.zero({len}, {off})\n");
                    // The partial blocks at the ends are written with zeros.
                    model[touched.0 as usize..touched.1 as usize].fill(Block::Data);
                    if whole.0 < whole.1 {
                        model[whole.0 as usize..whole.1 as usize].fill(Block::Zeroed);
                    }
                }
                _ => {
                    script += &format!("h.trim({len}, {off})\n");
                    if whole.0 < whole.1 {
                        model[whole.0 as usize..whole.1 as usize].fill(Block::Trimmed);
                    }
                }
            }
        }
        script += "h.flush()\n";
        let (engine, server, socket) = serve_engine(&dir, cache.clone(), backing.clone());
        let uri = unix_uri(&socket);
        nbdsh(&uri, &[], &script).expect_success("nbdsh writes, zeroes and trims");
        assert!(
            model.contains(&Block::Zeroed),
            "seed {seed}: the schedule zeroes nothing"
        );
        check_zero_map(&engine, &uri, &model, &format!("seed {seed}"));

        server.shutdown();
        engine.close().expect("clean close");
        let (engine, server, socket) = serve_engine(&dir, cache.clone(), backing.clone());
        check_zero_map(
            &engine,
            &unix_uri(&socket),
            &model,
            &format!("seed {seed} after a clean restart"),
        );

        server.shutdown();
        engine.crash();
        let (engine, server, socket) = serve_engine(&dir, cache, backing);
        check_zero_map(
            &engine,
            &unix_uri(&socket),
            &model,
            &format!("seed {seed} after a crash"),
        );
        server.shutdown();
        drop(engine);
    }
}
