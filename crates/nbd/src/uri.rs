//! NBD URIs (`doc/uri.md` in the NBD project) parsed into a typed value.
//!
//! Supported: `nbd://HOST[:PORT][/EXPORT]` (TCP, port 10809 by default, IPv6 literals in
//! brackets) and `nbd+unix:///[EXPORT]?socket=PATH` (Unix socket). The export name and the socket
//! path are percent-decoded. The TLS schemes `nbds://` and `nbds+unix://` take libnbd's query
//! parameters `tls-certificates=DIR`, `tls-psk-file=FILE`, `tls-username=USER` (or `USER@` in
//! the authority) and `tls-verify-peer=false`. vsock schemes are recognised so they get a clear
//! "not supported" error instead of being mistaken for something else.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::str::FromStr;

use thiserror::Error;

use crate::consts::MAX_STRING_BYTES;

/// The port IANA assigned to NBD, used when a TCP URI names none.
pub const DEFAULT_PORT: u16 = 10809;

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdAddress {
    /// A TCP endpoint. `host` is a name or an IP literal, IPv6 without brackets.
    Tcp { host: String, port: u16 },
    /// A Unix domain socket.
    Unix { socket_path: PathBuf },
}

/// A parsed NBD URI. `Display` gives back the text it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub address: NbdAddress,
    /// Export to ask for; empty means the server's default export.
    pub export_name: String,
    /// Set for `nbds://` and `nbds+unix://`: the client must start TLS before anything else.
    pub tls: Option<UriTls>,
    text: String,
}

/// TLS settings from an `nbds` URI, spelled as libnbd spells them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UriTls {
    /// `tls-certificates=DIR`: `ca-cert.pem` to verify the server, and optionally
    /// `client-cert.pem` / `client-key.pem` to present.
    pub certificates: Option<PathBuf>,
    /// `tls-psk-file=FILE`: `username:hexkey` lines (psktool's format).
    pub psk_file: Option<PathBuf>,
    /// `tls-username=USER` or `USER@HOST`: the PSK identity.
    pub username: Option<String>,
    /// `tls-verify-peer=false` turns off checking the server's certificate.
    pub verify_peer: bool,
}

impl NbdUri {
    /// Parses `text`; see the module documentation for the accepted forms.
    pub fn parse(text: &str) -> Result<Self, UriError> {
        parse(text)
    }

    /// The URI as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for NbdUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for NbdUri {
    type Err = UriError;

    fn from_str(text: &str) -> Result<Self, UriError> {
        parse(text)
    }
}

/// Why a string is not a usable NBD URI. Every message names the URI.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UriError {
    #[error("{uri:?} is not an NBD URI: expected nbd://HOST[:PORT][/EXPORT] or nbd+unix:///[EXPORT]?socket=PATH")]
    NotNbd { uri: String },
    #[error("{uri:?}: {scheme}:// (TLS over vsock) is not supported; use nbds:// or nbds+unix://")]
    TlsNotSupported { uri: String, scheme: String },
    #[error("{uri:?}: give either tls-certificates= or tls-psk-file=, not both")]
    TlsBothCredentials { uri: String },
    #[error("{uri:?}: tls-verify-peer takes true or false")]
    TlsVerifyPeer { uri: String },
    #[error("{uri:?}: the {scheme}:// scheme is not supported; use nbd:// or nbd+unix://")]
    UnsupportedScheme { uri: String, scheme: String },
    #[error("{uri:?}: missing host; write nbd://HOST[:PORT][/EXPORT]")]
    MissingHost { uri: String },
    #[error("{uri:?}: invalid port {port:?} (expected a number from 1 to 65535)")]
    InvalidPort { uri: String, port: String },
    #[error("{uri:?}: invalid host {host:?}")]
    InvalidHost { uri: String, host: String },
    #[error(
        "{uri:?}: user names in NBD URIs are only used for TLS: write nbds:// or nbds+unix://"
    )]
    UserInfoNotSupported { uri: String },
    #[error("{uri:?}: nbd+unix URIs take no host (write nbd+unix:///EXPORT?socket=PATH)")]
    UnixWithHost { uri: String },
    #[error("{uri:?}: nbd+unix URIs need the socket path as a query parameter: nbd+unix:///EXPORT?socket=PATH")]
    MissingSocket { uri: String },
    #[error("{uri:?}: abstract Unix sockets (socket path starting with %00) are not supported")]
    AbstractSocket { uri: String },
    #[error("{uri:?}: the socket parameter is only valid for nbd+unix:// URIs")]
    SocketOnTcp { uri: String },
    #[error("{uri:?}: query parameter {name:?} given more than once")]
    DuplicateParameter { uri: String, name: String },
    #[error("{uri:?}: TLS query parameter {name:?} needs a TLS scheme: nbds:// or nbds+unix://")]
    TlsParameter { uri: String, name: String },
    #[error("{uri:?}: unknown query parameter {name:?} (understood: socket=, and with nbds: tls-certificates=, tls-psk-file=, tls-username=, tls-verify-peer=)")]
    UnknownParameter { uri: String, name: String },
    #[error("{uri:?}: fragments (#...) are not allowed in NBD URIs")]
    Fragment { uri: String },
    #[error("{uri:?}: invalid percent-encoding {sequence:?}")]
    BadPercentEncoding { uri: String, sequence: String },
    #[error("{uri:?}: the export name must be UTF-8 without NUL and at most 4096 bytes")]
    InvalidExportName { uri: String },
}

