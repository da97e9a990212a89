//! The client against scripted fake servers built from logcache-nbd's server-side encoders,
//! for the cases real servers will not produce on demand (bad cookies, protocol violations,
//! error codes). `tests/nbd_backing.rs` covers real servers.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::thread::{self, JoinHandle};

use super::handshake::{handshake, request_limits};
use super::stream::{write_all_vectored, Stream};
use super::*;

use logcache_nbd::consts::{
    CMD_FLAG_FUA, DEFAULT_MAX_OPTION_BYTES, EINVAL, EIO, ENOSPC, ENOTSUP, EPERM, ESHUTDOWN,
    FLAG_CAN_MULTI_CONN, FLAG_FIXED_NEWSTYLE, FLAG_HAS_FLAGS, FLAG_NO_ZEROES, FLAG_READ_ONLY,
    FLAG_SEND_FLUSH, FLAG_SEND_FUA, FLAG_SEND_TRIM, INFO_BLOCK_SIZE, NBDMAGIC, OLDSTYLE_MAGIC,
    OPTION_HEADER_BYTES, OPT_ABORT, OPT_EXPORT_NAME, OPT_GO, REP_ERR_INVALID, REP_ERR_POLICY,
    REP_ERR_SHUTDOWN, REP_ERR_TLS_REQD, REP_ERR_UNKNOWN, REP_ERR_UNSUP, REP_FLAG_ERROR, REP_INFO,
    REQUEST_HEADER_BYTES,
};
use logcache_nbd::handshake::{
    decode_client_flags, decode_option_header, encode_greeting, ClientFlags, InfoRequest,
};
use logcache_nbd::option_reply::{
    encode_ack, encode_error, encode_export_name_reply, BlockSizeConstraints, Info,
    OptionReplyHeader,
};
use logcache_nbd::reply::{ChunkHeader, SimpleReply};
use logcache_nbd::request::{Command, Request};

pub(super) const URI: &str = "nbd+unix:///disk?socket=/fake";
pub(super) const ALL_FLAGS: u16 =
    FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_CAN_MULTI_CONN;

pub(super) type Log = Vec<(Command, u16, u64, u32)>;

/// Runs `server` on one end of a socket pair and the client handshake on the other.
pub(super) fn start<T: Send + 'static>(
    server: impl FnOnce(UnixStream) -> T + Send + 'static,
) -> (io::Result<Client>, JoinHandle<T>) {
    let (client_end, server_end) = UnixStream::pair().unwrap();
    let handle = thread::spawn(move || server(server_end));
    (
        handshake(Stream::Unix(client_end), URI, "disk", REQUEST_TIMEOUT),
        handle,
    )
}

fn greet(s: &mut UnixStream, handshake_flags: u16) -> ClientFlags {
    s.write_all(&encode_greeting(handshake_flags)).unwrap();
    let mut flags = [0u8; 4];
    s.read_exact(&mut flags).unwrap();
    decode_client_flags(&flags, handshake_flags).expect("client sent unadvertised flags")
}

fn read_option(s: &mut UnixStream) -> (u32, Vec<u8>) {
    let mut header = [0u8; OPTION_HEADER_BYTES];
    s.read_exact(&mut header).unwrap();
    let header = decode_option_header(&header, DEFAULT_MAX_OPTION_BYTES).unwrap();
    let mut payload = vec![0u8; header.length_bytes as usize];
    s.read_exact(&mut payload).unwrap();
    (header.option, payload)
}

