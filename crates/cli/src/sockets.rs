//! Unix socket files: bind, replacing a stale file left by a killed process but never one a
//! live process still accepts on.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use anyhow::{bail, Context, Result};

pub fn bind_unix(path: &Path) -> Result<UnixListener> {
    if path.exists() {
        match UnixStream::connect(path) {
            Ok(_) => bail!(
                "{} is in use by a running process; stop it or choose another path",
                path.display()
            ),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                // Nobody accepts: a leftover of a process that was killed.
                std::fs::remove_file(path)
                    .with_context(|| format!("removing stale socket {}", path.display()))?;
            }
            Err(_) => bail!(
                "{} exists and is not a socket logcache can replace; remove it or choose another path",
                path.display()
            ),
        }
    }
    UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}
