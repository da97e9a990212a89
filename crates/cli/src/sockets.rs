//! Unix socket files: bind, replacing a stale file left by a killed process but never one a
//! live process still accepts on (the NBD server's rule, shared).

use std::os::unix::net::UnixListener;
use std::path::Path;

use anyhow::{Context, Result};
use logcache_server::remove_stale_socket;

pub fn bind_unix(path: &Path) -> Result<UnixListener> {
    remove_stale_socket(path)?;
    UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}
