//! The NBD server against real clients (nbdinfo, qemu-io, nbdcopy, nbdsh, fio) and a raw
//! protocol client, nbdkit-style: each test starts a `Server` in-process on a RAM-backed engine,
//! listening on a Unix socket in its own temp dir (one test uses TCP), and asserts behaviour.
//! A missing client binary fails the test, saying to run scripts/setup.sh.

mod server_support;

use std::net::Shutdown;
use std::os::unix::net::UnixListener;
use std::process::Command;
use std::time::{Duration, Instant};

use logcache_nbd::consts::{
    CMD_FLAG_FUA, CMD_FLAG_REQ_ONE, EINVAL, FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES,
    INFO_BLOCK_SIZE, INFO_DESCRIPTION, INFO_EXPORT, INFO_NAME, OPT_ABORT, OPT_EXPORT_NAME, OPT_GO,
    OPT_INFO, OPT_LIST, OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT, OPT_STARTTLS,
    OPT_STRUCTURED_REPLY, REPLY_TYPE_BLOCK_STATUS, REPLY_TYPE_ERROR, REPLY_TYPE_NONE,
    REPLY_TYPE_OFFSET_DATA, REP_ACK, REP_ERR_INVALID, REP_ERR_UNKNOWN, REP_ERR_UNSUP,
    REP_META_CONTEXT, REP_SERVER,
};
use logcache_nbd::handshake::{InfoRequest, MetaContextRequest, OptionHeader};
use logcache_nbd::option_reply::{BlockSizeConstraints, Info};
use logcache_nbd::reply::{decode_block_status_payload, BlockDescriptor, ErrorPayload};
use logcache_nbd::request::{Command as NbdCommand, Request};
use logcache_server::{Server, ServerConfig, ServerError};
use server_support::*;

// --- Real clients ----------------------------------------------------------------------------

#[test]
fn nbdinfo_sees_the_export_its_flags_and_block_sizes() {
    let fixture = Fixture::start("nbdinfo");
    let export = nbdinfo_export(&fixture.uri());
    assert_eq!(export["export-name"], "logcache");
    assert_eq!(export["description"], "logcache write-back block cache");
    assert_eq!(export["export-size"], fixture.export_size_bytes());
    assert_eq!(export["is_read_only"], false);
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_fast_zero",
        "can_cache",
        "can_multi_conn",
    ] {
        assert_eq!(export[flag], true, "{flag} in {export}");
    }
    assert_eq!(export["block_size_minimum"], 1);
    assert_eq!(export["block_size_preferred"], 4096);
    assert_eq!(export["block_size_maximum"], 32 << 20);
    assert_eq!(export["contexts"], serde_json::json!(["base:allocation"]));

    // OPT_LIST names the export; the name selects it, another name does not.
    let list =
        run("nbdinfo", &["--list", "--json", &fixture.uri()]).expect_success("nbdinfo --list");
    assert!(
        list.stdout.contains("\"export-name\": \"logcache\""),
        "{}",
        list.stdout
    );
    let named = format!("nbd+unix:///logcache?socket={}", fixture.socket.display());
    assert_eq!(nbdinfo_export(&named)["export-name"], "logcache");
    let wrong = format!("nbd+unix:///other?socket={}", fixture.socket.display());
    assert!(!run("nbdinfo", &[&wrong]).status.success());
    let stats = fixture.server.stats();
    assert!(stats.connections_total >= 4, "{stats:?}");
}

#[test]
fn qemu_io_aligned_unaligned_fua_zero_and_discard() {
    let fixture = Fixture::start("qemu-io");
    let uri = fixture.uri();
    let commands = [
        "write -P 0xab 0 1M",
        "read -P 0xab 0 1M",
        "write -P 7 1000 3000",
        "read -P 7 1000 3000",
        "read -P 0xab 0 1000",
        "read -P 0xab 4000 4096",
        "write -f -P 0x33 1M 64k",
        "write -z 2M 128k",
        "write -z 5000 100",
        "read -P 0 2M 128k",
        "read -P 0 5000 100",
        "discard 3M 64k",
        "flush",
        "read -P 0x33 1M 64k",
    ];
    let mut args = vec!["-f", "raw", uri.as_str()];
    for command in &commands {
        args.extend(["-c", command]);
    }
    let run = run("qemu-io", &args).expect_success("qemu-io");
    assert!(
        !run.stdout.contains("verification failed"),
        "{}",
        run.describe()
    );

    // The engine holds exactly what was written, down to the byte.
    let mut model = vec![0xab_u8; 1 << 20];
    model[1000..4000].fill(7);
    model[5000..5100].fill(0);
    assert_eq!(fixture.engine_bytes(0, 1 << 20), model);
    assert_eq!(fixture.engine_bytes(1 << 20, 65536), vec![0x33; 65536]);
    assert_eq!(fixture.engine_bytes(2 << 20, 131072), vec![0; 131072]);
}

