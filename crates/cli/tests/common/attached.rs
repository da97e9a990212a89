//! Real block devices for the filesystem tests: [`Fused`] exposes an NBD export as a file
//! (nbdfuse), [`Attached`] makes a file a loop device and mounts it. Dropping either undoes
//! everything, in order: umount, losetup -d, fusermount3 -u, kill nbdfuse.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

pub fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = run(cmd);
    assert_ok(&out, what);
    text(&out.stdout)
}

/// Panics unless the test can attach devices: root, /dev/fuse, loop devices and `tools`.
pub fn preflight(tools: &[&str]) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("the filesystem test needs root (it runs losetup and mount); run the tests as root");
    }
    if !Path::new("/dev/fuse").exists() {
        panic!("/dev/fuse is missing: the filesystem test needs FUSE (modprobe fuse; in a container, pass --device /dev/fuse)");
    }
    if !Path::new("/dev/loop-control").exists() {
        panic!("/dev/loop-control is missing: the filesystem test needs loop devices (modprobe loop; in a container, run privileged)");
    }
    for t in ["nbdfuse", "fusermount3", "losetup", "mount", "umount"]
        .iter()
        .chain(tools)
    {
        require(t);
    }
}

/// An NBD export as a file, `DIR/NAME.fuse/disk`, served by nbdfuse until dropped.
pub struct Fused {
    fuse_dir: PathBuf,
    nbdfuse: Option<Child>,
}

impl Fused {
    pub fn start(dir: &TestDir, name: &str, uri: &str) -> Fused {
        let fuse_dir = dir.join(format!("{name}.fuse"));
        fs::create_dir_all(&fuse_dir).unwrap();
        let pidfile = dir.join(format!("{name}.nbdfuse.pid"));
        let log_path = dir.join(format!("{name}.nbdfuse.log"));
        let _ = fs::remove_file(&pidfile);
        let log = File::create(&log_path).unwrap();
        let child = tool("nbdfuse")
            .arg("-P")
            .arg(&pidfile)
            .arg(fuse_dir.join("disk"))
            .arg(uri)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting nbdfuse");
        let mut f = Fused {
            fuse_dir,
            nbdfuse: Some(child),
        };
        // nbdfuse writes its pid file once the FUSE mount is ready.
        let deadline = Instant::now() + START_TIMEOUT;
        while fs::read_to_string(&pidfile).map_or(true, |s| s.trim().is_empty()) {
            if let Some(st) = f.nbdfuse.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "nbdfuse exited early ({st}):\n{}",
                    fs::read_to_string(&log_path).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "nbdfuse did not become ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        f
    }

    pub fn file(&self) -> PathBuf {
        self.fuse_dir.join("disk")
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.nbdfuse.take() {
            let out = run(tool("fusermount3").arg("-u").arg(&self.fuse_dir));
            if !out.status.success() {
                let _ = run(tool("fusermount3").arg("-uz").arg(&self.fuse_dir));
            }
            if wait_timeout(&mut child, Duration::from_secs(5)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for Fused {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loop device over a file (over an NBD export through [`Fused`], or a plain file), and
/// maybe a mount of it.
pub struct Attached {
    fused: Option<Fused>,
    loop_dev: Option<String>,
    mounted: Option<PathBuf>,
}

impl Attached {
    /// The NBD export `uri`, which must be `disk_bytes` long, as a loop device.
    pub fn new(dir: &TestDir, uri: &str, disk_bytes: u64) -> Attached {
        let fused = Fused::start(dir, "mnt", uri);
        assert_eq!(
            fs::metadata(fused.file()).expect("nbdfuse's file").len(),
            disk_bytes
        );
        let mut a = Attached::file(&fused.file(), None);
        a.fused = Some(fused);
        a
    }

    /// `file` as a loop device, limited to its first `size_bytes` if given.
    pub fn file(file: &Path, size_bytes: Option<u64>) -> Attached {
        let mut c = tool("losetup");
        c.args(["-f", "--show"]);
        if let Some(n) = size_bytes {
            c.arg("--sizelimit").arg(n.to_string());
        }
        let dev = run_ok(c.arg(file), "losetup -f --show");
        Attached {
            fused: None,
            loop_dev: Some(dev.trim().to_string()),
            mounted: None,
        }
    }

    pub fn dev(&self) -> &str {
        self.loop_dev.as_deref().unwrap()
    }

    pub fn mount(&mut self, target: &Path, opts: &str) {
        fs::create_dir_all(target).unwrap();
        let mut c = tool("mount");
        if !opts.is_empty() {
            c.args(["-o", opts]);
        }
        run_ok(c.arg(self.dev()).arg(target), "mount");
        self.mounted = Some(target.to_path_buf());
    }

    pub fn umount(&mut self) {
        let target = self.mounted.take().unwrap();
        run_ok(tool("umount").arg(&target), "umount");
    }

    /// Undoes everything; after a crash underneath, whatever state it is in.
    pub fn detach(&mut self) {
        if let Some(target) = self.mounted.take() {
            let out = run(tool("umount").arg(&target));
            if !out.status.success() {
                let _ = run(tool("umount").arg("-l").arg(&target));
            }
        }
        if let Some(dev) = self.loop_dev.take() {
            let _ = run(tool("losetup").args(["-d", &dev]));
        }
        if let Some(mut f) = self.fused.take() {
            f.stop();
        }
    }

    /// After the server died: the filesystem is broken under us, detach lazily.
    pub fn abandon(&mut self) {
        if let Some(target) = self.mounted.take() {
            let _ = run(tool("umount").arg("-l").arg(&target));
        }
        self.detach();
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.detach();
    }
}