/// A well-behaved fixed-newstyle handshake ending in `NBD_OPT_GO` success.
pub(super) fn accept_go(
    s: &mut UnixStream,
    size_bytes: u64,
    transmission_flags: u16,
    block_size: Option<BlockSizeConstraints>,
) {
    let flags = greet(s, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    assert!(flags.fixed_newstyle && flags.no_zeroes);
    let (option, payload) = read_option(s);
    assert_eq!(option, OPT_GO);
    let request = InfoRequest::decode(&payload).unwrap();
    assert_eq!(request.export_name, "disk");
    assert!(request.info_types.contains(&INFO_BLOCK_SIZE));
    let export = Info::Export {
        size_bytes,
        transmission_flags,
    };
    s.write_all(&export.encode_reply(OPT_GO).unwrap()).unwrap();
    if let Some(constraints) = block_size {
        let reply = Info::BlockSize(constraints).encode_reply(OPT_GO).unwrap();
        s.write_all(&reply).unwrap();
    }
    // An item the client does not know must be ignored.
    let unknown = Info::Unknown {
        info_type: 77,
        data: vec![1, 2, 3],
    };
    s.write_all(&unknown.encode_reply(OPT_GO).unwrap()).unwrap();
    s.write_all(&encode_ack(OPT_GO)).unwrap();
}

/// Reads one request and its write payload; `None` at end of stream.
pub(super) fn read_request(s: &mut UnixStream) -> Option<(Request, Vec<u8>)> {
    let mut header = [0u8; REQUEST_HEADER_BYTES];
    s.read_exact(&mut header).ok()?;
    let request = Request::decode(&header).unwrap();
    let mut payload = vec![0u8; request.payload_length_bytes() as usize];
    s.read_exact(&mut payload).unwrap();
    Some((request, payload))
}

pub(super) fn reply(s: &mut UnixStream, cookie: u64, error: u32, data: &[u8]) {
    s.write_all(&SimpleReply { error, cookie }.encode())
        .unwrap();
    s.write_all(data).unwrap();
}

/// Serves a RAM disk until `NBD_CMD_DISC` or end of stream, failing requests over
/// `max_request_bytes` with EINVAL as a strict server would. Returns the request log.
pub(super) fn serve_disk(s: &mut UnixStream, disk: &mut [u8], max_request_bytes: u32) -> Log {
    let mut log = Vec::new();
    while let Some((request, payload)) = read_request(s) {
        let r = &request;
        log.push((r.command, r.flags, r.offset_bytes, r.length_bytes));
        let start = r.offset_bytes as usize;
        let end = start + r.length_bytes as usize;
        match r.command {
            Command::Disconnect => break,
            _ if r.length_bytes > max_request_bytes => reply(s, r.cookie, EINVAL, &[]),
            Command::Read => {
                let data = disk[start..end].to_vec();
                reply(s, r.cookie, 0, &data);
            }
            Command::Write => {
                disk[start..end].copy_from_slice(&payload);
                reply(s, r.cookie, 0, &[]);
            }
            Command::Trim => {
                disk[start..end].fill(0);
                reply(s, r.cookie, 0, &[]);
            }
            _ => reply(s, r.cookie, 0, &[]),
        }
    }
    log
}

pub(super) fn pattern(len_bytes: usize, seed: u8) -> Vec<u8> {
    (0..len_bytes)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn handshake_learns_size_flags_and_limits() {
    let constraints = BlockSizeConstraints {
        minimum_bytes: 1,
        preferred_bytes: 4096,
        maximum_payload_bytes: 0xffff_ffff,
    };
    let (client, server) = start(move |mut s| {
        accept_go(&mut s, (1 << 20) + 100, ALL_FLAGS, Some(constraints));
        serve_disk(&mut s, &mut [], 0)
    });
    let client = client.unwrap();
    let info = *client.info();
    assert_eq!(info.reported_size_bytes, (1 << 20) + 100);
    // Rounded down to whole sectors.
    assert_eq!(info.size_bytes, 1 << 20);
    assert_eq!(client.size_bytes(), 1 << 20);
    assert_eq!(info.transmission_flags, ALL_FLAGS);
    assert!(info.can_flush() && info.can_fua() && info.can_trim() && info.can_multi_conn());
    assert!(!info.is_read_only());
    assert_eq!(info.block_size, Some(constraints));
    assert_eq!(info.minimum_block_bytes, 1);
    // A huge advertised maximum is capped.
    assert_eq!(info.max_request_bytes, DEFAULT_MAX_REQUEST_BYTES);
    assert_eq!(client.uri(), URI);
    assert_eq!(client.export_name(), "disk");
    client.disconnect().unwrap();
    let log = server.join().unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].0, Command::Disconnect);
}

