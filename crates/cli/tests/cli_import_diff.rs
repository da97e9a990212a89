//! `logcache import-diff` end to end, with streams from `logcache-diff`'s encoder (the Ceph
//! interop tests, with streams from `rbd export-diff`, are in `cli_ceph_rbd.rs`):
//!
//! - a model: random writes and zero ranges, aligned and not, applied from a file and from a
//!   pipe to a file of random bytes, equal to the model; applying twice changes nothing; zero
//!   ranges punch holes (the device's write-zeroes, not written zeros);
//! - onto a served logcache over NBD (replication to a second logcache);
//! - each refusal is one line, and nothing is written when the stream's header does not fit.

mod common;
mod diff_model;

use std::path::Path;
use std::process::Command;

use common::*;
use diff_model::random_record;
use logcache_diff::{Encoder, Header};
use logcache_nbd_client::Client;

const DISK_BYTES: u64 = 8 * MIB;

/// A stream of random records over `model` (changing it as the stream will change a disk),
/// from snapshot `from` to `to`.
fn random_stream(model: &mut [u8], rng: &mut Rng, from: Option<&str>, to: Option<&str>) -> Vec<u8> {
    let size_bytes = model.len() as u64;
    let header = Header {
        from_snap: from.map(|s| s.as_bytes().to_vec()),
        to_snap: to.map(|s| s.as_bytes().to_vec()),
        size_bytes,
    };
    let mut e = Encoder::new(Vec::new(), &header).unwrap();
    let mut at = rng.below(4096);
    // A long aligned zero range at 4 MiB (on disks big enough): it must become a hole.
    let mut zero_done = size_bytes < 6 * MIB;
    while at < size_bytes {
        if !zero_done && at >= 4 * MIB - 300_000 {
            e.zero(4 * MIB, 2 * MIB).unwrap();
            model[(4 * MIB) as usize..(6 * MIB) as usize].fill(0);
            at = 6 * MIB + rng.below(3) * 1000;
            zero_done = true;
            continue;
        }
        let len = (1 + rng.below(70_000)).min(size_bytes - at);
        random_record(&mut e, model, rng, at, len);
        at += len + rng.below(200_000);
    }
    e.finish().unwrap()
}

fn random_file(path: &Path, rng: &mut Rng) -> Vec<u8> {
    let data = rng.bytes(DISK_BYTES as usize);
    std::fs::write(path, &data).unwrap();
    data
}

/// Panics at the first 4 KiB block that differs.
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len())
        .step_by(4096)
        .find(|&i| got[i..(i + 4096).min(got.len())] != want[i..(i + 4096).min(got.len())])
    {
        panic!("{what}: the 4 KiB block at byte {i} differs from the model");
    }
}

#[test]
fn a_stream_applied_to_a_file_equals_the_model_from_a_file_or_a_pipe() {
    let dir = TestDir::new("idiff-file");
    let mut rng = Rng::new(2121);
    let target = dir.join("copy.img");
    let base = random_file(&target, &mut rng);
    let mut model = base.clone();
    let stream = random_stream(&mut model, &mut rng, Some("monday"), Some("tuesday"));
    let diff = dir.join("d.diff");
    std::fs::write(&diff, &stream).unwrap();
    let allocated_before = allocated_bytes(&target);

    let out = logcache_ok(&[
        "import-diff",
        &diff.to_string_lossy(),
        &target.to_string_lossy(),
        "--from",
        "monday",
    ]);
    assert!(
        out.contains("(from 'monday' to 'tuesday')") && out.contains("flushed"),
        "{out}"
    );
    assert_same(
        &std::fs::read(&target).unwrap(),
        &model,
        "after import-diff",
    );
    // The 2 MiB zero range went through write-zeroes: a hole, not 2 MiB of written zeros.
    let allocated_after = allocated_bytes(&target);
    assert!(
        allocated_after + 2 * MIB - 256 * 1024 <= allocated_before,
        "allocated {allocated_before} bytes before, {allocated_after} after"
    );

    // Again: applying a diff twice is harmless.
    logcache_ok(&[
        "import-diff",
        &diff.to_string_lossy(),
        &target.to_string_lossy(),
        "--from",
        "monday",
    ]);
    assert_same(
        &std::fs::read(&target).unwrap(),
        &model,
        "after a second import-diff",
    );

    // From a pipe, onto a fresh copy of the base.
    let second = dir.join("second.img");
    std::fs::write(&second, &base).unwrap();
    let out = run(Command::new("/bin/sh").args([
        "-c",
        &format!(
            "cat {} | {BIN} import-diff - {} --from monday",
            diff.display(),
            second.display()
        ),
    ]));
    assert_ok(&out, "cat DIFF | logcache import-diff - TARGET");
    assert!(
        text(&out.stdout).contains("applied standard input"),
        "{}",
        text(&out.stdout)
    );
    assert_same(
        &std::fs::read(&second).unwrap(),
        &model,
        "after import-diff from a pipe",
    );
}

