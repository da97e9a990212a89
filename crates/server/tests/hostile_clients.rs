//! Hostile clients against a live server: seeded connections that send random and truncated
//! bytes in the handshake, unknown and oversized options, and request frames with unknown
//! commands, bad flags, offsets past the end, oversized and truncated payloads. Meanwhile a
//! well-behaved client keeps writing and reading back on its own connection. The server must
//! answer with errors or drop only the offending client, never panic, and leave no connection
//! or memory behind.
//!
//! `LOGCACHE_SEED=<n>` replays a run; `LOGCACHE_HOSTILE_CLIENTS=<n>` sets the number of hostile
//! connections (default 600).

mod server_support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use logcache_nbd::consts::{
    CMD_BLOCK_STATUS, CMD_FLAG_FUA, IHAVEOPT, OPT_GO, OPT_INFO, OPT_LIST, OPT_SET_META_CONTEXT,
    OPT_STARTTLS, OPT_STRUCTURED_REPLY, REPLY_TYPE_NONE, REQUEST_MAGIC,
};
use logcache_nbd::handshake::{InfoRequest, MetaContextRequest, OptionHeader};
use logcache_nbd::request::{Command as NbdCommand, Request};
use logcache_testkit::rng::{seed_from_env, Rng};
use server_support::*;

