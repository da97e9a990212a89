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

/// The disk served at `uri` (`size` bytes), copied by nbdcopy into `dir`'s `name`.
fn disk_image(dir: &TestDir, uri: &str, name: &str, size: u64) -> Vec<u8> {
    let file = dir.s(name);
    sparse(std::path::Path::new(&file), size);
    copy_disk(uri, &file);
    std::fs::read(&file).unwrap()
}

/// `logcache export-diff --since SINCE --checkpoint TO --control CTL OUT`, run.
fn export_diff(since: &str, to: &str, ctl: &str, out: &str) -> std::process::Output {
    run(
        std::process::Command::new(env!("CARGO_BIN_EXE_logcache")).args([
            "export-diff",
            "--since",
            since,
            "--checkpoint",
            to,
            "--control",
            ctl,
            out,
        ]),
    )
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
    assert_ok(&export_diff("mon", "tue", &ctl, &diff), "export-diff");
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

/// A client writing with NBD as fast as it can, until `stop` exists: random runs of 1 to 16
/// blocks, each sector holding (write number, sector) so the image can be decoded; each
/// acknowledged write is logged ("number offset length") in order. Debian's python3-libnbd.
const HAMMER: &str = r#"
import nbd, os, random, struct, sys
uri, log, ready, stop = sys.argv[1:5]
h = nbd.NBD()
h.connect_uri(uri)
blocks = h.get_size() // 4096
r = random.Random(int(sys.argv[5]))
gen = 0
with open(log, "w") as f:
    while not os.path.exists(stop):
        gen += 1
        n = r.choice([1, 1, 2, 4, 16])
        off = r.randrange(0, blocks - n + 1) * 4096
        first = off // 512
        h.pwrite(b"".join(struct.pack("<QQ", gen, s) * 32 for s in range(first, first + n * 8)), off)
        f.write(f"{gen} {off} {n * 4096}\n")
        if gen == 50:
            open(ready, "w").close()
h.shutdown()
"#;

/// The write number sector `s` of `img` holds, 0 if it holds `pre`'s bytes; panics on bytes
/// neither put there.
fn decode_gens(img: &[u8], pre: &[u8]) -> Vec<u64> {
    img.chunks(512)
        .zip(pre.chunks(512))
        .enumerate()
        .map(|(s, (b, p))| {
            let gen = u64::from_le_bytes(b[..8].try_into().unwrap());
            let mut want = Vec::with_capacity(512);
            for _ in 0..32 {
                want.extend_from_slice(&gen.to_le_bytes());
                want.extend_from_slice(&(s as u64).to_le_bytes());
            }
            if gen > 0 && b == &want[..] {
                gen
            } else {
                assert!(
                    b == p,
                    "sector {s} holds bytes neither the writer nor the base put there"
                );
                0
            }
        })
        .collect()
}

/// The issue's consistency: the diff describes the disk at one moment, the creation of the new
/// checkpoint, while a client keeps writing. The copy as of `mon` plus the diff must be the
/// disk after exactly the first K acknowledged writes of the hammering client, for some K
/// (writes are one at a time, so every moment of the disk is such a prefix), and the client
/// must have gone on writing after the moment, into blocks the export still had to read.
#[test]
fn an_export_while_a_client_keeps_writing_is_the_disk_at_one_moment() {
    let dir = TestDir::new("export-diff-hammer");
    let (cache, backing) = formatted_pair(&dir, 64 * MIB, 64 * MIB);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    let ctl = served.control().to_string_lossy().into_owned();
    let uri = served.unix_uri();
    let size = 64 * MIB - 4096;
    qemu_io_ok(&uri, &["write -P 1 0 16M"]);
    logcache_ok(&["checkpoint", "create", "mon", "--control", &ctl]);
    let copy = dir.s("copy.img");
    sparse(std::path::Path::new(&copy), size);
    copy_disk(&uri, &copy);
    // A large diff (48 MiB), so the export takes a while and the client's writes land on
    // blocks it has not read yet.
    qemu_io_ok(&uri, &["write -P 2 8M 48M"]);
    let pre = dir.s("pre.img");
    sparse(std::path::Path::new(&pre), size);
    copy_disk(&uri, &pre);

    let (script, log, ready, stop) = (
        dir.s("hammer.py"),
        dir.s("writes.log"),
        dir.s("ready"),
        dir.s("stop"),
    );
    std::fs::write(&script, HAMMER).unwrap();
    let mut writer = std::process::Command::new("/usr/bin/python3")
        .args([&script, &uri, &log, &ready, &stop, "21"])
        .spawn()
        .expect("starting the writer");
    let started = std::time::Instant::now();
    while !std::path::Path::new(&ready).exists() {
        assert!(
            writer.try_wait().unwrap().is_none(),
            "the writer exited early"
        );
        assert!(started.elapsed().as_secs() < 60, "the writer did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let diff = dir.s("mon-tue.diff");
    let out = export_diff("mon", "tue", &ctl, &diff);
    std::fs::write(&stop, b"").unwrap();
    let status =
        wait_timeout(&mut writer, std::time::Duration::from_secs(60)).expect("writer stops");
    assert!(status.success(), "the writer failed");
    assert_ok(&out, "export-diff while a client writes");
    let said = text(&out.stderr);
    assert!(said.contains("as of one moment"), "{said}");

    logcache_ok(&["import-diff", &diff, &copy, "--from", "mon"]);
    let image = decode_gens(
        &std::fs::read(&copy).unwrap(),
        &std::fs::read(&pre).unwrap(),
    );
    let writes: Vec<(u64, u64, u64)> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            (v[0], v[1], v[2])
        })
        .collect();
    // The disk after the first k writes, k = 0, 1, ...: count the sectors that differ from
    // the image, and find a k where none does.
    let mut state = vec![0u64; image.len()];
    let mut differ = image.iter().filter(|&&g| g != 0).count();
    let mut moment = (differ == 0).then_some(0);
    for &(gen, off, len) in &writes {
        for s in (off / 512) as usize..((off + len) / 512) as usize {
            differ -= usize::from(state[s] != image[s]);
            state[s] = gen;
            differ += usize::from(state[s] != image[s]);
        }
        if differ == 0 {
            moment = Some(gen);
        }
    }
    let k = moment.unwrap_or_else(|| {
        panic!(
            "the copy plus the diff is no moment of the disk ({} writes logged; {said})",
            writes.len()
        )
    });
    let after = writes.len() as u64 - k;
    eprintln!(
        "moment after write {k} of {}; {after} writes after it; {said}",
        writes.len()
    );
    assert!(
        after > 0,
        "the client wrote nothing after the moment: the test proved nothing"
    );
    assert!(
        !said.contains("; 0 bytes rewritten"),
        "no write reached a block the export still held: the test proved nothing ({said})"
    );
    // And the disk now is the moment plus the later writes (nothing lost on the way).
    let now = disk_image(&dir, &uri, "now.img", size);
    let now = decode_gens(&now, &std::fs::read(&pre).unwrap());
    assert!(
        now == state,
        "the disk now is not every acknowledged write applied in order"
    );
}

/// The issue's model test against the real binary, across SIGKILLs and clean stops between
/// any two steps, with up to three checkpoints at once, each with a copy of the disk taken
/// when it was created. Steps (seeded): a batch of changes through qemu-io (writes of 512 B to
/// 1 MiB, write-zeroes, TRIM; qemu-io flushes as it closes), a new checkpoint (and its copy),
/// a drain, a SIGKILL and restart, a clean restart, and a backup: `export-diff --since C
/// --checkpoint NEW` applied by `import-diff` to C's copy, which must then equal the disk
/// (so C's bitmap reported every block that changed: over-reporting is allowed, it only ships
/// more), the copy becoming NEW's and C being deleted. After every restart the disk equals the
/// model (flushed data survives), trimmed blocks aside. The cache is small (16 MiB for a
/// 64 MiB disk), so the log wraps and writeback and reclaim run between the steps.
#[test]
fn copies_plus_diffs_equal_the_disk_across_sigkills_with_several_checkpoints() {
    let dir = TestDir::new("export-diff-model");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 64 * MIB);
    let args = ["--cache", cache.as_str(), "--backing", backing.as_str()];
    let mut served = Some(Served::start(&args));
    let size = 64 * MIB - 4096;
    let mut model = vec![0u8; size as usize];
    let mut trimmed = vec![false; (size / 4096) as usize];
    // Active checkpoints: (name, copy file).
    let mut active: Vec<(String, String)> = Vec::new();
    let mut rng = Rng::new(2104);
    let (mut next, mut kills, mut backups) = (0u64, 0, 0);
    let steps: u64 = std::env::var("LOGCACHE_DIFF_MODEL_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    for step in 0..steps {
        let s = served.as_ref().unwrap();
        let (uri, ctl) = (s.unix_uri(), s.control().to_string_lossy().into_owned());
        let what = rng.below(10);
        match what {
            0..=3 => {
                let mut cmds = Vec::new();
                for _ in 0..1 + rng.below(8) {
                    let len = 512 * (1 + rng.below(2048));
                    let off = rng.below((size - len) / 512 + 1) * 512;
                    let (a, b) = (off as usize, (off + len) as usize);
                    match rng.below(8) {
                        0 => {
                            cmds.push(format!("write -z {off} {len}"));
                            model[a..b].fill(0);
                        }
                        1 => {
                            // A hint: whole blocks inside it may read old data or zeros.
                            cmds.push(format!("discard {off} {len}"));
                            for blk in off.div_ceil(4096)..(off + len) / 4096 {
                                trimmed[blk as usize] = true;
                            }
                        }
                        _ => {
                            let p = 1 + rng.below(250) as u8;
                            cmds.push(format!("write -P {p} {off} {len}"));
                            model[a..b].fill(p);
                        }
                    }
                    if !cmds.last().unwrap().starts_with("discard") {
                        // Blocks written whole are known again (a partly written trimmed
                        // block stays unspecified).
                        for blk in off.div_ceil(4096)..(off + len) / 4096 {
                            trimmed[blk as usize] = false;
                        }
                    }
                }
                let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
                qemu_io_ok(&uri, &cmds);
            }
            4 if active.len() < 3 => {
                let name = format!("c{next}");
                next += 1;
                logcache_ok(&["checkpoint", "create", &name, "--control", &ctl]);
                let copy = dir.s(format!("{name}.img"));
                sparse(std::path::Path::new(&copy), size);
                copy_disk(&uri, &copy);
                active.push((name, copy));
            }
            5 => {
                assert_ok(&logcache(&["drain", "--control", &ctl]), "drain");
            }
            6 | 7 => {
                let s = served.take().unwrap();
                if what == 6 {
                    s.kill();
                    kills += 1;
                } else {
                    assert!(s.stop().status.success());
                }
                let s = Served::start(&args);
                let now = disk_image(&dir, &s.unix_uri(), "now.img", size);
                for (blk, &t) in trimmed.iter().enumerate() {
                    let r = blk * 4096..(blk + 1) * 4096;
                    assert!(
                        t || now[r.clone()] == model[r],
                        "step {step}: block {blk} lost flushed data across a restart"
                    );
                }
                served = Some(s);
            }
            _ if !active.is_empty() => {
                let (since, copy) = active.remove(rng.below(active.len() as u64) as usize);
                let name = format!("c{next}");
                next += 1;
                let diff = dir.s("step.diff");
                assert_ok(&export_diff(&since, &name, &ctl, &diff), "export-diff");
                logcache_ok(&["import-diff", &diff, &copy, "--from", &since]);
                assert!(
                    std::fs::read(&copy).unwrap() == disk_image(&dir, &uri, "now.img", size),
                    "step {step}: the copy as of {since} plus the diff differs from the disk"
                );
                logcache_ok(&["checkpoint", "delete", &since, "--control", &ctl]);
                let renamed = dir.s(format!("{name}.img"));
                std::fs::rename(&copy, &renamed).unwrap();
                active.push((name, renamed));
                backups += 1;
            }
            _ => {}
        }
    }
    eprintln!("{steps} steps: {kills} SIGKILLs, {backups} backups checked");
    assert!(kills > 0 && backups > 0, "the seed exercised too little");
}

