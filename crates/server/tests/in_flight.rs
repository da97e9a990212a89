//! Many requests of one connection in flight at once: replies out of order, a read waiting
//! on a device holding back nothing behind it, overlapping requests and a flush among them,
//! and a connection closed with IO in flight (nothing leaks, nothing is acknowledged that was
//! not done). Devices are held at their door by testkit's gate (an emulation, for tests), so
//! every assertion is about what happened, never how long it took.

mod server_support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use std::io::Write;

use logcache_nbd::consts::EINVAL;
use logcache_nbd::request::Command as NbdCommand;
use logcache_testkit::fault::OpKind;
use server_support::*;

const BLOCK: u64 = 4096;
const HELD: Duration = Duration::from_secs(30);

/// A read waiting on the backing device (a miss) holds back none of the requests behind it:
/// a write, a cached read and a flush sent after it are all answered while it still waits,
/// and its own reply, when the device lets it through, carries the backing device's data.
#[test]
fn replies_come_out_of_order_and_a_held_read_holds_back_nothing() {
    let gated = Gated::start("out-of-order");
    let mut client = RawClient::go(&gated.socket, true, false);
    let cached = pattern(1, BLOCK as usize);
    client.send_request(&request(NbdCommand::Write, 1, 0, BLOCK as u32), &cached);
    assert_eq!(read_structured_reply(&mut client), (1, false, Vec::new()));

    gated.gate.hold(OpKind::Read);
    // Block 100 is not cached: its read waits at the backing device's door.
    client.send_request(
        &request(NbdCommand::Read, 10, 100 * BLOCK, BLOCK as u32),
        &[],
    );
    assert!(
        gated.gate.wait_held(OpKind::Read, 1, HELD),
        "the miss never reached the device"
    );
    let written = pattern(2, BLOCK as usize);
    client.send_request(
        &request(NbdCommand::Write, 11, BLOCK, BLOCK as u32),
        &written,
    );
    client.send_request(&request(NbdCommand::Read, 12, 0, BLOCK as u32), &[]);
    client.send_request(&request(NbdCommand::Flush, 13, 0, 0), &[]);
    client.send_request(&request(NbdCommand::Read, 14, BLOCK, BLOCK as u32), &[]);
    let mut replies = HashMap::new();
    for _ in 0..4 {
        let (cookie, failed, data) = read_structured_reply(&mut client);
        assert!(!failed, "request {cookie} failed");
        replies.insert(cookie, data);
    }
    assert_eq!(
        replies
            .keys()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        [11, 12, 13, 14].into(),
        "the requests behind the held read were not all answered first"
    );
    assert_eq!(replies[&12], cached);
    assert_eq!(replies[&14], written, "a read after a write sees it");
    assert_eq!(gated.gate.passed(OpKind::Read), 0, "the miss is still held");

    gated.gate.release(OpKind::Read);
    let (cookie, failed, data) = read_structured_reply(&mut client);
    assert_eq!((cookie, failed), (10, false));
    let backing = pattern(99, (8 * MIB) as usize);
    assert_eq!(
        data,
        backing[(100 * BLOCK) as usize..(101 * BLOCK) as usize]
    );
    assert!(gated.gate.passed(OpKind::Read) >= 1);
}