#[test]
fn large_requests_are_split_at_the_maximum_and_round_trip() {
    let constraints = BlockSizeConstraints {
        minimum_bytes: 512,
        preferred_bytes: 4096,
        maximum_payload_bytes: 4096,
    };
    let (client, server) = start(move |mut s| {
        accept_go(&mut s, 1 << 20, ALL_FLAGS, Some(constraints));
        let mut disk = vec![0u8; 1 << 20];
        let log = serve_disk(&mut s, &mut disk, 4096);
        (log, disk)
    });
    let mut client = client.unwrap();
    assert_eq!(client.info().max_request_bytes, 4096);
    let data = pattern(3 * 4096 + 512, 7);
    client.write_at(&data, 8192 + 512, false).unwrap();
    let mut back = vec![0u8; data.len()];
    client.read_at(&mut back, 8192 + 512).unwrap();
    assert!(back == data);
    client.trim(100_000, 10_000).unwrap();
    client.write_at(&data[..512], 0, true).unwrap();
    drop(client);
    let (log, disk) = server.join().unwrap();
    assert!(disk[8192 + 512..8192 + 512 + data.len()] == data[..]);
    let writes: Vec<_> = log.iter().filter(|e| e.0 == Command::Write).collect();
    let reads: Vec<_> = log.iter().filter(|e| e.0 == Command::Read).collect();
    let trims: Vec<_> = log.iter().filter(|e| e.0 == Command::Trim).collect();
    assert_eq!(writes.len(), 5);
    assert_eq!(reads.len(), 4);
    assert_eq!(
        writes[..4].iter().map(|e| (e.2, e.3)).collect::<Vec<_>>(),
        [(8704, 4096), (12800, 4096), (16896, 4096), (20992, 512)]
    );
    assert_eq!(
        trims.iter().map(|e| (e.2, e.3)).collect::<Vec<_>>(),
        [(100_000, 4096), (104_096, 4096), (108_192, 1808)]
    );
    // FUA is sent natively when advertised, and only then.
    assert_eq!(writes[4].1, CMD_FLAG_FUA);
    assert!(writes[..4].iter().all(|e| e.1 == 0));
    assert_eq!(log.last().unwrap().0, Command::Disconnect);
}

#[test]
fn fua_without_server_support_becomes_write_then_flush() {
    let (client, server) = start(|mut s| {
        accept_go(&mut s, 8192, FLAG_HAS_FLAGS | FLAG_SEND_FLUSH, None);
        serve_disk(&mut s, &mut [0u8; 8192], u32::MAX)
    });
    let mut client = client.unwrap();
    assert_eq!(client.info().max_request_bytes, DEFAULT_MAX_REQUEST_BYTES);
    client.write_at(&[1u8; 512], 512, true).unwrap();
    drop(client);
    let log = server.join().unwrap();
    let commands: Vec<_> = log.iter().map(|e| (e.0, e.1)).collect();
    assert_eq!(
        commands,
        [
            (Command::Write, 0),
            (Command::Flush, 0),
            (Command::Disconnect, 0)
        ]
    );
}

#[test]
fn flush_and_trim_without_server_support_send_nothing() {
    let (client, server) = start(|mut s| {
        accept_go(&mut s, 8192, FLAG_HAS_FLAGS, None);
        serve_disk(&mut s, &mut [0u8; 8192], u32::MAX)
    });
    let mut client = client.unwrap();
    client.flush().unwrap();
    let e = client.trim(0, 512).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::Unsupported);
    assert!(!client.is_broken());
    drop(client);
    let log = server.join().unwrap();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].0, Command::Disconnect);
}

#[test]
fn server_errors_map_to_errno_and_keep_the_connection() {
    let wire_errors = [EPERM, EIO, ENOSPC, EINVAL, ENOTSUP, 12, 75, 9999];
    let (client, server) = start(move |mut s| {
        accept_go(&mut s, 8192, ALL_FLAGS, None);
        for error in wire_errors {
            let (request, _) = read_request(&mut s).unwrap();
            reply(&mut s, request.cookie, error, &[]);
        }
        serve_disk(&mut s, &mut [9u8; 8192], u32::MAX)
    });
    let mut client = client.unwrap();
    let expected = [
        libc::EPERM,
        libc::EIO,
        libc::ENOSPC,
        libc::EINVAL,
        libc::ENOTSUP,
        libc::ENOMEM,
        libc::EOVERFLOW,
        libc::EIO,
    ];
    let mut buf = [0u8; 512];
    for (index, errno) in expected.into_iter().enumerate() {
        let e = if index % 2 == 0 {
            client.read_at(&mut buf, 0).unwrap_err()
        } else {
            client.write_at(&buf, 0, false).unwrap_err()
        };
        assert_eq!(e.raw_os_error(), Some(errno), "{e}");
        assert!(!client.is_broken());
    }
    // The stream stayed in step: the next read gets its data.
    client.read_at(&mut buf, 512).unwrap();
    assert_eq!(buf, [9u8; 512]);
    drop(client);
    server.join().unwrap();
}