/// The lines of the `nth` ```sh block after `marker` in README.md.
fn readme_block(marker: &str, nth: usize) -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let mut rest = &readme[readme.find(marker).expect("the README section")..];
    for _ in 0..nth {
        rest = &rest[rest.find("```sh\n").unwrap() + 6..];
        rest = &rest[rest.find("```").unwrap() + 3..];
    }
    let start = rest.find("```sh\n").unwrap() + 6;
    let end = start + rest[start..].find("```").unwrap();
    rest[start..end].lines().map(str::to_owned).collect()
}

/// README's daily backup (the crontab line run twice, without its schedule, `date` answering
/// two nights) and its replication to a second logcache, as written, with the paths and URIs
/// of this test put in: after each night the copy equals the disk; after the replication the
/// replica does.
#[test]
fn the_readme_daily_backup_and_replication_work_as_written() {
    let dir = TestDir::new("readme-backup");
    let (cache, backing) = formatted_pair(&dir, 32 * MIB, 64 * MIB);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    let uri = served.unix_uri();
    let size = 64 * MIB - 4096;
    // The admin commands find this serve the way they find the embedded default's.
    let runtime = dir.join("run");
    std::fs::create_dir(&runtime).unwrap();
    std::os::unix::fs::symlink(served.control(), runtime.join("logcache-default.ctl")).unwrap();
    let shims = dir.join("shims");
    std::fs::create_dir(&shims).unwrap();
    std::fs::write(shims.join("date"), "#!/bin/sh\necho \"$NIGHT\"\n").unwrap();
    std::fs::set_permissions(
        shims.join("date"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_logcache"))
        .parent()
        .unwrap();
    let path_env = format!("{}:{}:/usr/bin:/bin", shims.display(), bin.display());
    let backups = dir.s("backups");
    let sh = |script: &str, night: &str| {
        let script = script
            .replace("/var/backups/vm1", &backups)
            .replace("nbd+unix:///?socket=/path/to/socket", &uri);
        let out = run(std::process::Command::new("/bin/sh")
            .args(["-ec", &script])
            .current_dir(dir.path())
            .env("PATH", &path_env)
            .env("XDG_RUNTIME_DIR", &runtime)
            .env("NIGHT", night));
        assert_ok(&out, &script);
    };
    let disk_equals = |file: &str, what: &str| {
        assert!(
            std::fs::read(file).unwrap() == disk_image(&dir, &uri, "now.img", size),
            "{what} differs from the disk"
        );
    };

    let backup = readme_block("### Daily backup", 0);
    assert_eq!(backup.len(), 3, "{backup:?}");
    let cron = backup[2].splitn(6, ' ').nth(5).unwrap().replace("\\%", "%");
    assert_eq!(
        backup[2].split(' ').take(5).collect::<Vec<_>>(),
        ["0", "2", "*", "*", "*"]
    );
    qemu_io_ok(&uri, &["write -P 1 0 8M"]);
    sh(&format!("{}\n{}", backup[0], backup[1]), "");
    for (night, writes) in [
        ("2026-11-26", ["write -P 2 1M 64K", "write -z 4M 1M"]),
        ("2026-11-27", ["write -P 3 20M 4K", "discard 0 64K"]),
    ] {
        qemu_io_ok(&uri, &writes);
        sh(&cron, night);
        let full = format!("{backups}/full.img");
        disk_equals(&full, &format!("full.img after night {night}"));
        assert!(std::path::Path::new(&format!("{backups}/{night}.diff")).exists());
        assert_eq!(
            std::fs::read_to_string(format!("{backups}/last"))
                .unwrap()
                .trim(),
            night
        );
    }

    let second = TestDir::new("readme-replica");
    let (cache2, backing2) = formatted_pair(&second, 32 * MIB, 64 * MIB);
    let replica = Served::start(&["--cache", &cache2, "--backing", &backing2]);
    let replica_uri = replica.unix_uri();
    let replicate = readme_block("### Replicating", 0);
    assert_eq!(replicate.len(), 2, "{replicate:?}");
    let with_replica =
        |l: &str| l.replace("nbd+unix:///?socket=/path/to/replica.sock", &replica_uri);
    sh(&with_replica(&replicate[0]), "");
    qemu_io_ok(&uri, &["write -P 4 30M 2M", "write -z 0 4K"]);
    sh(&with_replica(&replicate[1]), "");
    disk_image(&dir, &replica_uri, "replica.img", size);
    disk_equals(&dir.s("replica.img"), "the replica");
}

/// The stream `logcache export-diff` writes, compared byte for byte with one built by hand
/// from the layout of Ceph's `doc/dev/rbd-diff.rst` (header line; `f`, `t` as tag, le32
/// length, name; `s` as tag, le64; `w` as tag, le64 offset, le64 length, data; `z` as tag,
/// le64 offset, le64 length; `e`): a 4 KiB write, a 512-byte write (shipped as its whole 4 KiB
/// block), a block written with zeros (a `z` record, not data) and a write-zeroes over data.
#[test]
fn an_exported_stream_is_byte_for_byte_the_hand_built_one() {
    let dir = TestDir::new("export-diff-bytes");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, 16 * MIB);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    let ctl = served.control().to_string_lossy().into_owned();
    let uri = served.unix_uri();
    qemu_io_ok(&uri, &["write -P 9 64K 16K"]);
    logcache_ok(&["checkpoint", "create", "a", "--control", &ctl]);
    qemu_io_ok(
        &uri,
        &[
            "write -P 171 8K 4K",
            "write -P 17 20992 512",
            "write -P 0 28K 4K",
            "write -z 64K 8K",
        ],
    );
    let diff = dir.s("a-bc.diff");
    assert_ok(&export_diff("a", "bc", &ctl, &diff), "export-diff");

    let size_bytes: u64 = 16 * MIB - 4096;
    let mut want = b"rbd diff v1\n".to_vec();
    want.extend([b'f', 1, 0, 0, 0, b'a']);
    want.extend([b't', 2, 0, 0, 0, b'b', b'c']);
    want.push(b's');
    want.extend(size_bytes.to_le_bytes());
    let record = |want: &mut Vec<u8>, tag: u8, offset: u64, len: u64| {
        want.push(tag);
        want.extend(offset.to_le_bytes());
        want.extend(len.to_le_bytes());
    };
    record(&mut want, b'w', 8192, 4096);
    want.extend([171u8; 4096]);
    record(&mut want, b'w', 20480, 4096);
    let mut block = [0u8; 4096];
    block[512..1024].fill(17);
    want.extend(block);
    record(&mut want, b'z', 28672, 4096);
    record(&mut want, b'z', 65536, 8192);
    want.push(b'e');
    let got = std::fs::read(&diff).unwrap();
    if got != want {
        let at = got.iter().zip(&want).position(|(g, w)| g != w);
        panic!(
            "the stream ({} bytes) differs from the hand-built one ({} bytes) first at byte \
             {at:?}",
            got.len(),
            want.len()
        );
    }
}