/// Resident memory of this process (the server runs in it), in KiB, after returning the
/// allocator's free memory to the system (so retention does not pass for a leak).
fn rss_kib() -> u64 {
    // SAFETY: malloc_trim only releases free heap memory.
    unsafe {
        libc::malloc_trim(0);
    }
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

fn random_bytes(rng: &mut Rng, max_len: u64) -> Vec<u8> {
    let mut v = vec![0u8; rng.below(max_len + 1) as usize];
    rng.fill(&mut v);
    v
}

/// A request frame a hostile client might send: mostly well-formed headers with hostile field
/// values, the payload absent, short or complete.
fn hostile_request(rng: &mut Rng, export_size_bytes: u64) -> Vec<u8> {
    let command = match rng.below(7) {
        0 => rng.below(u64::from(u16::MAX)) as u16,
        1 => CMD_BLOCK_STATUS,
        _ => rng.below(12) as u16,
    };
    let offset_bytes = match rng.below(4) {
        0 => export_size_bytes - rng.below(8192).min(export_size_bytes),
        1 => export_size_bytes + rng.below(1 << 20),
        2 => u64::MAX - rng.below(4096),
        _ => rng.below(export_size_bytes / 512) * 512,
    };
    let length_bytes = match rng.below(5) {
        0 => 0,
        1 => u32::MAX - rng.below(4096) as u32,
        2 => (32 << 20) + 512,
        _ => rng.below(64 << 10) as u32,
    };
    let request = Request {
        flags: rng.below(1 << 16) as u16,
        command: NbdCommand::from_wire(command),
        cookie: rng.next_u64(),
        offset_bytes,
        length_bytes,
    };
    let mut frame = request.encode().to_vec();
    if rng.below(8) == 0 {
        // A wrong magic.
        frame[..4].copy_from_slice(&(REQUEST_MAGIC ^ 1).to_be_bytes());
    }
    // Some payload: none, part of it, or all of a small one.
    let payload = rng.below(u64::from(length_bytes.min(64 << 10)) + 1) as usize;
    frame.extend(std::iter::repeat_n(0x5a, payload));
    if rng.below(4) == 0 {
        frame.truncate(rng.below(frame.len() as u64) as usize);
    }
    frame
}

/// One hostile connection; returns when the server hung up or we did.
fn hostile_connection(rng: &mut Rng, fixture: &Fixture) {
    let mut s = UnixStream::connect(&fixture.socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut sink = vec![0u8; 1 << 16];
    // Whatever the server says we mostly ignore; reading keeps its replies from blocking it.
    let mut drain = |s: &mut UnixStream| {
        let deadline = Instant::now() + Duration::from_millis(40);
        while Instant::now() < deadline {
            match s.read(&mut sink) {
                Ok(0) => return false,
                Ok(_) => continue,
                Err(_) => return true,
            }
        }
        true
    };
    let scenario = rng.below(4);
    if scenario == 0 {
        // Garbage instead of client flags and options.
        let _ = s.write_all(&random_bytes(rng, 300));
        drain(&mut s);
        return;
    }
    let mut greeting = [0u8; 18];
    if s.read_exact(&mut greeting).is_err() {
        return;
    }
    let _ = s.write_all(&3u32.to_be_bytes());
    if scenario == 1 {
        // Options: unknown ones, lying lengths, truncated payloads, random payloads.
        for _ in 0..1 + rng.below(6) {
            let option = match rng.below(3) {
                0 => rng.next_u64() as u32,
                1 => [OPT_LIST, OPT_INFO, OPT_GO, OPT_SET_META_CONTEXT][rng.below(4) as usize],
                _ => rng.below(16) as u32,
            };
            let payload = random_bytes(rng, 64);
            let length_bytes = match rng.below(4) {
                0 => u32::MAX - rng.below(100) as u32,
                1 => payload.len() as u32 + rng.below(100) as u32,
                _ => payload.len() as u32,
            };
            let mut frame = OptionHeader {
                option,
                length_bytes,
            }
            .encode()
            .to_vec();
            if rng.below(6) == 0 {
                frame[..8].copy_from_slice(&(IHAVEOPT ^ 1).to_be_bytes());
            }
            frame.extend(payload);
            if s.write_all(&frame).is_err() || !drain(&mut s) {
                return;
            }
        }
        return;
    }
    // A proper GO (half the time with base:allocation, so BLOCK_STATUS is served), then
    // hostile requests.
    let mut go = OptionHeader {
        option: OPT_STRUCTURED_REPLY,
        length_bytes: 0,
    }
    .encode()
    .to_vec();
    if rng.below(2) == 0 {
        let set = MetaContextRequest {
            export_name: String::new(),
            queries: vec!["base:allocation".to_owned()],
        }
        .encode()
        .unwrap();
        go.extend(
            OptionHeader {
                option: OPT_SET_META_CONTEXT,
                length_bytes: set.len() as u32,
            }
            .encode(),
        );
        go.extend(set);
    }
    let info = InfoRequest::default().encode().unwrap();
    go.extend(
        OptionHeader {
            option: OPT_GO,
            length_bytes: info.len() as u32,
        }
        .encode(),
    );
    go.extend(info);
    if s.write_all(&go).is_err() || !drain(&mut s) {
        return;
    }
    for _ in 0..1 + rng.below(8) {
        let frame = hostile_request(rng, fixture.export_size_bytes());
        if s.write_all(&frame).is_err() || !drain(&mut s) {
            return;
        }
    }
    if rng.below(2) == 0 {
        let _ = s.shutdown(std::net::Shutdown::Write);
        drain(&mut s);
    }
}

#[test]
fn hostile_clients_are_refused_and_others_keep_being_served() {
    let panicked = Arc::new(AtomicBool::new(false));
    {
        let panicked = panicked.clone();
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            panicked.store(true, Ordering::SeqCst);
            default_hook(info);
        }));
    }
    let fixture = Fixture::start("hostile");
    // The RAM cache holds copies up to its size by design (read blocks, and since the flusher
    // keeps small writes' blocks, written ones too): held to 4 MiB, so the RSS bound below
    // measures what connections leave behind, not the cache filling.
    fixture
        .engine
        .set_tunable("ram_cache_mib", "4")
        .expect("a small RAM cache");
    let seed = seed_from_env("LOGCACHE_SEED");
    let clients: u64 = std::env::var("LOGCACHE_HOSTILE_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    eprintln!(
        "hostile clients: seed {seed} (replay with LOGCACHE_SEED={seed}), {clients} connections"
    );
    // Warm up (before the healthy client, whose blocks this overwrites), then measure memory across the campaign: the memory-backed devices grow as the
    // log first wraps (twice the cache's size written through the engine touches all of them),
    // and allocator pools and thread stacks settle after a few connections.
    let export_bytes = fixture.export_size_bytes() / 4096 * 4096;
    let chunk = vec![0x11u8; 1 << 20];
    let mut written = 0u64;
    while written < 2 * CACHE_BYTES {
        let off = written % export_bytes;
        let n = (export_bytes - off).min(chunk.len() as u64) as usize;
        fixture.engine.write(off, &chunk[..n], false).unwrap();
        written += n as u64;
    }
    fixture.engine.flush().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let healthy_rounds = Arc::new(AtomicU64::new(0));
    // A well-behaved client writing and reading back throughout.
    let healthy = {
        let socket = fixture.socket.clone();
        let stop = stop.clone();
        let rounds = healthy_rounds.clone();
        std::thread::spawn(move || {
            let mut c = RawClient::go(&socket, true, false);
            let mut round = 0u64;
            while !stop.load(Ordering::SeqCst) || round < 20 {
                let offset_bytes = (round % 256) * 4096;
                let data = pattern(round, 4096);
                let write = Request {
                    flags: if round.is_multiple_of(5) {
                        CMD_FLAG_FUA
                    } else {
                        0
                    },
                    command: NbdCommand::Write,
                    cookie: 2 * round,
                    offset_bytes,
                    length_bytes: 4096,
                };
                c.send_request(&write, &data);
                let (h, _) = c.read_chunk();
                assert_eq!((h.reply_type, h.cookie), (REPLY_TYPE_NONE, 2 * round));
                let read = Request {
                    flags: 0,
                    command: NbdCommand::Read,
                    cookie: 2 * round + 1,
                    ..write
                };
                c.send_request(&read, &[]);
                let mut got = Vec::new();
                loop {
                    let (h, payload) = c.read_chunk();
                    assert_eq!(h.cookie, 2 * round + 1);
                    if !payload.is_empty() {
                        // OFFSET_DATA: 8 bytes of offset, then the data.
                        got.extend_from_slice(&payload[8..]);
                    }
                    if h.is_done() {
                        break;
                    }
                }
                assert!(
                    got == data,
                    "healthy client read back wrong data in round {round}"
                );
                round += 1;
                rounds.store(round, Ordering::SeqCst);
            }
        })
    };
    let mut rng = Rng::new(seed);
    for _ in 0..30 {
        hostile_connection(&mut rng, &fixture);
    }
    // Two halves: allocator pools settle in the first; a leak grows in both.
    for _ in 0..clients / 2 {
        hostile_connection(&mut rng, &fixture);
    }
    let rss_before_kib = rss_kib();
    for _ in clients / 2..clients {
        hostile_connection(&mut rng, &fixture);
    }
    stop.store(true, Ordering::SeqCst);
    healthy
        .join()
        .expect("the healthy client saw only correct replies");
    // Every hostile connection ends: the server holds none of them.
    let deadline = Instant::now() + Duration::from_secs(30);
    while fixture.server.active_connections() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        fixture.server.active_connections(),
        0,
        "connections left behind"
    );
    let grown_kib = rss_kib().saturating_sub(rss_before_kib);
    eprintln!(
        "hostile clients: {clients} connections, {} healthy rounds, {} protocol errors, RSS grew {grown_kib} KiB over the second half",
        healthy_rounds.load(Ordering::SeqCst),
        fixture.server.stats().protocol_errors
    );
    // Connections come and go one at a time, so a leak would grow with their number; the
    // bound is far below `clients` times a payload buffer.
    assert!(
        grown_kib < 96 * 1024,
        "RSS grew {grown_kib} KiB over {clients} connections"
    );
    assert!(fixture.server.stats().protocol_errors > 0);
    // A new, real client is served.
    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &fixture.uri(),
            "-c",
            "write -P 0x42 0 64k",
            "-c",
            "read -P 0x42 0 64k",
        ],
    )
    .expect_success("qemu-io after the hostile clients");
    assert!(!panicked.load(Ordering::SeqCst), "something panicked");
}

