//! The reader's spin (`spin`): before sleeping for a client that has every reply, the reader
//! polls its socket for a while (`ServerStats::reader_spins` counts the polls). Requests that
//! arrive while it polls, after it gave up and slept, and a client that leaves while it polls
//! are all served or noticed as without it. Real sockets, a real server; the pauses only
//! create the situations, nothing asserts how long anything took.

mod server_support;

use std::net::Shutdown;
use std::time::Duration;

use logcache_nbd::request::Command as NbdCommand;
use server_support::*;

const BLOCK: u64 = 4096;
/// Longer than any spin budget: a request sent after it finds the reader asleep.
const PAST_THE_SPIN: Duration = Duration::from_millis(3);

/// A client at iodepth 1: reads and writes one at a time, some sent at once after the
/// previous reply (while the reader may poll), some after a pause (the reader asleep); every
/// read returns the newest data, every write is acknowledged, and the reader did poll.
#[test]
fn requests_during_and_after_the_spin_are_served_in_order() {
    let _serial = serial_thread_counting();
    let fixture = Fixture::start("reader-spin-iodepth-1");
    let blocks = 64u64;
    let mut data = pattern(31, (blocks * BLOCK) as usize);
    fixture.engine.write(0, &data, false).unwrap();
    let spins_before = fixture.server.stats().reader_spins;
    for structured in [false, true] {
        let mut client = RawClient::go(&fixture.socket, structured, false);
        let mut cookie = 0u64;
        for i in 0..400u64 {
            if i % 7 == 3 {
                std::thread::sleep(PAST_THE_SPIN);
            }
            let block = (i * 37) % blocks;
            let at = (block * BLOCK) as usize;
            cookie += 1;
            if i % 5 == 4 {
                // A write, then reads see it.
                let new = pattern(1000 + i, BLOCK as usize);
                data[at..at + BLOCK as usize].copy_from_slice(&new);
                client.send_request(
                    &request(NbdCommand::Write, cookie, block * BLOCK, BLOCK as u32),
                    &new,
                );
                if structured {
                    let (got_cookie, failed, _) = read_structured_reply(&mut client);
                    assert_eq!((got_cookie, failed), (cookie, false));
                } else {
                    let reply = client.read_simple_reply();
                    assert_eq!((reply.cookie, reply.error), (cookie, 0));
                }
                continue;
            }
            client.send_request(
                &request(NbdCommand::Read, cookie, block * BLOCK, BLOCK as u32),
                &[],
            );
            let got = read_ok_reply(&mut client, structured, cookie, BLOCK as usize);
            assert!(
                got == data[at..at + BLOCK as usize],
                "read {i} (block {block}) returned other data"
            );
        }
        cookie += 1;
        client.send_request(&request(NbdCommand::Disconnect, cookie, 0, 0), &[]);
        assert!(client.is_closed_by_server());
    }
    // The first wait of a connection with nothing on its workers is a probe: it polled.
    assert!(
        fixture.server.stats().reader_spins - spins_before >= 2,
        "the reader never polled"
    );
    wait_for_no_connection_thread(&fixture.server);
}

/// Clients that leave right after a reply (the reader polling, or just asleep): each
/// connection ends, its thread with it, and nothing hangs; a client that half-closes after
/// its request still gets its reply first.
#[test]
fn a_client_leaving_while_the_reader_polls_ends_its_connection() {
    let _serial = serial_thread_counting();
    let fixture = Fixture::start("reader-spin-close");
    let data = pattern(32, (16 * BLOCK) as usize);
    fixture.engine.write(0, &data, false).unwrap();
    for i in 0..40u64 {
        let mut client = RawClient::go(&fixture.socket, i % 2 == 0, false);
        // A few requests first, so the reader has polled and may be polling again.
        for cookie in 1..=5u64 {
            client.send_request(&request(NbdCommand::Read, cookie, 0, BLOCK as u32), &[]);
            let got = read_ok_reply(&mut client, i % 2 == 0, cookie, BLOCK as usize);
            assert!(got == data[..BLOCK as usize]);
        }
        match i % 4 {
            // Gone at once (during the reader's poll, if it polls), or after it slept.
            0 => drop(client),
            1 => {
                std::thread::sleep(PAST_THE_SPIN);
                drop(client);
            }
            // Half-closed right behind a last request: that request is still answered.
            _ => {
                client.send_request(&request(NbdCommand::Read, 9, 0, BLOCK as u32), &[]);
                client.stream.shutdown(Shutdown::Write).unwrap();
                let got = read_ok_reply(&mut client, i % 2 == 0, 9, BLOCK as usize);
                assert!(got == data[..BLOCK as usize]);
                assert!(client.is_closed_by_server());
            }
        }
        wait_for_no_connection_thread(&fixture.server);
    }
}

/// A server shut down while its client is idle (the reader polling or asleep) stops.
#[test]
fn shutdown_with_an_idle_client_returns() {
    let _serial = serial_thread_counting();
    let fixture = Fixture::start("reader-spin-shutdown");
    fixture
        .engine
        .write(0, &pattern(33, BLOCK as usize), false)
        .unwrap();
    let mut client = RawClient::go(&fixture.socket, true, false);
    client.send_request(&request(NbdCommand::Read, 1, 0, BLOCK as u32), &[]);
    read_ok_reply(&mut client, true, 1, BLOCK as usize);
    fixture.server.shutdown();
    assert!(client.is_closed_by_server());
    wait_for_no_connection_thread(&fixture.server);
}