/// A READ alone in the input buffer is served on the reader itself only when the cache holds
/// all of it: one that also needs the backing device goes to a worker, so while it waits at
/// the device the reader still answers a cached read (served inline) and a write behind it,
/// and a BLOCK_STATUS (a worker's job: it may ask the backing device).
#[test]
fn a_partly_cached_read_never_holds_up_the_reader() {
    let gated = Gated::start("partly-cached");
    let mut client = RawClient::go(&gated.socket, true, true);
    let cached = pattern(4, BLOCK as usize);
    client.send_request(&request(NbdCommand::Write, 1, 0, BLOCK as u32), &cached);
    assert_eq!(read_structured_reply(&mut client), (1, false, Vec::new()));

    gated.gate.hold(OpKind::Read);
    // Block 0 is cached, block 1 is not: the read needs the backing device.
    client.send_request(&request(NbdCommand::Read, 20, 0, 2 * BLOCK as u32), &[]);
    assert!(
        gated.gate.wait_held(OpKind::Read, 1, HELD),
        "the partly cached read never reached the backing device"
    );
    client.send_request(&request(NbdCommand::Read, 21, 0, BLOCK as u32), &[]);
    let (cookie, failed, data) = read_structured_reply(&mut client);
    assert_eq!((cookie, failed), (21, false), "the cached read waited");
    assert_eq!(data, cached);
    let written = pattern(5, BLOCK as usize);
    client.send_request(
        &request(NbdCommand::Write, 22, 5 * BLOCK, BLOCK as u32),
        &written,
    );
    assert_eq!(read_structured_reply(&mut client), (22, false, Vec::new()));
    client.send_request(
        &request(NbdCommand::BlockStatus, 23, 0, 8 * BLOCK as u32),
        &[],
    );
    let (header, _) = client.read_chunk();
    assert_eq!(
        header.cookie, 23,
        "block status waited behind the held read"
    );
    assert_eq!(gated.gate.passed(OpKind::Read), 0, "the miss is still held");

    gated.gate.release(OpKind::Read);
    let (cookie, failed, data) = read_structured_reply(&mut client);
    assert_eq!((cookie, failed), (20, false));
    let backing = pattern(99, (8 * MIB) as usize);
    let mut model = cached.clone();
    model.extend_from_slice(&backing[BLOCK as usize..2 * BLOCK as usize]);
    assert_eq!(data, model);
}

/// A client's queue of 32 read misses reaches the backing device whole: all 32 wait at its
/// door together, so a disk that reorders its queue (NCQ is 32 deep) sees every one of them.
/// (With 16 workers per connection, 16 waited there and 16 behind them in the server.) Once
/// released, each reply carries the backing device's data.
#[test]
fn thirty_two_read_misses_wait_at_the_backing_device_together() {
    const MISSES: u64 = 32;
    let gated = Gated::start("misses-together");
    let mut client = RawClient::go(&gated.socket, true, false);
    gated.gate.hold(OpKind::Read);
    // Blocks 50 apart: none is cached, no two are one run.
    let block_of = |i: u64| 100 + i * 50;
    for i in 0..MISSES {
        client.send_request(
            &request(NbdCommand::Read, 40 + i, block_of(i) * BLOCK, BLOCK as u32),
            &[],
        );
    }
    assert!(
        gated.gate.wait_held(OpKind::Read, MISSES as u32, HELD),
        "the {MISSES} misses never waited at the backing device together"
    );
    gated.gate.release(OpKind::Read);
    let backing = pattern(99, (8 * MIB) as usize);
    let mut answered = std::collections::BTreeSet::new();
    for _ in 0..MISSES {
        let (cookie, failed, data) = read_structured_reply(&mut client);
        assert!(!failed, "miss {cookie} failed");
        let at = (block_of(cookie - 40) * BLOCK) as usize;
        assert!(
            data == backing[at..at + BLOCK as usize],
            "miss {cookie} returned other data"
        );
        answered.insert(cookie);
    }
    assert_eq!(answered, (40..40 + MISSES).collect());
}