/// A real TLS 1.3 ClientHello (OpenSSL, offering a PSK), to cut short at random places.
fn client_hello() -> Vec<u8> {
    use openssl::ssl::{Ssl, SslContextBuilder, SslMethod, SslStream};
    /// Collects what the client writes; reading blocks forever (nothing comes back).
    struct Outbox(Vec<u8>);
    impl Read for Outbox {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::WouldBlock.into())
        }
    }
    impl Write for Outbox {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut builder = SslContextBuilder::new(SslMethod::tls_client()).unwrap();
    builder.set_psk_client_callback(|_, _, identity, key| {
        identity[..6].copy_from_slice(b"alice\0");
        key[..32].fill(0x5a);
        Ok(32)
    });
    let ssl = Ssl::new(&builder.build()).unwrap();
    let mut stream = SslStream::new(ssl, Outbox(Vec::new())).unwrap();
    assert!(
        stream.connect().is_err(),
        "the handshake cannot finish alone"
    );
    stream.get_ref().0.clone()
}

/// One hostile connection that asks for TLS and then misbehaves.
fn hostile_tls_connection(rng: &mut Rng, fixture: &Fixture, hello: &[u8]) {
    let mut s = UnixStream::connect(&fixture.socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut greeting = [0u8; 18];
    if s.read_exact(&mut greeting).is_err() {
        return;
    }
    let _ = s.write_all(&3u32.to_be_bytes());
    let starttls_payload = if rng.below(6) == 0 {
        random_bytes(rng, 16)
    } else {
        Vec::new()
    };
    let mut frame = OptionHeader {
        option: OPT_STARTTLS,
        length_bytes: starttls_payload.len() as u32,
    }
    .encode()
    .to_vec();
    frame.extend_from_slice(&starttls_payload);
    let _ = s.write_all(&frame);
    let mut reply = [0u8; 20];
    if s.read_exact(&mut reply).is_err() {
        return;
    }
    let bytes = match rng.below(4) {
        // Nothing: the client leaves mid-handshake.
        0 => Vec::new(),
        // Garbage where the ClientHello belongs.
        1 => random_bytes(rng, 600),
        // A real ClientHello cut short.
        2 => hello[..rng.below(hello.len() as u64) as usize].to_vec(),
        // A whole ClientHello with garbage after it.
        _ => {
            let mut v = hello.to_vec();
            v.extend(random_bytes(rng, 200));
            v
        }
    };
    let _ = s.write_all(&bytes);
    let mut sink = [0u8; 4096];
    // Read a little of what the server says, then hang up.
    for _ in 0..rng.below(3) {
        if matches!(s.read(&mut sink), Ok(0) | Err(_)) {
            break;
        }
    }
}

#[test]
fn hostile_tls_handshakes_end_only_their_connection() {
    let keys = TestDir::new("hostile-tls-keys");
    let psk = keys.path.join("keys.psk");
    std::fs::write(&psk, format!("alice:{}\n", "5a".repeat(32))).unwrap();
    let tls = logcache_server::TlsConfig::psk(&psk, logcache_server::TlsMode::On).unwrap();
    let fixture = Fixture::start_with(
        "hostile-tls",
        logcache_server::ServerConfig {
            tls: Some(tls),
            ..logcache_server::ServerConfig::default()
        },
    );
    let seed = seed_from_env("LOGCACHE_SEED");
    let clients: u64 = std::env::var("LOGCACHE_HOSTILE_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(150, |n: u64| n / 4);
    eprintln!("hostile TLS clients: seed {seed} (replay with LOGCACHE_SEED={seed}), {clients} connections");
    let hello = client_hello();
    let mut rng = Rng::new(seed);
    for _ in 0..clients {
        hostile_tls_connection(&mut rng, &fixture, &hello);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while fixture.server.active_connections() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        fixture.server.active_connections(),
        0,
        "TLS connections left behind"
    );
    // A real GnuTLS client is served through TLS afterwards, and so is a plain one.
    let uri = format!(
        "nbds+unix://alice@/?socket={}&tls-psk-file={}",
        fixture.socket.display(),
        psk.display()
    );
    run("nbdinfo", &["--size", &uri])
        .expect_success("nbdinfo through TLS after the hostile clients");
    run("nbdinfo", &["--size", &fixture.uri()])
        .expect_success("plain nbdinfo after the hostile clients");
}
