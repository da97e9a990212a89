//! Requests in flight on one connection, for the tests that hold devices at their door
//! (testkit's gate, an emulation): a server whose backing (or cache) device is gated, and a
//! raw client's request building and structured-reply reading.

use std::sync::Arc;

use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, Engine, FormatOptions};
use logcache_nbd::consts::{REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA};
use logcache_nbd::request::{Command as NbdCommand, Request};
use logcache_server::Server;
use logcache_testkit::fault::OpKind;
use logcache_testkit::gate::GateDevice;

use super::*;

/// A server on an engine whose backing device sits behind a gate.
pub struct Gated {
    _dir: TestDir,
    pub gate: Arc<GateDevice>,
    pub engine: Engine,
    pub server: Server,
    pub socket: std::path::PathBuf,
}

impl Gated {
    pub fn start(name: &str) -> Gated {
        Gated::start_with(name, false)
    }

    /// With `cache_gated`, the gate stands in front of the cache device instead.
    pub fn start_with(name: &str, cache_gated: bool) -> Gated {
        let dir = TestDir::new(name);
        let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(CACHE_BYTES));
        let backing_mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(BACKING_BYTES));
        format_cache(&*cache, &*backing_mem, &FormatOptions::default()).expect("format");
        // What the backing device holds before the cache sees it: a pattern per block.
        backing_mem
            .write_at(&pattern(99, (8 * MIB) as usize), 0)
            .unwrap();
        let (gate, engine, server, socket) = if cache_gated {
            let gate = Arc::new(GateDevice::new(cache));
            let (engine, server, socket) = serve_engine(&dir, gate.clone(), backing_mem);
            (gate, engine, server, socket)
        } else {
            let gate = Arc::new(GateDevice::new(backing_mem));
            let (engine, server, socket) = serve_engine(&dir, cache, gate.clone());
            (gate, engine, server, socket)
        };
        Gated {
            _dir: dir,
            gate,
            engine,
            server,
            socket,
        }
    }
}

impl Drop for Gated {
    fn drop(&mut self) {
        // Never leave a held IO behind a failing assertion: the shutdown would wait for it.
        self.gate.release(OpKind::Read);
        self.gate.release(OpKind::Write);
        self.server.shutdown();
    }
}

pub fn request(command: NbdCommand, cookie: u64, offset_bytes: u64, length_bytes: u32) -> Request {
    Request {
        flags: 0,
        command,
        cookie,
        offset_bytes,
        length_bytes,
    }
}

/// The successful reply to READ `cookie` of `length` bytes, in either reply kind: its data.
pub fn read_ok_reply(
    client: &mut RawClient,
    structured: bool,
    cookie: u64,
    length: usize,
) -> Vec<u8> {
    if structured {
        let (got_cookie, failed, got) = read_structured_reply(client);
        assert_eq!((got_cookie, failed), (cookie, false));
        got
    } else {
        let reply = client.read_simple_reply();
        assert_eq!((reply.cookie, reply.error), (cookie, 0));
        client.read_exact(length)
    }
}

/// One structured reply, whole: its cookie, whether it failed, and its data (for a READ).
pub fn read_structured_reply(client: &mut RawClient) -> (u64, bool, Vec<u8>) {
    let mut data = Vec::new();
    loop {
        let (header, payload) = client.read_chunk();
        let failed = header.reply_type & 0x8000 != 0;
        if header.reply_type == REPLY_TYPE_OFFSET_DATA {
            data.extend_from_slice(&payload[8..]);
        } else {
            assert!(
                header.reply_type == REPLY_TYPE_NONE || failed,
                "unexpected chunk {header:?}"
            );
        }
        if header.flags & 1 != 0 || failed {
            return (header.cookie, failed, data);
        }
    }
}