#[test]
fn wrong_cookie_breaks_the_connection_for_good() {
    let (client, server) = start(|mut s| {
        accept_go(&mut s, 8192, ALL_FLAGS, None);
        let (request, _) = read_request(&mut s).unwrap();
        reply(&mut s, request.cookie + 100, 0, &[]);
        // The client must close without sending anything more.
        read_request(&mut s).map(|(r, _)| r.command)
    });
    let mut client = client.unwrap();
    let mut buf = [0u8; 512];
    let e = client.read_at(&mut buf, 0).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("cookie"), "{e}");
    assert!(e.to_string().contains(URI), "{e}");
    assert!(client.is_broken());
    assert!(client.broken_reason().unwrap().contains("cookie"));
    assert!(!client.broken_reason().unwrap().contains(URI));
    for e in [
        client.read_at(&mut buf, 0).unwrap_err(),
        client.write_at(&buf, 0, false).unwrap_err(),
        client.flush().unwrap_err(),
        client.trim(0, 512).unwrap_err(),
    ] {
        assert_eq!(e.kind(), io::ErrorKind::NotConnected);
        assert!(e.to_string().contains("cookie"), "{e}");
        assert!(e.to_string().contains("not reconnecting"), "{e}");
    }
    assert!(client.disconnect().is_err());
    assert_eq!(server.join().unwrap(), None);
}

#[test]
fn end_of_stream_breaks_the_connection() {
    let (client, server) = start(|mut s| {
        accept_go(&mut s, 8192, ALL_FLAGS, None);
        // Answer one request, then die halfway through the data of the next.
        let (request, _) = read_request(&mut s).unwrap();
        reply(&mut s, request.cookie, 0, &[]);
        let (request, _) = read_request(&mut s).unwrap();
        reply(&mut s, request.cookie, 0, &[0u8; 100]);
    });
    let mut client = client.unwrap();
    client.flush().unwrap();
    let mut buf = [0u8; 512];
    let e = client.read_at(&mut buf, 0).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    assert!(e.to_string().contains("closed the connection"), "{e}");
    server.join().unwrap();
    let e = client.flush().unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotConnected);
}

#[test]
fn server_gone_before_a_request_is_an_error() {
    let (client, server) = start(|mut s| accept_go(&mut s, 8192, ALL_FLAGS, None));
    let mut client = client.unwrap();
    server.join().unwrap();
    // Either the send or the reply read fails; both mark the connection broken.
    assert!(client.write_at(&[0u8; 512], 0, false).is_err());
    assert!(client.is_broken());
}

#[test]
fn structured_reply_is_a_protocol_violation() {
    let (client, server) = start(|mut s| {
        accept_go(&mut s, 8192, ALL_FLAGS, None);
        let (request, _) = read_request(&mut s).unwrap();
        let chunk = ChunkHeader {
            flags: 1,
            reply_type: 0,
            cookie: request.cookie,
            length_bytes: 0,
        };
        s.write_all(&chunk.encode()).unwrap();
    });
    let mut client = client.unwrap();
    let e = client.read_at(&mut [0u8; 512], 0).unwrap_err();
    assert!(e.to_string().contains("structured reply"), "{e}");
    assert!(client.is_broken());
    server.join().unwrap();
}

#[test]
fn eshutdown_makes_the_client_disconnect() {
    let (client, server) = start(|mut s| {
        accept_go(&mut s, 8192, ALL_FLAGS, None);
        let (request, _) = read_request(&mut s).unwrap();
        reply(&mut s, request.cookie, ESHUTDOWN, &[]);
        read_request(&mut s).map(|(r, _)| r.command)
    });
    let mut client = client.unwrap();
    let e = client.flush().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ESHUTDOWN));
    assert_eq!(server.join().unwrap(), Some(Command::Disconnect));
    let e = client.flush().unwrap_err();
    assert!(e.to_string().contains("shutting down"), "{e}");
}

#[test]
fn read_only_exports_refuse_writes_locally() {
    let (client, server) = start(|mut s| {
        accept_go(&mut s, 8192, ALL_FLAGS | FLAG_READ_ONLY, None);
        serve_disk(&mut s, &mut [5u8; 8192], u32::MAX)
    });
    let mut client = client.unwrap();
    assert!(client.info().is_read_only());
    let e = client.write_at(&[0u8; 512], 0, false).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    let e = client.trim(0, 512).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    let mut buf = [0u8; 512];
    client.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [5u8; 512]);
    drop(client);
    let log = server.join().unwrap();
    assert_eq!(
        log.len(),
        2,
        "only the read and DISC reach the server: {log:?}"
    );
}