#[test]
fn nbdcopy_round_trips_an_image() {
    let fixture = Fixture::start("nbdcopy");
    // Old contents everywhere, so zeroed ranges of the image must really be zeroed.
    let export_bytes = fixture.export_size_bytes() as usize;
    fixture
        .engine
        .write(0, &vec![0xee; export_bytes], false)
        .unwrap();
    let image_bytes = 8 << 20;
    let mut image = pattern(42, image_bytes);
    image[3 << 20..4 << 20].fill(0);
    let image_path = fixture.dir.path.join("in.img");
    std::fs::write(&image_path, &image).unwrap();
    let out_path = fixture.dir.path.join("out.img");
    std::fs::write(&out_path, b"").unwrap();

    let image_arg = image_path.to_str().unwrap();
    let out_arg = out_path.to_str().unwrap();
    run("nbdcopy", &[image_arg, &fixture.uri()]).expect_success("nbdcopy in");
    run("nbdcopy", &[&fixture.uri(), out_arg]).expect_success("nbdcopy out");
    let out = std::fs::read(&out_path).unwrap();
    assert_eq!(out.len(), export_bytes);
    assert!(out[..image_bytes] == image[..], "copied-out image differs");
    assert!(out[image_bytes..].iter().all(|&byte| byte == 0xee));
}

#[test]
fn trim_is_a_hint_and_write_zeroes_reads_as_zeros_in_every_mode() {
    let fixture = Fixture::start("trim-modes");
    for (i, mode) in ["write-back", "write-through", "write-around"]
        .iter()
        .enumerate()
    {
        fixture.engine.set_tunable("cache_mode", mode).unwrap();
        let base = (i as u64) << 22;
        let script = format!(
            r#"
base = {base}
h.pwrite(b"\x77" * (1 << 20), base)
assert h.pread(1 << 20, base) == b"\x77" * (1 << 20)
# TRIM with unaligned ends (a hint: each trimmed sector reads as data written there before or
# zeros, never anything else), and write-zeroes (must read as zeros afterwards).
h.trim(65536 + 1000, base + 3000)
h.zero(8192, base + 512 * 1024, nbd.CMD_FLAG_FUA)
data = h.pread(1 << 20, base)
assert data[:3072] == b"\x77" * 3072
for s in range(3072, 69632, 512):
    assert data[s:s + 512] in (b"\x77" * 512, bytes(512)), f"trimmed sector at {{s}}"
assert data[69632:512 * 1024] == b"\x77" * (512 * 1024 - 69632)
assert data[512 * 1024:512 * 1024 + 8192] == bytes(8192), "zeroed range"
assert data[512 * 1024 + 8192:] == b"\x77" * (512 * 1024 - 8192)
h.flush()
"#
        );
        nbdsh(&fixture.uri(), &[], &script).expect_success(&format!("nbdsh trim ({mode})"));
        // After a drain the backing device alone holds the same image.
        fixture.engine.drain(|_| {}).unwrap();
        let mut raw = vec![0u8; 1 << 20];
        fixture.devices.backing.read_at(&mut raw, base).unwrap();
        let mut expect = vec![0x77u8; 1 << 20];
        expect[512 * 1024..512 * 1024 + 8192].fill(0);
        for s in (3072..69632).step_by(512) {
            // Trimmed: old data or zeros, whichever the backing device's discard left.
            let sector = &raw[s..s + 512];
            assert!(
                sector.iter().all(|&b| b == 0x77) || sector.iter().all(|&b| b == 0),
                "trimmed sector at {s} after drain ({mode})"
            );
            expect[s..s + 512].copy_from_slice(sector);
        }
        assert!(raw == expect, "backing device after drain ({mode})");
    }
    let c = fixture.engine.stats().counters;
    assert_eq!(c.discards, 3, "{c:?}");
    assert_eq!(c.write_zeroes, 3, "{c:?}");
    assert!(c.blocks_invalidated > 0, "{c:?}");
    assert!(
        c.write_through_writes > 0 && c.write_around_writes > 0,
        "{c:?}"
    );
}

