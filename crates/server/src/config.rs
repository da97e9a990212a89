//! What the server exports: the export's name and description, and whether it is read-only.

use logcache_nbd::consts::{
    FLAG_CAN_MULTI_CONN, FLAG_HAS_FLAGS, FLAG_READ_ONLY, FLAG_SEND_CACHE, FLAG_SEND_FAST_ZERO,
    FLAG_SEND_FLUSH, FLAG_SEND_FUA, FLAG_SEND_TRIM, FLAG_SEND_WRITE_ZEROES, MAX_STRING_BYTES,
};

use crate::error::ServerError;
use crate::tls::TlsConfig;

/// Name clients ask for (an empty name also selects the export).
pub const DEFAULT_EXPORT_NAME: &str = "logcache";
/// Description shown by clients such as `nbdinfo`.
pub const DEFAULT_DESCRIPTION: &str = "logcache write-back block cache";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The one export's name; clients may also use the empty (default) name.
    pub export_name: String,
    /// Human-readable description sent in `INFO_DESCRIPTION`.
    pub description: String,
    /// Advertise `READ_ONLY` and fail writes, trims and zeroing with `EPERM`.
    pub read_only: bool,
    /// STARTTLS: `None` serves in the clear only (STARTTLS answered `NBD_REP_ERR_UNSUP`).
    pub tls: Option<TlsConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            export_name: DEFAULT_EXPORT_NAME.to_owned(),
            description: DEFAULT_DESCRIPTION.to_owned(),
            read_only: false,
            tls: None,
        }
    }
}

impl ServerConfig {
    /// Checks both strings are valid NBD strings, so every handshake reply can be encoded.
    pub(crate) fn validate(&self) -> Result<(), ServerError> {
        check_nbd_string("export name", &self.export_name)?;
        check_nbd_string("export description", &self.description)
    }

    /// The transmission flags sent with the export.
    ///
    /// `CAN_MULTI_CONN` is truthful: every connection shares one export (the engine, or a
    /// device), its flush covers every write that returned before it (from any handle), and we
    /// reply to a write only after the export's write returned, so a FLUSH or FUA reply on one
    /// connection covers every write already acknowledged on any connection. `SEND_FAST_ZERO`
    /// is offered and always answered `ENOTSUP`, which is what the spec asks when zeroing is no
    /// faster than writing, and lets clients skip a pointless pre-zeroing pass. `SEND_DF` is
    /// not offered: it would only matter if we split reads into several chunks, which we never
    /// do.
    pub(crate) fn transmission_flags(&self) -> u16 {
        let mut flags = FLAG_HAS_FLAGS
            | FLAG_SEND_FLUSH
            | FLAG_SEND_FUA
            | FLAG_SEND_TRIM
            | FLAG_SEND_WRITE_ZEROES
            | FLAG_SEND_FAST_ZERO
            | FLAG_SEND_CACHE
            | FLAG_CAN_MULTI_CONN;
        if self.read_only {
            flags |= FLAG_READ_ONLY;
        }
        flags
    }

    /// Whether a client's requested export name selects our export.
    pub(crate) fn matches_export(&self, requested_name: &str) -> bool {
        requested_name.is_empty() || requested_name == self.export_name
    }
}

fn check_nbd_string(what: &str, text: &str) -> Result<(), ServerError> {
    if text.len() > MAX_STRING_BYTES {
        return Err(ServerError::InvalidConfig(format!(
            "the {what} is {} bytes; NBD allows at most {MAX_STRING_BYTES}, so shorten it",
            text.len()
        )));
    }
    if text.contains('\0') {
        return Err(ServerError::InvalidConfig(format!(
            "the {what} contains a NUL byte, which NBD forbids; remove it"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_matches_its_name_and_the_empty_name() {
        let config = ServerConfig::default();
        config.validate().unwrap();
        assert!(config.matches_export(""));
        assert!(config.matches_export("logcache"));
        assert!(!config.matches_export("other"));
    }

    #[test]
    fn read_only_adds_exactly_the_read_only_flag() {
        let writable = ServerConfig::default().transmission_flags();
        let read_only = ServerConfig {
            read_only: true,
            ..ServerConfig::default()
        }
        .transmission_flags();
        assert_eq!(read_only, writable | FLAG_READ_ONLY);
        assert_eq!(writable & FLAG_READ_ONLY, 0);
        assert_ne!(writable & FLAG_CAN_MULTI_CONN, 0);
    }

    #[test]
    fn rejects_strings_nbd_cannot_carry() {
        let long = ServerConfig {
            export_name: "x".repeat(MAX_STRING_BYTES + 1),
            ..ServerConfig::default()
        };
        assert!(long.validate().unwrap_err().to_string().contains("shorten"));
        let nul = ServerConfig {
            description: "a\0b".to_owned(),
            ..ServerConfig::default()
        };
        assert!(nul.validate().unwrap_err().to_string().contains("NUL"));
    }
}
