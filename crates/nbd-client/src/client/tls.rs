//! The client's TLS: after the server acknowledged `NBD_OPT_STARTTLS`, an OpenSSL handshake with
//! the credentials an `nbds` URI names (libnbd's layout: `ca-cert.pem`, and optionally
//! `client-cert.pem`/`client-key.pem`, in `tls-certificates=DIR`; or a psktool file in
//! `tls-psk-file=FILE`). Without either, the system's CAs verify the server.

use std::io;
use std::path::Path;

use logcache_nbd::psk::parse_psk_file;
use logcache_nbd::uri::UriTls;
use openssl::error::ErrorStack;
use openssl::ssl::{
    HandshakeError, SslConnector, SslFiletype, SslMethod, SslOptions, SslVerifyMode, SslVersion,
};

use super::stream::Stream;

/// PSK suites for TLS 1.2 (TLS 1.3 uses its own with a PSK); RSA-PSK needs a certificate.
const PSK_CIPHERS_TLS12: &str = "PSK:!RSAPSK:!aNULL:!eNULL:!3DES:!RC4";

/// Where the server is, for checking its certificate's name: a TCP host, or `None` for a Unix
/// socket (no name to check; the chain is still verified against the CA).
pub(super) struct TlsTarget<'a> {
    pub settings: &'a UriTls,
    pub host: Option<&'a str>,
}

fn setup_error<'a>(uri: &'a str, what: &str) -> impl FnOnce(ErrorStack) -> io::Error + 'a {
    let what = what.to_owned();
    move |e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{uri}: {what}: {}", first_reason(&e)),
        )
    }
}

fn first_reason(error: &ErrorStack) -> String {
    error
        .errors()
        .first()
        .and_then(|e| e.reason())
        .map(str::to_owned)
        .unwrap_or_else(|| error.to_string())
}

/// Runs the TLS handshake over `stream`; every error is one line naming the URI.
pub(super) fn connect(stream: Stream, uri: &str, target: &TlsTarget<'_>) -> io::Result<Stream> {
    let settings = target.settings;
    let mut builder =
        SslConnector::builder(SslMethod::tls_client()).map_err(setup_error(uri, "TLS setup"))?;
    builder
        .set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(setup_error(uri, "TLS setup"))?;
    builder.set_options(SslOptions::NO_TICKET | SslOptions::NO_COMPRESSION);
    let psk = settings.psk_file.is_some();
    match (&settings.certificates, &settings.psk_file) {
        (Some(dir), _) => load_certificates(&mut builder, dir, uri)?,
        (None, Some(file)) => load_psk(&mut builder, file, settings.username.as_deref(), uri)?,
        (None, None) => {} // The system's CAs (the connector's default).
    }
    if psk || !settings.verify_peer {
        builder.set_verify(SslVerifyMode::NONE);
    }
    let connector = builder.build();
    let mut config = connector
        .configure()
        .map_err(setup_error(uri, "TLS setup"))?;
    let check_name = target.host.is_some() && settings.verify_peer && !psk;
    config.set_verify_hostname(check_name);
    config.set_use_server_name_indication(target.host.is_some() && !psk);
    let host = target.host.unwrap_or("localhost");
    config
        .connect(host, stream)
        .map_err(|error| {
            let reason = match &error {
                HandshakeError::SetupFailure(stack) => first_reason(stack),
                HandshakeError::Failure(mid) | HandshakeError::WouldBlock(mid) => {
                    let verify = mid.ssl().verify_result();
                    match mid.error().ssl_error() {
                        _ if verify.as_raw() != 0 && verify.as_raw() != 1 => format!(
                            "the server's certificate did not verify: {}",
                            verify.error_string()
                        ),
                        Some(stack) => first_reason(stack),
                        None => mid.error().to_string(),
                    }
                }
            };
            // GnuTLS servers hang up without an alert when the PSK does not match.
            let hint = if psk && reason.contains("unexpected EOF") {
                " (the server hung up: a wrong key, or an identity it does not know?)"
            } else {
                ""
            };
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{uri}: TLS handshake with the server failed: {reason}{hint}"),
            )
        })
        .map(|tls| Stream::Tls(Box::new(tls)))
}

fn load_certificates(
    builder: &mut openssl::ssl::SslConnectorBuilder,
    dir: &Path,
    uri: &str,
) -> io::Result<()> {
    let ca = dir.join("ca-cert.pem");
    if !ca.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{uri}: tls-certificates={}: {} is missing (the CA that signed the server's certificate)",
                dir.display(),
                ca.display()
            ),
        ));
    }
    builder
        .set_ca_file(&ca)
        .map_err(setup_error(uri, &format!("cannot load {}", ca.display())))?;
    let cert = dir.join("client-cert.pem");
    let key = dir.join("client-key.pem");
    if cert.is_file() && key.is_file() {
        builder
            .set_certificate_chain_file(&cert)
            .map_err(setup_error(uri, &format!("cannot load {}", cert.display())))?;
        builder
            .set_private_key_file(&key, SslFiletype::PEM)
            .map_err(setup_error(uri, &format!("cannot load {}", key.display())))?;
    }
    Ok(())
}

fn load_psk(
    builder: &mut openssl::ssl::SslConnectorBuilder,
    file: &Path,
    username: Option<&str>,
    uri: &str,
) -> io::Result<()> {
    let bad = |text: String| io::Error::new(io::ErrorKind::InvalidInput, format!("{uri}: {text}"));
    let text = std::fs::read_to_string(file)
        .map_err(|e| bad(format!("tls-psk-file={}: {e}", file.display())))?;
    let keys =
        parse_psk_file(&text).map_err(|e| bad(format!("tls-psk-file={} {e}", file.display())))?;
    // libnbd's default identity is the local user name.
    let username = match username {
        Some(name) => name.to_owned(),
        None => std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .map_err(|_| bad("give the PSK identity: tls-username=USER or nbds://USER@…".into()))?,
    };
    let key = keys
        .into_iter()
        .find(|(name, _)| *name == username)
        .map(|(_, key)| key)
        .ok_or_else(|| {
            bad(format!(
                "tls-psk-file={} has no key for user {username:?} (set tls-username= or USER@)",
                file.display()
            ))
        })?;
    builder
        .set_cipher_list(PSK_CIPHERS_TLS12)
        .map_err(setup_error(uri, "TLS setup"))?;
    let identity = username.into_bytes();
    builder.set_psk_client_callback(move |_, _hint, identity_out, key_out| {
        // The identity is written NUL-terminated.
        if identity.len() >= identity_out.len() || key.len() > key_out.len() {
            return Ok(0);
        }
        identity_out[..identity.len()].copy_from_slice(&identity);
        identity_out[identity.len()] = 0;
        key_out[..key.len()].copy_from_slice(&key);
        Ok(key.len())
    });
    Ok(())
}