#[test]
fn read_misses_are_promoted_and_long_streams_are_not() {
    let fixture = Fixture::start("promote");
    fixture
        .devices
        .backing
        .write_at(&vec![0x3c; 8 << 20], 0)
        .unwrap();
    let script = r#"
# Random 4 KiB reads: promoted, then served from the cache.
for i in range(64):
    assert h.pread(4096, (i * 37 % 64) * 65536) == b"<" * 4096
# A sequential stream of 8 MiB in 64 KiB reads: past the 4 MiB cutoff, no longer promoted.
for i in range(128):
    assert h.pread(65536, (8 << 20) + i * 65536) == bytes(65536)
"#;
    nbdsh(&fixture.uri(), &[], script).expect_success("nbdsh reads");
    let c = fixture.engine.stats().counters;
    assert!(c.promotions >= 64 + 1024, "{c:?}");
    assert!(
        c.promotions < 64 + 2048,
        "the stream past the cutoff was promoted: {c:?}"
    );
    assert!(c.promotions_sequential_skipped > 0, "{c:?}");
    // Reading the random blocks again hits the cache.
    let hits_before = c.read_hits;
    let mut buf = vec![0u8; 4096];
    for i in 0..64u64 {
        fixture.engine.read(i * 65536, &mut buf).unwrap();
    }
    assert_eq!(fixture.engine.stats().counters.read_hits - hits_before, 64);
}

#[test]
fn flush_on_one_connection_is_visible_on_another() {
    let fixture = Fixture::start("multi-conn");
    let script = format!(
        r#"
assert h.can_multi_conn()
h.pwrite(b"\xa5" * 65536, 1 << 20)
h.flush()
h2 = nbd.NBD()
h2.connect_uri({uri:?})
assert h2.pread(65536, 1 << 20) == b"\xa5" * 65536
h2.pwrite(b"\x5a" * 4096, 0, nbd.CMD_FLAG_FUA)
assert h.pread(4096, 0) == b"\x5a" * 4096
h2.shutdown()
"#,
        uri = fixture.uri()
    );
    nbdsh(&fixture.uri(), &[], &script).expect_success("nbdsh");
    assert_eq!(fixture.engine_bytes(1 << 20, 65536), vec![0xa5; 65536]);
}

#[test]
fn many_requests_in_flight_all_complete() {
    let fixture = Fixture::start("aio");
    // Plain writes run inline, FUA writes, flushes, zeroes and trims on workers, so replies
    // come back in a different order than requests; every one must still complete correctly.
    let script = r#"
N = 512
cookies = []
for i in range(N):
    data = bytes([i % 251 + 1]) * 4096
    flags = nbd.CMD_FLAG_FUA if i % 16 == 0 else 0
    cookies.append(h.aio_pwrite(data, i * 8192, flags=flags))
    if i % 64 == 63:
        cookies.append(h.aio_flush())
cookies.append(h.aio_zero(65536, 8 << 20))
cookies.append(h.aio_trim(4096, 16 << 20))
cookies.append(h.aio_cache(1 << 20, 0))
while h.aio_in_flight() > 0:
    h.poll(-1)
for c in cookies:
    assert h.aio_command_completed(c)
reads = [(i, nbd.Buffer(4096)) for i in range(N)]
cookies = [h.aio_pread(buf, i * 8192) for (i, buf) in reads]
while h.aio_in_flight() > 0:
    h.poll(-1)
for c in cookies:
    assert h.aio_command_completed(c)
for i, buf in reads:
    assert buf.to_bytearray() == bytes([i % 251 + 1]) * 4096, i
assert h.pread(65536, 8 << 20) == bytes(65536)
"#;
    nbdsh(&fixture.uri(), &[], script).expect_success("nbdsh aio");
    assert!(fixture.server.stats().requests >= 1024 + 8);
}

#[test]
fn block_status_reports_the_range_as_allocated_data() {
    let fixture = Fixture::start("block-status");
    let script = r#"
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
seen = []
def extent(metacontext, offset, entries, err):
    seen.append((metacontext, offset, list(entries)))
h.block_status(65536, 4096, extent)
assert seen == [("base:allocation", 4096, [65536, 0])], seen
seen.clear()
h.block_status(1 << 20, 0, extent, nbd.CMD_FLAG_REQ_ONE)
assert seen == [("base:allocation", 0, [1 << 20, 0])], seen
try:
    h.block_status(8192, h.get_size() - 4096, extent)
    assert False, "block status past the end succeeded"
except nbd.Error as e:
    assert e.errno == "EINVAL", e
"#;
    nbdsh(
        &fixture.uri(),
        &["--base-allocation"],
        &format!("import errno\n{script}"),
    )
    .expect_success("nbdsh block status");
}