#[test]
fn a_stream_applied_to_a_served_logcache_over_nbd() {
    let dir = TestDir::new("idiff-nbd");
    // The backing device is the exported size plus logcache's 4 KiB label.
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, DISK_BYTES + 4096);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    let uri = served.unix_uri();
    let mut rng = Rng::new(77);
    let mut model = vec![0u8; DISK_BYTES as usize];
    let stream = random_stream(&mut model, &mut rng, None, Some("replica"));
    let diff = dir.join("full.diff");
    std::fs::write(&diff, &stream).unwrap();
    let out = logcache_ok(&["import-diff", &diff.to_string_lossy(), &uri]);
    assert!(out.contains("(to 'replica')"), "{out}");
    let mut nbd = Client::connect_str(&uri).unwrap();
    let mut got = vec![0u8; DISK_BYTES as usize];
    nbd.read_at(&mut got, 0).unwrap();
    assert_same(&got, &model, "the served disk after import-diff");
    drop(nbd);
    // The served backing device is locked: applying a diff under the cache is refused.
    fails_with(
        1,
        &["import-diff", &diff.to_string_lossy(), &backing],
        &["in use by", "stop it first", "nothing was written"],
    );
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
}

#[test]
fn refusals_are_one_line_and_write_nothing() {
    let dir = TestDir::new("idiff-refuse");
    let mut rng = Rng::new(5);
    let target = dir.join("t.img");
    let base = random_file(&target, &mut rng);
    let t = target.to_string_lossy().into_owned();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_string_lossy().into_owned()
    };
    let mut model = base.clone();
    let since = write(
        "since.diff",
        &random_stream(&mut model, &mut rng, Some("a"), None),
    );
    let full = write(
        "full.diff",
        &random_stream(&mut model.clone(), &mut rng, None, None),
    );
    let mut small = vec![0u8; (DISK_BYTES / 2) as usize];
    let wrong_size = write(
        "small.diff",
        &random_stream(&mut small, &mut rng, None, None),
    );

    fails_with(
        1,
        &["import-diff", &since, &t],
        &["changes since 'a'", "--from 'a'", "nothing was written"],
    );
    fails_with(
        1,
        &["import-diff", &since, &t, "--from", "b"],
        &["since 'a', not since 'b'"],
    );
    fails_with(
        1,
        &["import-diff", &full, &t, "--from", "a"],
        &["no from-snapshot", "without --from"],
    );
    fails_with(
        1,
        &["import-diff", &wrong_size, &t],
        &[
            "a disk of 4194304 bytes",
            "is 8388608 bytes",
            "nothing was written",
        ],
    );
    let junk = write("junk.diff", b"this is not a diff at all");
    fails_with(
        1,
        &["import-diff", &junk, &t],
        &["not a usable diff", "not an rbd diff v1 stream"],
    );
    fails_with(
        1,
        &["import-diff", &dir.s("absent.diff"), &t],
        &["opening the diff", "absent.diff"],
    );
    fails_with(
        1,
        &["import-diff", &full, &dir.s("absent.img")],
        &["target", "does not exist"],
    );
    fails_with(
        1,
        &[
            "import-diff",
            &full,
            "nbd+unix:///?socket=/nonexistent/sock",
        ],
        &["opening target nbd+unix:///?socket=/nonexistent/sock"],
    );
    assert_same(
        &std::fs::read(&target).unwrap(),
        &base,
        "after the refusals",
    );

    // A stream cut short is found only once part of it is applied: the message says so.
    let bytes = std::fs::read(&since).unwrap();
    let cut = write("cut.diff", &bytes[..bytes.len() * 2 / 3]);
    fails_with(
        1,
        &["import-diff", &cut, &t, "--from", "a"],
        &[
            "is damaged",
            "ends early",
            "partly updated",
            "applying one again is harmless",
        ],
    );
    // An intact stream applied afterwards finishes the job.
    logcache_ok(&["import-diff", &since, &t, "--from", "a"]);
    assert_same(
        &std::fs::read(&target).unwrap(),
        &model,
        "after the intact stream",
    );
}
