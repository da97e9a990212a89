//! STARTTLS as the NBD spec sets it out, driven by hand: under `require`, every option but
//! STARTTLS and ABORT is answered `NBD_REP_ERR_TLS_REQD` and EXPORT_NAME ends the connection;
//! STARTTLS with data, or on a server without TLS, gets the errors the spec names; after the TLS
//! handshake (an OpenSSL PSK client here; GnuTLS clients are in the CLI's `cli_tls` tests) the
//! negotiation starts over and requests are served through TLS.

mod server_support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use logcache_nbd::consts::{
    FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES, OPT_ABORT, OPT_EXPORT_NAME, OPT_GO, OPT_LIST,
    OPT_STARTTLS, OPT_STRUCTURED_REPLY, REP_ACK, REP_ERR_INVALID, REP_ERR_TLS_REQD, REP_ERR_UNSUP,
    SIMPLE_REPLY_HEADER_BYTES, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_HEADER_BYTES,
    STRUCTURED_REPLY_MAGIC,
};
use logcache_nbd::handshake::{InfoRequest, OptionHeader};
use logcache_nbd::option_reply::OptionReplyHeader;
use logcache_nbd::reply::{ChunkHeader, SimpleReply};
use logcache_nbd::request::{Command as NbdCommand, Request};
use logcache_server::{ServerConfig, TlsConfig, TlsMode};
use openssl::ssl::{SslConnector, SslMethod, SslStream, SslVerifyMode};
use server_support::*;

const PSK_IDENTITY: &str = "alice";
const PSK_KEY: [u8; 32] = [0x5a; 32];

fn psk_file(dir: &Path) -> PathBuf {
    let path = dir.join("keys.psk");
    let hex: String = PSK_KEY.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&path, format!("{PSK_IDENTITY}:{hex}\n")).unwrap();
    path
}

fn tls_fixture(name: &str, mode: TlsMode) -> Fixture {
    let keys_dir = TestDir::new(&format!("{name}-keys"));
    let tls = TlsConfig::psk(&psk_file(&keys_dir.path), mode).expect("PSK config");
    Fixture::start_with(
        name,
        ServerConfig {
            tls: Some(tls),
            ..ServerConfig::default()
        },
    )
}