#[test]
fn invalid_requests_get_error_replies_and_the_connection_survives() {
    let fixture = Fixture::start("errors");
    // Strict mode off: libnbd sends what it would otherwise refuse, so the server must judge.
    let script = r#"
import errno
h.set_strict_mode(0)
size = h.get_size()
def expect(errnum, fn, *args):
    try:
        fn(*args)
    except nbd.Error as e:
        assert e.errno == errnum, (fn, args, e.errno, e)
        return
    assert False, ("no error", fn, args)
expect("EINVAL", h.pread, 4096, size)
expect("EINVAL", h.pread, 8192, size - 4096)
expect("EINVAL", h.pwrite, b"x" * 4096, size - 512)
expect("EINVAL", h.pread, 0, 0)
expect("EINVAL", h.pread, 512, 0, nbd.CMD_FLAG_NO_HOLE)
expect("EINVAL", h.trim, 4096, size)
expect("ENOTSUP", h.zero, 4096, 0, nbd.CMD_FLAG_FAST_ZERO)
h.pwrite(b"\x11" * 4096, 0)
assert h.pread(4096, 0) == b"\x11" * 4096
"#;
    nbdsh(&fixture.uri(), &[], script).expect_success("nbdsh errors");
    assert!(fixture.server.stats().protocol_errors >= 6);
}

#[test]
fn fio_random_writes_verify() {
    let fixture = Fixture::start("fio");
    let uri_arg = format!("--uri={}", fixture.uri());
    let jobs: [&[&str]; 2] = [
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            "--size=32m",
            "--verify=crc32c",
        ],
        // Mixed sizes from one sector up, unaligned to 4 KiB.
        &[
            "--rw=randwrite",
            "--bsrange=512-128k",
            "--iodepth=8",
            "--size=16m",
            "--verify=md5",
        ],
    ];
    for job in jobs {
        let mut args = vec![
            "--name=v",
            "--ioengine=nbd",
            uri_arg.as_str(),
            "--do_verify=1",
            "--verify_state_save=0",
        ];
        args.extend_from_slice(job);
        let run = run_in(&fixture.dir.path, "fio", &args).expect_success("fio");
        assert!(!run.stdout.contains("verify:"), "{}", run.describe());
        assert!(run.stdout.contains("err= 0"), "{}", run.describe());
    }
}

#[test]
fn read_only_export_refuses_writes() {
    let config = ServerConfig {
        read_only: true,
        ..ServerConfig::default()
    };
    let fixture = Fixture::start_with("read-only", config);
    fixture.engine.write(0, &[0x42; 4096], false).unwrap();
    let export = nbdinfo_export(&fixture.uri());
    assert_eq!(export["is_read_only"], true);
    let script = r#"
import errno
h.set_strict_mode(0)
assert h.is_read_only()
assert h.pread(4096, 0) == b"\x42" * 4096
for fn, args in [(h.pwrite, (b"x" * 4096, 0)), (h.trim, (4096, 0)), (h.zero, (4096, 0))]:
    try:
        fn(*args)
        assert False, ("write succeeded", fn)
    except nbd.Error as e:
        assert e.errno == "EPERM", e
h.flush()
"#;
    nbdsh(&fixture.uri(), &[], script).expect_success("nbdsh read-only");
    assert_eq!(fixture.engine_bytes(0, 4096), vec![0x42; 4096]);
}

#[test]
fn tcp_listener_serves_real_clients() {
    let fixture = Fixture::start("tcp");
    let addr = fixture
        .server
        .listen_tcp("127.0.0.1:0")
        .expect("listen on TCP");
    assert_ne!(addr.port(), 0);
    let uri = format!("nbd://127.0.0.1:{}", addr.port());
    assert_eq!(
        nbdinfo_export(&uri)["export-size"],
        fixture.export_size_bytes()
    );
    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 9 4k 64k",
            "-c",
            "read -P 9 4k 64k",
        ],
    )
    .expect_success("qemu-io over TCP");
    assert_eq!(fixture.engine_bytes(4096, 65536), vec![9; 65536]);

    // The same port again is a clear error.
    let other = Server::new(fixture.engine.clone(), ServerConfig::default());
    let error = other.listen_tcp(&addr.to_string()).unwrap_err();
    assert!(matches!(error, ServerError::AddressInUse { .. }), "{error}");
    assert!(error.to_string().contains("already in use"), "{error}");
    assert!(other.listen_tcp("no-such-host.invalid:1").is_err());
}

