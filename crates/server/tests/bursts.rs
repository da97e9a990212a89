//! Bursts: small READs that arrive together are served by the connection's reader itself, their
//! cache-device reads submitted together and their replies sent in one `sendmsg`
//! (`ServerStats::reads_in_bursts` counts them). Each test sends its requests in one write, so
//! the reader finds them together in its input buffer. Devices are held at their door by
//! testkit's gate or failed by its fault device (emulations, for tests): every assertion is
//! about what happened, never how long it took.

mod server_support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, FormatOptions};
use logcache_nbd::consts::EIO;
use logcache_nbd::request::{Command as NbdCommand, Request};
use logcache_testkit::fault::{FaultDevice, FaultKind, OpKind};
use server_support::*;

const BLOCK: u64 = 4096;
const HELD: Duration = Duration::from_secs(30);
/// Data written before the reads: twice the engine's RAM buffers (`serve_engine`: 8 MiB), so
/// its first blocks are read from the cache device, not from RAM.
const DATA_BYTES: u64 = 16 * MIB;

/// Requests (with a WRITE's payload) as one write to the socket.
fn send_together(client: &mut RawClient, requests: &[(Request, Vec<u8>)]) {
    let mut bytes = Vec::new();
    for (request, payload) in requests {
        bytes.extend_from_slice(&request.encode());
        bytes.extend_from_slice(payload);
    }
    client.send(&bytes);
}

fn read(cookie: u64, offset_bytes: u64, length_bytes: u64) -> (Request, Vec<u8>) {
    let request = request(NbdCommand::Read, cookie, offset_bytes, length_bytes as u32);
    (request, Vec::new())
}

/// Waits (bounded) until the server has no connection left: its thread, and with it every
/// worker of the connection, has finished.
fn wait_for_no_connection(server: &logcache_server::Server) {
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    while server.stats().connections_active > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        server.stats().connections_active,
        0,
        "a connection outlived its client"
    );
}

/// Many cached READs in flight on one connection around a WRITE and a FLUSH, with a miss among
/// them held at the backing device: the cached ones are answered (in bursts) while the miss
/// still waits (it went to a worker: out of order), every READ after the WRITE sees it, the
/// WRITE and FLUSH succeed, and the miss's reply comes once the device lets it through.
#[test]
fn cached_reads_in_bursts_around_a_write_and_a_flush_while_a_miss_waits() {
    let gated = Gated::start("bursts-around-write");
    let data = pattern(7, DATA_BYTES as usize);
    gated.engine.write(0, &data, false).unwrap();
    let mut model = data.clone();
    let mut client = RawClient::go(&gated.socket, true, false);
    gated.gate.hold(OpKind::Read);

    let miss_offset = 2 * DATA_BYTES; // never written: the backing device's zeros
    let written = pattern(8, 2 * BLOCK as usize);
    let mut requests = Vec::new();
    // Sizes a burst takes (up to 64 KiB), with the miss in the middle of them, then one read
    // a burst leaves alone (1 MiB).
    let sizes = [BLOCK, 2 * BLOCK, 16 * BLOCK, BLOCK, 3 * BLOCK];
    for i in 0..12u64 {
        let size = sizes[i as usize % sizes.len()];
        requests.push(read(100 + i, (i * 5 % 40) * BLOCK, size));
        if i == 5 {
            requests.push(read(150, miss_offset, BLOCK));
        }
    }
    requests.push(read(160, 0, 256 * BLOCK));
    // Blocks 5 and 6, which reads before and after it cover.
    requests.push((
        request(NbdCommand::Write, 200, 5 * BLOCK, 2 * BLOCK as u32),
        written.clone(),
    ));
    for i in 0..24u64 {
        requests.push(read(300 + i, (i % 8) * BLOCK, 2 * BLOCK));
    }
    requests.push((request(NbdCommand::Flush, 400, 0, 0), Vec::new()));
    for i in 0..24u64 {
        requests.push(read(500 + i, (4 + i % 4) * BLOCK, BLOCK));
    }
    send_together(&mut client, &requests);

    let mut replies = HashMap::new();
    for _ in 0..requests.len() - 1 {
        let (cookie, failed, data) = read_structured_reply(&mut client);
        assert!(!failed, "request {cookie} failed");
        assert!(
            replies.insert(cookie, data).is_none(),
            "two replies to {cookie}"
        );
    }
    assert!(!replies.contains_key(&150), "the held miss was answered");
    assert_eq!(gated.gate.passed(OpKind::Read), 0, "the miss is still held");
    let before = model.clone();
    model[(5 * BLOCK) as usize..(7 * BLOCK) as usize].copy_from_slice(&written);
    for (request, _) in &requests {
        let cookie = request.cookie;
        let range = request.offset_bytes as usize
            ..(request.offset_bytes + u64::from(request.length_bytes)) as usize;
        match request.command {
            NbdCommand::Read if cookie == 150 => {}
            // In flight together with the write: either is allowed.
            NbdCommand::Read if cookie < 200 => assert!(
                replies[&cookie] == before[range.clone()] || replies[&cookie] == model[range],
                "read {cookie} holds neither the old nor the new data"
            ),
            NbdCommand::Read => assert!(
                replies[&cookie] == model[range],
                "read {cookie}, decoded after the write, misses it"
            ),
            _ => assert!(replies[&cookie].is_empty()),
        }
    }
    assert!(
        gated.server.stats().reads_in_bursts >= 2,
        "no read was served in a burst: {:?}",
        gated.server.stats()
    );

    gated.gate.release(OpKind::Read);
    let (cookie, failed, data) = read_structured_reply(&mut client);
    assert_eq!((cookie, failed), (150, false));
    assert!(data.iter().all(|&b| b == 0), "the miss read the wrong data");
}

