//! Ordering among out-of-order completions (s40 concurrency review, docs/RELIABILITY.md): a
//! FLUSH and a FUA write waiting for the cache device's sync are answered only once it is
//! done, while the requests behind them (an inline write, an inline read, a burst) are
//! answered meanwhile, and what a client had acknowledged is what another connection reads.
//! The cache device is held at its door by testkit's gate (an emulation, for tests): every
//! assertion is about what happened, never how long it took.

mod server_support;

use std::collections::HashSet;
use std::time::Duration;

use logcache_nbd::consts::CMD_FLAG_FUA;
use logcache_nbd::request::{Command as NbdCommand, Request};
use logcache_testkit::fault::OpKind;
use server_support::*;

const BLOCK: u64 = 4096;
const HELD: Duration = Duration::from_secs(30);

/// Requests (with a WRITE's payload) as one write to the socket, so the reader finds them
/// together in its input buffer.
fn send_together(client: &mut RawClient, requests: &[(Request, Vec<u8>)]) {
    let mut bytes = Vec::new();
    for (request, payload) in requests {
        bytes.extend_from_slice(&request.encode());
        bytes.extend_from_slice(payload);
    }
    client.send(&bytes);
}

/// Lets `op` through when dropped, so a failing assertion never leaves it held for the server's
/// shutdown to wait out (`Gated` releases reads and writes only).
struct ReleaseOnDrop<'a>(&'a Gated, OpKind);

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.gate.release(self.1);
    }
}

/// Reads `count` structured replies: by cookie, whether it failed and its data.
fn replies(client: &mut RawClient, count: usize) -> Vec<(u64, bool, Vec<u8>)> {
    (0..count).map(|_| read_structured_reply(client)).collect()
}