// --- Raw protocol ----------------------------------------------------------------------------

#[test]
fn handshake_options_get_the_replies_the_spec_requires() {
    let fixture = Fixture::start("options");
    let mut client = RawClient::start(&fixture.socket, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    let error_type = |client: &mut RawClient, option: u32, payload: &[u8]| {
        client.send_option(option, payload);
        let (header, _) = client.read_option_reply();
        assert_eq!(header.option, option);
        header.reply_type
    };
    assert_eq!(
        error_type(&mut client, 99, b"ignored payload"),
        REP_ERR_UNSUP
    );
    assert_eq!(error_type(&mut client, OPT_STARTTLS, &[]), REP_ERR_UNSUP);
    assert_eq!(error_type(&mut client, OPT_LIST, b"x"), REP_ERR_INVALID);
    let base = MetaContextRequest {
        export_name: String::new(),
        queries: vec!["base:allocation".to_owned()],
    }
    .encode()
    .unwrap();
    // Metadata contexts need structured replies first.
    assert_eq!(
        error_type(&mut client, OPT_LIST_META_CONTEXT, &base),
        REP_ERR_INVALID
    );
    assert_eq!(error_type(&mut client, OPT_STRUCTURED_REPLY, &[]), REP_ACK);
    assert_eq!(
        error_type(&mut client, OPT_STRUCTURED_REPLY, &[]),
        REP_ERR_INVALID
    );
    assert_eq!(error_type(&mut client, OPT_INFO, b"\0"), REP_ERR_INVALID);
    let unknown = InfoRequest {
        export_name: "other".to_owned(),
        info_types: Vec::new(),
    };
    assert_eq!(
        error_type(&mut client, OPT_INFO, &unknown.encode().unwrap()),
        REP_ERR_UNKNOWN
    );

    client.send_option(OPT_LIST, &[]);
    let servers = client.read_replies_until_ack();
    assert_eq!(servers.len(), 1);
    assert_eq!(servers[0].0.reply_type, REP_SERVER);
    assert_eq!(&servers[0].1[4..], b"logcache");

    // LIST with no query lists base:allocation (id 0); SET selects it with a real id.
    let all = MetaContextRequest::default().encode().unwrap();
    client.send_option(OPT_LIST_META_CONTEXT, &all);
    let listed = client.read_replies_until_ack();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].0.reply_type, REP_META_CONTEXT);
    assert_eq!(&listed[0].1[4..], b"base:allocation");
    client.send_option(OPT_SET_META_CONTEXT, &base);
    let set = client.read_replies_until_ack();
    assert_eq!(set.len(), 1);
    let context_id = u32::from_be_bytes(set[0].1[..4].try_into().unwrap());

    let request = InfoRequest {
        export_name: "logcache".to_owned(),
        info_types: vec![INFO_EXPORT],
    };
    client.send_option(OPT_GO, &request.encode().unwrap());
    let infos: Vec<Info> = client
        .read_replies_until_ack()
        .iter()
        .map(|(_, data)| Info::decode_data(data).unwrap())
        .collect();
    let info_types: Vec<u16> = infos
        .iter()
        .map(|info| match info {
            Info::Export { .. } => INFO_EXPORT,
            Info::Name(_) => INFO_NAME,
            Info::Description(_) => INFO_DESCRIPTION,
            Info::BlockSize(_) => INFO_BLOCK_SIZE,
            Info::Unknown { info_type, .. } => *info_type,
        })
        .collect();
    assert_eq!(
        info_types,
        [INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]
    );
    assert!(infos.contains(&Info::BlockSize(BlockSizeConstraints {
        minimum_bytes: 1,
        preferred_bytes: 4096,
        maximum_payload_bytes: 32 << 20,
    })));

    // Transmission with structured replies: block status, a read, an error, DISC.
    let size = fixture.export_size_bytes();
    let request = |command, flags, cookie, offset_bytes, length_bytes| Request {
        flags,
        command,
        cookie,
        offset_bytes,
        length_bytes,
    };
    client.send_request(
        &request(NbdCommand::BlockStatus, CMD_FLAG_REQ_ONE, 1, 512, 4096),
        &[],
    );
    let (header, payload) = client.read_chunk();
    assert_eq!(
        (header.reply_type, header.cookie),
        (REPLY_TYPE_BLOCK_STATUS, 1)
    );
    assert!(header.is_done());
    let descriptor = BlockDescriptor {
        length_bytes: 4096,
        status_flags: 0,
    };
    assert_eq!(
        decode_block_status_payload(&payload).unwrap(),
        (context_id, vec![descriptor])
    );
    fixture.engine.write(0, &[3; 4096], false).unwrap();
    client.send_request(&request(NbdCommand::Read, 0, 2, 100, 10), &[]);
    let (header, payload) = client.read_chunk();
    assert_eq!(
        (header.reply_type, header.cookie),
        (REPLY_TYPE_OFFSET_DATA, 2)
    );
    assert!(header.is_done());
    assert_eq!(&payload[..8], &100u64.to_be_bytes());
    assert_eq!(&payload[8..], &[3; 10]);
    client.send_request(&request(NbdCommand::Read, 0, 3, size, 512), &[]);
    let (header, payload) = client.read_chunk();
    assert_eq!((header.reply_type, header.cookie), (REPLY_TYPE_ERROR, 3));
    assert!(header.is_done());
    assert_eq!(
        ErrorPayload::decode(header.reply_type, &payload)
            .unwrap()
            .error,
        EINVAL
    );
    client.send_request(&request(NbdCommand::Flush, 0, 4, 0, 0), &[]);
    let (header, _) = client.read_chunk();
    assert_eq!((header.reply_type, header.cookie), (REPLY_TYPE_NONE, 4));
    client.send_request(&request(NbdCommand::Disconnect, 0, 5, 0, 0), &[]);
    assert!(client.is_closed_by_server());
}

