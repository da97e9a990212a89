//! A TLS session over a connected socket, shared by the connection's reader and its reply
//! writers the way the plain socket is: `recv` by one reader, `send_all` by writers the sink
//! already serialises.
//!
//! OpenSSL's session object may not be used by two threads at once, and a reader blocked in
//! `SSL_read` on the socket would hold it while writers wait. So the session works on memory
//! buffers only (`Buffers`), and socket IO happens outside its lock: the reader receives
//! ciphertext, then locks only to decrypt; a writer locks only to encrypt, then sends. Lock
//! order is `sending` before `state`, and all ciphertext leaves through `sending`, so records go
//! out in the order they were sealed even when the reader has to answer the peer (TLS 1.3 key
//! updates).

use std::io::{self, Read, Write};

use openssl::ssl::{ErrorCode, Ssl, SslContext, SslStream};
use parking_lot::Mutex;

use super::credentials::{first_reason, psk_note_index};
use crate::stream::Socket;

/// OpenSSL's reasons for a handshake where client and server hold different pre-shared keys.
const PSK_MISMATCH_REASONS: [&str; 4] = [
    "binder does not verify",
    "bad record mac",
    "decryption failed or bad record mac",
    "decrypt error",
];

/// `X509_V_ERR_UNSPECIFIED`: no certificate was verified on this session.
const X509_V_ERR_UNSPECIFIED: i32 = 1;

/// One socket read takes at most this much ciphertext (a few full TLS records).
const RAW_READ_BYTES: usize = 64 * 1024;

pub(crate) struct TlsChannel {
    state: Mutex<SslStream<Buffers>>,
    /// Ciphertext being sent; whoever holds it is the only one sending.
    sending: Mutex<Vec<u8>>,
    /// Ciphertext just received (only the connection's reader uses it).
    receiving: Mutex<Vec<u8>>,
}

/// What OpenSSL reads from and writes to instead of the socket.
#[derive(Default)]
struct Buffers {
    inbound: Vec<u8>,
    inbound_start: usize,
    outbound: Vec<u8>,
    /// The socket reached end of stream: reads report end of file once `inbound` is drained.
    peer_closed: bool,
}

