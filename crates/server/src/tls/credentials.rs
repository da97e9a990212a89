//! Reading TLS credentials from disk into an OpenSSL context, with one clear line for each thing
//! a user can get wrong (a missing file, a key that does not match, an expired certificate, a
//! malformed PSK line).

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use logcache_nbd::psk::parse_psk_file;
use openssl::asn1::Asn1Time;
use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{
    Ssl, SslContext, SslContextBuilder, SslFiletype, SslMethod, SslOptions, SslVerifyMode,
    SslVersion,
};
use openssl::x509::{X509Name, X509};

use crate::error::ServerError;

/// File names inside a `--tls-certificates` directory (qemu's and nbdkit's layout).
pub(crate) const CA_CERT_FILE: &str = "ca-cert.pem";
pub(crate) const SERVER_CERT_FILE: &str = "server-cert.pem";
pub(crate) const SERVER_KEY_FILE: &str = "server-key.pem";

/// PSK cipher suites for TLS 1.2 (TLS 1.3 uses its own suites with a PSK). RSA-PSK needs a
/// certificate, which a PSK server does not have.
const PSK_CIPHERS_TLS12: &str = "PSK:!RSAPSK:!aNULL:!eNULL:!3DES:!RC4";

/// Per-connection note left by the PSK callback, read when a handshake fails so the log line
/// can say which identity the client offered.
pub(crate) fn psk_note_index() -> Index<Ssl, String> {
    static INDEX: OnceLock<Index<Ssl, String>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL could not allocate an ex_data index"))
}

fn base_context() -> Result<SslContextBuilder, ErrorStack> {
    let mut builder = SslContextBuilder::new(SslMethod::tls_server())?;
    // The NBD spec: TLS 1.2 at least, older versions not by default.
    builder.set_min_proto_version(Some(SslVersion::TLS1_2))?;
    // NBD never resumes sessions; tickets would only add bytes after the handshake.
    builder.set_options(SslOptions::NO_TICKET | SslOptions::NO_COMPRESSION);
    builder.set_num_tickets(0)?;
    Ok(builder)
}

fn tls_error(what: String) -> impl FnOnce(ErrorStack) -> ServerError {
    move |error| ServerError::InvalidConfig(format!("{what}: {}", first_reason(&error)))
}

/// The most specific reason OpenSSL gives, without its error-code prefix.
pub(crate) fn first_reason(error: &ErrorStack) -> String {
    error
        .errors()
        .first()
        .and_then(|e| e.reason())
        .map(str::to_owned)
        .unwrap_or_else(|| error.to_string())
}

pub(crate) fn x509_context(dir: &Path, verify_peer: bool) -> Result<SslContext, ServerError> {
    let ca = dir.join(CA_CERT_FILE);
    let cert = dir.join(SERVER_CERT_FILE);
    let key = dir.join(SERVER_KEY_FILE);
    for (path, what) in [
        (&cert, "the server certificate"),
        (&key, "the server's private key"),
    ] {
        if !path.is_file() {
            return Err(ServerError::InvalidConfig(format!(
                "--tls-certificates {}: {what} {} is missing; the directory needs {CA_CERT_FILE}, {SERVER_CERT_FILE} and {SERVER_KEY_FILE}",
                dir.display(),
                path.display()
            )));
        }
    }
    if verify_peer && !ca.is_file() {
        return Err(ServerError::InvalidConfig(format!(
            "--tls-verify-peer needs the CA that signs client certificates in {}",
            ca.display()
        )));
    }
    check_not_expired(&cert)?;
    let mut builder = base_context().map_err(tls_error("cannot set up TLS".to_owned()))?;
    builder
        .set_certificate_chain_file(&cert)
        .map_err(tls_error(format!("cannot load {}", cert.display())))?;
    builder
        .set_private_key_file(&key, SslFiletype::PEM)
        .map_err(tls_error(format!("cannot load {}", key.display())))?;
    builder.check_private_key().map_err(|_| {
        ServerError::InvalidConfig(format!(
            "{} is not the private key of {}; put the matching pair in the directory",
            key.display(),
            cert.display()
        ))
    })?;
    if ca.is_file() {
        builder
            .set_ca_file(&ca)
            .map_err(tls_error(format!("cannot load {}", ca.display())))?;
    }
    if verify_peer {
        // Tell clients which CA we accept, so they pick the right certificate.
        let names = X509Name::load_client_ca_file(&ca)
            .map_err(tls_error(format!("cannot read {}", ca.display())))?;
        builder.set_client_ca_list(names);
        builder.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    } else {
        builder.set_verify(SslVerifyMode::NONE);
    }
    Ok(builder.build())
}