#[test]
fn export_name_abort_and_bad_handshakes() {
    let fixture = Fixture::start("export-name");
    let size = fixture.export_size_bytes();
    // EXPORT_NAME: size, flags and 124 zero bytes, or none with NO_ZEROES.
    for (client_flags, reply_bytes) in [
        (FLAG_C_FIXED_NEWSTYLE, 134),
        (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES, 10),
    ] {
        let mut client = RawClient::start(&fixture.socket, client_flags);
        client.send_option(OPT_EXPORT_NAME, b"logcache");
        let reply = client.read_exact(reply_bytes);
        assert_eq!(&reply[..8], &size.to_be_bytes());
        assert!(reply[10..].iter().all(|&byte| byte == 0));
        // Simple replies, since structured replies were not negotiated.
        let write = Request {
            flags: CMD_FLAG_FUA,
            command: NbdCommand::Write,
            cookie: 7,
            offset_bytes: 1000,
            length_bytes: 24,
        };
        client.send_request(&write, &[0x61; 24]);
        let reply = client.read_simple_reply();
        assert_eq!((reply.error, reply.cookie), (0, 7));
        let read = Request {
            command: NbdCommand::Read,
            flags: 0,
            cookie: 8,
            ..write
        };
        client.send_request(&read, &[]);
        assert_eq!(client.read_simple_reply().error, 0);
        assert_eq!(client.read_exact(24), vec![0x61; 24]);
        client.stream.shutdown(Shutdown::Write).unwrap();
        assert!(client.is_closed_by_server());
    }
    // Unknown name: the server can only hang up.
    let mut client = RawClient::start(&fixture.socket, FLAG_C_FIXED_NEWSTYLE);
    client.send_option(OPT_EXPORT_NAME, b"other");
    assert!(client.is_closed_by_server());
    // ABORT: ACK, then close.
    let mut client = RawClient::start(&fixture.socket, FLAG_C_FIXED_NEWSTYLE);
    client.send_option(OPT_ABORT, &[]);
    assert_eq!(client.read_option_reply().0.reply_type, REP_ACK);
    assert!(client.is_closed_by_server());
    // Not fixed newstyle, unknown client flags, oversized option, bad option magic: hang up.
    for flags in [0, FLAG_C_FIXED_NEWSTYLE | 0x100] {
        let mut client = RawClient::start(&fixture.socket, flags);
        assert!(client.is_closed_by_server(), "client flags {flags:#x}");
    }
    let mut client = RawClient::start(&fixture.socket, FLAG_C_FIXED_NEWSTYLE);
    let huge = OptionHeader {
        option: OPT_GO,
        length_bytes: 1 << 20,
    };
    client.send(&huge.encode());
    assert!(client.is_closed_by_server());
    let mut client = RawClient::start(&fixture.socket, FLAG_C_FIXED_NEWSTYLE);
    client.send(b"GARBAGE!GARBAGE!");
    assert!(client.is_closed_by_server());
    assert_eq!(fixture.server.stats().protocol_errors, 4);
}