/// A large READ the cache holds on the cache device, with another request in flight, goes to a
/// worker, not the reader: two 1 MiB READs sent together (the first finds the second buffered
/// behind it, the second finds the first on a worker), and while their device reads are held
/// at the gate, the reader still takes a write behind them and answers a read of that write;
/// once released, both large reads return their data. (Served on the reader, as 1 MiB reads
/// once were, each kept the client's next requests undecoded for its device read, CRCs and
/// send: 1 MiB reads at iodepth 8 had 3.5-5 device reads in flight. Only a lone one, the
/// connection's only request, is the reader's: `lone_reads.rs`.)
#[test]
fn a_large_cached_read_never_holds_up_the_reader() {
    let gated = Gated::start_with("large-cached-read", true);
    let mut client = RawClient::go(&gated.socket, true, false);
    let data = pattern(7, MIB as usize);
    client.send_request(&request(NbdCommand::Write, 1, 0, MIB as u32), &data);
    assert_eq!(read_structured_reply(&mut client), (1, false, Vec::new()));
    // Twice the engine's 8 MiB of RAM buffers written after it: its copy is on the cache
    // device only, so reading it is a device read.
    for i in 0..16u64 {
        let other = pattern(100 + i, MIB as usize);
        let cookie = 2 + i;
        client.send_request(
            &request(NbdCommand::Write, cookie, (8 + i) * MIB, MIB as u32),
            &other,
        );
        assert_eq!(
            read_structured_reply(&mut client),
            (cookie, false, Vec::new())
        );
    }
    client.send_request(&request(NbdCommand::Flush, 20, 0, 0), &[]);
    assert_eq!(read_structured_reply(&mut client), (20, false, Vec::new()));

    gated.gate.hold(OpKind::Read);
    let held_before = gated.gate.passed(OpKind::Read);
    let lone_before = gated.server.stats().lone_large_reads_inline;
    let mut together = request(NbdCommand::Read, 30, 0, MIB as u32)
        .encode()
        .to_vec();
    together.extend_from_slice(&request(NbdCommand::Read, 33, 8 * MIB, MIB as u32).encode());
    client.send(&together);
    assert!(
        gated.gate.wait_held(OpKind::Read, 2, HELD),
        "the large reads never reached the cache device together"
    );
    let written = pattern(8, BLOCK as usize);
    client.send_request(
        &request(NbdCommand::Write, 31, 40 * MIB, BLOCK as u32),
        &written,
    );
    assert_eq!(
        read_structured_reply(&mut client),
        (31, false, Vec::new()),
        "the write waited behind the held read"
    );
    client.send_request(&request(NbdCommand::Read, 32, 40 * MIB, BLOCK as u32), &[]);
    assert_eq!(read_structured_reply(&mut client), (32, false, written));
    assert_eq!(
        gated.gate.passed(OpKind::Read),
        held_before,
        "nothing passed the gate"
    );

    gated.gate.release(OpKind::Read);
    let mut cookies = Vec::new();
    for _ in 0..2 {
        let (cookie, failed, got) = read_structured_reply(&mut client);
        assert!(!failed, "large read {cookie} failed");
        let expected = if cookie == 30 {
            data.clone()
        } else {
            pattern(100, MIB as usize)
        };
        assert!(got == expected, "large read {cookie} returned other data");
        cookies.push(cookie);
    }
    cookies.sort_unstable();
    assert_eq!(cookies, [30, 33]);
    assert_eq!(
        gated.server.stats().lone_large_reads_inline,
        lone_before,
        "a large read with another in flight was served by the reader"
    );
}

