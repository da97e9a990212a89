//! [`Pipe`] against scripted fake servers: many requests in flight on one connection, replies
//! out of order, errors and breaks with requests in flight. `tests/nbd_backing.rs` covers real
//! servers.

use std::io;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use logcache_nbd::consts::{EIO, ESHUTDOWN};
use logcache_nbd::reply::ChunkHeader;
use logcache_nbd::request::{Command, Request};

use super::tests::{accept_go, pattern, read_request, reply, serve_disk, start, ALL_FLAGS, URI};
use super::{Pipe, REQUEST_TIMEOUT};

const DISK_BYTES: u64 = 1 << 20;
/// How long a fake server waits for requests that a pipelining client sends at once; only
/// reached when the client is wrong (it then fails the test rather than hang it).
const SERVER_PATIENCE: Duration = Duration::from_secs(20);

/// A pipe over a fake server running `server` after a good handshake.
fn pipe_with<T: Send + 'static>(
    request_timeout: Duration,
    depth: usize,
    server: impl FnOnce(&mut UnixStream) -> T + Send + 'static,
) -> (Arc<Pipe>, thread::JoinHandle<T>) {
    let (client, handle) = start(move |mut s| {
        accept_go(&mut s, DISK_BYTES, ALL_FLAGS, None);
        server(&mut s)
    });
    let pipe = Pipe::with_depth(client.unwrap(), request_timeout, depth).unwrap();
    (Arc::new(pipe), handle)
}

/// Reads `count` requests before answering any (giving up after [`SERVER_PATIENCE`]).
fn read_requests(s: &mut UnixStream, count: usize) -> Vec<(Request, Vec<u8>)> {
    s.set_read_timeout(Some(SERVER_PATIENCE)).unwrap();
    let requests: Vec<_> = (0..count).map_while(|_| read_request(s)).collect();
    s.set_read_timeout(None).unwrap();
    requests
}

/// A permutation of `0..n` from `seed` (a small LCG: the test replays).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut state = seed;
    for i in (1..n).rev() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        order.swap(i, (state >> 33) as usize % (i + 1));
    }
    order
}

/// Reads 0–6, a read the server fails, two writes and a flush, all in flight at once on one
/// connection; the server answers them in a seeded order. Each caller gets its own answer.
#[test]
fn replies_in_any_order_reach_their_own_callers() {
    for seed in 0..8u64 {
        const REQUESTS: usize = 11;
        let (pipe, server) = pipe_with(REQUEST_TIMEOUT, 64, move |s| {
            let requests = read_requests(s, REQUESTS);
            let seen_at_once = requests.len();
            let mut written = Vec::new();
            for i in shuffled(requests.len(), seed) {
                let (r, payload) = &requests[i];
                let block = (r.offset_bytes / 4096) as u8;
                match r.command {
                    Command::Read if block == 7 => reply(s, r.cookie, EIO, &[]),
                    Command::Read => {
                        reply(s, r.cookie, 0, &pattern(r.length_bytes as usize, block))
                    }
                    Command::Write => {
                        written.push((r.offset_bytes, payload.clone()));
                        reply(s, r.cookie, 0, &[]);
                    }
                    _ => reply(s, r.cookie, 0, &[]),
                }
            }
            // Up until the client says goodbye.
            let goodbye = read_request(s).map(|(r, _)| r.command);
            assert_eq!(goodbye, Some(Command::Disconnect));
            (seen_at_once, written)
        });
        thread::scope(|scope| {
            for block in 0..8u64 {
                let pipe = &pipe;
                scope.spawn(move || {
                    let mut buf = vec![0u8; 4096];
                    let result = pipe.read_at(&mut buf, block * 4096);
                    if block == 7 {
                        let e = result.unwrap_err();
                        assert_eq!(e.raw_os_error(), Some(libc::EIO), "seed {seed}");
                    } else {
                        result.unwrap();
                        assert!(
                            buf == pattern(4096, block as u8),
                            "seed {seed} block {block}"
                        );
                    }
                });
            }
            for block in 8..10u64 {
                let pipe = &pipe;
                scope.spawn(move || {
                    let data = pattern(4096, 100 + block as u8);
                    pipe.write_at(&data, block * 4096, false).unwrap();
                });
            }
            scope.spawn(|| pipe.flush().unwrap());
        });
        assert_eq!(pipe.in_flight(), 0);
        assert!(
            !pipe.is_broken(),
            "an error reply leaves the stream in step"
        );
        drop(pipe);
        let (seen_at_once, mut written) = server.join().unwrap();
        assert_eq!(
            seen_at_once, REQUESTS,
            "every request was in flight at once"
        );
        written.sort();
        assert_eq!(
            written,
            vec![
                (8 * 4096, pattern(4096, 108)),
                (9 * 4096, pattern(4096, 109))
            ]
        );
    }
}