#[test]
fn garbage_closes_only_that_connection() {
    let fixture = Fixture::start("garbage");
    let mut healthy = RawClient::go(&fixture.socket, true, false);
    let mut broken = RawClient::go(&fixture.socket, true, false);
    broken.send(&[0xde; 28]);
    assert!(broken.is_closed_by_server());
    // A write announcing more than the 32 MiB maximum: hang up rather than skip it.
    let mut oversized = RawClient::go(&fixture.socket, false, false);
    let request = Request {
        flags: 0,
        command: NbdCommand::Write,
        cookie: 1,
        offset_bytes: 0,
        length_bytes: (32 << 20) + 512,
    };
    oversized.send_request(&request, &[]);
    assert!(oversized.is_closed_by_server());
    // An unknown command is an error reply, not a disconnect.
    let unknown = Request {
        command: NbdCommand::Unknown(77),
        length_bytes: 0,
        cookie: 2,
        ..request
    };
    healthy.send_request(&unknown, &[]);
    let (header, payload) = healthy.read_chunk();
    assert_eq!((header.reply_type, header.cookie), (REPLY_TYPE_ERROR, 2));
    assert_eq!(
        ErrorPayload::decode(header.reply_type, &payload)
            .unwrap()
            .error,
        EINVAL
    );
    // The healthy connection and new clients keep working.
    let write = Request {
        flags: 0,
        command: NbdCommand::Write,
        cookie: 3,
        offset_bytes: 8192,
        length_bytes: 4096,
    };
    healthy.send_request(&write, &[0x77; 4096]);
    assert_eq!(healthy.read_chunk().0.reply_type, REPLY_TYPE_NONE);
    run(
        "qemu-io",
        &["-f", "raw", &fixture.uri(), "-c", "read -P 0x77 8k 4k"],
    )
    .expect_success("qemu-io after garbage");
    assert!(fixture.server.stats().protocol_errors >= 3);
}

// --- Life cycle ------------------------------------------------------------------------------

#[test]
fn shutdown_finishes_received_requests_and_data_survives_reopen() {
    let fixture = Fixture::start("shutdown");
    let mut client = RawClient::go(&fixture.socket, true, false);
    let block_bytes = 65536;
    let blocks = 48u64;
    let mut burst = Vec::new();
    for block in 0..blocks {
        let request = Request {
            flags: if block % 8 == 0 { CMD_FLAG_FUA } else { 0 },
            command: NbdCommand::Write,
            cookie: block,
            offset_bytes: block * block_bytes as u64,
            length_bytes: block_bytes as u32,
        };
        burst.extend_from_slice(&request.encode());
        burst.extend_from_slice(&pattern(block, block_bytes));
    }
    let flush = Request {
        flags: 0,
        command: NbdCommand::Flush,
        cookie: blocks,
        offset_bytes: 0,
        length_bytes: 0,
    };
    burst.extend_from_slice(&flush.encode());
    // Everything is sent before shutdown starts; no reply has been read yet.
    client.send(&burst);
    fixture.server.shutdown();
    assert_eq!(fixture.server.active_connections(), 0);
    let mut replied = Vec::new();
    for _ in 0..=blocks {
        let (header, _) = client.read_chunk();
        assert_eq!(header.reply_type, REPLY_TYPE_NONE, "{header:?}");
        replied.push(header.cookie);
    }
    replied.sort_unstable();
    assert_eq!(replied, (0..=blocks).collect::<Vec<_>>());
    assert!(client.is_closed_by_server());
    assert!(!fixture.socket.exists(), "socket file left behind");
    fixture.server.shutdown(); // idempotent
    assert!(matches!(
        fixture.server.listen_unix(&fixture.socket),
        Err(ServerError::ShutDown)
    ));

    // What was acknowledged is there after a clean close and reopen.
    fixture.engine.close().unwrap();
    let reopened = fixture.devices.open();
    for block in 0..blocks {
        let mut data = vec![0u8; block_bytes];
        reopened
            .read(block * block_bytes as u64, &mut data)
            .unwrap();
        assert!(data == pattern(block, block_bytes), "block {block} lost");
    }
    reopened.close().unwrap();
}