impl Read for Buffers {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        assert!(self.inbound_start <= self.inbound.len());
        let available = &self.inbound[self.inbound_start..];
        if available.is_empty() {
            return if self.peer_closed {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let count = available.len().min(buf.len());
        buf[..count].copy_from_slice(&available[..count]);
        self.inbound_start += count;
        if self.inbound_start == self.inbound.len() {
            self.inbound.clear();
            self.inbound_start = 0;
        }
        Ok(count)
    }
}

impl Write for Buffers {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.outbound.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Buffers {
    fn received(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            self.peer_closed = true;
        } else {
            self.inbound.extend_from_slice(bytes);
        }
    }
}

/// Runs the server side of the TLS handshake on `socket` (whose read timeout bounds how long a
/// silent client can hold it). On failure, returns one line saying why, for the server log.
pub(crate) fn accept(context: &SslContext, socket: &Socket) -> Result<TlsChannel, String> {
    let ssl = Ssl::new(context).map_err(|e| format!("cannot start TLS: {}", first_reason(&e)))?;
    let mut session = SslStream::new(ssl, Buffers::default())
        .map_err(|e| format!("cannot start TLS: {}", first_reason(&e)))?;
    let mut raw = vec![0u8; RAW_READ_BYTES];
    loop {
        let result = session.accept();
        // Send what the handshake produced, a fatal alert included: it tells the client why.
        let outbound = std::mem::take(&mut session.get_mut().outbound);
        let sent = socket.send_all(&outbound);
        match result {
            Ok(()) => {
                sent.map_err(|e| format!("the client went away during the TLS handshake: {e}"))?;
                break;
            }
            Err(error) if error.code() == ErrorCode::WANT_READ => {
                sent.map_err(|e| format!("the client went away during the TLS handshake: {e}"))?;
            }
            Err(error) => return Err(describe_failure(&session, &error)),
        }
        match socket.recv(&mut raw, false) {
            Ok(0) => return Err("the client closed the connection during the TLS handshake".into()),
            Ok(received) => session.get_mut().received(&raw[..received]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err("the client did not finish the TLS handshake in time".into())
            }
            Err(e) => {
                return Err(format!(
                    "the connection failed during the TLS handshake: {e}"
                ))
            }
        }
    }
    Ok(TlsChannel {
        state: Mutex::new(session),
        sending: Mutex::new(Vec::new()),
        receiving: Mutex::new(raw),
    })
}

/// Why a handshake failed, in the words an operator can act on.
fn describe_failure(session: &SslStream<Buffers>, error: &openssl::ssl::Error) -> String {
    let ssl = session.ssl();
    let reason = match error.ssl_error() {
        Some(stack) => first_reason(stack),
        None => error.to_string(),
    };
    if let Some(note) = ssl.ex_data(psk_note_index()) {
        if note.starts_with("unknown") {
            return format!(
                "TLS handshake refused: the client offered an {note}, which is not in the PSK file"
            );
        }
        // What OpenSSL says when the two ends derived different keys (TLS 1.3, then 1.2).
        if PSK_MISMATCH_REASONS.contains(&reason.as_str()) {
            return format!("TLS handshake refused: the client's key for {note} does not match the PSK file ({reason})");
        }
    }
    let verify = ssl.verify_result();
    // OpenSSL starts every session at "unspecified" until a certificate is checked.
    let checked = verify.as_raw() != X509_V_ERR_UNSPECIFIED;
    if checked && verify != openssl::x509::X509VerifyResult::OK {
        return format!(
            "TLS handshake refused: the client's certificate did not verify against our CA: {}",
            verify.error_string()
        );
    }
    if reason == "peer did not return a certificate" {
        return "TLS handshake refused: the client presented no certificate signed by our CA (--tls-verify-peer requires one)".to_owned();
    }
    if session.get_ref().peer_closed {
        return format!("the client closed the connection during the TLS handshake ({reason})");
    }
    format!("TLS handshake failed: {reason}")
}

impl TlsChannel {
    /// Reads plaintext that is available (at least one byte unless `dont_wait`); `Ok(0)` is the
    /// end of the stream.
    pub(crate) fn recv(
        &self,
        socket: &Socket,
        buf: &mut [u8],
        dont_wait: bool,
    ) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut raw = self.receiving.lock();
        loop {
            let (result, must_answer, peer_closed) = {
                let mut state = self.state.lock();
                let result = state.ssl_read(buf);
                let buffers = state.get_ref();
                (result, !buffers.outbound.is_empty(), buffers.peer_closed)
            };
            if must_answer {
                self.send_sealed(socket, &[])?;
            }
            match result {
                Ok(count) => return Ok(count),
                Err(error) if error.code() == ErrorCode::ZERO_RETURN => return Ok(0),
                Err(error) if error.code() == ErrorCode::WANT_READ => {}
                // A peer that cut the connection without a TLS close is just gone.
                Err(_) if peer_closed => return Ok(0),
                Err(error) => {
                    let reason = match error.ssl_error() {
                        Some(stack) => first_reason(stack),
                        None => error.to_string(),
                    };
                    return Err(io::Error::new(io::ErrorKind::InvalidData, reason));
                }
            }
            let received = socket.recv(&mut raw, dont_wait)?;
            self.state.lock().get_mut().received(&raw[..received]);
        }
    }

    /// Encrypts and sends all of `bytes`.
    pub(crate) fn send_all(&self, socket: &Socket, bytes: &[u8]) -> io::Result<()> {
        self.send_sealed(socket, bytes)
    }

    /// Seals `bytes` (possibly none) and sends it after any ciphertext already waiting.
    fn send_sealed(&self, socket: &Socket, mut bytes: &[u8]) -> io::Result<()> {
        let mut sealed = self.sending.lock();
        {
            let mut state = self.state.lock();
            while !bytes.is_empty() {
                let written = state.ssl_write(bytes).map_err(|error| {
                    io::Error::other(match error.ssl_error() {
                        Some(stack) => first_reason(stack),
                        None => error.to_string(),
                    })
                })?;
                bytes = &bytes[written..];
            }
            // Swap buffers rather than copy: both keep their capacity, so steady state allocates
            // nothing.
            assert!(
                sealed.is_empty(),
                "ciphertext left unsent by an earlier sender"
            );
            std::mem::swap(&mut state.get_mut().outbound, &mut *sealed);
        }
        let result = socket.send_all(&sealed);
        // Sent or not, it is gone: after a failed send the connection is cut (see `sink`).
        sealed.clear();
        result
    }
}