/// A large write (its payload bigger than the reader's input buffer) runs on a worker, so one
/// waiting for room in the log holds up nothing behind it: with the cache device's writes held
/// at the gate, 1 MiB writes fill the engine's 8 MiB of RAM buffers and the later ones wait,
/// yet a read sent after them all is answered (from RAM) while they wait; none of the waiting
/// writes is acknowledged before the log moves, and once it does, every write is, and every
/// byte reads back. (Run on the reader, the first waiting write held the read behind it.)
#[test]
fn a_large_write_waiting_for_room_holds_up_nothing_behind_it() {
    let gated = Gated::start_with("large-write-room", true);
    let mut client = RawClient::go(&gated.socket, true, false);
    let small = pattern(6, BLOCK as usize);
    client.send_request(&request(NbdCommand::Write, 1, 0, BLOCK as u32), &small);
    assert_eq!(read_structured_reply(&mut client), (1, false, Vec::new()));

    gated.gate.hold(OpKind::Write);
    let waits_before = gated.engine.stats().counters.write_waits;
    const WRITES: u64 = 12;
    let mut model = HashMap::new();
    for i in 0..WRITES {
        let data = pattern(10 + i, MIB as usize);
        let offset_bytes = (1 + i) * MIB;
        client.send_request(
            &request(NbdCommand::Write, 100 + i, offset_bytes, MIB as u32),
            &data,
        );
        model.insert(100 + i, (offset_bytes, data));
    }
    let deadline = Instant::now() + HELD;
    while gated.engine.stats().counters.write_waits == waits_before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        gated.engine.stats().counters.write_waits > waits_before,
        "no write waited for room (RAM buffers larger than the writes?)"
    );
    client.send_request(&request(NbdCommand::Read, 50, 0, BLOCK as u32), &[]);
    let mut acknowledged = Vec::new();
    loop {
        let (cookie, failed, data) = read_structured_reply(&mut client);
        assert!(!failed, "request {cookie} failed");
        if cookie == 50 {
            assert_eq!(data, small);
            break;
        }
        acknowledged.push(cookie);
    }
    assert!(
        (acknowledged.len() as u64) < WRITES,
        "every write was acknowledged before the log could move: none waited"
    );
    assert_eq!(
        gated.gate.passed(OpKind::Write),
        0,
        "the gate let a write by"
    );

    gated.gate.release(OpKind::Write);
    while (acknowledged.len() as u64) < WRITES {
        let (cookie, failed, _) = read_structured_reply(&mut client);
        assert!(!failed, "write {cookie} failed");
        assert!(model.contains_key(&cookie), "unexpected reply {cookie}");
        acknowledged.push(cookie);
    }
    acknowledged.sort_unstable();
    assert_eq!(acknowledged, (100..100 + WRITES).collect::<Vec<_>>());
    for (offset_bytes, data) in model.values() {
        let mut out = vec![0u8; data.len()];
        gated.engine.read(*offset_bytes, &mut out).unwrap();
        assert!(out == *data, "the write at {offset_bytes} reads back wrong");
    }
}

/// A connection closed while reads wait at the device and a write-through write waits for the
/// backing device: the write is never acknowledged before the device took it, the server
/// finishes what it received and frees the connection (no thread, no count left), and the
/// next client is served.
#[test]
fn a_connection_closed_with_io_in_flight_leaks_nothing_and_acknowledges_nothing_undone() {
    let gated = Gated::start("close-in-flight");
    gated
        .engine
        .set_tunable("cache_mode", "write-through")
        .unwrap();
    let mut client = RawClient::go(&gated.socket, false, false);
    gated.gate.hold(OpKind::Read);
    gated.gate.hold(OpKind::Write);
    let data = pattern(3, BLOCK as usize);
    // A write-through write: its reply may only come once the backing device has it.
    client.send_request(
        &request(NbdCommand::Write, 1, 200 * BLOCK, BLOCK as u32),
        &data,
    );
    assert!(
        gated.gate.wait_held(OpKind::Write, 1, HELD),
        "the write never reached the device"
    );
    for i in 0..8u64 {
        client.send_request(
            &request(
                NbdCommand::Read,
                100 + i,
                (300 + 16 * i) * BLOCK,
                16 * BLOCK as u32,
            ),
            &[],
        );
    }
    assert!(
        gated.gate.wait_held(OpKind::Read, 8, HELD),
        "the reads were not all in flight"
    );
    // A request behind them all: answered while the write is still held, so the write's reply
    // (if the server sent it early) would have come before it.
    client.send_request(&request(NbdCommand::Cache, 7, 0, BLOCK as u32), &[]);
    let reply = client.read_simple_reply();
    assert_eq!(
        (reply.cookie, reply.error),
        (7, 0),
        "the held write was acknowledged"
    );
    assert_eq!(gated.gate.passed(OpKind::Write), 0);

    // The client goes away with all of that in flight.
    drop(client);
    gated.gate.release(OpKind::Read);
    gated.gate.release(OpKind::Write);
    wait_for_no_connection_thread(&gated.server);
    // The write was received, so it was done (write-through: on the backing device too).
    let mut out = vec![0u8; BLOCK as usize];
    gated.engine.read(200 * BLOCK, &mut out).unwrap();
    assert_eq!(out, data);
    // The server still serves.
    let mut client = RawClient::go(&gated.socket, false, false);
    client.send_request(
        &request(NbdCommand::Read, 5, 200 * BLOCK, BLOCK as u32),
        &[],
    );
    let reply = client.read_simple_reply();
    assert_eq!((reply.cookie, reply.error), (5, 0));
    assert_eq!(client.read_exact(BLOCK as usize), data);
}

