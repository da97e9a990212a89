//! A large READ that is a connection's only request (nothing else buffered, nothing on a
//! worker: a client at iodepth 1) is served by the connection's reader itself, like a small
//! one (`ServerStats::lone_large_reads_inline` counts them); with other requests in flight it
//! goes to a worker (`in_flight.rs`). Real clients against a real server; devices are held at
//! their door by testkit's gate or failed by corrupting the cache device's bytes (emulations,
//! for tests): every assertion is about what happened, never how long it took.

mod server_support;

use std::sync::Arc;
use std::time::Duration;

use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, FormatOptions};
use logcache_nbd::consts::EIO;
use logcache_nbd::request::Command as NbdCommand;
use logcache_testkit::fault::OpKind;
use server_support::*;

const BLOCK: u64 = 4096;
const HELD: Duration = Duration::from_secs(30);
/// Data written before the reads: twice the engine's RAM buffers (`serve_engine`: 8 MiB), so
/// its first MiB is read from the cache device, not from RAM.
const DATA_BYTES: u64 = 16 * MIB;

/// A gated server whose first `DATA_BYTES` hold pattern `seed`, dirty and kept on the cache
/// device (no writeback); returns it, the data and the count of lone large reads so far.
fn dirty_data_held_in_the_cache(name: &str, seed: u64) -> (Gated, Vec<u8>, u64) {
    let gated = Gated::start_with(name, true);
    no_writeback(&gated.engine);
    let data = pattern(seed, DATA_BYTES as usize);
    gated.engine.write(0, &data, false).unwrap();
    let before = gated.server.stats().lone_large_reads_inline;
    (gated, data, before)
}

/// Lone 1 MiB READs of data on the cache device, one at a time, through both reply kinds and
/// through a real client (libnbd): each returns its data, and the reader served each itself
/// (no worker thread was ever started for them).
#[test]
fn lone_large_cached_reads_are_served_by_the_reader() {
    let _serial = serial_thread_counting();
    let (gated, data, before) = dirty_data_held_in_the_cache("lone-large-read", 21);
    for structured in [false, true] {
        let mut client = RawClient::go(&gated.socket, structured, false);
        for (cookie, offset_bytes) in [(1u64, 0u64), (2, MIB), (3, 3 * MIB + 8 * BLOCK)] {
            let length = MIB as usize;
            client.send_request(
                &request(NbdCommand::Read, cookie, offset_bytes, length as u32),
                &[],
            );
            let got = read_ok_reply(&mut client, structured, cookie, length);
            let offset = offset_bytes as usize;
            assert!(
                got == data[offset..offset + length],
                "read {cookie} returned other data"
            );
            // One request at a time: the reader served it, so no worker ever started.
            assert_eq!(connection_threads(), 1, "a worker started for a lone read");
        }
    }
    assert_eq!(gated.server.stats().lone_large_reads_inline - before, 6);
    // A real client's lone reads (libnbd, one request at a time), checked against the data.
    let files = TestDir::new("lone-large-read-expected");
    let expected = files.path.join("expected.bin");
    std::fs::write(&expected, &data[..4 * MIB as usize]).unwrap();
    let uri = unix_uri(&gated.socket);
    let script = format!(
        "expected = open({:?}, 'rb').read()\n\
         for i in range(4):\n    \
         assert h.pread(1048576, i * 1048576) == expected[i * 1048576:(i + 1) * 1048576], i\n\
         print('ok')\n",
        expected.display().to_string()
    );
    let run = nbdsh(&uri, &[], &script).expect_success("nbdsh lone reads");
    assert_eq!(run.stdout.trim(), "ok");
    assert_eq!(gated.server.stats().lone_large_reads_inline - before, 10);
}