/// More callers than slots: they wait for room, and all finish against a server that answers
/// in order; the data round-trips.
#[test]
fn callers_beyond_the_depth_wait_for_room() {
    let (pipe, server) = pipe_with(REQUEST_TIMEOUT, 3, |s| {
        let mut disk = vec![0u8; DISK_BYTES as usize];
        serve_disk(s, &mut disk, u32::MAX)
    });
    thread::scope(|scope| {
        for t in 0..12u64 {
            let pipe = &pipe;
            scope.spawn(move || {
                for round in 0..20u64 {
                    let offset = (t * 20 + round) * 2048;
                    let data = pattern(2048, (t * 7 + round) as u8);
                    pipe.write_at(&data, offset, false).unwrap();
                    let mut back = vec![0u8; 2048];
                    pipe.read_at(&mut back, offset).unwrap();
                    assert!(back == data, "thread {t} round {round}");
                }
            });
        }
    });
    assert_eq!(pipe.in_flight(), 0);
    drop(pipe);
    let log = server.join().unwrap();
    assert_eq!(log.len(), 12 * 20 * 2 + 1);
    assert_eq!(
        log.last().unwrap().0,
        Command::Disconnect,
        "a dropped pipe says goodbye"
    );
}

/// The server answers two of six requests in flight and closes: those two succeed, the other
/// four fail naming the URI and the reason, nothing waits forever, later calls fail at once.
#[test]
fn a_connection_closed_with_requests_in_flight_fails_the_rest_and_later_calls() {
    let (pipe, server) = pipe_with(REQUEST_TIMEOUT, 64, |s| {
        let requests = read_requests(s, 6);
        for (r, _) in requests.iter().filter(|(r, _)| r.offset_bytes < 2 * 4096) {
            reply(s, r.cookie, 0, &pattern(4096, 9));
        }
        requests.len()
        // The socket closes here.
    });
    let results: Vec<io::Result<Vec<u8>>> = thread::scope(|scope| {
        let handles: Vec<_> = (0..6u64)
            .map(|block| {
                let pipe = &pipe;
                scope.spawn(move || {
                    let mut buf = vec![0u8; 4096];
                    pipe.read_at(&mut buf, block * 4096).map(|()| buf)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(server.join().unwrap(), 6);
    for (block, result) in results.iter().enumerate() {
        match result {
            Ok(data) => {
                assert!(block < 2, "block {block} was never answered");
                assert!(*data == pattern(4096, 9));
            }
            Err(e) => {
                assert!(block >= 2, "block {block} was answered: {e}");
                let text = e.to_string();
                assert!(
                    text.contains(URI) && text.contains("closed the connection"),
                    "{text}"
                );
            }
        }
    }
    assert!(pipe.is_broken());
    assert_eq!(pipe.in_flight(), 0);
    let e = pipe.write_at(&[0u8; 512], 0, false).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotConnected);
    assert!(e.to_string().contains("unusable"), "{e}");
}

/// A server that closes an idle connection: the pipe notices before anyone calls, and the
/// next call fails at once instead of sending into a dead socket.
#[test]
fn a_server_closing_an_idle_connection_is_noticed_before_the_next_call() {
    let (pipe, server) = pipe_with(REQUEST_TIMEOUT, 64, |_| ());
    server.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pipe.is_broken() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    assert!(
        pipe.is_broken(),
        "end of stream on an idle pipe went unnoticed"
    );
    let e = pipe.flush().unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotConnected);
}

/// A cookie that names no request in flight (here: answering one request twice) breaks the
/// pipe for good; the request already answered keeps its answer.
#[test]
fn a_reply_to_no_request_in_flight_breaks_the_pipe() {
    let (pipe, server) = pipe_with(REQUEST_TIMEOUT, 64, |s| {
        let (r, _) = read_request(s).unwrap();
        reply(s, r.cookie, 0, &[]);
        reply(s, r.cookie, 0, &[]);
        read_request(s).map(|(r, _)| r.command)
    });
    pipe.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pipe.is_broken() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    assert!(pipe.broken_reason().unwrap().contains("names no request"));
    assert!(pipe.flush().is_err());
    drop(pipe);
    assert_eq!(server.join().unwrap(), None, "nothing more was sent");
}

/// A structured reply was not negotiated: it breaks the pipe and fails its request.
#[test]
fn a_structured_reply_breaks_the_pipe() {
    let (pipe, server) = pipe_with(REQUEST_TIMEOUT, 64, |s| {
        let (r, _) = read_request(s).unwrap();
        let chunk = ChunkHeader {
            flags: 1,
            reply_type: 0,
            cookie: r.cookie,
            length_bytes: 0,
        };
        std::io::Write::write_all(s, &chunk.encode()).unwrap();
        read_request(s).map(|(r, _)| r.command)
    });
    let e = pipe.read_at(&mut [0u8; 512], 0).unwrap_err();
    assert!(e.to_string().contains("structured reply"), "{e}");
    drop(pipe);
    assert_eq!(server.join().unwrap(), None);
}

/// A server that takes requests and never answers: every request in flight fails once the
/// request timeout passes with nothing received; an idle pipe is not broken by the timeout.
#[test]
fn a_silent_server_fails_the_requests_in_flight_after_the_request_timeout() {
    let timeout = Duration::from_millis(200);
    let (pipe, server) = pipe_with(timeout, 64, |s| {
        let requests = read_requests(s, 3);
        // Hold the socket open, answering nothing, until the client gives up and closes.
        let _ = read_request(s);
        requests.len()
    });
    thread::sleep(timeout * 3);
    assert!(!pipe.is_broken(), "an idle pipe owes nothing and stays up");
    let errors: Vec<io::Error> = thread::scope(|scope| {
        let handles: Vec<_> = (0..3u64)
            .map(|block| {
                let pipe = &pipe;
                scope.spawn(move || pipe.read_at(&mut [0u8; 512], block * 512).unwrap_err())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // A caller the machine started late may find the pipe already broken by the others'
    // timeout: it fails at once, with the same reason.
    for e in &errors {
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::NotConnected
            ),
            "{e}"
        );
        assert!(e.to_string().contains("no answer"), "{e}");
    }
    assert!(errors.iter().any(|e| e.kind() == io::ErrorKind::TimedOut));
    let seen = server.join().unwrap();
    assert!((1..=3).contains(&seen), "{seen}");
}

/// ESHUTDOWN on one request of two in flight: that caller gets ESHUTDOWN, the other fails,
/// and the pipe says goodbye with NBD_CMD_DISC.
#[test]
fn eshutdown_fails_the_pipe_and_disconnects() {
    let (pipe, server) = pipe_with(REQUEST_TIMEOUT, 64, |s| {
        let requests = read_requests(s, 2);
        let (first, _) = &requests[0];
        reply(s, first.cookie, ESHUTDOWN, &[]);
        read_request(s).map(|(r, _)| r.command)
    });
    let results: Vec<io::Error> = thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| pipe.flush().unwrap_err()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        results
            .iter()
            .filter(|e| e.raw_os_error() == Some(libc::ESHUTDOWN))
            .count(),
        1,
        "{results:?}"
    );
    assert!(results
        .iter()
        .any(|e| e.to_string().contains("shutting down")));
    assert_eq!(server.join().unwrap(), Some(Command::Disconnect));
    assert!(pipe.is_broken());
}