/// A cache-device read failing in the middle of a burst (a dirty block: the cache holds the
/// only copy) gives that READ an EIO reply of its own; the others of the burst get their
/// data, and the failure is not sticky (the block reads again once the device recovers).
#[test]
fn a_read_failing_in_a_burst_gets_its_own_error_and_the_others_their_data() {
    let dir = TestDir::new("burst-read-error");
    let cache_mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(CACHE_BYTES));
    let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(BACKING_BYTES));
    format_cache(&*cache_mem, &*backing, &FormatOptions::default()).expect("format");
    let fault = Arc::new(FaultDevice::new(cache_mem));
    let (engine, server, socket) = serve_engine(&dir, fault.clone(), backing);
    no_writeback(&engine);
    let data = pattern(9, DATA_BYTES as usize);
    engine.write(0, &data, false).unwrap();
    let mut client = RawClient::go(&socket, false, false);

    // The next cache-device read fails: the first of the burst's (each READ is its own IO).
    fault.fail_next(OpKind::Read, 1, FaultKind::Io);
    let reads: Vec<_> = (0..16u64)
        .map(|i| read(10 + i, 3 * i * BLOCK, BLOCK))
        .collect();
    send_together(&mut client, &reads);
    let mut failed = Vec::new();
    for _ in 0..reads.len() {
        let reply = client.read_simple_reply();
        let (request, _) = reads
            .iter()
            .find(|(request, _)| request.cookie == reply.cookie)
            .expect("a reply to a request sent");
        if reply.error != 0 {
            assert_eq!(reply.error, EIO, "read {} failed oddly", reply.cookie);
            failed.push(*request);
            continue;
        }
        let offset = request.offset_bytes as usize;
        assert!(
            client.read_exact(BLOCK as usize) == data[offset..offset + BLOCK as usize],
            "read {} returned the wrong data",
            reply.cookie
        );
    }
    assert_eq!(fault.injected(OpKind::Read), 1);
    assert_eq!(failed.len(), 1, "one read failed, not {failed:?}");
    assert!(
        server.stats().reads_in_bursts >= 2,
        "no read was served in a burst: {:?}",
        server.stats()
    );

    // The failure was the device's, once: the dirty block is still there.
    let offset = failed[0].offset_bytes;
    client.send_request(&request(NbdCommand::Read, 99, offset, BLOCK as u32), &[]);
    let reply = client.read_simple_reply();
    assert_eq!((reply.cookie, reply.error), (99, 0));
    let offset = offset as usize;
    assert!(client.read_exact(BLOCK as usize) == data[offset..offset + BLOCK as usize]);
    drop(client);
    server.shutdown();
}

/// A client that goes away while a burst's cache-device reads are held: the reader finishes
/// the burst (its send fails), the connection ends, and nothing is left behind: no connection,
/// no thread, no pinned block (the same blocks are written and read again afterwards).
#[test]
fn a_connection_closed_mid_burst_leaks_nothing() {
    let gated = Gated::start_with("burst-closed", true);
    no_writeback(&gated.engine);
    let data = pattern(11, DATA_BYTES as usize);
    gated.engine.write(0, &data, false).unwrap();
    let mut client = RawClient::go(&gated.socket, true, false);
    gated.gate.hold(OpKind::Read);
    let reads: Vec<_> = (0..16u64).map(|i| read(i, 2 * i * BLOCK, BLOCK)).collect();
    send_together(&mut client, &reads);
    assert!(
        gated.gate.wait_held(OpKind::Read, 1, HELD),
        "the burst never reached the cache device"
    );
    drop(client);
    gated.gate.release(OpKind::Read);
    wait_for_no_connection(&gated.server);
    assert!(
        gated.server.stats().reads_in_bursts >= 2,
        "the held reads were not a burst's: {:?}",
        gated.server.stats()
    );

    // The blocks the burst had pinned can be overwritten, and everything reads back.
    let written = pattern(12, (32 * BLOCK) as usize);
    gated.engine.write(0, &written, false).unwrap();
    let mut client = RawClient::go(&gated.socket, true, false);
    let reads: Vec<_> = (0..16u64).map(|i| read(i, 3 * i * BLOCK, BLOCK)).collect();
    send_together(&mut client, &reads);
    let mut model = data;
    model[..written.len()].copy_from_slice(&written);
    for _ in 0..reads.len() {
        let (cookie, failed, got) = read_structured_reply(&mut client);
        assert!(!failed, "read {cookie} failed");
        let offset = (3 * cookie * BLOCK) as usize;
        assert!(
            got == model[offset..offset + BLOCK as usize],
            "read {cookie} differs"
        );
    }
}
