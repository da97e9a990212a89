//! The embedded default: what `logcache serve` runs with neither `--cache` nor `--backing`.
//! Sparse files under `./logcache-data/`, formatted on first start.

use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use logcache_engine::io::file::create_sparse;

pub const DATA_DIR: &str = "logcache-data";
pub const CACHE_SIZE_BYTES: u64 = 1 << 30;
pub const BACKING_SIZE_BYTES: u64 = 8 << 30;
pub const TCP_LISTEN: &str = "127.0.0.1:10809";

pub fn cache_path() -> PathBuf {
    Path::new(DATA_DIR).join("cache.img")
}

pub fn backing_path() -> PathBuf {
    Path::new(DATA_DIR).join("backing.img")
}

pub fn socket_path() -> PathBuf {
    Path::new(DATA_DIR).join("nbd.sock")
}

/// The embedded default's control socket, relative to the directory serve runs in.
pub fn control_path() -> PathBuf {
    crate::devices::control_path_for(&cache_path())
}

/// The control socket `status`, `set` and `drain` use when not told otherwise: the embedded
/// default's in this directory if there is one, else the one a running embedded default
/// announced in [`control_link`] (so the admin commands work from any directory).
pub fn admin_control_path() -> PathBuf {
    let here = control_path();
    if here.exists() {
        return here;
    }
    match control_link() {
        Some(link) if link.exists() => link,
        _ => here,
    }
}

/// A symlink to the running embedded default's control socket, per user:
/// `$XDG_RUNTIME_DIR/logcache-default.ctl`, else `/tmp/logcache-UID/default.ctl`.
pub fn control_link() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("logcache-default.ctl"));
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    Some(
        std::env::temp_dir()
            .join(format!("logcache-{uid}"))
            .join("default.ctl"),
    )
}

/// The announcement made by [`announce_control`]; withdrawn when dropped if still ours.
pub struct Announced {
    link: PathBuf,
    target: PathBuf,
}

impl Drop for Announced {
    fn drop(&mut self) {
        if std::fs::read_link(&self.link).ok().as_deref() == Some(self.target.as_path()) {
            let _ = std::fs::remove_file(&self.link);
        }
    }
}

/// Points [`control_link`] at `control` (made absolute), unless another live serve already
/// answers there (then the admin commands need --control or this directory, and None is
/// returned). Best effort: a failure here costs only the convenience.
pub fn announce_control(control: &Path) -> Option<Announced> {
    let link = control_link()?;
    let target = std::fs::canonicalize(control).ok()?;
    assert!(target.is_absolute());
    if UnixStream::connect(&link).is_ok() {
        return None;
    }
    let dir = link.parent()?;
    if !dir.exists() {
        std::fs::DirBuilder::new().mode(0o700).create(dir).ok()?;
    }
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&target, &link).ok()?;
    Some(Announced { link, target })
}

/// Creates the directory and the sparse files if missing. Returns whether the cache file was
/// created now (so it must be formatted).
pub fn ensure_files() -> Result<bool> {
    std::fs::create_dir_all(DATA_DIR).with_context(|| format!("creating ./{DATA_DIR}"))?;
    let cache = cache_path();
    let backing = backing_path();
    let fresh = !cache.exists();
    if !backing.exists() {
        create_sparse(&backing, BACKING_SIZE_BYTES)
            .with_context(|| format!("creating {}", backing.display()))?;
    }
    if fresh {
        create_sparse(&cache, CACHE_SIZE_BYTES)
            .with_context(|| format!("creating {}", cache.display()))?;
    }
    Ok(fresh)
}
