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

/// NBD without TLS has no authentication: anyone who reaches the port can read and overwrite
/// the whole disk. So plain TCP serving is loopback-only unless the operator says the network is
/// trusted (`--allow-remote`). Every address `addr` resolves to must be loopback. (`serve` skips
/// this when TLS is required.)
pub fn check_tcp_listen(addr: &str, allow_remote: bool) -> Result<()> {
    if allow_remote {
        return Ok(());
    }
    if let Some(remote) = first_remote_ip(addr)? {
        anyhow::bail!(
            "refusing to serve NBD on {addr} ({remote}) without TLS: it is not a loopback address, and NBD without TLS has no authentication or encryption, so anyone who can reach it could read and overwrite the disk; serve TLS with --tls-certificates DIR or --tls-psk FILE, listen on 127.0.0.1 or a Unix socket, or add --allow-remote if the network is trusted"
        );
    }
    Ok(())
}

/// Whether `addr` resolves to any address that is not loopback.
pub fn is_remote(addr: &str) -> Result<bool> {
    Ok(first_remote_ip(addr)?.is_some())
}

fn first_remote_ip(addr: &str) -> Result<Option<std::net::IpAddr>> {
    use std::net::ToSocketAddrs;
    let resolved: Vec<_> = addr
        .to_socket_addrs()
        .with_context(|| format!("--listen {addr}: not a HOST:PORT address that resolves"))?
        .collect();
    Ok(resolved
        .iter()
        .find(|a| !a.ip().is_loopback())
        .map(|a| a.ip()))
}

/// Checks that `addr` can be bound now, before anything is created or opened: a port in use
/// (a second checkout's embedded default, say) is said at once, with how to pick another.
pub fn check_tcp_free(addr: &str) -> Result<()> {
    match std::net::TcpListener::bind(addr) {
        Ok(listener) => {
            drop(listener);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => anyhow::bail!(
            "{addr} is in use (another logcache serve?); pick another port with --listen, e.g. --listen 127.0.0.1:10810 (nothing was created or opened)"
        ),
        Err(e) => Err(e).with_context(|| format!("--listen {addr}")),
    }
}

#[cfg(test)]
mod tests {
    use super::{check_tcp_free, check_tcp_listen};

    #[test]
    fn a_port_in_use_is_said_with_how_to_pick_another() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let e = check_tcp_free(&addr).unwrap_err().to_string();
        assert!(
            e.contains(&addr) && e.contains("in use") && e.contains("--listen"),
            "{e}"
        );
        drop(taken);
        check_tcp_free(&addr).unwrap();
    }

    #[test]
    fn only_loopback_without_allow_remote() {
        check_tcp_listen("127.0.0.1:0", false).unwrap();
        check_tcp_listen("[::1]:0", false).unwrap();
        check_tcp_listen("localhost:0", false).unwrap();
        let e = check_tcp_listen("0.0.0.0:10809", false).unwrap_err();
        assert!(e.to_string().contains("--allow-remote"), "{e}");
        assert!(check_tcp_listen("192.0.2.1:10809", false).is_err());
        check_tcp_listen("0.0.0.0:10809", true).unwrap();
    }
}