/// With the cache device's sync held, a FUA write and a FLUSH on one connection get no reply
/// (the FUA write is in the engine, not yet durable), while a plain write, a cached read, a
/// burst of cached reads and a CACHE sent after them are all answered; another connection
/// reads what the first had acknowledged (inline and in a burst); once the sync goes through,
/// the FUA write and the FLUSH succeed, after it. The guards: a worker replies to a FUA write
/// only after `ops::write(.., fua)` returned, which flushes (`workers::execute`), and to a
/// FLUSH only after the engine's flush (`ops::flush`); the reader runs a plain write before it
/// decodes the next request and replies to it only after `Engine::write` returned
/// (`transmission`). Without FUA passed on (`fua` false in `execute`), the FUA write's reply
/// comes while the sync is held.
#[test]
fn flush_and_fua_replies_wait_for_the_sync_while_later_requests_pass_them() {
    let gated = Gated::start_with("flush-order", true);
    no_writeback(&gated.engine);
    let mut a = RawClient::go(&gated.socket, true, false);
    let old = pattern(1, BLOCK as usize);
    let data = pattern(2, (4 * BLOCK) as usize);
    a.send_request(
        &request(NbdCommand::Write, 1, 10 * BLOCK, BLOCK as u32),
        &old,
    );
    a.send_request(
        &request(NbdCommand::Write, 2, 20 * BLOCK, 4 * BLOCK as u32),
        &data,
    );
    a.send_request(&request(NbdCommand::Flush, 3, 0, 0), &[]);
    for (cookie, failed, _) in replies(&mut a, 3) {
        assert!(!failed, "request {cookie} failed");
    }
    let flushes_before = gated.gate.passed(OpKind::Flush);

    gated.gate.hold(OpKind::Flush);
    let _release = ReleaseOnDrop(&gated, OpKind::Flush);
    let new = pattern(3, BLOCK as usize);
    let fua_write = Request {
        flags: CMD_FLAG_FUA,
        ..request(NbdCommand::Write, 4, 10 * BLOCK, BLOCK as u32)
    };
    a.send_request(&fua_write, &new);
    assert!(
        gated.gate.wait_held(OpKind::Flush, 1, HELD),
        "the FUA write never synced the cache device"
    );
    a.send_request(&request(NbdCommand::Flush, 5, 0, 0), &[]);
    // Behind them: a plain write (inline on the reader), a cached read alone (inline), then a
    // burst of cached reads and a CACHE in one send. All are answered while the sync is held.
    let acked = pattern(4, BLOCK as usize);
    a.send_request(
        &request(NbdCommand::Write, 6, 11 * BLOCK, BLOCK as u32),
        &acked,
    );
    a.send_request(
        &request(NbdCommand::Read, 7, 20 * BLOCK, 4 * BLOCK as u32),
        &[],
    );
    send_together(
        &mut a,
        &[
            (
                request(NbdCommand::Read, 8, 20 * BLOCK, BLOCK as u32),
                vec![],
            ),
            (
                request(NbdCommand::Read, 9, 11 * BLOCK, BLOCK as u32),
                vec![],
            ),
            (request(NbdCommand::Cache, 10, 0, BLOCK as u32), vec![]),
        ],
    );
    let mut answered = HashSet::new();
    for (cookie, failed, got) in replies(&mut a, 5) {
        assert!(
            cookie != 4 && cookie != 5,
            "request {cookie} (FUA write 4, FLUSH 5) was answered while the sync was held"
        );
        assert!(!failed, "request {cookie} failed");
        match cookie {
            7 => assert!(got == data, "read 7 differs"),
            8 => assert!(got == data[..BLOCK as usize], "read 8 differs"),
            9 => assert!(
                got == acked,
                "read 9 missed the write acknowledged before it"
            ),
            _ => {}
        }
        answered.insert(cookie);
    }
    assert_eq!(answered, HashSet::from([6, 7, 8, 9, 10]));
    assert_eq!(gated.gate.passed(OpKind::Flush), flushes_before);

    // Another connection reads what the first had acknowledged, inline and in a burst.
    let mut b = RawClient::go(&gated.socket, true, false);
    b.send_request(
        &request(NbdCommand::Read, 20, 11 * BLOCK, BLOCK as u32),
        &[],
    );
    let (cookie, failed, got) = read_structured_reply(&mut b);
    assert_eq!((cookie, failed), (20, false));
    assert!(
        got == acked,
        "another connection missed an acknowledged write"
    );
    send_together(
        &mut b,
        &[
            (
                request(NbdCommand::Read, 21, 11 * BLOCK, BLOCK as u32),
                vec![],
            ),
            (
                request(NbdCommand::Read, 22, 21 * BLOCK, BLOCK as u32),
                vec![],
            ),
        ],
    );
    for (cookie, failed, got) in replies(&mut b, 2) {
        assert!(!failed, "read {cookie} failed");
        let want = if cookie == 21 {
            &acked[..]
        } else {
            &data[BLOCK as usize..2 * BLOCK as usize]
        };
        assert!(got == want, "burst read {cookie} differs");
    }
    assert_eq!(gated.gate.passed(OpKind::Flush), flushes_before);

    // The sync goes through: then, and only then, the FUA write and the FLUSH succeed.
    gated.gate.release(OpKind::Flush);
    let mut answered = HashSet::new();
    for (cookie, failed, _) in replies(&mut a, 2) {
        assert!(!failed, "request {cookie} failed");
        answered.insert(cookie);
    }
    assert_eq!(answered, HashSet::from([4, 5]));
    assert!(gated.gate.passed(OpKind::Flush) > flushes_before);
    b.send_request(
        &request(NbdCommand::Read, 23, 10 * BLOCK, BLOCK as u32),
        &[],
    );
    let (cookie, failed, got) = read_structured_reply(&mut b);
    assert_eq!((cookie, failed), (23, false));
    assert!(
        got == new,
        "the FUA write, acknowledged, is not what another connection reads"
    );
    // The reads sent together were bursts on the readers (reads 8 and 9, 21 and 22).
    let bursts = gated.server.stats().reads_in_bursts;
    assert!(bursts >= 4, "{bursts} reads in bursts");
}
