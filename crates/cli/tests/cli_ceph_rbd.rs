//! logcache in front of a Ceph RBD image (`--backing rbd:POOL/IMAGE?conf=PATH`), against a real
//! one-node cluster that `scripts/ceph-up.sh` starts once for this test binary (and
//! `scripts/ceph-down.sh` removes when it exits, whether the tests passed or not).
//!
//! - the block-semantics model: random writes, reads, trims and flushes through a served
//!   logcache with a small cache (so writeback and reclaim run), every read checked against an
//!   in-memory model; then a drain, after which the image alone (`rbd export`) equals the model;
//! - SIGKILL cycles: flushed data survives each kill, unflushed data reads as one of the values
//!   written; after the last cycle a drain, and again the image alone equals the model;
//! - block status over the image: WRITE_ZEROES ranges reported zero, written ones data, also
//!   after a clean restart and a SIGKILL;
//! - the cache lost under ext4 (issue 25's scenario on RBD): files fsynced while writeback runs
//!   in flush-epoch order, the server SIGKILLed, its cache file deleted, `logcache detach
//!   --force`, and the image opened as a second host would, by a fresh logcache with a new
//!   cache: the filesystem mounts, `e2fsck -fn` finds nothing, and the files that had to reach
//!   the image are there and exact;
//! - read-ahead of sequential misses: the OSD serves 2,048 sequential 4 KiB misses in a few
//!   reads, and write-around writes and write-zeroes into ranges read ahead are what later
//!   sequential reads return (this test holds the cluster alone, to count the OSD's reads);
//! - the exclusive lock: a second logcache on the same image is refused with one clear line;
//! - `rbd diff v1` interop, both ways: `rbd export-diff --from-snap` applied by `logcache
//!   import-diff` to a file exported at the first snapshot equals `rbd export` of the second;
//!   a stream from logcache's encoder (random writes and zero ranges, some not sector-aligned)
//!   applied by `rbd import-diff` to an image equals the model, and creates the `t` snapshot;
//!   `logcache export-diff` piped to `rbd import-diff` replicates a served disk; a stream
//!   exported after a SIGKILL meets what `rbd import-diff` demands of `f`, `t` and `s`.
//!
//! Skipped, with one message, only when the Ceph packages are not installed (scripts/setup.sh
//! installs them: ceph-mon ceph-osd ceph-common librbd-dev).

mod common;
mod diff_model;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{OnceLock, RwLock, RwLockReadGuard};
use std::time::Duration;

use common::attached::{preflight, Attached};
use common::cache_loss::*;
use common::*;
use diff_model::random_record;
use logcache_nbd_client::Client;

const IMAGE_BYTES: u64 = 128 * MIB;
/// A small cache, so that the model test fills it and writeback and reclaim run.
const CACHE_BYTES: u64 = 16 * MIB;
const BLOCK: u64 = 4096;
/// The bytes logcache exports: the image minus its label block at the end.
const EXPORTED_BYTES: u64 = IMAGE_BYTES - BLOCK;

/// The cluster of this test binary.
struct Cluster {
    dir: PathBuf,
    conf: String,
}

fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts")
}

/// Removes the cluster when the test binary exits (libtest exits through `exit`, which runs
/// `atexit` handlers, whether the tests passed or failed).
/// With `LOGCACHE_CEPH_LOGS=DIR` the daemons' logs are copied to DIR/lc-ceph-PID first, to
/// look into a failure after the cluster is gone.
extern "C" fn tear_down_cluster() {
    if let Some(Some(c)) = CLUSTER.get() {
        if let Some(keep) = std::env::var_os("LOGCACHE_CEPH_LOGS") {
            let to = Path::new(&keep).join(format!("lc-ceph-{}", std::process::id()));
            let _ = std::fs::create_dir_all(&to);
            let _ = Command::new("cp")
                .arg("-r")
                .arg(c.dir.join("log"))
                .arg(c.dir.join("ceph.conf"))
                .arg(&to)
                .status();
        }
        let _ = Command::new(scripts_dir().join("ceph-down.sh"))
            .arg(&c.dir)
            .status();
    }
}

static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();

/// The test that stops the OSD holds this for writing, the others for reading: they share the
/// cluster and would stall while it is stopped.
static OSD_GATE: RwLock<()> = RwLock::new(());

fn osd_shared() -> RwLockReadGuard<'static, ()> {
    OSD_GATE.read().unwrap_or_else(|e| e.into_inner())
}

fn ceph_installed() -> bool {
    ["ceph-mon", "ceph-osd", "rbd"].iter().all(|t| {
        ["/usr/bin", "/usr/sbin", "/bin", "/sbin"]
            .iter()
            .any(|d| Path::new(d).join(t).exists())
    })
}

/// The shared cluster, started on first use; `None` (after saying so) when Ceph is missing.
fn cluster() -> Option<&'static Cluster> {
    CLUSTER
        .get_or_init(|| {
            if !ceph_installed() {
                eprintln!(
                    "SKIPPED: the Ceph packages are not installed (scripts/setup.sh installs \
                     ceph-mon ceph-osd ceph-common); the RBD backing is not tested"
                );
                return None;
            }
            let dir = std::env::temp_dir().join(format!("lc-ceph-{}", std::process::id()));
            // SAFETY: registers a plain extern "C" function with no arguments.
            unsafe { libc::atexit(tear_down_cluster) };
            let out = run(Command::new(scripts_dir().join("ceph-up.sh")).arg(&dir));
            assert_ok(&out, "scripts/ceph-up.sh");
            let conf = text(&out.stdout).lines().last().unwrap_or("").to_string();
            assert!(conf.ends_with("ceph.conf"), "ceph-up.sh printed {conf:?}");
            Some(Cluster { dir, conf })
        })
        .as_ref()
}

impl Cluster {
    fn rbd(&self, args: &[&str]) -> String {
        let out = run(tool("rbd").arg("-c").arg(&self.conf).args(args));
        assert_ok(&out, &format!("rbd {}", args.join(" ")));
        text(&out.stdout)
    }

    /// Creates image `name` and returns its backing SPEC.
    fn image(&self, name: &str) -> String {
        self.rbd(&[
            "create",
            "--size",
            &format!("{}M", IMAGE_BYTES / MIB),
            &format!("rbd/{name}"),
        ]);
        format!("rbd:rbd/{name}?conf={}", self.conf)
    }

    /// Creates image `name` of `bytes` and returns its backing SPEC.
    fn small_image(&self, name: &str, bytes: u64) -> String {
        self.rbd(&[
            "create",
            "--size",
            &format!("{}M", bytes / MIB),
            &format!("rbd/{name}"),
        ]);
        format!("rbd:rbd/{name}?conf={}", self.conf)
    }

    /// Client reads the OSD has served since it started (`op_r` of `ceph tell osd.0 perf
    /// dump`).
    fn osd_reads(&self) -> u64 {
        let out = run(tool("ceph")
            .arg("-c")
            .arg(&self.conf)
            .args(["tell", "osd.0", "perf", "dump"]));
        assert_ok(&out, "ceph tell osd.0 perf dump");
        let dump: serde_json::Value = serde_json::from_slice(&out.stdout).expect("perf dump JSON");
        dump["osd"]["op_r"]
            .as_u64()
            .unwrap_or_else(|| panic!("no osd.op_r in the OSD's perf dump"))
    }