/// Whether `text` looks like an NBD URI (any `nbd…://` scheme, TLS and vsock ones included so
/// that parsing can reject them with a clear message), as opposed to a file path.
pub fn is_nbd_uri(text: &str) -> bool {
    split_scheme(text).is_some_and(|(scheme, _)| scheme.to_ascii_lowercase().starts_with("nbd"))
}

/// Parses an NBD URI.
pub fn parse(text: &str) -> Result<NbdUri, UriError> {
    let uri = || text.to_owned();
    let (scheme, rest) = split_scheme(text).ok_or_else(|| UriError::NotNbd { uri: uri() })?;
    let scheme = scheme.to_ascii_lowercase();
    let (unix, tls) = match scheme.as_str() {
        "nbd" => (false, false),
        "nbd+unix" => (true, false),
        "nbds" => (false, true),
        "nbds+unix" => (true, true),
        "nbds+vsock" => return Err(UriError::TlsNotSupported { uri: uri(), scheme }),
        other if other.starts_with("nbd") => {
            return Err(UriError::UnsupportedScheme { uri: uri(), scheme })
        }
        _ => return Err(UriError::NotNbd { uri: uri() }),
    };
    if rest.contains('#') {
        return Err(UriError::Fragment { uri: uri() });
    }
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(slash) => before_query.split_at(slash),
        None => (before_query, ""),
    };

    // The export name is the path minus its leading '/', so "nbd://h//x" names "/x".
    let export_bytes = percent_decode(path.strip_prefix('/').unwrap_or(path), text)?;
    let export_name = String::from_utf8(export_bytes)
        .ok()
        .filter(|name| !name.contains('\0') && name.len() <= MAX_STRING_BYTES)
        .ok_or_else(|| UriError::InvalidExportName { uri: uri() })?;

    let Query {
        socket,
        tls: mut tls_settings,
    } = parse_query(query, text, tls)?;
    // A user name is the PSK identity (libnbd's `USER@`); without TLS it means nothing.
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) if tls => {
            let user = String::from_utf8(percent_decode(user, text)?).map_err(|_| {
                UriError::InvalidHost {
                    uri: uri(),
                    host: authority.to_owned(),
                }
            })?;
            if let Some(settings) = tls_settings.as_mut() {
                settings.username.get_or_insert(user);
            }
            host
        }
        _ => authority,
    };
    let address = if unix {
        if !authority.is_empty() {
            return Err(UriError::UnixWithHost { uri: uri() });
        }
        let socket = socket
            .filter(|bytes| !bytes.is_empty())
            .ok_or_else(|| UriError::MissingSocket { uri: uri() })?;
        if socket.contains(&0) {
            return Err(UriError::AbstractSocket { uri: uri() });
        }
        NbdAddress::Unix {
            socket_path: PathBuf::from(OsString::from_vec(socket)),
        }
    } else {
        if socket.is_some() {
            return Err(UriError::SocketOnTcp { uri: uri() });
        }
        let (host, port) = parse_authority(authority, text)?;
        NbdAddress::Tcp { host, port }
    };
    Ok(NbdUri {
        address,
        export_name,
        tls: tls_settings,
        text: text.to_owned(),
    })
}

/// What the query part says.
struct Query {
    socket: Option<Vec<u8>>,
    tls: Option<UriTls>,
}

/// Splits `scheme://rest`, requiring an RFC 3986 scheme (a letter, then letters, digits, `+-.`).
fn split_scheme(text: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = text.split_once("://")?;
    let mut chars = scheme.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (first_ok && rest_ok).then_some((scheme, rest))
}