fn newstyle(fixture: &Fixture) -> RawClient {
    RawClient::start(&fixture.socket, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
}

fn reply_to(client: &mut RawClient, option: u32, payload: &[u8]) -> OptionReplyHeader {
    client.send_option(option, payload);
    let (header, _) = client.read_option_reply();
    assert_eq!(header.option, option);
    header
}

/// An OpenSSL TLS 1.3 PSK client over the raw client's socket, after STARTTLS was acknowledged.
fn tls_client(client: RawClient, key: [u8; 32]) -> SslStream<std::os::unix::net::UnixStream> {
    let mut builder = SslConnector::builder(SslMethod::tls_client()).unwrap();
    builder.set_verify(SslVerifyMode::NONE);
    builder.set_psk_client_callback(move |_, _, identity, key_out| {
        identity[..PSK_IDENTITY.len()].copy_from_slice(PSK_IDENTITY.as_bytes());
        identity[PSK_IDENTITY.len()] = 0;
        key_out[..key.len()].copy_from_slice(&key);
        Ok(key.len())
    });
    let connector = builder.build();
    let mut config = connector.configure().unwrap();
    config.set_verify_hostname(false);
    config.set_use_server_name_indication(false);
    config
        .connect("localhost", client.stream)
        .expect("TLS handshake with the server")
}

fn send_option(stream: &mut impl Write, option: u32, payload: &[u8]) {
    let header = OptionHeader {
        option,
        length_bytes: payload.len() as u32,
    };
    stream.write_all(&header.encode()).unwrap();
    stream.write_all(payload).unwrap();
}

fn read_option_reply(stream: &mut impl Read) -> (OptionReplyHeader, Vec<u8>) {
    let mut header = [0u8; 20];
    stream.read_exact(&mut header).unwrap();
    let header = OptionReplyHeader::decode(&header).unwrap();
    let mut data = vec![0u8; header.length_bytes as usize];
    stream.read_exact(&mut data).unwrap();
    (header, data)
}

/// One simple reply or structured chunk: (cookie, chunk payload, whether the reply is complete).
/// Fails the test on an error reply.
fn read_reply(stream: &mut impl Read) -> (u64, Vec<u8>, bool) {
    let mut magic = [0u8; 4];
    stream.read_exact(&mut magic).unwrap();
    if u32::from_be_bytes(magic) == SIMPLE_REPLY_MAGIC {
        let mut bytes = [0u8; SIMPLE_REPLY_HEADER_BYTES];
        bytes[..4].copy_from_slice(&magic);
        stream.read_exact(&mut bytes[4..]).unwrap();
        let reply = SimpleReply::decode(&bytes).unwrap();
        assert_eq!(reply.error, 0, "request {} failed", reply.cookie);
        return (reply.cookie, Vec::new(), true);
    }
    assert_eq!(u32::from_be_bytes(magic), STRUCTURED_REPLY_MAGIC);
    let mut bytes = [0u8; STRUCTURED_REPLY_HEADER_BYTES];
    bytes[..4].copy_from_slice(&magic);
    stream.read_exact(&mut bytes[4..]).unwrap();
    let header = ChunkHeader::decode(&bytes).unwrap();
    let mut payload = vec![0u8; header.length_bytes as usize];
    stream.read_exact(&mut payload).unwrap();
    assert!(
        header.reply_type < 0x8000,
        "error chunk for {}",
        header.cookie
    );
    (header.cookie, payload, header.is_done())
}

#[test]
fn require_refuses_every_option_but_starttls_and_abort() {
    let fixture = tls_fixture("tls-require", TlsMode::Require);
    let mut client = newstyle(&fixture);
    for option in [OPT_LIST, OPT_STRUCTURED_REPLY, OPT_GO] {
        let payload = if option == OPT_GO {
            InfoRequest::default().encode().unwrap()
        } else {
            Vec::new()
        };
        assert_eq!(
            reply_to(&mut client, option, &payload).reply_type,
            REP_ERR_TLS_REQD
        );
    }
    // An unknown option is refused the same way (the server has not looked at it yet).
    assert_eq!(
        reply_to(&mut client, 0x4242, b"xyz").reply_type,
        REP_ERR_TLS_REQD
    );
    // STARTTLS carries no data.
    assert_eq!(
        reply_to(&mut client, OPT_STARTTLS, b"x").reply_type,
        REP_ERR_INVALID
    );
    assert_eq!(reply_to(&mut client, OPT_ABORT, &[]).reply_type, REP_ACK);

    // EXPORT_NAME cannot carry an error: the connection ends.
    let mut client = newstyle(&fixture);
    client.send_option(OPT_EXPORT_NAME, b"");
    let mut byte = [0u8; 1];
    assert_eq!(client.stream.read(&mut byte).unwrap(), 0);
    assert_eq!(fixture.server.stats().connections_total, 2);
}

#[test]
fn starttls_on_a_server_without_tls_is_unsupported() {
    let fixture = Fixture::start("tls-none");
    let mut client = newstyle(&fixture);
    assert_eq!(
        reply_to(&mut client, OPT_STARTTLS, &[]).reply_type,
        REP_ERR_UNSUP
    );
    // The connection goes on in the clear.
    assert_eq!(
        reply_to(&mut client, OPT_STRUCTURED_REPLY, &[]).reply_type,
        REP_ACK
    );
}

#[test]
fn after_starttls_negotiation_starts_over_and_requests_are_served_through_tls() {
    let fixture = tls_fixture("tls-on", TlsMode::On);
    let mut client = newstyle(&fixture);
    // In the clear first (allowed under `on`); TLS must forget it.
    assert_eq!(
        reply_to(&mut client, OPT_STRUCTURED_REPLY, &[]).reply_type,
        REP_ACK
    );
    assert_eq!(reply_to(&mut client, OPT_STARTTLS, &[]).reply_type, REP_ACK);
    let mut tls = tls_client(client, PSK_KEY);
    send_option(&mut tls, OPT_STARTTLS, &[]);
    let (header, _) = read_option_reply(&mut tls);
    assert_eq!(header.reply_type, REP_ERR_INVALID, "STARTTLS twice");
    send_option(&mut tls, OPT_STRUCTURED_REPLY, &[]);
    let (header, _) = read_option_reply(&mut tls);
    assert_eq!(
        header.reply_type, REP_ACK,
        "structured replies were not forgotten"
    );
    send_option(&mut tls, OPT_GO, &InfoRequest::default().encode().unwrap());
    loop {
        let (header, _) = read_option_reply(&mut tls);
        assert!(!header.is_error(), "{header:?}");
        if header.reply_type == REP_ACK {
            break;
        }
    }
    // A write, then many pipelined writes and reads, so replies from workers and the reader
    // interleave on the TLS channel.
    let rounds = 64u64;
    for round in 0..rounds {
        let write = Request {
            flags: 0,
            command: NbdCommand::Write,
            cookie: round,
            offset_bytes: round * 65536,
            length_bytes: 65536,
        };
        tls.write_all(&write.encode()).unwrap();
        tls.write_all(&pattern(round, 65536)).unwrap();
    }
    let mut acknowledged = 0;
    while acknowledged < rounds {
        let (cookie, payload, done) = read_reply(&mut tls);
        assert!(
            cookie < rounds && payload.is_empty(),
            "write {cookie}: {payload:?}"
        );
        acknowledged += u64::from(done);
    }
    for round in 0..rounds {
        let read = Request {
            flags: 0,
            command: NbdCommand::Read,
            cookie: 1000 + round,
            offset_bytes: round * 65536,
            length_bytes: 65536,
        };
        tls.write_all(&read.encode()).unwrap();
    }
    let mut seen = 0;
    while seen < rounds {
        let (cookie, payload, done) = read_reply(&mut tls);
        let round = cookie - 1000;
        if !payload.is_empty() {
            // OFFSET_DATA: 8 bytes of offset, then the data.
            assert!(
                payload[8..] == pattern(round, 65536)[..],
                "round {round} read back other data"
            );
        }
        seen += u64::from(done);
    }
    assert!(fixture.engine_bytes(0, 65536) == pattern(0, 65536));
}

#[test]
fn a_wrong_psk_ends_only_that_connection() {
    let fixture = tls_fixture("tls-wrong", TlsMode::Require);
    let mut client = newstyle(&fixture);
    assert_eq!(reply_to(&mut client, OPT_STARTTLS, &[]).reply_type, REP_ACK);
    let mut builder = SslConnector::builder(SslMethod::tls_client()).unwrap();
    builder.set_verify(SslVerifyMode::NONE);
    builder.set_psk_client_callback(|_, _, identity, key_out| {
        identity[..PSK_IDENTITY.len()].copy_from_slice(PSK_IDENTITY.as_bytes());
        identity[PSK_IDENTITY.len()] = 0;
        key_out[..32].copy_from_slice(&[0x11; 32]);
        Ok(32)
    });
    let mut config = builder.build().configure().unwrap();
    config.set_verify_hostname(false);
    assert!(config.connect("localhost", client.stream).is_err());
    // The right key still works.
    let mut client = newstyle(&fixture);
    assert_eq!(reply_to(&mut client, OPT_STARTTLS, &[]).reply_type, REP_ACK);
    let mut tls = tls_client(client, PSK_KEY);
    send_option(&mut tls, OPT_LIST, &[]);
    let (header, _) = read_option_reply(&mut tls);
    assert!(!header.is_error(), "{header:?}");
}