    /// The OSD daemon's pid, from its pid file.
    fn osd_pid(&self) -> libc::pid_t {
        let file = self.dir.join("run/ceph-osd.0.pid");
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        text.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{file:?}: {text:?}: {e}"))
    }

    /// Whether the OSD answers plain `rbd` commands, each within `limit`: `rbd info` of image
    /// `name` (its header object), and creating and removing an image (other objects).
    fn answers(&self, name: &str, limit: Duration) -> bool {
        let probe = format!("rbd/probe-{}", std::process::id());
        let info = format!("rbd/{name}");
        let commands: [&[&str]; 3] = [
            &["info", &info],
            &["create", "--size", "4M", &probe],
            &["rm", "--no-progress", &probe],
        ];
        commands.iter().all(|args| {
            let mut child = tool("rbd")
                .arg("-c")
                .arg(&self.conf)
                .args(*args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            match wait_timeout(&mut child, limit) {
                Some(status) => status.success(),
                None => {
                    let _ = child.kill();
                    let _ = child.wait();
                    false
                }
            }
        })
    }

    /// SIGKILLs the OSD and starts it again on its data (it daemonizes, writing its pid file).
    fn restart_osd(&self) {
        let pid = self.osd_pid();
        // SAFETY: kill(2) on the pid from this cluster's pid file.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        // Not our child: wait until it is gone (its data and port are then free).
        while Path::new(&format!("/proc/{pid}")).exists() {
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = run(tool("ceph-osd").arg("-c").arg(&self.conf).args(["-i", "0"]));
        assert_ok(&out, "ceph-osd (restart)");
    }

    /// The image's bytes, read by `rbd export` (bypassing logcache).
    fn export(&self, name: &str, dir: &TestDir) -> Vec<u8> {
        let data = std::fs::read(self.export_file(name, dir)).unwrap();
        assert_eq!(data.len() as u64, IMAGE_BYTES);
        data
    }

    /// `rbd export` of `what` (an image or IMAGE@SNAP) to a file in `dir`; returns its path.
    fn export_file(&self, what: &str, dir: &TestDir) -> PathBuf {
        let file = dir.join(format!("{}.export", what.replace('@', "-at-")));
        self.rbd(&[
            "export",
            "--no-progress",
            &format!("rbd/{what}"),
            &file.to_string_lossy(),
        ]);
        file
    }
}

fn format_cache(dir: &TestDir, backing: &str) -> String {
    format_cache_of(dir, "cache.img", CACHE_BYTES, backing, IMAGE_BYTES)
}

/// Formats a `cache_bytes` cache file `name` for the image `backing` of `image_bytes`.
fn format_cache_of(
    dir: &TestDir,
    name: &str,
    cache_bytes: u64,
    backing: &str,
    image_bytes: u64,
) -> String {
    let cache = dir.s(name);
    sparse(Path::new(&cache), cache_bytes);
    let out = logcache_ok(&[
        "format",
        "--cache",
        &cache,
        "--backing",
        backing,
        "--segment-size",
        "256K",
    ]);
    assert!(
        out.contains(&format!("({} bytes exported", image_bytes - BLOCK)),
        "{out}"
    );
    cache
}

fn serve(cache: &str, backing: &str) -> Served {
    serve_with(cache, backing, &[])
}

/// Serves `cache` over `backing` with `extra` serve options.
fn serve_with(cache: &str, backing: &str, extra: &[&str]) -> Served {
    let mut args = vec!["--cache", cache, "--backing", backing];
    args.extend_from_slice(extra);
    Served::start(&args)
}

fn drain(served: &Served) {
    let ctl = served.control().to_string_lossy().into_owned();
    assert_ok(&logcache(&["drain", "--control", &ctl]), "logcache drain");
    assert_eq!(served.status()["dirty_blocks"].as_u64(), Some(0));
}

/// Panics at the first 4 KiB block where `got` and `want` differ, naming it.
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_same_except(got, want, &[], what);
}

/// As `assert_same`, but blocks whose `unspecified` flag is set (trimmed since last written:
/// TRIM is a hint, their content is old data or zeros) are not compared. `got` starts at block
/// 0 of `unspecified`'s disk when `unspecified` is not empty.
fn assert_same_except(got: &[u8], want: &[u8], unspecified: &[bool], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).step_by(BLOCK as usize).find(|&i| {
        let end = (i + BLOCK as usize).min(got.len());
        let skip = unspecified
            .get(i / BLOCK as usize)
            .copied()
            .unwrap_or(false);
        !skip && got[i..end] != want[i..end]
    }) {
        panic!("{what}: block at byte {i} differs from the model");
    }
}

/// A random 4 KiB-aligned range of 1 to 16 blocks inside the first `region` bytes.
fn random_range(rng: &mut Rng, region: u64) -> (u64, usize) {
    let blocks = 1 + rng.below(16);
    let offset = rng.below(region / BLOCK - blocks) * BLOCK;
    (offset, (blocks * BLOCK) as usize)
}

#[test]
fn model_through_logcache_over_rbd_then_the_image_alone_equals_it() {
    let Some(cluster) = cluster() else { return };
    let _gate = osd_shared();
    let dir = TestDir::new("rbd-model");
    let backing = cluster.image("model");
    let cache = format_cache(&dir, &backing);
    let served = serve(&cache, &backing);
    let mut nbd = Client::connect_str(&served.unix_uri()).unwrap();
    assert_eq!(nbd.size_bytes(), EXPORTED_BYTES);

    // Twice the cache's size in a 32 MiB region: the log wraps, so writeback and reclaim run
    // while reads hit blocks in the cache, on the image, and in between.
    let region = 32 * MIB;
    let mut model = vec![0u8; EXPORTED_BYTES as usize];
    // Blocks trimmed since last written: TRIM is a hint (old data or zeros may read back).
    let mut unspecified = vec![false; (EXPORTED_BYTES / BLOCK) as usize];
    let mut rng = Rng::new(22);
    let mut written_bytes = 0u64;
    let mut op = 0;
    while written_bytes < 2 * CACHE_BYTES {
        let (offset, len) = random_range(&mut rng, region);
        let range = offset as usize..offset as usize + len;
        let blocks = range.start / BLOCK as usize..range.end / BLOCK as usize;
        match rng.below(20) {
            0..=9 => {
                let data = rng.bytes(len);
                nbd.write_at(&data, offset, rng.below(8) == 0).unwrap();
                model[range].copy_from_slice(&data);
                unspecified[blocks].fill(false);
                written_bytes += len as u64;
            }
            10..=15 => {
                let mut got = vec![0u8; len];
                nbd.read_at(&mut got, offset).unwrap();
                assert_same_except(
                    &got,
                    &model[range],
                    &unspecified[blocks],
                    &format!("op {op}: read at {offset}"),
                );
            }
            16 => {
                nbd.trim(offset, len as u64).unwrap();
                unspecified[blocks].fill(true);
            }
            17 => {
                nbd.write_zeroes(offset, len as u64).unwrap();
                model[range].fill(0);
                unspecified[blocks].fill(false);
            }
            _ => nbd.flush().unwrap(),
        }
        op += 1;
    }
    let mut all = vec![0u8; region as usize];
    nbd.read_at(&mut all, 0).unwrap();
    assert_same_except(
        &all,
        &model[..region as usize],
        &unspecified,
        "the region read back",
    );
    nbd.flush().unwrap();
    drop(nbd);

    drain(&served);
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
    let image = cluster.export("model", &dir);
    assert_same_except(
        &image[..EXPORTED_BYTES as usize],
        &model,
        &unspecified,
        "the image after a drain",
    );
    // The cache still opens against the image after a clean stop.
    let out = logcache(&["check", "--cache", &cache, "--backing", &backing]);
    assert_ok(&out, "logcache check against the RBD image");
}