#[test]
fn out_of_range_requests_are_refused_locally() {
    let (client, server) = start(|mut s| {
        accept_go(&mut s, 8192 + 7, ALL_FLAGS, None);
        serve_disk(&mut s, &mut [0u8; 8192], u32::MAX)
    });
    let mut client = client.unwrap();
    let mut buf = [0u8; 512];
    for e in [
        client.read_at(&mut buf, 8192).unwrap_err(),
        client.write_at(&buf, 7680 + 1, false).unwrap_err(),
        client.trim(u64::MAX, 2).unwrap_err(),
    ] {
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("past the end"), "{e}");
    }
    // Zero-length calls succeed without a round trip.
    client.read_at(&mut [], 0).unwrap();
    client.write_at(&[], 8192, false).unwrap();
    client.trim(8192, 0).unwrap();
    assert!(!client.is_broken());
    drop(client);
    assert_eq!(server.join().unwrap().len(), 1);
}

#[test]
fn unknown_export_is_one_clear_line() {
    let (client, server) = start(|mut s| {
        greet(&mut s, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        let (option, _) = read_option(&mut s);
        assert_eq!(option, OPT_GO);
        let reply = encode_error(OPT_GO, REP_ERR_UNKNOWN, "no such\nexport").unwrap();
        s.write_all(&reply).unwrap();
        // The client says goodbye with NBD_OPT_ABORT.
        read_option(&mut s).0
    });
    let e = client.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    let text = e.to_string();
    assert!(text.starts_with(URI), "{text}");
    assert!(text.contains("\"disk\" not found"), "{text}");
    assert!(text.contains("no such export"), "{text}");
    assert!(!text.contains('\n'), "{text}");
    assert_eq!(server.join().unwrap(), OPT_ABORT);
}

#[test]
fn option_errors_have_specific_messages() {
    for (reply_type, kind, needle) in [
        (REP_ERR_POLICY, io::ErrorKind::PermissionDenied, "refused"),
        (REP_ERR_TLS_REQD, io::ErrorKind::Unsupported, "TLS"),
        (
            REP_ERR_SHUTDOWN,
            io::ErrorKind::ConnectionAborted,
            "shutting down",
        ),
        (REP_ERR_INVALID, io::ErrorKind::InvalidInput, "invalid"),
        (REP_FLAG_ERROR | 50, io::ErrorKind::Other, "error 0x32"),
    ] {
        let (client, server) = start(move |mut s| {
            greet(&mut s, FLAG_FIXED_NEWSTYLE);
            read_option(&mut s);
            s.write_all(&encode_error(OPT_GO, reply_type, "").unwrap())
                .unwrap();
        });
        let e = client.unwrap_err();
        assert_eq!(e.kind(), kind, "{e}");
        assert!(e.to_string().contains(needle), "{e}");
        server.join().unwrap();
    }
}

#[test]
fn servers_without_opt_go_get_opt_export_name() {
    let (client, server) = start(|mut s| {
        // Fixed newstyle without NO_ZEROES, and no NBD_OPT_GO.
        let flags = greet(&mut s, FLAG_FIXED_NEWSTYLE);
        assert!(!flags.no_zeroes);
        let (option, _) = read_option(&mut s);
        assert_eq!(option, OPT_GO);
        s.write_all(&encode_error(OPT_GO, REP_ERR_UNSUP, "").unwrap())
            .unwrap();
        let (option, name) = read_option(&mut s);
        assert_eq!((option, name.as_slice()), (OPT_EXPORT_NAME, &b"disk"[..]));
        s.write_all(&encode_export_name_reply(4096, ALL_FLAGS, false))
            .unwrap();
        serve_disk(&mut s, &mut [3u8; 4096], u32::MAX)
    });
    let mut client = client.unwrap();
    assert_eq!(client.size_bytes(), 4096);
    assert_eq!(client.info().block_size, None);
    let mut buf = [0u8; 1024];
    client.read_at(&mut buf, 1024).unwrap();
    assert_eq!(buf, [3u8; 1024]);
    drop(client);
    server.join().unwrap();
}

#[test]
fn plain_newstyle_server_gets_opt_export_name_and_its_eof_means_unknown_export() {
    let (client, server) = start(|mut s| {
        let flags = greet(&mut s, 0);
        assert_eq!(flags, ClientFlags::default());
        let (option, _) = read_option(&mut s);
        assert_eq!(option, OPT_EXPORT_NAME);
        // Unknown export: a server can only hang up.
    });
    let e = client.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    assert!(e.to_string().contains("\"disk\""), "{e}");
    server.join().unwrap();
}

#[test]
fn oldstyle_and_non_nbd_servers_are_refused_clearly() {
    let (client, server) = start(|mut s| {
        let mut greeting = Vec::new();
        greeting.extend_from_slice(&NBDMAGIC.to_be_bytes());
        greeting.extend_from_slice(&OLDSTYLE_MAGIC.to_be_bytes());
        greeting.extend_from_slice(&[0u8; 2]);
        let _ = s.write_all(&greeting);
    });
    let e = client.unwrap_err();
    assert!(e.to_string().contains("oldstyle"), "{e}");
    server.join().unwrap();

    let (client, server) = start(|mut s| {
        let _ = s.write_all(b"SSH-2.0-OpenSSH_9.2\r\n");
    });
    let e = client.unwrap_err();
    assert!(e.to_string().contains("not an NBD server"), "{e}");
    server.join().unwrap();

    let (client, server) = start(drop::<UnixStream>);
    let e = client.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    assert!(e.to_string().contains("during the handshake"), "{e}");
    server.join().unwrap();
}

#[test]
fn handshake_protocol_violations_are_errors() {
    // ACK without the export size.
    let (client, server) = start(|mut s| {
        greet(&mut s, FLAG_FIXED_NEWSTYLE);
        read_option(&mut s);
        s.write_all(&encode_ack(OPT_GO)).unwrap();
    });
    assert!(client.unwrap_err().to_string().contains("export size"));
    server.join().unwrap();

    // A huge reply length must not be allocated.
    let (client, server) = start(|mut s| {
        greet(&mut s, FLAG_FIXED_NEWSTYLE);
        read_option(&mut s);
        let header = OptionReplyHeader {
            option: OPT_GO,
            reply_type: REP_INFO,
            length_bytes: u32::MAX,
        };
        s.write_all(&header.encode()).unwrap();
    });
    assert!(client.unwrap_err().to_string().contains("limit"));
    server.join().unwrap();

    // Invalid block size constraints.
    for (minimum_bytes, maximum_payload_bytes) in [(3, 4096), (1 << 17, 1 << 20), (4096, 512)] {
        let constraints = BlockSizeConstraints {
            minimum_bytes,
            preferred_bytes: 4096,
            maximum_payload_bytes,
        };
        let (client, server) =
            start(move |mut s| accept_go(&mut s, 8192, ALL_FLAGS, Some(constraints)));
        let e = client.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("block size"), "{e}");
        server.join().unwrap();
    }
}

