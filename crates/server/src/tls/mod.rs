//! TLS for NBD's STARTTLS: the server's settings (`TlsConfig`: mode and credentials), the TLS
//! channel a connection switches to after `NBD_OPT_STARTTLS` is acknowledged (`channel`), and
//! how credentials are read from disk (`credentials`).
//!
//! One TLS stack, OpenSSL, serves both X.509 and PSK: rustls has no TLS-PSK, and GnuTLS's
//! clients (libnbd, qemu) interoperate with OpenSSL for both (tested in
//! `crates/server/tests/tls_clients.rs`).

mod channel;
mod credentials;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use openssl::ssl::SslContext;

pub(crate) use self::channel::{accept, TlsChannel};
use crate::error::ServerError;

/// When clients must use TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// STARTTLS is offered; clients may also negotiate in the clear (the spec's SELECTIVETLS
    /// with no TLS-only export).
    On,
    /// Every option but STARTTLS and ABORT is refused with `NBD_REP_ERR_TLS_REQD` until TLS is
    /// up, and `EXPORT_NAME` ends the connection (the spec's FORCEDTLS).
    Require,
}

/// The server's TLS settings: a mode and the credentials, loaded and checked once at start.
#[derive(Clone)]
pub struct TlsConfig {
    mode: TlsMode,
    context: Arc<SslContext>,
    /// Shown in logs and `Debug`: where the credentials came from.
    source: String,
}

impl TlsConfig {
    /// X.509 from a directory laid out as qemu and nbdkit expect: `ca-cert.pem`,
    /// `server-cert.pem`, `server-key.pem`. With `verify_peer`, clients must present a
    /// certificate signed by the CA.
    pub fn x509(dir: &Path, verify_peer: bool, mode: TlsMode) -> Result<TlsConfig, ServerError> {
        Ok(TlsConfig {
            mode,
            context: Arc::new(credentials::x509_context(dir, verify_peer)?),
            source: format!("X.509 certificates in {}", dir.display()),
        })
    }

    /// Pre-shared keys from a `psktool` file (`username:hexkey` lines).
    pub fn psk(file: &Path, mode: TlsMode) -> Result<TlsConfig, ServerError> {
        Ok(TlsConfig {
            mode,
            context: Arc::new(credentials::psk_context(file)?),
            source: format!("pre-shared keys in {}", file.display()),
        })
    }

    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    pub(crate) fn context(&self) -> &SslContext {
        &self.context
    }
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("mode", &self.mode)
            .field("source", &self.source)
            .finish()
    }
}

/// Two configs are equal when they share the loaded credentials (a clone) and the mode.
impl PartialEq for TlsConfig {
    fn eq(&self, other: &TlsConfig) -> bool {
        self.mode == other.mode && Arc::ptr_eq(&self.context, &other.context)
    }
}

impl Eq for TlsConfig {}