/// Sequential reads that miss the cache are read ahead from the image (`logcache-rbd`'s
/// `readahead.rs`): the OSD serves 2,048 sequential 4 KiB misses in a few large reads. And a
/// write into a range already read ahead is what the later reads return: write-around writes
/// (straight to the image, the cache's copies dropped), some unaligned, and write-zeroes, each a
/// little ahead of a sequential reader, every read checked against a model.
#[test]
fn sequential_misses_are_read_ahead_and_later_reads_see_every_write_into_them() {
    let Some(cluster) = cluster() else { return };
    // Alone on the cluster: the OSD's read count below must be this test's own.
    let _gate = OSD_GATE.write().unwrap_or_else(|e| e.into_inner());
    let dir = TestDir::new("rbd-readahead");
    let backing = cluster.image("readahead");
    let cache = format_cache(&dir, &backing);
    let served = serve_with(&cache, &backing, &["--set", "read_cache=off"]);
    let ctl = served.control().to_string_lossy().into_owned();
    logcache_ok(&["set", "--control", &ctl, "cache_mode=write-around"]);
    let mut nbd = Client::connect_str(&served.unix_uri()).unwrap();
    let region = 24 * MIB;
    let mut rng = Rng::new(2202);
    let mut model = rng.bytes(region as usize);
    for at in (0..region).step_by(MIB as usize) {
        let chunk = &model[at as usize..(at + MIB) as usize];
        nbd.write_at(chunk, at, false).unwrap();
    }

    let before = cluster.osd_reads();
    let mut got = vec![0u8; 4096];
    for at in (0..8 * MIB).step_by(4096) {
        nbd.read_at(&mut got, at).unwrap();
        let want = &model[at as usize..at as usize + 4096];
        assert_same(&got, want, &format!("4 KiB read at {at}"));
    }
    let osd_reads = cluster.osd_reads() - before;
    assert!(
        osd_reads < 256,
        "2,048 sequential 4 KiB misses took {osd_reads} OSD reads: nothing was read ahead"
    );

    let mut got = vec![0u8; 64 << 10];
    let mut at = 8 * MIB;
    let mut changes = 0;
    while at < region {
        nbd.read_at(&mut got, at).unwrap();
        let want = &model[at as usize..at as usize + got.len()];
        assert_same(
            &got,
            want,
            &format!("64 KiB read at {at} after {changes} changes"),
        );
        at += got.len() as u64;
        if rng.below(4) == 0 {
            // Somewhere in the next 8 MiB: inside the buffers read ahead, or just past them.
            let to = (at + rng.below(8 * MIB) / 512 * 512).min(region - 512);
            let len = (512 * (1 + rng.below(256))).min(region - to) as usize;
            let range = to as usize..to as usize + len;
            if rng.below(3) == 0 {
                nbd.write_zeroes(to, len as u64).unwrap();
                model[range].fill(0);
            } else {
                let data = rng.bytes(len);
                nbd.write_at(&data, to, false).unwrap();
                model[range].copy_from_slice(&data);
            }
            changes += 1;
        }
    }
    assert!(changes > 20, "only {changes} changes");
    let mut all = vec![0u8; region as usize];
    nbd.read_at(&mut all, 0).unwrap();
    assert_same(&all, &model, "the region read back whole");
    drop(nbd);
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
    assert_same(
        &cluster.export("readahead", &dir)[..region as usize],
        &model,
        "the image alone",
    );
}

#[test]
fn the_read_ahead_tunable_off_reads_nothing_ahead_and_on_again_reads_ahead() {
    let Some(cluster) = cluster() else { return };
    // Alone on the cluster: the OSD's read counts below must be this test's own.
    let _gate = OSD_GATE.write().unwrap_or_else(|e| e.into_inner());
    let dir = TestDir::new("rbd-readahead-off");
    let backing = cluster.image("readahead-off");
    let cache = format_cache(&dir, &backing);
    let served = serve_with(
        &cache,
        &backing,
        &[
            "--set",
            "read_cache=off",
            "--set",
            "backing_read_ahead_kib=0",
        ],
    );
    let ctl = served.control().to_string_lossy().into_owned();
    logcache_ok(&["set", "--control", &ctl, "cache_mode=write-around"]);
    let status = logcache_ok(&["status", "--control", &ctl]);
    assert!(
        status.contains("backing_read_ahead_kib=0"),
        "status does not show the tunable: {status}"
    );
    let mut nbd = Client::connect_str(&served.unix_uri()).unwrap();
    let region = 8 * MIB;
    let mut rng = Rng::new(2203);
    let model = rng.bytes(region as usize);
    for at in (0..region).step_by(MIB as usize) {
        nbd.write_at(&model[at as usize..(at + MIB) as usize], at, false)
            .unwrap();
    }
    // Reads 4 KiB at a time from `from` for 4 MiB; returns the OSD reads they took.
    let read_4_mib = |nbd: &mut Client, from: u64| {
        let before = cluster.osd_reads();
        let mut got = vec![0u8; 4096];
        for at in (from..from + 4 * MIB).step_by(4096) {
            nbd.read_at(&mut got, at).unwrap();
            assert_same(&got, &model[at as usize..at as usize + 4096], "4 KiB read");
        }
        cluster.osd_reads() - before
    };
    let off = read_4_mib(&mut nbd, 0);
    assert!(
        off >= 1024,
        "1,024 sequential 4 KiB misses with read-ahead off took only {off} OSD reads"
    );
    // Online: the next reads of the stream are read ahead.
    logcache_ok(&["set", "--control", &ctl, "backing_read_ahead_kib=2048"]);
    let on = read_4_mib(&mut nbd, 4 * MIB);
    assert!(
        on < 128,
        "1,024 sequential 4 KiB misses with a 2 MiB window took {on} OSD reads"
    );
    drop(nbd);
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
}

/// What a block may read as after a crash: the flushed value, or any value written since.
struct CrashModel {
    flushed: Vec<u8>,
    /// Blocks written since the last flush: every value each may now hold.
    unflushed: HashMap<u64, Vec<Vec<u8>>>,
}