/// Every client would refuse an expired certificate, so say so at start, not per connection.
fn check_not_expired(cert: &Path) -> Result<(), ServerError> {
    let pem = std::fs::read(cert)
        .map_err(|e| ServerError::InvalidConfig(format!("cannot read {}: {e}", cert.display())))?;
    let certificate = X509::from_pem(&pem).map_err(tls_error(format!(
        "{} is not a PEM certificate",
        cert.display()
    )))?;
    let now = Asn1Time::days_from_now(0).map_err(tls_error("cannot read the clock".to_owned()))?;
    if certificate.not_after() < now {
        return Err(ServerError::InvalidConfig(format!(
            "{} expired on {}; every client would refuse it, so issue a new one",
            cert.display(),
            certificate.not_after()
        )));
    }
    Ok(())
}

pub(crate) fn psk_context(file: &Path) -> Result<SslContext, ServerError> {
    let keys = read_psk_file(file)?;
    let mut builder = base_context().map_err(tls_error("cannot set up TLS".to_owned()))?;
    builder
        .set_cipher_list(PSK_CIPHERS_TLS12)
        .map_err(tls_error("cannot select PSK cipher suites".to_owned()))?;
    builder.set_psk_server_callback(move |ssl, identity, key_out| {
        let identity = String::from_utf8_lossy(identity.unwrap_or_default()).into_owned();
        let Some(key) = keys.get(&identity) else {
            ssl.set_ex_data(
                psk_note_index(),
                format!("unknown PSK identity {identity:?}"),
            );
            // Zero bytes: OpenSSL refuses the handshake.
            return Ok(0);
        };
        ssl.set_ex_data(psk_note_index(), format!("PSK identity {identity:?}"));
        if key.len() > key_out.len() {
            return Ok(0);
        }
        key_out[..key.len()].copy_from_slice(key);
        Ok(key.len())
    });
    Ok(builder.build())
}

/// Reads `username:hexkey` lines (what `psktool -u NAME -p FILE` writes).
pub(crate) fn read_psk_file(file: &Path) -> Result<HashMap<String, Vec<u8>>, ServerError> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        ServerError::InvalidConfig(format!("--tls-psk: cannot read {}: {e}", file.display()))
    })?;
    let keys = parse_psk_file(&text)
        .map_err(|e| ServerError::InvalidConfig(format!("--tls-psk {} {e}", file.display())))?;
    if keys.is_empty() {
        return Err(ServerError::InvalidConfig(format!(
            "--tls-psk {}: the file holds no key; make one with `psktool -u USER -p {}`",
            file.display(),
            file.display()
        )));
    }
    Ok(keys.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_psk_file_error_names_the_file_and_line() {
        let path = std::env::temp_dir().join(format!("logcache-psk-{}", std::process::id()));
        std::fs::write(&path, "alice:00ff\nbob:0g\n").unwrap();
        let message = read_psk_file(&path).unwrap_err().to_string();
        assert!(
            message.contains("line 2") && message.contains("--tls-psk"),
            "{message}"
        );
        std::fs::write(&path, "\n").unwrap();
        let message = read_psk_file(&path).unwrap_err().to_string();
        assert!(message.contains("psktool"), "{message}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_missing_certificate_directory_names_the_files_it_needs() {
        let message = x509_context(Path::new("/nonexistent-logcache-tls"), false)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains(SERVER_CERT_FILE) && message.contains(CA_CERT_FILE),
            "{message}"
        );
    }
}
