//! The hostile-input targets on seeded inputs: random bytes, and well-formed messages with a
//! few bytes changed (which get past the magic numbers and length checks that random bytes
//! rarely pass). Short, for CI; `cargo fuzz run <target>` in `fuzz/` runs the same targets for
//! as long as you like.
//!
//! A failure prints the seed and the input in hex; `LOGCACHE_SEED=<seed>` replays the run,
//! `LOGCACHE_HOSTILE_CASES=<n>` changes the number of cases per target.

use std::panic::{catch_unwind, AssertUnwindSafe};

use logcache_engine::format::superblock::SUPERBLOCK_MAGIC;
use logcache_hostile::Outcome;
use logcache_nbd::consts::{
    CMD_FLAG_REQ_ONE, IHAVEOPT, OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT, OPT_STARTTLS,
    REQUEST_MAGIC, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC,
};
use logcache_nbd::handshake::{InfoRequest, MetaContextRequest, OptionHeader};
use logcache_nbd::request::{Command, Request};
use logcache_testkit::rng::{seed_from_env, Rng};

fn cases(default: u64) -> u64 {
    std::env::var("LOGCACHE_HOSTILE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs `target` on `n` inputs from `generate`; on a panic, says how to replay it.
fn campaign(name: &str, n: u64, target: fn(&[u8]), generate: impl Fn(&mut Rng) -> Vec<u8>) {
    let seed = seed_from_env("LOGCACHE_SEED");
    let mut rng = Rng::new(seed);
    for case in 0..n {
        let input = generate(&mut rng);
        if catch_unwind(AssertUnwindSafe(|| target(&input))).is_err() {
            panic!(
                "{name}: case {case} panicked; replay with LOGCACHE_SEED={seed} cargo test -p logcache-hostile --test hostile_inputs {name}\ninput: {}",
                hex(&input)
            );
        }
    }
}

fn random_bytes(rng: &mut Rng, max_len: u64) -> Vec<u8> {
    let len = rng.below(max_len + 1) as usize;
    let mut v = vec![0u8; len];
    rng.fill(&mut v);
    v
}

/// Changes a few bytes of `v`, sometimes cuts it short or extends it.
fn mutate(rng: &mut Rng, mut v: Vec<u8>) -> Vec<u8> {
    for _ in 0..rng.below(4) {
        if v.is_empty() {
            break;
        }
        let i = rng.below(v.len() as u64) as usize;
        v[i] ^= 1 << rng.below(8);
    }
    match rng.below(8) {
        0 if !v.is_empty() => v.truncate(rng.below(v.len() as u64) as usize),
        1 => v.extend(random_bytes(rng, 16)),
        2 if v.len() >= 4 => {
            // A length or count field set to something huge.
            let i = rng.below(v.len() as u64 - 3) as usize;
            v[i..i + 4].copy_from_slice(&[0xff, 0xff, 0xff, 0xf0]);
        }
        _ => {}
    }
    v
}

fn with_selector(selector: u8, body: Vec<u8>) -> Vec<u8> {
    let mut v = vec![selector];
    v.extend(body);
    v
}

#[test]
fn nbd_handshake_parsers_reject_or_round_trip() {
    campaign(
        "nbd_handshake",
        cases(30_000),
        logcache_hostile::nbd_handshake,
        |rng| {
            let selector = rng.below(6) as u8;
            let body = match (selector, rng.below(2)) {
                (2, 0) => {
                    let h = OptionHeader {
                        option: rng.below(16) as u32,
                        length_bytes: rng.below(1 << 20) as u32,
                    };
                    let mut v = h.encode().to_vec();
                    v.extend((rng.below(1 << 21) as u32).to_le_bytes());
                    v
                }
                (4, 0) => InfoRequest {
                    export_name: "x".repeat(rng.below(8) as usize),
                    info_types: (0..rng.below(5)).map(|_| rng.below(5) as u16).collect(),
                }
                .encode()
                .unwrap(),
                (5, 0) => MetaContextRequest {
                    export_name: String::new(),
                    queries: (0..rng.below(3))
                        .map(|_| "base:allocation".to_string())
                        .collect(),
                }
                .encode()
                .unwrap(),
                _ => {
                    let mut v = IHAVEOPT.to_be_bytes().to_vec();
                    v.extend(random_bytes(rng, 40));
                    v
                }
            };
            with_selector(selector, mutate(rng, body))
        },
    );
}

#[test]
fn nbd_request_headers_reject_or_round_trip() {
    campaign(
        "nbd_request",
        cases(30_000),
        logcache_hostile::nbd_request,
        |rng| {
            let mut v = random_bytes(rng, 5);
            v.resize(5, 0);
            v.extend(REQUEST_MAGIC.to_be_bytes());
            let mut rest = vec![0u8; 24];
            rng.fill(&mut rest);
            if rng.below(2) == 0 {
                // Small command numbers and lengths, offsets near the end of small exports.
                rest[2] = 0;
                rest[3] = rng.below(12) as u8;
                rest[12..20].copy_from_slice(&rng.below(1 << 24).to_be_bytes());
            }
            v.extend(rest);
            mutate(rng, v)
        },
    );
}

#[test]
fn nbd_reply_parsers_reject_hostile_servers() {
    campaign(
        "nbd_replies",
        cases(30_000),
        logcache_hostile::nbd_replies,
        |rng| {
            let selector = rng.below(7) as u8;
            let mut body = match selector {
                3 => SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec(),
                4 => STRUCTURED_REPLY_MAGIC.to_be_bytes().to_vec(),
                _ => Vec::new(),
            };
            body.extend(random_bytes(rng, 48));
            with_selector(selector, mutate(rng, body))
        },
    );
}

#[test]
fn on_disk_decoders_reject_corruption_without_panicking() {
    campaign(
        "on_disk_metadata",
        cases(20_000),
        logcache_hostile::on_disk_metadata,
        |rng| {
            // Half the time with the checksum fixed up, to reach the fields behind it.
            let selector = (rng.below(3) as u8) | if rng.below(2) == 0 { 0x80 } else { 0 };
            let mut block = vec![0u8; 4096];
            match selector % 3 {
                0 => block[..8].copy_from_slice(&SUPERBLOCK_MAGIC.to_le_bytes()),
                2 => {
                    block[..8].copy_from_slice(b"LCCHUNK\x01");
                    block[8..16].copy_from_slice(&7u64.to_le_bytes());
                    // segment id, seq, synced seq, epoch, then small counts.
                    block[24..32].copy_from_slice(&(10 + rng.below(5)).to_le_bytes());
                    block[32..40].copy_from_slice(&rng.below(10).to_le_bytes());
                    block[50] = 1 + rng.below(2) as u8;
                    block[52] = rng.below(40) as u8;
                    block[54] = rng.below(40) as u8;
                    for i in 0..40usize {
                        let e = 64 + 16 * i;
                        block[e..e + 8].copy_from_slice(&rng.below(1 << 20).to_le_bytes());
                        block[e + 12] = rng.below(5) as u8;
                        block[e + 13] = rng.below(256) as u8;
                        block[e + 14] = rng.below(256) as u8;
                    }
                    block[4095] = rng.below(256) as u8;
                }
                _ => {
                    let mut l = random_bytes(rng, 64);
                    l.resize(64, 0);
                    block[..64].copy_from_slice(&l);
                    block[..8].copy_from_slice(&logcache_label_magic());
                }
            }
            let rest_len = rng.below(4096) as usize;
            rng.fill(&mut block[4096 - rest_len.min(64)..]);
            with_selector(selector, mutate(rng, block))
        },
    );
}

fn logcache_label_magic() -> [u8; 8] {
    // The label codec is the reference: encode one and take its magic.
    let l = logcache_engine::format::label::Label {
        backing_uuid: [0; 16],
        format_id: 0,
        exported_size_bytes: 0,
    };
    l.encode()[..8].try_into().unwrap()
}

/// Corrupted images: each must open or be refused, never panic; both outcomes must occur, or
/// the edits are not reaching recovery (or break everything).
#[test]
fn recovery_of_a_corrupted_cache_errs_or_serves() {
    let opened = std::sync::atomic::AtomicU64::new(0);
    let refused = std::sync::atomic::AtomicU64::new(0);
    let seed = seed_from_env("LOGCACHE_SEED");
    let mut rng = Rng::new(seed);
    for case in 0..cases(400) {
        let input = corrupted_image_edits(&mut rng);
        match catch_unwind(AssertUnwindSafe(|| logcache_hostile::open_corrupted_cache(&input))) {
            Ok(Outcome::Opened) => opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            Ok(Outcome::Refused) => refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            Err(_) => panic!(
                "open_corrupted_cache: case {case} panicked; replay with LOGCACHE_SEED={seed} cargo test -p logcache-hostile --test hostile_inputs recovery\ninput: {}",
                hex(&input)
            ),
        };
    }
    let (opened, refused) = (opened.into_inner(), refused.into_inner());
    eprintln!("corrupted images: {opened} opened, {refused} refused");
    assert!(
        opened > 0 && refused > 0,
        "opened {opened}, refused {refused}"
    );
}

/// Mostly metadata edits with checksums fixed up: random edits of checksummed structures are
/// caught by the checksum alone.
fn corrupted_image_edits(rng: &mut Rng) -> Vec<u8> {
    let flags = if rng.below(4) == 0 { 0 } else { 1 } | if rng.below(10) == 0 { 2 } else { 0 };
    let mut v = vec![flags];
    for _ in 0..1 + rng.below(6) {
        let mut raw = rng.next_u64() as u32;
        if rng.below(4) != 0 {
            raw &= !1;
        }
        v.extend(raw.to_le_bytes());
        v.push(1 << rng.below(8));
    }
    v
}

/// Streams from the encoder (random headers and records), then mutated: bit flips, cuts, huge
/// length fields. Each must decode or be refused, never panic or run away; both outcomes must
/// occur, or the mutations are not reaching past the header (or break everything).
#[test]
fn rbd_diff_streams_decode_or_are_refused() {
    let seed = seed_from_env("LOGCACHE_SEED");
    let mut rng = Rng::new(seed);
    let (mut decoded, mut refused) = (0u64, 0u64);
    for case in 0..cases(20_000) {
        let input = rbd_diff_input(&mut rng);
        match catch_unwind(AssertUnwindSafe(|| logcache_hostile::rbd_diff(&input))) {
            Ok(true) => decoded += 1,
            Ok(false) => refused += 1,
            Err(_) => panic!(
                "rbd_diff: case {case} panicked; replay with LOGCACHE_SEED={seed} cargo test -p logcache-hostile --test hostile_inputs rbd_diff\ninput: {}",
                hex(&input)
            ),
        }
    }
    eprintln!("rbd diff streams: {decoded} decoded, {refused} refused");
    assert!(
        decoded > 0 && refused > 0,
        "decoded {decoded}, refused {refused}"
    );
}

fn rbd_diff_input(rng: &mut Rng) -> Vec<u8> {
    let size_bytes = rng.range(1, 1 << 20);
    let name = |rng: &mut Rng| (rng.below(3) != 0).then(|| random_bytes(rng, 12));
    let header = logcache_diff::Header {
        from_snap: name(rng),
        to_snap: name(rng),
        size_bytes,
    };
    let mut e = logcache_diff::Encoder::new(Vec::new(), &header).unwrap();
    let mut at = 0u64;
    for _ in 0..rng.below(6) {
        at += rng.below(size_bytes / 4 + 1);
        if at >= size_bytes {
            break;
        }
        let len = rng.range(1, (size_bytes - at).min(64));
        if rng.below(2) == 0 {
            let mut data = vec![0u8; len as usize];
            rng.fill(&mut data);
            e.data(at, &data).unwrap();
        } else {
            e.zero(at, len).unwrap();
        }
        at += len;
    }
    let stream = e.finish().unwrap();
    if rng.below(10) == 0 {
        stream
    } else {
        mutate(rng, stream)
    }
}

/// TLS URIs and psktool files built from their pieces, then mutated.
#[test]
fn tls_uris_and_key_files_parse_or_are_refused() {
    campaign(
        "tls_settings",
        cases(20_000),
        logcache_hostile::tls_settings,
        |rng| {
            const PIECES: [&str; 16] = [
                "nbds://",
                "nbds+unix://",
                "nbd://",
                "alice@",
                "host",
                ":10809",
                "/export",
                "?",
                "&",
                "socket=/s",
                "tls-certificates=/pki",
                "tls-psk-file=/k.psk",
                "tls-username=bob",
                "tls-verify-peer=false",
                "%41",
                "alice:00ff\n",
            ];
            let mut text = String::new();
            for _ in 0..rng.below(10) {
                text.push_str(PIECES[rng.below(PIECES.len() as u64) as usize]);
            }
            mutate(rng, text.into_bytes())
        },
    );
}

/// Client sessions against a live server: option haggling, request frames after a good
/// handshake (mostly block status with hostile offsets, lengths and flags), and bytes after
/// STARTTLS (a TLS record cut short, or garbage).
#[test]
fn hostile_sessions_are_answered_and_the_server_keeps_serving() {
    const EXPORT_BYTES: u64 = (8 << 20) - 4096;
    campaign(
        "nbd_session",
        cases(300),
        logcache_hostile::nbd_session,
        |rng| {
            let selector = rng.below(4) as u8;
            let mut v = vec![selector];
            match selector {
                0 => {
                    for _ in 0..rng.below(4) {
                        let option = [OPT_SET_META_CONTEXT, OPT_LIST_META_CONTEXT, OPT_STARTTLS]
                            [rng.below(3) as usize];
                        let payload = if option == OPT_STARTTLS {
                            Vec::new()
                        } else {
                            let queries = ["base:allocation", "base:", "qemu:dirty-bitmap:x", ""];
                            MetaContextRequest {
                                export_name: String::new(),
                                queries: (0..rng.below(3))
                                    .map(|_| queries[rng.below(4) as usize].to_owned())
                                    .collect(),
                            }
                            .encode()
                            .unwrap()
                        };
                        let header = OptionHeader {
                            option,
                            length_bytes: payload.len() as u32,
                        };
                        v.extend(header.encode());
                        v.extend(payload);
                    }
                    v = mutate(rng, v);
                }
                1 | 2 => {
                    for cookie in 0..rng.range(1, 4) {
                        let command = if rng.below(4) == 0 {
                            Command::from_wire(rng.below(12) as u16)
                        } else {
                            Command::BlockStatus
                        };
                        let offset_bytes = match rng.below(4) {
                            0 => EXPORT_BYTES - rng.below(8192),
                            1 => EXPORT_BYTES + rng.below(1 << 20),
                            2 => u64::MAX - rng.below(4096),
                            _ => rng.below(EXPORT_BYTES),
                        };
                        let length_bytes = match rng.below(4) {
                            0 => 0,
                            1 => u32::MAX - rng.below(4096) as u32,
                            _ => rng.below(1 << 24) as u32,
                        };
                        let flags = match rng.below(3) {
                            0 => CMD_FLAG_REQ_ONE,
                            1 => rng.below(1 << 16) as u16,
                            _ => 0,
                        };
                        let request = Request {
                            flags,
                            command,
                            cookie,
                            offset_bytes,
                            length_bytes,
                        };
                        let frame = request.encode().to_vec();
                        v.extend(if rng.below(4) == 0 {
                            mutate(rng, frame)
                        } else {
                            frame
                        });
                    }
                }
                _ => {
                    if rng.below(2) == 0 {
                        // A TLS handshake record promising more than arrives.
                        let length = rng.range(40, 600) as u16;
                        v.extend([0x16, 0x03, 0x01]);
                        v.extend(length.to_be_bytes());
                        v.extend(random_bytes(rng, u64::from(length) - 1));
                    } else {
                        v.extend(random_bytes(rng, 600));
                    }
                }
            }
            v
        },
    );
}

#[test]
fn every_target_through_the_dispatcher() {
    campaign("all", cases(5_000), logcache_hostile::all, |rng| {
        random_bytes(rng, 96)
    });
}