impl CrashModel {
    fn write(&mut self, offset: u64, data: &[u8]) {
        for (i, chunk) in data.chunks(BLOCK as usize).enumerate() {
            let block = offset / BLOCK + i as u64;
            let at = (block * BLOCK) as usize;
            let old = self.flushed[at..at + BLOCK as usize].to_vec();
            let values = self.unflushed.entry(block).or_insert_with(|| vec![old]);
            values.push(chunk.to_vec());
        }
    }

    fn flush(&mut self) {
        for (block, values) in self.unflushed.drain() {
            let at = (block * BLOCK) as usize;
            self.flushed[at..at + BLOCK as usize].copy_from_slice(values.last().unwrap());
        }
    }

    /// Checks a restarted logcache's contents of `region` and settles each unflushed block to
    /// what it reads as now (later reads must agree).
    fn settle(&mut self, nbd: &mut Client, region: u64, cycle: u32) {
        let mut got = vec![0u8; region as usize];
        nbd.read_at(&mut got, 0).unwrap();
        for (block, values) in self.unflushed.drain() {
            let at = (block * BLOCK) as usize;
            let now = &got[at..at + BLOCK as usize];
            assert!(
                values.iter().any(|v| v == now),
                "cycle {cycle}: unflushed block {block} reads as none of the {} values written",
                values.len()
            );
            self.flushed[at..at + BLOCK as usize].copy_from_slice(now);
        }
        assert_same(
            &got,
            &self.flushed[..region as usize],
            &format!("cycle {cycle}: flushed data"),
        );
    }
}

#[test]
fn sigkill_cycles_keep_flushed_data_and_a_drain_leaves_it_on_the_image() {
    let Some(cluster) = cluster() else { return };
    let _gate = osd_shared();
    let dir = TestDir::new("rbd-kill");
    let backing = cluster.image("kill");
    let cache = format_cache(&dir, &backing);
    let region = 16 * MIB;
    let mut model = CrashModel {
        flushed: vec![0u8; EXPORTED_BYTES as usize],
        unflushed: HashMap::new(),
    };
    let mut rng = Rng::new(2022);
    for cycle in 0..3 {
        let served = serve(&cache, &backing);
        let mut nbd = Client::connect_str(&served.unix_uri()).unwrap();
        model.settle(&mut nbd, region, cycle);
        for _ in 0..40 {
            let (offset, len) = random_range(&mut rng, region);
            let data = rng.bytes(len);
            nbd.write_at(&data, offset, false).unwrap();
            model.write(offset, &data);
        }
        nbd.flush().unwrap();
        model.flush();
        // Acknowledged, never flushed: may be lost by the kill.
        for _ in 0..20 {
            let (offset, len) = random_range(&mut rng, region);
            let data = rng.bytes(len);
            nbd.write_at(&data, offset, false).unwrap();
            model.write(offset, &data);
        }
        served.kill();
    }
    // A restart after the last kill takes the image's lock over from the dead process.
    let served = serve(&cache, &backing);
    let mut nbd = Client::connect_str(&served.unix_uri()).unwrap();
    model.settle(&mut nbd, region, 3);
    drop(nbd);
    drain(&served);
    let image = cluster.export("kill", &dir);
    assert_same(
        &image[..region as usize],
        &model.flushed[..region as usize],
        "the image after a drain",
    );
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
}

/// `nbdinfo --map --json` as (offset, length, zero flag) runs over `[0, end)`.
fn zero_map(uri: &str, end: u64) -> Vec<(u64, u64, bool)> {
    let out = run(Command::new("nbdinfo").args(["--map", "--json", uri]));
    assert_ok(&out, "nbdinfo --map");
    let map: serde_json::Value = serde_json::from_str(&text(&out.stdout)).expect("nbdinfo JSON");
    let mut runs: Vec<(u64, u64, bool)> = Vec::new();
    for e in map.as_array().expect("extents") {
        let (offset, length) = (e["offset"].as_u64().unwrap(), e["length"].as_u64().unwrap());
        let zero = e["type"].as_u64().unwrap() & 2 != 0;
        if offset >= end {
            break;
        }
        let length = length.min(end - offset);
        match runs.last_mut() {
            Some(last) if last.2 == zero => last.1 += length,
            _ => runs.push((offset, length, zero)),
        }
    }
    runs
}

/// An RBD image cannot tell which ranges read as zeros, so block status over it comes from
/// logcache's own record of WRITE_ZEROES ranges: zero where zeroed and not written since, data
/// elsewhere; the same after a clean restart and after a SIGKILL (rebuilt from the log).
#[test]
fn zeroed_ranges_on_an_rbd_image_are_reported_zero() {
    let Some(cluster) = cluster() else { return };
    let _gate = osd_shared();
    let dir = TestDir::new("rbd-zero-map");
    let backing = cluster.image("zeromap");
    let cache = format_cache(&dir, &backing);
    let served = serve(&cache, &backing);
    let mut nbd = Client::connect_str(&served.unix_uri()).unwrap();
    nbd.write_at(&vec![0x5a; 4 * MIB as usize], 0, false)
        .unwrap();
    nbd.write_zeroes(MIB, 2 * MIB).unwrap();
    nbd.write_at(&[0x77; 4096], 2 * MIB, false).unwrap();
    nbd.flush().unwrap();
    drop(nbd);
    let expected = vec![
        (0, MIB, false),
        (MIB, MIB, true),
        (2 * MIB, 4096, false),
        (2 * MIB + 4096, MIB - 4096, true),
        (3 * MIB, 5 * MIB, false),
    ];
    assert_eq!(
        zero_map(&served.unix_uri(), 8 * MIB),
        expected,
        "while serving"
    );
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
    let served = serve(&cache, &backing);
    assert_eq!(
        zero_map(&served.unix_uri(), 8 * MIB),
        expected,
        "after a clean restart"
    );
    served.kill();
    let served = serve(&cache, &backing);
    assert_eq!(
        zero_map(&served.unix_uri(), 8 * MIB),
        expected,
        "after a SIGKILL"
    );
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
}

/// The cache-loss test's image: ext4 (mkfs.xfs wants 300 MiB, more to write to RBD first),
/// with room for the writers' files.
const LOSS_IMAGE_BYTES: u64 = 256 * MIB;
const LOSS_CACHE_BYTES: u64 = 64 * MIB;