/// A real client (libnbd) with hundreds of requests in flight on one connection: reads of
/// cached data in many sizes, writes (some overlapping each other, some FUA), reads
/// overlapping writes in flight, and flushes among them. Every request completes; data no
/// request raced on reads back exactly; each raced block holds one of the values written.
#[test]
fn hundreds_of_requests_in_flight_with_overlaps_and_flushes() {
    let fixture = Fixture::start("many-in-flight");
    let script = r#"
import random
rng = random.Random(20)
MIB = 1 << 20
B = 4096
# 24 MiB of known data, more than the engine's RAM buffers: most reads hit the cache device.
base = bytearray(rng.getrandbits(8) for _ in range(256)) * (24 * MIB // 256)
for off in range(0, 24 * MIB, 4 * MIB):
    h.pwrite(bytes(base[off:off + 4 * MIB]), off)
h.flush()
model = bytearray(base)
cookies = []
reads = []
raced = {}  # block -> set of values it may hold
for i in range(600):
    kind = rng.random()
    if kind < 0.6:
        size = rng.choice([512, B, 3 * B, 64 * 1024, MIB])
        off = rng.randrange(0, 16 * MIB - size) // 512 * 512
        buf = nbd.Buffer(size)
        reads.append((off, size, buf))
        cookies.append(h.aio_pread(buf, off))
    elif kind < 0.95:
        # Writes into the last 8 MiB, two blocks wide, so they overlap one another.
        blk = 16 * MIB // B + rng.randrange(0, 64)
        val = bytes([i % 251 + 1]) * (2 * B)
        flags = nbd.CMD_FLAG_FUA if i % 7 == 0 else 0
        for b in (blk, blk + 1):
            raced.setdefault(b, {bytes(model[b * B:(b + 1) * B])}).add(val[:B])
        cookies.append(h.aio_pwrite(val, blk * B, flags=flags))
    else:
        cookies.append(h.aio_flush())
    if h.aio_in_flight() > 128:
        h.poll(-1)
while h.aio_in_flight() > 0:
    h.poll(-1)
for c in cookies:
    assert h.aio_command_completed(c)
for off, size, buf in reads:
    assert buf.to_bytearray() == base[off:off + size], (off, size)
final = h.pread(8 * MIB, 16 * MIB)
for b in range(16 * MIB // B, 24 * MIB // B):
    got = bytes(final[(b - 16 * MIB // B) * B:(b - 16 * MIB // B + 1) * B])
    if b in raced:
        assert got in raced[b], b
    else:
        assert got == bytes(base[b * B:(b + 1) * B]), b
"#;
    nbdsh(&fixture.uri(), &[], script).expect_success("nbdsh many in flight");
    assert!(fixture.server.stats().requests >= 600);
}

/// A large plain write is received straight into log blocks reserved for it (one copy, no
/// payload buffer) and reads back; one cut off mid-payload (its client closes) publishes
/// nothing and is never acknowledged, and the log goes on past the holes it leaves.
#[test]
fn large_writes_go_straight_into_the_log_and_one_cut_mid_payload_publishes_nothing() {
    let gated = Gated::start("reserved-writes");
    let mut client = RawClient::go(&gated.socket, true, false);
    let old = pattern(20, MIB as usize);
    client.send_request(&request(NbdCommand::Write, 1, 4 * MIB, MIB as u32), &old);
    assert_eq!(read_structured_reply(&mut client), (1, false, Vec::new()));
    let reserved_before = gated.engine.stats().counters.writes_reserved;
    assert_eq!(
        reserved_before, 1,
        "the 1 MiB write was not received into the log"
    );

    let mut cut = RawClient::go(&gated.socket, true, false);
    let new = pattern(21, MIB as usize);
    cut.send_request(
        &request(NbdCommand::Write, 2, 4 * MIB, MIB as u32),
        &new[..(MIB / 2) as usize],
    );
    drop(cut);
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    while gated.server.stats().connections_active > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(gated.server.stats().connections_active, 1);
    let mut out = vec![0u8; MIB as usize];
    gated.engine.read(4 * MIB, &mut out).unwrap();
    assert!(out == old, "a write cut mid-payload was published");

    client.send_request(&request(NbdCommand::Write, 3, 6 * MIB, MIB as u32), &new);
    assert_eq!(read_structured_reply(&mut client), (3, false, Vec::new()));
    client.send_request(&request(NbdCommand::Flush, 4, 0, 0), &[]);
    assert_eq!(read_structured_reply(&mut client), (4, false, Vec::new()));
    gated.engine.read(6 * MIB, &mut out).unwrap();
    assert!(out == new);
    gated.engine.read(4 * MIB, &mut out).unwrap();
    assert!(out == old, "a write cut mid-payload was published");
    assert_eq!(gated.engine.stats().counters.writes_reserved, 2);
}

/// Small writes streamed on one connection, with READs, FLUSHes and refused requests among
/// them, as fio's nbd engine sends them at a high iodepth: the reader decodes many per
/// receive and batches their replies. The stream is cut at irregular points (headers split
/// from payloads, a header split in two); then writes go one at a time, each payload a moment
/// after its header (the reader finds only the header, and must send the reply it batched
/// before it sleeps, or the client never sends again). Every request gets exactly one reply,
/// the right one; every READ sees the writes sent before it (or, sector by sector, one sent
/// after it: a READ on a worker races the writes behind it, as NBD allows); the engine holds
/// the last write of each block.
#[test]
fn small_writes_streamed_or_one_at_a_time_get_each_its_own_reply() {
    const BLOCKS: u64 = 64;
    let fixture = Fixture::start("streamed-writes");
    let mut client = RawClient::go(&fixture.socket, false, false);
    let export_bytes = fixture.export_size_bytes();
    let mut model = vec![0u8; (BLOCKS * BLOCK) as usize];
    // What each request's reply must be: its error, and a READ's offset and data when sent.
    type Owed = HashMap<u64, (u32, Option<(u64, Vec<u8>)>)>;
    let mut expected = Owed::new();
    // Every write: its cookie, offset and data (a READ may see a later one).
    let mut writes: Vec<(u64, u64, Vec<u8>)> = Vec::new();
    let mut stream = Vec::new();
    for i in 0..900u64 {
        let cookie = 1000 + i;
        let (request, payload) = match i % 50 {
            // A READ of two blocks, after every write to them sent so far.
            7 | 31 => {
                let offset_bytes = (i * 5 % (BLOCKS - 1)) * BLOCK;
                let range = offset_bytes as usize..(offset_bytes + 2 * BLOCK) as usize;
                expected.insert(cookie, (0, Some((offset_bytes, model[range].to_vec()))));
                let request = request(NbdCommand::Read, cookie, offset_bytes, 2 * BLOCK as u32);
                (request, Vec::new())
            }
            19 => {
                expected.insert(cookie, (0, None));
                (request(NbdCommand::Flush, cookie, 0, 0), Vec::new())
            }
            // A write past the end: refused, its payload read and skipped.
            43 => {
                expected.insert(cookie, (EINVAL, None));
                let request = request(NbdCommand::Write, cookie, export_bytes, BLOCK as u32);
                (request, pattern(cookie, BLOCK as usize))
            }
            // Whole blocks, and a few sub-block writes.
            _ => {
                let length_bytes = if i % 9 == 0 { 512 } else { BLOCK };
                let offset_bytes = (i * 37 % BLOCKS) * BLOCK + (i % 9 == 0) as u64 * 1024;
                let data = pattern(cookie, length_bytes as usize);
                let start = offset_bytes as usize;
                model[start..start + data.len()].copy_from_slice(&data);
                writes.push((cookie, offset_bytes, data.clone()));
                expected.insert(cookie, (0, None));
                let request = request(NbdCommand::Write, cookie, offset_bytes, length_bytes as u32);
                (request, data)
            }
        };
        stream.extend_from_slice(&request.encode());
        stream.extend_from_slice(&payload);
    }
    // Whether the sector at `offset_bytes` read as `got` by the READ `cookie`: as when it was
    // sent, or as a write sent after it left it.
    let sector_ok = |cookie: u64, offset_bytes: u64, sent: &[u8], got: &[u8]| {
        got == sent
            || writes.iter().any(|(w, at, data)| {
                *w > cookie
                    && (*at..*at + data.len() as u64).contains(&offset_bytes)
                    && data[(offset_bytes - at) as usize..][..512] == *got
            })
    };
    let check_reply = |client: &mut RawClient, owed: &mut Owed| {
        let reply = client.read_simple_reply();
        let (error, read) = owed
            .remove(&reply.cookie)
            .unwrap_or_else(|| panic!("a reply to cookie {} not owed", reply.cookie));
        assert_eq!(reply.error, error, "cookie {}", reply.cookie);
        if let Some((offset_bytes, sent)) = read {
            let got = client.read_exact(sent.len());
            for (i, (sent, got)) in sent.chunks(512).zip(got.chunks(512)).enumerate() {
                let sector_bytes = offset_bytes + 512 * i as u64;
                assert!(
                    sector_ok(reply.cookie, sector_bytes, sent, got),
                    "READ {} of byte {sector_bytes}: neither the data written before it nor after",
                    reply.cookie
                );
            }
        }
    };
    // Streamed: one thread sends, cut at irregular points; this one reads the replies.
    let mut sender_socket = client.stream.try_clone().unwrap();
    let cuts: Vec<usize> = (0..stream.len()).map(|i| 1 + i * 7919 % 9001).collect();
    let sender = std::thread::spawn(move || {
        let mut rest = &stream[..];
        for cut in cuts {
            if rest.is_empty() {
                break;
            }
            let (piece, after) = rest.split_at(cut.min(rest.len()));
            sender_socket.write_all(piece).unwrap();
            rest = after;
        }
    });
    let mut owed = expected.clone();
    for _ in 0..expected.len() {
        check_reply(&mut client, &mut owed);
    }
    sender.join().unwrap();
    assert!(owed.is_empty());
    // One at a time, the payload a moment after its header.
    for i in 0..40u64 {
        let cookie = 5000 + i;
        let offset_bytes = (i * 13 % BLOCKS) * BLOCK;
        let data = pattern(cookie, BLOCK as usize);
        model[offset_bytes as usize..(offset_bytes + BLOCK) as usize].copy_from_slice(&data);
        let request = request(NbdCommand::Write, cookie, offset_bytes, BLOCK as u32);
        client.send(&request.encode());
        std::thread::sleep(Duration::from_millis(2));
        client.send(&data);
        owed.insert(cookie, (0, None));
        check_reply(&mut client, &mut owed);
    }
    assert_eq!(fixture.engine_bytes(0, model.len()), model);
    assert!(fixture.server.stats().requests >= 940);
}