/// Decodes the `socket` parameter and, for a TLS scheme, the TLS ones, rejecting everything
/// else: the URI spec asks clients to diagnose parameters they do not understand rather than
/// ignore them.
fn parse_query(query: Option<&str>, text: &str, tls: bool) -> Result<Query, UriError> {
    let mut socket = None;
    let mut settings = UriTls {
        verify_peer: true,
        ..UriTls::default()
    };
    let mut seen: Vec<String> = Vec::new();
    for pair in query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
    {
        let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = String::from_utf8_lossy(&percent_decode(raw_name, text)?).into_owned();
        match name.as_str() {
            "socket" => {
                if socket.is_some() {
                    return Err(UriError::DuplicateParameter {
                        uri: text.to_owned(),
                        name,
                    });
                }
                socket = Some(percent_decode(raw_value, text)?);
            }
            "tls-certificates" | "tls-psk-file" | "tls-username" | "tls-verify-peer" if tls => {
                if seen.contains(&name) {
                    return Err(UriError::DuplicateParameter {
                        uri: text.to_owned(),
                        name,
                    });
                }
                let value = percent_decode(raw_value, text)?;
                match name.as_str() {
                    "tls-certificates" => {
                        settings.certificates = Some(PathBuf::from(OsString::from_vec(value)))
                    }
                    "tls-psk-file" => {
                        settings.psk_file = Some(PathBuf::from(OsString::from_vec(value)))
                    }
                    "tls-username" => {
                        settings.username = Some(String::from_utf8_lossy(&value).into_owned())
                    }
                    _ => {
                        settings.verify_peer = match value.as_slice() {
                            b"true" | b"1" | b"yes" => true,
                            b"false" | b"0" | b"no" => false,
                            _ => {
                                return Err(UriError::TlsVerifyPeer {
                                    uri: text.to_owned(),
                                })
                            }
                        }
                    }
                }
                seen.push(name);
            }
            _ if name.starts_with("tls") && !tls => {
                return Err(UriError::TlsParameter {
                    uri: text.to_owned(),
                    name,
                })
            }
            _ => {
                return Err(UriError::UnknownParameter {
                    uri: text.to_owned(),
                    name,
                })
            }
        }
    }
    if settings.certificates.is_some() && settings.psk_file.is_some() {
        return Err(UriError::TlsBothCredentials {
            uri: text.to_owned(),
        });
    }
    Ok(Query {
        socket,
        tls: tls.then_some(settings),
    })
}

/// Parses `host[:port]` or `[ipv6][:port]`.
fn parse_authority(authority: &str, text: &str) -> Result<(String, u16), UriError> {
    let uri = || text.to_owned();
    if authority.contains('@') {
        return Err(UriError::UserInfoNotSupported { uri: uri() });
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| UriError::InvalidHost {
                uri: uri(),
                host: authority.to_owned(),
            })?;
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| UriError::InvalidHost {
                        uri: uri(),
                        host: authority.to_owned(),
                    })?,
            ),
        };
        if host.is_empty() || !host.contains(':') {
            return Err(UriError::InvalidHost {
                uri: uri(),
                host: authority.to_owned(),
            });
        }
        (host.to_owned(), port)
    } else {
        let (host, port) = match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        };
        let host =
            String::from_utf8(percent_decode(host, text)?).map_err(|_| UriError::InvalidHost {
                uri: uri(),
                host: host.to_owned(),
            })?;
        (host, port)
    };
    if host.is_empty() {
        return Err(UriError::MissingHost { uri: uri() });
    }
    if host.contains(|c: char| c.is_whitespace() || c == '\0' || c == '/') {
        return Err(UriError::InvalidHost { uri: uri(), host });
    }
    let port = match port {
        // RFC 3986 lets an empty port mean the default.
        None | Some("") => DEFAULT_PORT,
        Some(digits) => digits
            .parse::<u16>()
            .ok()
            .filter(|&port| port != 0 && digits.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| UriError::InvalidPort {
                uri: uri(),
                port: digits.to_owned(),
            })?,
    };
    Ok((host, port))
}