/// Issue 25's cache-loss scenario with the RBD image as the backing device: the cache device
/// is lost under a busy filesystem, and the image, opened by another logcache with a new cache
/// (as a second host would after `detach --force`), holds a filesystem a power cut could have
/// left. `LOGCACHE_SEED=N` replays the kill moment and the files.
#[test]
fn the_cache_lost_under_ext4_then_a_fresh_logcache_finds_the_image_clean() {
    let Some(cluster) = cluster() else { return };
    let _gate = osd_shared();
    preflight(&["mkfs.ext4", "e2fsck"]);
    let seed = seed_from_env();
    eprintln!(
        "rbd cache loss: seed {seed} (replay: LOGCACHE_SEED={seed} cargo test -p logcache --test cli_ceph_rbd the_cache_lost)"
    );
    let mut rng = Rng::new(seed);
    let dir = TestDir::new("rbd-loss");
    let backing = cluster.small_image("loss", LOSS_IMAGE_BYTES);
    // Old contents everywhere (mkfs is told not to discard): a file whose data never reached
    // the image but whose extent says it did reads these, not zeros, and is caught.
    {
        let dev =
            logcache_backing::open_backing(&backing, std::time::Duration::from_secs(60)).unwrap();
        let old = vec![STALE_BYTE; 4 * MIB as usize];
        for at in (0..LOSS_IMAGE_BYTES).step_by(old.len()) {
            dev.write_at(&old, at).unwrap();
        }
        dev.flush().unwrap();
    }
    let cache = format_cache_of(
        &dir,
        "cache.img",
        LOSS_CACHE_BYTES,
        &backing,
        LOSS_IMAGE_BYTES,
    );
    // LOGCACHE_LOSS_ORDER=sorted runs the same load without the guarantee (to see the test
    // catch a torn filesystem; CI runs the default, consistent).
    let order = std::env::var("LOGCACHE_LOSS_ORDER").unwrap_or_else(|_| "consistent".into());
    let order_arg = format!("writeback_order={order}");
    let consistent = [
        "--set",
        "writeback_threshold_percent=0",
        "--set",
        &order_arg,
    ];
    let served =
        Served::start(&[&["--cache", &cache, "--backing", &backing][..], &consistent].concat());
    let disk_bytes = LOSS_IMAGE_BYTES - BLOCK;
    let mnt = dir.join("fs");
    let mut att = Attached::new(&dir, &served.unix_uri(), disk_bytes);
    EXT4.make(att.dev());
    att.mount(&mnt, "");
    // A first batch, written back whole before the writers start: these files must be on the
    // image whatever moment the kill picks.
    let written_back = write_files(&mnt, "pre", &mut rng, 8);
    let ctl = served.control().to_string_lossy().into_owned();
    assert_ok(&logcache(&["drain", "--control", &ctl]), "logcache drain");
    let synced = write_until_killed(served, att, &mnt, seed, &mut rng, false);
    // The cache device is gone for good; another host takes the image over.
    std::fs::remove_file(&cache).unwrap();
    let out = logcache_ok(&["detach", "--force", "--backing", &backing]);
    let as_of_unix_s = match detached_as_of_unix_s(&out) {
        Some(t) => t,
        None if order == "sorted" => 0,
        None => panic!("detach does not say which disk is left:\n{out}"),
    };
    eprintln!("rbd cache loss: {}", out.lines().next().unwrap_or(""));

    let dir2 = TestDir::new("rbd-loss-host2");
    // A detached image takes a new cache without --force.
    let cache2 = format_cache_of(
        &dir2,
        "cache.img",
        LOSS_CACHE_BYTES,
        &backing,
        LOSS_IMAGE_BYTES,
    );
    let served = Served::start(
        &[
            &["--cache", &cache2, "--backing", &backing][..],
            &consistent,
        ]
        .concat(),
    );
    let mnt = dir2.join("fs");
    let mut att = Attached::new(&dir2, &served.unix_uri(), disk_bytes);
    EXT4.check_clean(&mut att, &mnt, "the RBD image through a new cache");
    let checked = check_files(&mnt, &written_back, &synced, as_of_unix_s, seed);
    eprintln!(
        "rbd cache loss: {} files fsynced, {} complete and exact on the image, {} of them had to be (written back or fsynced before the as-of time)",
        written_back.len() + synced.len(),
        checked.exact,
        checked.must_have
    );
    assert!(
        checked.exact >= written_back.len() && checked.must_have >= written_back.len(),
        "the written-back files were not all checked"
    );
    att.umount();
    drop(att);
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
}

#[test]
fn a_second_logcache_on_the_same_image_is_refused_by_its_lock() {
    let Some(cluster) = cluster() else { return };
    let _gate = osd_shared();
    let dir = TestDir::new("rbd-lock");
    let backing = cluster.image("lock");
    let cache = format_cache(&dir, &backing);
    let served = serve(&cache, &backing);
    let other = dir.s("other.img");
    sparse(Path::new(&other), CACHE_BYTES);
    let line = fails_with(
        1,
        &["format", "--cache", &other, "--backing", &backing],
        &["rbd/lock", "exclusive lock", "another client holds it"],
    );
    assert!(!line.contains("panicked"), "{line}");
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
    // Released on a clean stop: the image opens again at once.
    let served = serve(&cache, &backing);
    drop(served);
    // A missing image is named, with what to do.
    fails_with(
        1,
        &[
            "format",
            "--cache",
            &other,
            "--backing",
            &format!("rbd:rbd/absent?conf={}", cluster.conf),
        ],
        &["rbd/absent does not exist", "rbd create"],
    );
}

/// Sends SIGCONT to a stopped process when dropped, so that a failing test does not leave the
/// OSD stopped under the other tests.
struct Continue(libc::pid_t);