#[test]
fn shutdown_returns_while_a_real_client_is_busy() {
    let fixture = Fixture::start("shutdown-fio");
    let uri_arg = format!("--uri={}", fixture.uri());
    let mut command = Command::new(require_tool("fio"));
    command.current_dir(&fixture.dir.path);
    let mut fio = ChildGuard::spawn(command.args([
        "--name=busy",
        "--ioengine=nbd",
        uri_arg.as_str(),
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=32",
        "--size=16m",
        "--time_based",
        "--runtime=60",
    ]));
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    while fixture.server.stats().requests < 2000 {
        assert!(Instant::now() < deadline, "fio never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
    fixture.server.shutdown();
    assert_eq!(fixture.server.active_connections(), 0);
    assert_eq!(fixture.server.stats().connections_active, 0);
    // fio sees its connection end (and fails); it must not hang.
    let run = fio.wait_or_kill();
    assert!(!run.status.success(), "fio kept running after shutdown");
    assert!(!fixture.socket.exists());
}

#[test]
fn stale_socket_is_replaced_and_live_or_foreign_paths_are_refused() {
    let dir = TestDir::new("sockets");
    let devices = Devices::formatted();
    let engine = devices.open();
    let socket = dir.path.join("stale.sock");
    // A socket file left by a dead server: nobody accepts on it.
    drop(UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let server = Server::new(engine.clone(), ServerConfig::default());
    server
        .listen_unix(&socket)
        .expect("replacing a stale socket");
    assert_eq!(
        nbdinfo_export(&unix_uri(&socket))["export-name"],
        "logcache"
    );

    let second = Server::new(engine.clone(), ServerConfig::default());
    let error = second.listen_unix(&socket).unwrap_err();
    assert!(matches!(error, ServerError::SocketInUse { .. }), "{error}");
    assert!(
        error.to_string().contains("in use by another server"),
        "{error}"
    );

    let regular = dir.path.join("file");
    std::fs::write(&regular, b"keep me").unwrap();
    let error = second.listen_unix(&regular).unwrap_err();
    assert!(matches!(error, ServerError::NotASocket { .. }), "{error}");
    assert_eq!(std::fs::read(&regular).unwrap(), b"keep me");

    let bad_config = Server::new(
        engine,
        ServerConfig {
            export_name: "a\0b".to_owned(),
            ..ServerConfig::default()
        },
    );
    assert!(matches!(
        bad_config.listen_unix(&dir.path.join("x.sock")),
        Err(ServerError::InvalidConfig(_))
    ));

    // The first server still serves; shutting it down removes its socket file.
    assert_eq!(
        nbdinfo_export(&unix_uri(&socket))["export-name"],
        "logcache"
    );
    server.shutdown();
    assert!(!socket.exists());
}

#[test]
fn large_reads_of_every_size_and_alignment_return_the_data_written() {
    // Large READs (256 KiB and up) are answered from a worker's huge-page reply buffer, which
    // grows for a larger READ and is let go after one larger than the connection keeps: the
    // sizes below take it through first use, growth past 2 MiB, release after 6 MiB, and reuse;
    // the offsets through whole blocks (read straight into the reply) and sector-aligned ones.
    let fixture = Fixture::start("large-reads");
    let script = r#"
import random
size = 12 << 20
data = random.Random(7).randbytes(size)
for at in range(0, size, 1 << 20):
    h.pwrite(data[at:at + (1 << 20)], at)
h.flush()
for length, offset in [(256 << 10, 0), (1 << 20, 1 << 20), (1 << 20, 4096 + 512),
                       ((2 << 20) + 4096, 3 << 20), (6 << 20, 512), ((1 << 20) - 512, 5 << 20),
                       (1 << 20, 7 << 20)]:
    got = h.pread(length, offset)
    assert got == data[offset:offset + length], f"read of {length} at {offset}"
# Several in flight on one connection, each on its own worker.
reads = [(nbd.Buffer(1 << 20), (i << 20) + (i % 2) * 512) for i in range(8)]
cookies = [h.aio_pread(buf, offset) for buf, offset in reads]
while h.aio_in_flight() > 0:
    h.poll(-1)
for cookie, (buf, offset) in zip(cookies, reads):
    assert h.aio_command_completed(cookie)
    assert buf.to_bytearray() == data[offset:offset + (1 << 20)], f"in flight at {offset}"
"#;
    nbdsh(&fixture.uri(), &[], script).expect_success("nbdsh large reads");
}
