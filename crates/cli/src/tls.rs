//! `serve`'s TLS flags turned into the server's TLS settings: which mode, which credentials,
//! and the defaults (TLS required on a non-loopback address, offered when credentials are
//! given, off otherwise).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use logcache_server::{TlsConfig, TlsMode};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TlsChoice {
    /// No TLS: STARTTLS is refused.
    Off,
    /// STARTTLS offered; clients may also stay in the clear.
    On,
    /// Every option but STARTTLS is refused until TLS is up.
    Require,
}

#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// TLS for NBD clients (STARTTLS): off, on (offered) or require. Default: require on a
    /// non-loopback --listen address, on when credentials are given, off otherwise.
    #[arg(long, value_enum, value_name = "off|on|require")]
    pub tls: Option<TlsChoice>,
    /// X.509 credentials: a directory holding ca-cert.pem, server-cert.pem and server-key.pem
    /// (the layout qemu-nbd and nbdkit use).
    #[arg(long, value_name = "DIR", conflicts_with = "tls_psk")]
    pub tls_certificates: Option<PathBuf>,
    /// With --tls-certificates: clients must present a certificate signed by ca-cert.pem.
    #[arg(long, requires = "tls_certificates")]
    pub tls_verify_peer: bool,
    /// Pre-shared keys: a file of USERNAME:HEXKEY lines, as `psktool -u USER -p FILE` writes.
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
}

impl TlsArgs {
    /// The server's TLS settings; `remote_listen` says whether a TCP listener is not loopback.
    pub fn config(&self, remote_listen: bool) -> Result<Option<TlsConfig>> {
        let has_credentials = self.tls_certificates.is_some() || self.tls_psk.is_some();
        let choice = match self.tls {
            Some(choice) => choice,
            None if remote_listen && has_credentials => TlsChoice::Require,
            None if has_credentials => TlsChoice::On,
            None => TlsChoice::Off,
        };
        let mode = match choice {
            TlsChoice::Off => {
                if has_credentials {
                    bail!("--tls off with TLS credentials: drop --tls off, or the credentials");
                }
                return Ok(None);
            }
            TlsChoice::On => TlsMode::On,
            TlsChoice::Require => TlsMode::Require,
        };
        let config = match (&self.tls_certificates, &self.tls_psk) {
            (Some(dir), None) => TlsConfig::x509(dir, self.tls_verify_peer, mode)?,
            (None, Some(file)) => TlsConfig::psk(file, mode)?,
            (None, None) => bail!(
                "--tls {}: give the credentials too, --tls-certificates DIR (ca-cert.pem, server-cert.pem, server-key.pem) or --tls-psk FILE",
                if mode == TlsMode::On { "on" } else { "require" }
            ),
            (Some(_), Some(_)) => {
                bail!("give --tls-certificates or --tls-psk, not both")
            }
        };
        Ok(Some(config))
    }
}

impl TlsArgs {
    /// The query parameter a libnbd URI needs to reach this server (the client's credentials
    /// are its own; this names where the server's are, which a local client can share).
    pub fn uri_query(&self) -> Option<String> {
        let (key, path) = match (&self.tls_certificates, &self.tls_psk) {
            (Some(dir), _) => ("tls-certificates", dir),
            (None, Some(file)) => ("tls-psk-file", file),
            (None, None) => return None,
        };
        let path = std::path::absolute(path).unwrap_or_else(|_| path.clone());
        Some(format!(
            "{key}={}",
            crate::cmd::serve::uri_escape(&path.to_string_lossy())
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_address_and_the_credentials() {
        let none = TlsArgs::default();
        assert!(none.config(false).unwrap().is_none());
        assert!(none.config(true).unwrap().is_none());
        let wants_tls = TlsArgs {
            tls: Some(TlsChoice::Require),
            ..TlsArgs::default()
        };
        let e = wants_tls.config(false).unwrap_err().to_string();
        assert!(
            e.contains("--tls-certificates") && e.contains("--tls-psk"),
            "{e}"
        );
        let off_with_keys = TlsArgs {
            tls: Some(TlsChoice::Off),
            tls_psk: Some("/nonexistent".into()),
            ..TlsArgs::default()
        };
        assert!(off_with_keys.config(false).is_err());
    }
}