impl Drop for Continue {
    fn drop(&mut self) {
        // SAFETY: kill(2) with a pid read from the cluster's pid file.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

#[test]
fn a_stopped_osd_fails_writeback_until_it_answers_then_a_new_session_finishes_it() {
    let Some(cluster) = cluster() else { return };
    let _gate = OSD_GATE.write().unwrap_or_else(|e| e.into_inner());
    let dir = TestDir::new("rbd-osd");
    let backing = cluster.image("osd");
    let cache = format_cache(&dir, &backing);
    let served = Served::start(&[
        "--cache",
        &cache,
        "--backing",
        &backing,
        "--backing-timeout",
        "3",
        "--set",
        "writeback_idle_ms=0",
    ]);
    let mut nbd = Client::connect_str(&served.unix_uri()).unwrap();
    let data = Rng::new(7).bytes(256 * 1024);
    let osd = cluster.osd_pid();
    // SAFETY: kill(2) on the OSD's pid; `Continue` resumes it on every way out of this test.
    assert_eq!(unsafe { libc::kill(osd, libc::SIGSTOP) }, 0);
    let resume = Continue(osd);
    // Writes and flushes need only the cache.
    nbd.write_at(&data, 8 * MIB, false).unwrap();
    nbd.flush().unwrap();
    let ctl = served.control().to_string_lossy().into_owned();
    let out = logcache(&["drain", "--control", &ctl]);
    assert!(
        !out.status.success(),
        "drain succeeded with the OSD stopped:\n{}",
        text(&out.stdout)
    );
    let stderr = text(&out.stderr);
    assert!(stderr.contains("rbd:rbd/osd"), "{stderr}");
    drop(resume);
    // Ceph itself, not logcache, stalled once here: after a ~20 s stop every op on the image's
    // header object stayed "delayed" in the resumed OSD for minutes (the monitor never marked
    // the OSD down; the osdmap did not change), so `rbd` itself, this test's export and the
    // next tests' `rbd create`/`rbd export` each waited 90 s. Seen 1 in 15 runs; the cause
    // inside the OSD is not known. Plain `rbd` commands (no logcache) tell that stall apart;
    // it is cured by restarting the OSD, as an operator would, so that this test and the ones
    // after it go on with a cluster that answers.
    if !cluster.answers("osd", Duration::from_secs(30)) {
        eprintln!("the OSD stalled after SIGCONT (rbd did not answer in 30 s); restarting it");
        cluster.restart_osd();
        assert!(
            cluster.answers("osd", Duration::from_secs(90)),
            "the OSD does not answer after a restart"
        );
    }
    // Once the OSD answers, a new session (the lock taken again) finishes the drain. Each try
    // of drain gives up after a few seconds; the session is replaced within a few tries.
    let mut tries = 0;
    loop {
        let out = logcache(&["drain", "--control", &ctl]);
        if out.status.success() {
            break;
        }
        tries += 1;
        assert!(tries < 20, "drain still fails:\n{}", text(&out.stderr));
    }
    let mut got = vec![0u8; data.len()];
    nbd.read_at(&mut got, 8 * MIB).unwrap();
    assert_same(&got, &data, "read through logcache");
    drop(nbd);
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
    let image = cluster.export("osd", &dir);
    assert_same(
        &image[8 * MIB as usize..8 * MIB as usize + data.len()],
        &data,
        "the image after a drain",
    );
}

/// A cluster of one test's own (one that test kills), removed by `scripts/ceph-down.sh` when
/// dropped.
struct OwnCluster {
    dir: PathBuf,
    conf: String,
}

impl OwnCluster {
    fn start(dir: PathBuf, image: &str, size: &str) -> OwnCluster {
        let out = run(Command::new(scripts_dir().join("ceph-up.sh"))
            .arg(&dir)
            .args([image, size]));
        assert_ok(&out, "scripts/ceph-up.sh");
        let conf = text(&out.stdout).lines().last().unwrap_or("").to_string();
        assert!(conf.ends_with("ceph.conf"), "ceph-up.sh printed {conf:?}");
        OwnCluster { dir, conf }
    }

    /// SIGKILLs the daemon whose pid file is run/NAME.pid.
    fn kill(&self, name: &str) {
        let file = self.dir.join(format!("run/{name}.pid"));
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        let pid: libc::pid_t = text.trim().parse().unwrap();
        // SAFETY: kill(2) on a pid from this cluster's own pid file.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "{name}");
    }

    /// Starts the monitor and the OSD again on their data (both daemonize).
    fn restart(&self) {
        for args in [["-i", "a"], ["-i", "0"]] {
            let daemon = if args[1] == "a" {
                "ceph-mon"
            } else {
                "ceph-osd"
            };
            let out = run(tool(daemon).arg("-c").arg(&self.conf).args(args));
            assert_ok(&out, daemon);
        }
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = Command::new(scripts_dir().join("ceph-down.sh"))
            .arg(&self.dir)
            .status();
    }
}

/// The whole cluster dies (OSD and monitor SIGKILLed) under a serve with dirty data: status
/// keeps answering; SIGTERM stops serve (a hang fails the test: `stop` allows 30 s) with one
/// line naming the backing device and the dirty data left;
/// once the cluster is back, the next serve writes the dirty data back. Its own cluster: the
/// others' tests must not see theirs die.
#[test]
fn a_dead_cluster_leaves_status_answering_and_sigterm_stops_serve_with_one_line() {
    if !ceph_installed() {
        return;
    }
    let dir = TestDir::new("rbd-dead");
    let own = OwnCluster::start(dir.join("ceph"), "dead", "64M");
    let backing = format!("rbd:rbd/dead?conf={}", own.conf);
    let cache = format_cache_of(&dir, "cache.img", CACHE_BYTES, &backing, 64 * MIB);
    // Each cluster operation may take this long. librbd's close of an image with writes in
    // flight waits out several of them one after another (the write, the object map, the
    // lock): before the fix a stop took about 5 of them (50 s at 10 s; at the default 60 s,
    // over 200 s, i.e. a hang). serve now gives the stop TIMEOUT_S + 20 s at most.
    const TIMEOUT_S: u64 = 12;
    let timeout = TIMEOUT_S.to_string();
    let args = [
        "--cache",
        &cache,
        "--backing",
        &backing,
        "--backing-timeout",
        &timeout,
        "--set",
        "writeback_idle_ms=0",
    ];
    let served = Served::start(&args);
    let data = Rng::new(11).bytes(8 * MIB as usize);
    let mut nbd = Client::connect_str(&served.unix_uri()).unwrap();
    nbd.write_at(&data, 4 * MIB, false).unwrap();
    nbd.flush().unwrap();
    drop(nbd);
    // Killed while writeback is writing: its writes are in flight on the image.
    own.kill("ceph-osd.0");
    own.kill("ceph-mon.a");
    // Status answers with the cluster dead, and during the stop (state "stopping").
    let s = served.status();
    assert_eq!(s["state"], "serving", "{s}");
    assert!(s["dirty_blocks"].as_u64().unwrap() > 0, "{s}");
    let control = served.control();
    let during = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        logcache(&[
            "status".as_ref(),
            "--json".as_ref(),
            "--control".as_ref(),
            control.as_os_str(),
        ])
    });
    let stopped = served.stop_within(libc::SIGTERM, Duration::from_secs(TIMEOUT_S + 20 + 10));
    let out = during.join().unwrap();
    if out.status.success() {
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(s["state"], "stopping", "{s}");
    } else {
        // Already gone: status says so in one line.
        assert!(
            text(&out.stderr).contains("no logcache is serving"),
            "{}",
            text(&out.stderr)
        );
    }
    let stderr = stopped.stderr.trim_end();
    let after: Vec<&str> = stderr
        .lines()
        .skip_while(|l| !l.contains("SIGTERM"))
        .skip(1)
        .collect();
    eprintln!("serve stopped ({}): {stderr}", stopped.status);
    assert_eq!(after.len(), 1, "one line after SIGTERM:\n{stderr}");
    let line = after[0];
    for want in [
        "rbd:rbd/dead",
        "dirty data",
        "does not answer",
        "the next serve",
    ] {
        assert!(
            line.contains(want),
            "{want:?} missing from the last line:\n{stderr}"
        );
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The cluster back: the next serve writes the dirty data back (the dead serve's lock is
    // broken once the OSD drops its watch), and the image alone holds it.
    own.restart();
    // Returns once the OSD has booted and serves the image.
    let out = run(tool("rbd")
        .arg("-c")
        .arg(&own.conf)
        .args(["info", "rbd/dead"]));
    assert_ok(&out, "rbd info after the restart");
    let served = Served::start(&args[..6]);
    let ctl = served.control().to_string_lossy().into_owned();
    let mut tries = 0;
    while !logcache(&["drain", "--control", &ctl]).status.success() {
        tries += 1;
        assert!(
            tries < 20,
            "drain never succeeded once the cluster was back"
        );
    }
    drop(served);
    let file = dir.join("dead.export");
    let out = run(tool("rbd").arg("-c").arg(&own.conf).args([
        "export",
        "--no-progress",
        "rbd/dead",
        &file.to_string_lossy(),
    ]));
    assert_ok(&out, "rbd export");
    let image = std::fs::read(&file).unwrap();
    assert_same(
        &image[4 * MIB as usize..4 * MIB as usize + data.len()],
        &data,
        "the image after the cluster came back",
    );
}

/// The bytes of the `rbd diff v1` tests' images: small, a few RBD objects (4 MiB each).
const DIFF_IMAGE_BYTES: u64 = 16 * MIB;

/// Random writes (and, with `trims`, a whole-object discard, a partial discard and a
/// write-zeroes) straight to an RBD image through librbd, mirrored in `model`.
fn change_image(spec: &str, model: &mut [u8], rng: &mut Rng, trims: bool) {
    let dev = logcache_backing::open_backing(spec, std::time::Duration::from_secs(60)).unwrap();
    for _ in 0..24 {
        let (offset, len) = random_range(rng, DIFF_IMAGE_BYTES);
        let data = rng.bytes(len);
        dev.write_at(&data, offset).unwrap();
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
    }
    if trims {
        // Object 2 whole, then part of object 1, then write-zeroes across objects 0 and 1.
        let zeroed = [
            (8 * MIB, 4 * MIB),
            (4 * MIB + 64 * 1024, 512 * 1024),
            (3 * MIB, 2 * MIB),
        ];
        for (i, &(offset, len)) in zeroed.iter().enumerate() {
            if i < 2 {
                dev.discard(offset, len).unwrap();
            } else {
                dev.write_zeroes(offset, len).unwrap();
            }
            model[offset as usize..(offset + len) as usize].fill(0);
        }
    }
    dev.flush().unwrap();
}

#[test]
fn rbd_export_diff_applied_by_logcache_import_diff_equals_the_image() {
    let Some(cluster) = cluster() else { return };
    let _gate = osd_shared();
    let dir = TestDir::new("rbd-export-diff");
    let spec = cluster.small_image("dsrc", DIFF_IMAGE_BYTES);
    let mut model = vec![0u8; DIFF_IMAGE_BYTES as usize];
    let mut rng = Rng::new(2101);
    change_image(&spec, &mut model, &mut rng, false);
    cluster.rbd(&["snap", "create", "rbd/dsrc@one"]);
    let copy = cluster.export_file("dsrc@one", &dir);
    assert_same(
        &std::fs::read(&copy).unwrap(),
        &model,
        "rbd export at snapshot one",
    );
    let at_one = model.clone();
    change_image(&spec, &mut model, &mut rng, true);
    cluster.rbd(&["snap", "create", "rbd/dsrc@two"]);
    assert!(at_one != model, "the second round changed nothing");

    // One pipe, as a user would run it.
    let out = run(Command::new("/bin/bash").args([
        "-c",
        &format!(
            "set -o pipefail; rbd -c {} export-diff --no-progress --from-snap one rbd/dsrc@two - \
             | {BIN} import-diff - {} --from one",
            cluster.conf,
            copy.display()
        ),
    ]));
    assert_ok(&out, "rbd export-diff | logcache import-diff");
    let said = text(&out.stdout);
    assert!(said.contains("(from 'one' to 'two')"), "{said}");
    let now = cluster.export_file("dsrc@two", &dir);
    let now = std::fs::read(&now).unwrap();
    assert_same(&now, &model, "rbd export at snapshot two");
    assert_same(
        &std::fs::read(&copy).unwrap(),
        &now,
        "the copy after import-diff, against rbd export at snapshot two",
    );

    // The same stream without --from, or onto a target of another size, is refused.
    let diff = dir.join("one-two.diff");
    cluster.rbd(&[
        "export-diff",
        "--no-progress",
        "--from-snap",
        "one",
        "rbd/dsrc@two",
        &diff.to_string_lossy(),
    ]);
    // Ceph's stream holds both kinds of record, so both were applied above.
    let bytes = std::fs::read(&diff).unwrap();
    let mut decoder = logcache_diff::Decoder::new(&bytes[..]).unwrap();
    let (mut data_pieces, mut zero_bytes) = (0, 0);
    while let Some(piece) = decoder.next_piece().unwrap() {
        match piece {
            logcache_diff::Piece::Data { .. } => data_pieces += 1,
            logcache_diff::Piece::Zero { length_bytes, .. } => zero_bytes += length_bytes,
        }
    }
    eprintln!("rbd export-diff: {data_pieces} data pieces, {zero_bytes} bytes of zero ranges");
    assert!(
        data_pieces > 0 && zero_bytes >= 4 * MIB,
        "{data_pieces} {zero_bytes}"
    );
    fails_with(
        1,
        &[
            "import-diff",
            &diff.to_string_lossy(),
            &copy.to_string_lossy(),
        ],
        &["changes since 'one'", "--from 'one'"],
    );
    let other = dir.join("other.img");
    sparse(&other, DIFF_IMAGE_BYTES * 2);
    fails_with(
        1,
        &[
            "import-diff",
            &diff.to_string_lossy(),
            &other.to_string_lossy(),
            "--from",
            "one",
        ],
        &["a disk of 16777216 bytes", "33554432 bytes"],
    );
}

#[test]
fn logcache_diff_stream_applied_by_rbd_import_diff_equals_the_model() {
    let Some(cluster) = cluster() else { return };
    let _gate = osd_shared();
    let dir = TestDir::new("rbd-import-diff");
    let spec = cluster.small_image("ddst", DIFF_IMAGE_BYTES);
    let mut model = vec![0u8; DIFF_IMAGE_BYTES as usize];
    let mut rng = Rng::new(2102);
    change_image(&spec, &mut model, &mut rng, false);
    cluster.rbd(&["snap", "create", "rbd/ddst@base"]);

    // The model's next state as logcache's encoder writes it: sorted, disjoint records, writes
    // and zero ranges, a third of them starting or ending inside a sector.
    let header = logcache_diff::Header {
        from_snap: Some(b"base".to_vec()),
        to_snap: Some(b"next".to_vec()),
        size_bytes: DIFF_IMAGE_BYTES,
    };
    let mut e = logcache_diff::Encoder::new(Vec::new(), &header).unwrap();
    let mut at = 0u64;
    while at < DIFF_IMAGE_BYTES {
        let mut len = 512 * (1 + rng.below(256));
        if rng.below(3) == 0 {
            len += 1 + rng.below(511);
        }
        let len = len.min(DIFF_IMAGE_BYTES - at);
        random_record(&mut e, &mut model, &mut rng, at, len);
        at += len + rng.below(2 * MIB / 3);
    }
    assert!(e.records() > 10, "{} records", e.records());
    let diff = dir.join("model.diff");
    std::fs::write(&diff, e.finish().unwrap()).unwrap();

    cluster.rbd(&[
        "import-diff",
        "--no-progress",
        &diff.to_string_lossy(),
        "rbd/ddst",
    ]);
    let now = std::fs::read(cluster.export_file("ddst", &dir)).unwrap();
    assert_same(&now, &model, "the image after rbd import-diff");
    let snaps = cluster.rbd(&["snap", "ls", "rbd/ddst"]);
    assert!(
        snaps.contains("next"),
        "rbd import-diff made no snapshot 'next':\n{snaps}"
    );
}

/// Replication to Ceph, as README gives it: a served logcache's disk copied whole into an RBD
/// image (`rbd import`, snapshot `base`), then twice `logcache export-diff --since A
/// --checkpoint B - | rbd import-diff - IMAGE`; after each, `rbd export` of the image equals
/// the logcache disk byte for byte, and the image has snapshot B.
#[test]
fn logcache_export_diff_piped_to_rbd_import_diff_replicates_the_disk() {
    let Some(cluster) = cluster() else { return };
    let _gate = osd_shared();
    let dir = TestDir::new("rbd-replicate");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, DIFF_IMAGE_BYTES + BLOCK);
    let served = serve(&cache, &backing);
    let ctl = served.control().to_string_lossy().into_owned();
    let uri = served.unix_uri();
    qemu_io_ok(&uri, &["write -P 1 0 6M", "write -P 2 9M 3M"]);
    logcache_ok(&["checkpoint", "create", "base", "--control", &ctl]);
    let full = dir.s("full.img");
    sparse(Path::new(&full), DIFF_IMAGE_BYTES);
    assert_ok(&run(tool("nbdcopy").args([&uri, &full])), "nbdcopy");
    cluster.rbd(&["import", "--no-progress", &full, "rbd/repl"]);
    cluster.rbd(&["snap", "create", "rbd/repl@base"]);
    let rounds: [(&str, &str, &[&str]); 2] = [
        (
            "base",
            "mon",
            &[
                "write -P 3 1M 64K",
                "write -P 4 5M 2M",
                "write -z 9M 1M",
                "discard 10M 256K",
                "write -P 5 15M 4K",
            ],
        ),
        (
            "mon",
            "tue",
            &["write -P 6 0 4K", "write -z 4M 5M", "write -P 7 14M 1M"],
        ),
    ];
    for (since, to, writes) in rounds {
        qemu_io_ok(&uri, writes);
        let out = run(Command::new("/bin/bash").args([
            "-c",
            &format!(
                "set -o pipefail; {BIN} export-diff --since {since} --checkpoint {to} --control {ctl} - \
                 | rbd -c {} import-diff --no-progress - rbd/repl",
                cluster.conf
            ),
        ]));
        assert_ok(&out, "logcache export-diff | rbd import-diff");
        let disk = dir.s(format!("disk-{to}.img"));
        sparse(Path::new(&disk), DIFF_IMAGE_BYTES);
        assert_ok(&run(tool("nbdcopy").args([&uri, &disk])), "nbdcopy");
        let exported = cluster.export_file("repl", &dir);
        let image = std::fs::read(&exported).unwrap();
        std::fs::remove_file(exported).unwrap();
        assert_same(
            &image,
            &std::fs::read(&disk).unwrap(),
            &format!("rbd export after the diff from {since} to {to}"),
        );
        let snaps = cluster.rbd(&["snap", "ls", "rbd/repl"]);
        assert!(
            snaps.contains(to),
            "rbd import-diff made no snapshot {to}:\n{snaps}"
        );
    }
}

/// What `rbd import-diff` (Ceph 16) demands of a stream, and logcache's meeting it, with a
/// stream exported after a SIGKILL and restart of serve: the `f` snapshot must exist in the
/// image (else it is refused before any write, "start snapshot ... does not exist"), the `t`
/// snapshot must not (import-diff creates it at the end, so applying the stream twice is
/// refused), and `s` sets the image's size (here the image was grown past the disk). Then `rbd
/// export` equals the logcache disk byte for byte.
#[test]
fn rbd_import_diff_checks_f_t_and_s_of_a_logcache_stream_exported_after_a_sigkill() {
    let Some(cluster) = cluster() else { return };
    let _gate = osd_shared();
    let dir = TestDir::new("rbd-diff-kill");
    let (cache, backing) = formatted_pair(&dir, 16 * MIB, DIFF_IMAGE_BYTES + BLOCK);
    let args = ["--cache", cache.as_str(), "--backing", backing.as_str()];
    let served = Served::start(&args);
    let ctl = served.control().to_string_lossy().into_owned();
    qemu_io_ok(&served.unix_uri(), &["write -P 1 0 5M", "write -P 2 8M 4M"]);
    logcache_ok(&["checkpoint", "create", "base", "--control", &ctl]);
    let full = dir.s("full.img");
    sparse(Path::new(&full), DIFF_IMAGE_BYTES);
    let uri = served.unix_uri();
    assert_ok(&run(tool("nbdcopy").args([&uri, &full])), "nbdcopy");
    cluster.rbd(&["import", "--no-progress", &full, "rbd/kdiff"]);
    cluster.rbd(&["resize", "--no-progress", "--size", "32M", "rbd/kdiff"]);

    // Changes on both sides of a SIGKILL (flushed: qemu-io flushes as it closes).
    qemu_io_ok(
        &uri,
        &["write -P 3 1M 64K", "write -z 2M 1M", "write -P 4 9M 513K"],
    );
    served.kill();
    let served = Served::start(&args);
    let (uri, ctl) = (
        served.unix_uri(),
        served.control().to_string_lossy().into_owned(),
    );
    qemu_io_ok(
        &uri,
        &["write -P 5 4M 8K", "write -z 10M 2M", "write -P 6 15M 1M"],
    );
    let diff = dir.s("base-next.diff");
    logcache_ok(&[
        "export-diff",
        "--since",
        "base",
        "--checkpoint",
        "next",
        "--control",
        &ctl,
        &diff,
    ]);
    let import_diff = || {
        run(tool("rbd").arg("-c").arg(&cluster.conf).args([
            "import-diff",
            "--no-progress",
            &diff,
            "rbd/kdiff",
        ]))
    };

    // `f`: the image must have the stream's from-snapshot.
    let out = import_diff();
    assert!(!out.status.success(), "import-diff without snapshot base");
    let said = text(&out.stderr);
    assert!(
        said.contains("start snapshot 'base' does not exist"),
        "{said}"
    );
    cluster.rbd(&["snap", "create", "rbd/kdiff@base"]);
    let out = import_diff();
    assert_ok(&out, "rbd import-diff");
    // `s`: the image now has the disk's size.
    let info: serde_json::Value =
        serde_json::from_str(&cluster.rbd(&["info", "--format", "json", "rbd/kdiff"])).unwrap();
    assert_eq!(info["size"].as_u64(), Some(DIFF_IMAGE_BYTES), "{info}");
    let disk = dir.s("disk.img");
    sparse(Path::new(&disk), DIFF_IMAGE_BYTES);
    assert_ok(&run(tool("nbdcopy").args([&uri, &disk])), "nbdcopy");
    let image = std::fs::read(cluster.export_file("kdiff", &dir)).unwrap();
    assert_same(
        &image,
        &std::fs::read(&disk).unwrap(),
        "rbd export after import-diff of the stream exported after a SIGKILL",
    );
    // `t`: import-diff made snapshot next, so the same stream again is refused.
    assert!(cluster.rbd(&["snap", "ls", "rbd/kdiff"]).contains("next"));
    let out = import_diff();
    assert!(!out.status.success(), "the stream applied twice");
    let said = text(&out.stderr);
    assert!(
        said.contains("end snapshot 'next' already exists"),
        "{said}"
    );
}
