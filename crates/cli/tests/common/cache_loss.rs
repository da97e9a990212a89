//! The cache-loss scenario's pieces, shared by the local test (`cli_cache_loss_fs`: a backing
//! file) and the Ceph one (`cli_ceph_rbd`: an RBD image): writers creating and fsyncing files
//! on a filesystem while writeback runs, the server SIGKILLed under them, the as-of time
//! `logcache detach` prints, and the check of the files on the backing device alone.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::attached::Attached;
use super::*;

pub const WRITERS: u64 = 4;
pub const MAX_FILE_BYTES: u64 = 192 * 1024;
/// What the backing device holds before mkfs.
pub const STALE_BYTE: u8 = 0x5A;

/// A file a writer created and fsynced (with its directory), and when the fsync returned.
pub struct Synced {
    pub path: PathBuf,
    pub data: Vec<u8>,
    pub synced_unix_ms: u64,
}

pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The seed of `LOGCACHE_SEED`, or one from the clock.
pub fn seed_from_env() -> u64 {
    std::env::var("LOGCACHE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| now_unix_ms() % 1_000_000)
}

/// Seconds since 1970 of `YYYY-MM-DD HH:MM:SS` (UTC), by days from the civil date.
pub fn parse_utc(s: &str) -> u64 {
    let num = |a: usize, b: usize| s[a..b].parse::<i64>().unwrap_or_else(|_| panic!("{s:?}"));
    let (y, m, d) = (num(0, 4), num(5, 7), num(8, 10));
    let (hh, mm, ss) = (num(11, 13), num(14, 16), num(17, 19));
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    (days * 86_400 + hh * 3600 + mm * 60 + ss) as u64
}

/// The as-of time (seconds since 1970) in `logcache detach`'s output, if it names one.
pub fn detached_as_of_unix_s(out: &str) -> Option<u64> {
    out.split_once("the disk as of ")
        .map(|(_, rest)| parse_utc(&rest[..19]))
}

/// Writes `files` seeded files into `root/NAME`, each fsynced with its directory, and returns
/// them (all written or the first error).
pub fn write_files(root: &Path, name: &str, rng: &mut Rng, files: usize) -> Vec<Synced> {
    let dir = root.join(name);
    fs::create_dir_all(&dir).unwrap();
    let dir_handle = File::open(&dir).unwrap();
    (0..files)
        .map(|i| {
            let len = 1 + rng.below(MAX_FILE_BYTES) as usize;
            let data = rng.bytes(len);
            let path = dir.join(format!("f{i:05}"));
            let mut f = File::create(&path).unwrap();
            f.write_all(&data).unwrap();
            f.sync_all().unwrap();
            dir_handle.sync_all().unwrap();
            Synced {
                path: path.strip_prefix(root).unwrap().to_path_buf(),
                data,
                synced_unix_ms: now_unix_ms(),
            }
        })
        .collect()
}

/// Tells the writers to stop, or to hold between two files.
#[derive(Default)]
struct Control {
    stop: AtomicBool,
    pause: AtomicBool,
}

/// One writer: files of seeded sizes and contents in its own directory, each written, fsynced
/// and its directory fsynced, until `stop` or the first error (the server is gone); while
/// `pause`, it holds between two files.
fn writer(root: PathBuf, id: u64, seed: u64, ctl: Arc<Control>, out: Arc<Mutex<Vec<Synced>>>) {
    let mut rng = Rng::new(seed ^ (id + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let dir = root.join(format!("w{id}"));
    if fs::create_dir_all(&dir).is_err() {
        return;
    }
    let Ok(dir_handle) = File::open(&dir) else {
        return;
    };
    for i in 0.. {
        while ctl.pause.load(Ordering::Relaxed) && !ctl.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        if ctl.stop.load(Ordering::Relaxed) {
            return;
        }
        let len = 1 + rng.below(MAX_FILE_BYTES) as usize;
        let data = rng.bytes(len);
        let path = dir.join(format!("f{i:05}"));
        let res = File::create(&path)
            .and_then(|mut f| f.write_all(&data).and_then(|()| f.sync_all()))
            .and_then(|()| dir_handle.sync_all());
        if res.is_err() {
            return;
        }
        out.lock().unwrap().push(Synced {
            path: path.strip_prefix(&root).unwrap().to_path_buf(),
            data,
            synced_unix_ms: now_unix_ms(),
        });
        // Bursts and pauses, as applications write: writeback catches up now and then, so
        // some files are older than the disk left behind and must be there.
        if rng.below(8) == 0 {
            std::thread::sleep(Duration::from_millis(rng.below(400)));
        }
    }
}

/// Runs [`WRITERS`] writers on the filesystem mounted at `mnt` (on `att`, served by
/// `served`, whose writeback must be running), SIGKILLs the server at a seeded moment 2–6 s
/// in, waits for the writers to fail, abandons the mount and returns what they fsynced.
///
/// With `catch_up_first`, the writers run 2–3 s, then hold until writeback has caught up with
/// their files (and the backing label's record followed), then run 1–4 s more before the kill:
/// consistent writeback falls seconds behind fsync-per-file writers, so without that pause
/// few files (often none, with XFS) are older than the disk left behind.
pub fn write_until_killed(
    served: Served,
    mut att: Attached,
    mnt: &Path,
    seed: u64,
    rng: &mut Rng,
    catch_up_first: bool,
) -> Vec<Synced> {
    let synced = Arc::new(Mutex::new(Vec::new()));
    let ctl = Arc::new(Control::default());
    let threads: Vec<_> = (0..WRITERS)
        .map(|id| {
            let (root, ctl, out) = (mnt.to_path_buf(), ctl.clone(), synced.clone());
            std::thread::spawn(move || writer(root, id, seed, ctl, out))
        })
        .collect();
    if catch_up_first {
        std::thread::sleep(Duration::from_millis(2000 + rng.below(1000)));
        ctl.pause.store(true, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(500)); // a file under way finishes
        let last_synced_ms = synced
            .lock()
            .unwrap()
            .iter()
            .map(|f| f.synced_unix_ms)
            .max()
            .expect("no file was fsynced in the first phase");
        wait_written_back(&served, last_synced_ms);
        // The label's record follows at once when writeback caught up, else within a second.
        std::thread::sleep(Duration::from_millis(1500));
        ctl.pause.store(false, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(1000 + rng.below(3000)));
    } else {
        // The cache is lost at a random moment while the writers run and writeback copies.
        std::thread::sleep(Duration::from_millis(2000 + rng.below(4000)));
    }
    let before_kill = synced.lock().unwrap().len();
    let s = served.status();
    assert!(
        s["writeback_blocks"].as_u64().unwrap() > 0,
        "writeback did not run: {s}"
    );
    let killed = served.kill();
    assert!(!killed.status.success());
    ctl.stop.store(true, Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(60);
    for t in threads {
        while !t.is_finished() {
            assert!(
                Instant::now() < deadline,
                "a writer is stuck after the server died"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        t.join().unwrap();
    }
    att.abandon();
    assert!(before_kill > 0, "no file was fsynced before the kill");
    Arc::try_unwrap(synced)
        .ok()
        .expect("the writers are done")
        .into_inner()
        .unwrap()
}

/// Waits (up to 120 s) until `served`'s backing device holds every flush point up to
/// `unix_ms`: no dirty data left, or `backing_consistent_as_of` (now minus
/// `writeback_lag_seconds`, to the millisecond) past it.
fn wait_written_back(served: &Served, unix_ms: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = served.status();
        let as_of_ms = s["writeback_lag_seconds"]
            .as_f64()
            .map(|lag_s| now_unix_ms().saturating_sub((lag_s * 1000.0) as u64));
        if s["writeback_lag_bytes"].as_u64() == Some(0) || as_of_ms.is_some_and(|ms| ms > unix_ms) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "writeback did not catch up with the writers' first files in 120 s: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What [`check_files`] found.
pub struct FilesChecked {
    /// Files at their full length holding exactly what was written.
    pub exact: usize,
    /// Files that had to be there and exact (fsynced before the as-of time, or known written
    /// back).
    pub must_have: usize,
}

/// Checks the files on the filesystem mounted at `mnt` after the cache was lost: each of
/// `written_back` (on the backing device before the loss) and each of `synced` fsynced before
/// `as_of_unix_s` is there and exact; every file of `synced` at its full length holds what was
/// written or zeros (an ext4 unwritten extent committed before its data: a state a power cut
/// leaves too), never other bytes, such as the backing device's old contents.
pub fn check_files(
    mnt: &Path,
    written_back: &[Synced],
    synced: &[Synced],
    as_of_unix_s: u64,
    seed: u64,
) -> FilesChecked {
    let mut checked = FilesChecked {
        exact: 0,
        must_have: 0,
    };
    for (i, f) in written_back.iter().chain(synced).enumerate() {
        let got = fs::read(mnt.join(&f.path)).ok();
        if i < written_back.len() || f.synced_unix_ms < as_of_unix_s * 1000 {
            checked.must_have += 1;
            assert!(
                got.as_deref() == Some(&f.data[..]),
                "{:?} was on the backing device before the cache was lost (fsynced before the as-of time or written back) but is {} (seed {seed})",
                f.path,
                got.map_or("missing".to_string(), |g| format!(
                    "{} bytes, different",
                    g.len()
                ))
            );
        }
        if let Some(got) = got.filter(|g| g.len() == f.data.len()) {
            let torn = got
                .chunks(512)
                .zip(f.data.chunks(512))
                .position(|(g, d)| g != d && g.iter().any(|&b| b != 0));
            assert!(
                torn.is_none(),
                "{:?} is complete but holds wrong data at byte {} (seed {seed})",
                f.path,
                torn.unwrap_or(0) * 512
            );
            if got == f.data {
                checked.exact += 1;
            }
        }
    }
    checked
}

/// A filesystem the scenario runs on, and its tools.
pub struct Fs {
    pub name: &'static str,
    pub mkfs: &'static [&'static str],
    /// The read-only check, after a mount has replayed the journal.
    pub check: &'static [&'static str],
    /// XFS refuses a second mount of a UUID the lazily unmounted instance may still hold.
    pub mount_opts: &'static str,
}

pub const XFS: Fs = Fs {
    name: "xfs",
    mkfs: &["mkfs.xfs", "-f", "-q", "-K"],
    check: &["xfs_repair", "-n"],
    mount_opts: "nouuid",
};
pub const EXT4: Fs = Fs {
    name: "ext4",
    mkfs: &["mkfs.ext4", "-F", "-q", "-E", "nodiscard"],
    check: &["e2fsck", "-fn"],
    mount_opts: "",
};

impl Fs {
    /// The first of its tools that is not installed.
    pub fn tool_missing(&self) -> Option<&'static str> {
        [self.mkfs[0], self.check[0]].into_iter().find(|t| {
            !["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
                .iter()
                .any(|d| Path::new(d).join(t).exists())
        })
    }

    /// mkfs on `dev`.
    pub fn make(&self, dev: &str) {
        let mut mkfs = tool(self.mkfs[0]);
        super::attached::run_ok(mkfs.args(&self.mkfs[1..]).arg(dev), self.mkfs[0]);
    }

    /// Mounts `att` at `mnt` (replaying the journal a power cut leaves), unmounts it, and
    /// asserts the read-only check finds nothing; then mounts it again for reading.
    pub fn check_clean(&self, att: &mut Attached, mnt: &Path, what: &str) {
        att.mount(mnt, self.mount_opts);
        att.umount();
        let mut check = tool(self.check[0]);
        let out = run(check.args(&self.check[1..]).arg(att.dev()));
        assert_ok(&out, &format!("{} on {what}", self.check.join(" ")));
        att.mount(mnt, self.mount_opts);
    }
}
