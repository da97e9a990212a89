//! `logcache export-diff` against a real serve: a copy of the disk as of a checkpoint plus the
//! exported diff (applied with `logcache import-diff`) is the disk as of the new checkpoint,
//! byte for byte; the stream is checked record by record (sorted, disjoint, zeros as `z`).

mod common;

use std::fs::File;
use std::io::BufReader;

use common::*;
use logcache_diff::{Decoder, Piece};

fn copy_disk(uri: &str, to: &str) {
    assert_ok(&run(tool("nbdcopy").args([uri, to])), "nbdcopy");
}

/// (offset, length, data) per record, and the `f` and `t` names.
type Records = (Vec<(u64, u64, bool)>, Option<Vec<u8>>, Option<Vec<u8>>);

fn pieces(path: &str) -> Records {
    let mut d = Decoder::new(BufReader::new(File::open(path).unwrap())).expect("a stream");
    let (from, to) = (d.header().from_snap.clone(), d.header().to_snap.clone());
    let mut out: Vec<(u64, u64, bool)> = Vec::new();
    while let Some(p) = d.next_piece().expect("a valid stream") {
        let (off, len, data) = match p {
            Piece::Data {
                offset_bytes,
                bytes,
            } => (offset_bytes, bytes.len() as u64, true),
            Piece::Zero {
                offset_bytes,
                length_bytes,
            } => (offset_bytes, length_bytes, false),
        };
        // A record may come in several pieces: merge what touches and is of one kind.
        match out.last_mut() {
            Some(last) if last.0 + last.1 == off && last.2 == data => last.1 += len,
            _ => out.push((off, len, data)),
        }
    }
    (out, from, to)
}

#[test]
fn a_copy_plus_the_diff_is_the_disk() {
    let dir = TestDir::new("export-diff");
    let (cache, backing) = formatted_pair(&dir, 64 * MIB, 64 * MIB);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    let ctl = served.control().to_string_lossy().into_owned();
    let uri = served.unix_uri();
    qemu_io_ok(&uri, &["write -P 1 0 8M", "write -P 7 24M 1M"]);
    logcache_ok(&["checkpoint", "create", "mon", "--control", &ctl]);
    let copy = dir.s("copy.img");
    sparse(std::path::Path::new(&copy), 64 * MIB - 4096);
    copy_disk(&uri, &copy);
    qemu_io_ok(
        &uri,
        &[
            "write -P 2 1M 64K",
            "write -P 3 3172K 512",
            "write -z 8M 12K",
            "write -z 24M 8K",
            "write -P 4 40M 4K",
        ],
    );
    let diff = dir.s("mon-tue.diff");
    logcache_ok(&[
        "export-diff",
        "--since",
        "mon",
        "--checkpoint",
        "tue",
        "--control",
        &ctl,
        &diff,
    ]);
    let (records, from, to) = pieces(&diff);
    assert_eq!(from.as_deref(), Some(&b"mon"[..]));
    assert_eq!(to.as_deref(), Some(&b"tue"[..]));
    let expect = vec![
        (1 << 20, 64 << 10, true),
        (3172 << 10, 4 << 10, true),
        (8 << 20, 12 << 10, false),
        (24 << 20, 8 << 10, false),
        (40 << 20, 4 << 10, true),
    ];
    assert_eq!(records, expect);
    logcache_ok(&["import-diff", &diff, &copy, "--from", "mon"]);
    let now = dir.s("now.img");
    sparse(std::path::Path::new(&now), 64 * MIB - 4096);
    copy_disk(&uri, &now);
    assert!(
        std::fs::read(&copy).unwrap() == std::fs::read(&now).unwrap(),
        "the copy plus the diff differs from the disk"
    );
    let names = logcache_ok(&["checkpoint", "list", "--control", &ctl]);
    assert!(names.contains("tue"), "{names}");

    // To standard output, with a temporary checkpoint: the same records, no 't'.
    qemu_io_ok(&uri, &["write -P 5 50M 4K"]);
    let out = run(
        std::process::Command::new(env!("CARGO_BIN_EXE_logcache")).args([
            "export-diff",
            "--since",
            "tue",
            "--control",
            &ctl,
            "-",
        ]),
    );
    assert_ok(&out, "export-diff -");
    let piped = dir.s("tue-now.diff");
    std::fs::write(&piped, &out.stdout).unwrap();
    let (records, _, to) = pieces(&piped);
    assert_eq!(to, None);
    assert_eq!(records, vec![(50 << 20, 4096, true)]);
    let list = logcache_ok(&["checkpoint", "list", "--control", &ctl]);
    assert_eq!(
        list.lines().count(),
        3,
        "the temporary checkpoint is gone: {list}"
    );

    fails_with(
        1,
        &[
            "export-diff",
            "--since",
            "nope",
            "--control",
            &ctl,
            &dir.s("x.diff"),
        ],
        &["no checkpoint named \"nope\""],
    );
    assert!(!std::path::Path::new(&dir.s("x.diff")).exists());
}