/// Decodes `%XX` escapes; a `%` not followed by two hex digits is an error.
fn percent_decode(input: &str, text: &str) -> Result<Vec<u8>, UriError> {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let escape = bytes.get(index + 1..index + 3);
            let value = escape
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .filter(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| UriError::BadPercentEncoding {
                    uri: text.to_owned(),
                    sequence: String::from_utf8_lossy(&bytes[index..(index + 3).min(bytes.len())])
                        .into_owned(),
                })?;
            out.push(value);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16) -> NbdAddress {
        NbdAddress::Tcp {
            host: host.to_owned(),
            port,
        }
    }

    fn unix(path: &str) -> NbdAddress {
        NbdAddress::Unix {
            socket_path: PathBuf::from(path),
        }
    }

    fn ok(text: &str) -> (NbdAddress, String) {
        let uri = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(uri.to_string(), text);
        assert_eq!(uri.as_str(), text);
        (uri.address, uri.export_name)
    }

    #[test]
    fn tcp_uris_follow_the_spec_examples() {
        assert_eq!(
            ok("nbd://example.com/disk"),
            (tcp("example.com", 10809), "disk".into())
        );
        assert_eq!(
            ok("nbd://example.com/"),
            (tcp("example.com", 10809), "".into())
        );
        assert_eq!(
            ok("nbd://example.com"),
            (tcp("example.com", 10809), "".into())
        );
        assert_eq!(
            ok("nbd://example.com//disk"),
            (tcp("example.com", 10809), "/disk".into())
        );
        assert_eq!(
            ok("nbd://example.com/hello%20world"),
            (tcp("example.com", 10809), "hello world".into())
        );
        assert_eq!(
            ok("nbd://127.0.0.1:1234/a/b"),
            (tcp("127.0.0.1", 1234), "a/b".into())
        );
        assert_eq!(ok("NBD://host:/x"), (tcp("host", DEFAULT_PORT), "x".into()));
    }

    #[test]
    fn ipv6_literals_need_brackets() {
        assert_eq!(ok("nbd://[::1]:10810/e"), (tcp("::1", 10810), "e".into()));
        assert_eq!(ok("nbd://[fe80::2]"), (tcp("fe80::2", 10809), "".into()));
        assert!(matches!(
            parse("nbd://[::1"),
            Err(UriError::InvalidHost { .. })
        ));
        assert!(matches!(
            parse("nbd://[::1]x"),
            Err(UriError::InvalidHost { .. })
        ));
        assert!(matches!(
            parse("nbd://[]:1"),
            Err(UriError::InvalidHost { .. })
        ));
        // Without brackets the colons read as a port separator.
        assert!(matches!(
            parse("nbd://::1/"),
            Err(UriError::MissingHost { .. })
        ));
    }

    #[test]
    fn unix_uris_take_a_socket_parameter() {
        assert_eq!(
            ok("nbd+unix:///disk?socket=/run/nbd.sock"),
            (unix("/run/nbd.sock"), "disk".into())
        );
        assert_eq!(
            ok("nbd+unix://?socket=rel.sock"),
            (unix("rel.sock"), "".into())
        );
        assert_eq!(
            ok("nbd+unix:///?socket=/tmp/a%20b%3Fc"),
            (unix("/tmp/a b?c"), "".into())
        );
        assert_eq!(
            ok("nbd+unix:///ex%2Fport?socket=s&"),
            (unix("s"), "ex/port".into())
        );
    }

    #[test]
    fn unix_uri_errors() {
        assert!(matches!(
            parse("nbd+unix:///disk"),
            Err(UriError::MissingSocket { .. })
        ));
        assert!(matches!(
            parse("nbd+unix:///disk?socket="),
            Err(UriError::MissingSocket { .. })
        ));
        assert!(matches!(
            parse("nbd+unix://host/disk?socket=/s"),
            Err(UriError::UnixWithHost { .. })
        ));
        assert!(matches!(
            parse("nbd+unix:///?socket=/a&socket=/b"),
            Err(UriError::DuplicateParameter { .. })
        ));
        assert!(matches!(
            parse("nbd+unix:///?socket=%00abstract"),
            Err(UriError::AbstractSocket { .. })
        ));
        assert!(matches!(
            parse("nbd://host/?socket=/s"),
            Err(UriError::SocketOnTcp { .. })
        ));
    }

    #[test]
    fn tls_schemes_take_libnbds_parameters() {
        let uri = parse("nbds://alice@host:10810/x?tls-psk-file=/k%20s.psk").unwrap();
        assert_eq!(uri.address, tcp("host", 10810));
        let tls = uri.tls.unwrap();
        assert_eq!(tls.psk_file, Some(PathBuf::from("/k s.psk")));
        assert_eq!(tls.username.as_deref(), Some("alice"));
        assert!(tls.verify_peer);
        let uri = parse(
            "nbds+unix:///?socket=/s&tls-certificates=/pki&tls-verify-peer=false&tls-username=bob",
        )
        .unwrap();
        assert_eq!(uri.address, unix("/s"));
        let tls = uri.tls.unwrap();
        assert_eq!(tls.certificates, Some(PathBuf::from("/pki")));
        assert_eq!(tls.username.as_deref(), Some("bob"));
        assert!(!tls.verify_peer);
        let uri = parse("nbds+unix://carol@/?socket=/s").unwrap();
        assert_eq!(uri.tls.unwrap().username.as_deref(), Some("carol"));
        assert!(parse("nbd://host/x").unwrap().tls.is_none());
        assert!(matches!(
            parse("nbds://h/?tls-certificates=/a&tls-psk-file=/b"),
            Err(UriError::TlsBothCredentials { .. })
        ));
        assert!(matches!(
            parse("nbds://h/?tls-verify-peer=maybe"),
            Err(UriError::TlsVerifyPeer { .. })
        ));
        assert!(matches!(
            parse("nbds://h/?tls-psk-file=/a&tls-psk-file=/b"),
            Err(UriError::DuplicateParameter { .. })
        ));
    }

    #[test]
    fn tls_and_other_schemes_are_refused_clearly() {
        let e = parse("nbds+vsock://1:10809").unwrap_err();
        assert!(matches!(e, UriError::TlsNotSupported { .. }), "{e}");
        assert!(matches!(
            parse("nbd+vsock://1:10809"),
            Err(UriError::UnsupportedScheme { .. })
        ));
        assert!(matches!(
            parse("http://host/"),
            Err(UriError::NotNbd { .. })
        ));
        assert!(matches!(parse("/dev/sda"), Err(UriError::NotNbd { .. })));
        assert!(matches!(
            parse("nbd://host/?tls-type=x509"),
            Err(UriError::TlsParameter { .. })
        ));
        assert!(matches!(
            parse("nbd://host/?x-foo=1"),
            Err(UriError::UnknownParameter { .. })
        ));
    }

    #[test]
    fn malformed_authority_and_encoding() {
        assert!(matches!(
            parse("nbd:///disk"),
            Err(UriError::MissingHost { .. })
        ));
        assert!(matches!(
            parse("nbd://host:0/"),
            Err(UriError::InvalidPort { .. })
        ));
        assert!(matches!(
            parse("nbd://host:65536/"),
            Err(UriError::InvalidPort { .. })
        ));
        assert!(matches!(
            parse("nbd://host:+80/"),
            Err(UriError::InvalidPort { .. })
        ));
        assert!(matches!(
            parse("nbd://host:12ab/"),
            Err(UriError::InvalidPort { .. })
        ));
        assert!(matches!(
            parse("nbd://user@host/"),
            Err(UriError::UserInfoNotSupported { .. })
        ));
        assert!(matches!(
            parse("nbd://host/a%2"),
            Err(UriError::BadPercentEncoding { .. })
        ));
        assert!(matches!(
            parse("nbd://host/a%zz"),
            Err(UriError::BadPercentEncoding { .. })
        ));
        assert!(matches!(
            parse("nbd://host/%ff"),
            Err(UriError::InvalidExportName { .. })
        ));
        assert!(matches!(
            parse("nbd://host/a%00b"),
            Err(UriError::InvalidExportName { .. })
        ));
        assert!(matches!(
            parse("nbd://host/x#frag"),
            Err(UriError::Fragment { .. })
        ));
        let long = format!("nbd://host/{}", "e".repeat(MAX_STRING_BYTES + 1));
        assert!(matches!(
            parse(&long),
            Err(UriError::InvalidExportName { .. })
        ));
        // Multi-byte UTF-8 near a '%' must not panic.
        assert!(parse("nbd://host/é%é").is_err());
    }

    #[test]
    fn is_nbd_uri_tells_uris_from_paths() {
        for text in [
            "nbd://h",
            "nbd+unix:///?socket=s",
            "nbds://h",
            "NBD://h",
            "nbd+vsock://1",
        ] {
            assert!(is_nbd_uri(text), "{text}");
        }
        for text in [
            "/dev/sdb",
            "backing.img",
            "./nbd://x",
            "http://h",
            "nbd:foo",
            "",
        ] {
            assert!(!is_nbd_uri(text), "{text}");
        }
    }

    #[test]
    fn from_str_matches_parse() {
        let uri: NbdUri = "nbd://h:99/e".parse().unwrap();
        assert_eq!(uri, parse("nbd://h:99/e").unwrap());
        assert!("nope".parse::<NbdUri>().is_err());
    }
}