#[test]
fn request_limits_prefer_whole_sectors() {
    let limits = |minimum_bytes, maximum_payload_bytes| {
        request_limits(BlockSizeConstraints {
            minimum_bytes,
            preferred_bytes: 4096,
            maximum_payload_bytes,
        })
    };
    assert_eq!(limits(1, 65536), Ok((1, 65536)));
    assert_eq!(limits(1, 65537), Ok((1, 65536)));
    assert_eq!(limits(4096, 1 << 30), Ok((4096, DEFAULT_MAX_REQUEST_BYTES)));
    assert_eq!(limits(1, 100), Ok((1, 100)));
    assert_eq!(limits(64, 300), Ok((64, 256)));
    assert!(limits(0, 512).is_err());
}

#[test]
fn connect_errors_name_the_uri() {
    let text = "nbd+unix:///x?socket=/nonexistent/logcache-test.sock";
    let e = Client::connect_str(text).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    assert!(e.to_string().starts_with(text), "{e}");
    let e = Client::connect_str("nbds+vsock://1/x").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("TLS"), "{e}");
    let missing = "nbds+unix:///x?socket=/nonexistent/s.sock&tls-psk-file=/nonexistent/k.psk";
    let e = Client::connect_str(missing).unwrap_err();
    assert!(e.to_string().starts_with(missing), "{e}");
}

#[test]
fn write_all_vectored_handles_short_writes() {
    /// Accepts at most 3 bytes per call, to force partial progress through the slices.
    struct Trickle(Vec<u8>);
    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = buf.len().min(3);
            self.0.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut sink = Trickle(Vec::new());
    write_all_vectored(&mut sink, &[b"abcde", b"", b"fghij"]).unwrap();
    assert_eq!(sink.0, b"abcdefghij");
}