/// A lone 1 MiB READ whose data is dirty on the cache device and whose 129th block fails its
/// CRC (its bytes changed on the device underneath): the reader serves it, the client gets an
/// EIO error and not a byte of the data (a simple reply: the header only; a structured one: one
/// error chunk), the connection carries on, and the other blocks still read back.
#[test]
fn a_lone_large_read_failing_mid_way_gets_an_error_and_no_data() {
    let _serial = serial_thread_counting();
    let dir = TestDir::new("lone-large-read-error");
    let cache_mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(CACHE_BYTES));
    let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(BACKING_BYTES));
    format_cache(&*cache_mem, &*backing, &FormatOptions::default()).expect("format");
    let (engine, server, socket) = serve_engine(&dir, cache_mem.clone(), backing);
    no_writeback(&engine);
    let data = pattern(22, DATA_BYTES as usize);
    engine.write(0, &data, false).unwrap();
    engine.flush().unwrap();

    // Find block 128 of the first MiB on the cache device and change one byte of it.
    let bad_block = 128usize;
    let wanted = &data[bad_block * BLOCK as usize..(bad_block + 1) * BLOCK as usize];
    let mut device = vec![0u8; CACHE_BYTES as usize];
    cache_mem.read_at(&mut device, 0).unwrap();
    let at = device
        .chunks_exact(BLOCK as usize)
        .position(|block| block == wanted)
        .expect("the block is on the cache device") as u64
        * BLOCK;
    let mut flipped = wanted.to_vec();
    flipped[100] ^= 0xff;
    cache_mem.write_at(&flipped, at).unwrap();

    let before = server.stats().lone_large_reads_inline;
    let mut cookie = 10;
    for structured in [false, true] {
        let mut client = RawClient::go(&socket, structured, false);
        cookie += 1;
        client.send_request(&request(NbdCommand::Read, cookie, 0, MIB as u32), &[]);
        if structured {
            let (header, payload) = client.read_chunk();
            assert_eq!(header.cookie, cookie);
            assert!(
                header.reply_type & 0x8000 != 0,
                "not an error chunk: {header:?}"
            );
            assert!(header.is_done(), "the error chunk does not end the reply");
            let error = u32::from_be_bytes(payload[..4].try_into().unwrap());
            assert_eq!(error, EIO);
        } else {
            let reply = client.read_simple_reply();
            assert_eq!((reply.cookie, reply.error), (cookie, EIO));
        }
        // The next reply follows right after (no data bytes of the failed read between them):
        // a read of the good blocks before the bad one.
        cookie += 1;
        let good = (bad_block as u64) * BLOCK;
        client.send_request(&request(NbdCommand::Read, cookie, 0, good as u32), &[]);
        let got = read_ok_reply(&mut client, structured, cookie, good as usize);
        assert!(
            got == data[..good as usize],
            "the good blocks read back wrong"
        );
    }
    // Each failed read and each good one (512 KiB) was lone and large: served by the reader.
    assert_eq!(server.stats().lone_large_reads_inline - before, 4);
    server.shutdown();
}

/// A client that goes away while its lone 1 MiB READ waits at the cache device (held at the
/// gate, the reader inside the read): the reader finishes it (its send fails), the connection
/// ends, and nothing is left behind: no connection, no thread, no pinned block (the same
/// blocks are written and read back afterwards).
#[test]
fn a_connection_closed_during_a_lone_large_read_leaks_nothing() {
    let _serial = serial_thread_counting();
    let (gated, data, before) = dirty_data_held_in_the_cache("lone-large-read-closed", 23);
    let mut client = RawClient::go(&gated.socket, true, false);
    gated.gate.hold(OpKind::Read);
    client.send_request(&request(NbdCommand::Read, 1, 0, MIB as u32), &[]);
    assert!(
        gated.gate.wait_held(OpKind::Read, 1, HELD),
        "the read never reached the cache device"
    );
    drop(client);
    gated.gate.release(OpKind::Read);
    wait_for_no_connection_thread(&gated.server);
    assert_eq!(
        gated.server.stats().lone_large_reads_inline - before,
        1,
        "the held read was not the reader's"
    );

    // The blocks the read had pinned can be overwritten, and everything reads back.
    let written = pattern(24, MIB as usize);
    gated.engine.write(0, &written, false).unwrap();
    let mut client = RawClient::go(&gated.socket, true, false);
    for (cookie, offset_bytes) in [(2u64, 0u64), (3, MIB)] {
        client.send_request(
            &request(NbdCommand::Read, cookie, offset_bytes, MIB as u32),
            &[],
        );
        let (got_cookie, failed, got) = read_structured_reply(&mut client);
        assert_eq!((got_cookie, failed), (cookie, false));
        let expected = if offset_bytes == 0 {
            &written[..]
        } else {
            &data[MIB as usize..2 * MIB as usize]
        };
        assert!(got == expected, "read {cookie} differs");
    }
}
