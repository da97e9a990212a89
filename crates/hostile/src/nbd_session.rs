//! The [`nbd_session`] target: one hostile client session against a live in-process server,
//! for what no parser alone decides (block status requests the server must answer per the
//! spec, TLS handshakes cut short or replaced by garbage after STARTTLS). After each session
//! a well-behaved client must still be served.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, Engine, FormatOptions, OpenOptions};
use logcache_nbd::consts::{
    FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES, GREETING_BYTES, OPTION_REPLY_HEADER_BYTES, OPT_GO,
    OPT_SET_META_CONTEXT, OPT_STARTTLS, OPT_STRUCTURED_REPLY, REP_ACK, SIMPLE_REPLY_HEADER_BYTES,
};
use logcache_nbd::handshake::{InfoRequest, MetaContextRequest, OptionHeader};
use logcache_nbd::option_reply::OptionReplyHeader;
use logcache_nbd::reply::SimpleReply;
use logcache_nbd::request::{Command, Request};
use logcache_server::{Server, ServerConfig, TlsConfig, TlsMode};

/// Longer than any answer takes; a session still open after it is a hang.
const SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Set by the panic hook when a server thread panics.
static SERVER_PANICKED: AtomicBool = AtomicBool::new(false);

/// The server every session talks to: an engine on RAM devices, STARTTLS offered (PSK).
fn server_socket() -> &'static PathBuf {
    static SOCKET: OnceLock<(Server, PathBuf)> = OnceLock::new();
    &SOCKET
        .get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("logcache-hostile-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("a directory for the hostile server");
            let keys = dir.join("keys.psk");
            std::fs::write(&keys, format!("alice:{}\n", "5a".repeat(32))).expect("key file");
            let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(16 << 20));
            let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(8 << 20));
            format_cache(&*cache, &*backing, &FormatOptions::default()).expect("format");
            let options = OpenOptions {
                ram_buffer_bytes: 1 << 20,
                ..OpenOptions::default()
            };
            let engine = Engine::open(cache, backing, options).expect("open the engine");
            let config = ServerConfig {
                tls: Some(TlsConfig::psk(&keys, TlsMode::On).expect("PSK config")),
                ..ServerConfig::default()
            };
            // A panic on one of the server's threads drops only that session: note it, so the
            // session that caused it fails.
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                if std::thread::current()
                    .name()
                    .is_some_and(|name| name.starts_with("nbd-"))
                {
                    SERVER_PANICKED.store(true, Ordering::SeqCst);
                }
                previous(info);
            }));
            let server = Server::new(engine, config);
            let socket = dir.join("nbd.sock");
            server.listen_unix(&socket).expect("listen");
            (server, socket)
        })
        .1
}

/// Sends `data` as one client session; the first byte picks what comes before it:
/// - 0: nothing (`data` is the whole handshake, after the client flags);
/// - 1: a handshake to transmission with structured replies and `base:allocation` selected
///   (`data` is request frames: block status past the end, of length zero, unknown flags…);
/// - 2: the same without structured replies (block status must then be refused);
/// - 3: STARTTLS, answered (`data` is what arrives where the TLS handshake belongs).
///
/// The client then hangs up; the server must close the session within `SESSION_TIMEOUT`, and
/// a fresh client must get a read served.
pub fn nbd_session(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let socket = server_socket();
    let mut s = connect(socket);
    match selector % 4 {
        0 => {}
        1 => negotiate(&mut s, true),
        2 => negotiate(&mut s, false),
        _ => {
            send_option(&mut s, OPT_STARTTLS, &[]);
            let (header, _) = read_option_reply(&mut s);
            assert_eq!(header.reply_type, REP_ACK, "STARTTLS is offered");
        }
    }
    // The server may close early (a refused handshake): what it does not read is fine.
    let _ = s.write_all(rest);
    let _ = s.shutdown(Shutdown::Write);
    let mut sink = [0u8; 1 << 16];
    loop {
        match s.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                panic!("the server kept a session open {SESSION_TIMEOUT:?} after its client left")
            }
            Err(_) => break, // reset: the server dropped the session
        }
    }
    still_serving(socket);
    assert!(
        !SERVER_PANICKED.load(Ordering::SeqCst),
        "a server thread panicked during this session"
    );
}

fn connect(socket: &PathBuf) -> UnixStream {
    let mut s = UnixStream::connect(socket).expect("connect to the hostile server");
    s.set_read_timeout(Some(SESSION_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(SESSION_TIMEOUT)).unwrap();
    let mut greeting = [0u8; GREETING_BYTES];
    s.read_exact(&mut greeting).expect("the greeting");
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .expect("client flags");
    s
}

fn send_option(s: &mut UnixStream, option: u32, payload: &[u8]) {
    let header = OptionHeader {
        option,
        length_bytes: payload.len() as u32,
    };
    s.write_all(&header.encode()).expect("option header");
    s.write_all(payload).expect("option payload");
}

fn read_option_reply(s: &mut UnixStream) -> (OptionReplyHeader, Vec<u8>) {
    let mut bytes = [0u8; OPTION_REPLY_HEADER_BYTES];
    s.read_exact(&mut bytes).expect("an option reply");
    let header = OptionReplyHeader::decode(&bytes).expect("a valid option reply");
    let mut data = vec![0u8; header.length_bytes as usize];
    s.read_exact(&mut data).expect("option reply data");
    (header, data)
}

fn until_ack(s: &mut UnixStream) {
    loop {
        let (header, data) = read_option_reply(s);
        assert!(!header.is_error(), "option failed: {header:?} {data:?}");
        if header.reply_type == REP_ACK {
            return;
        }
    }
}

/// A well-behaved handshake up to transmission.
fn negotiate(s: &mut UnixStream, structured: bool) {
    if structured {
        send_option(s, OPT_STRUCTURED_REPLY, &[]);
        until_ack(s);
        let request = MetaContextRequest {
            export_name: String::new(),
            queries: vec!["base:allocation".to_owned()],
        };
        send_option(s, OPT_SET_META_CONTEXT, &request.encode().unwrap());
        until_ack(s);
    }
    send_option(s, OPT_GO, &InfoRequest::default().encode().unwrap());
    until_ack(s);
}

/// A fresh client negotiates and reads a sector.
fn still_serving(socket: &PathBuf) {
    let mut s = connect(socket);
    negotiate(&mut s, false);
    let request = Request {
        flags: 0,
        command: Command::Read,
        cookie: 0x600d,
        offset_bytes: 4096,
        length_bytes: 512,
    };
    s.write_all(&request.encode()).expect("a read request");
    let mut header = [0u8; SIMPLE_REPLY_HEADER_BYTES];
    s.read_exact(&mut header).expect("the read's reply");
    let reply = SimpleReply::decode(&header).expect("a simple reply");
    assert_eq!(
        (reply.error, reply.cookie),
        (0, 0x600d),
        "the read was served"
    );
    let mut data = [0u8; 512];
    s.read_exact(&mut data).expect("the read's data");
}
