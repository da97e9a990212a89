//! The handshake phase: fixed newstyle only. Greeting, client flags, then option haggling until
//! the client picks the export (`EXPORT_NAME` or `GO`), aborts, or breaks the protocol.
//!
//! Handshake traffic is small and rare, so this reads exactly each message and writes each reply
//! at once; it never reads past the last option, so the transmission reader starts clean.

use std::io;

use logcache_nbd::consts::{
    CLIENT_FLAGS_BYTES, DEFAULT_MAX_OPTION_BYTES, FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES,
    OPTION_HEADER_BYTES, OPT_ABORT, OPT_EXPORT_NAME, OPT_GO, OPT_INFO, OPT_LIST,
    OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT, OPT_STARTTLS, OPT_STRUCTURED_REPLY,
    REP_ERR_INVALID, REP_ERR_TLS_REQD, REP_ERR_UNKNOWN, REP_ERR_UNSUP,
};
use logcache_nbd::handshake::{
    decode_client_flags, decode_export_name, decode_option_header, encode_greeting, InfoRequest,
    MetaContextRequest,
};
use logcache_nbd::option_reply::{
    encode_ack, encode_error, encode_export_name_reply, encode_meta_context, encode_server,
    BlockSizeConstraints, Info,
};
use logcache_nbd::ProtocolError;

use crate::limits::{MAX_PAYLOAD_BYTES, MIN_BLOCK_BYTES, PREFERRED_BLOCK_BYTES};
use crate::meta::Selection;
use crate::reply::shorten;
use crate::shared::ServerInner;
use crate::stream::Stream;
use crate::tls::TlsMode;

/// What we advertise in the greeting.
const HANDSHAKE_FLAGS: u16 = FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES;
/// The spec says `LIST_META_CONTEXT` replies carry id 0, which clients ignore.
const LISTED_CONTEXT_ID: u32 = 0;
/// Longest message in an option error reply.
const OPTION_ERROR_MESSAGE_MAX_BYTES: usize = 512;

/// What the client negotiated, fixed for the transmission phase.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Session {
    pub structured: bool,
    /// The metadata contexts selected; BLOCK_STATUS needs at least one.
    pub contexts: Selection,
}

pub(crate) enum Outcome {
    /// Option haggling ended with an export chosen.
    Transmission(Session),
    /// The client aborted, or asked for an export we do not have with `EXPORT_NAME`.
    Closed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HandshakeError {
    /// The socket failed or the client went away (not the client's protocol error).
    Io,
    /// The client broke a rule the spec says to disconnect for.
    Violation,
    /// The TLS handshake after STARTTLS failed; why, in one line for the server log.
    Tls(String),
}

impl From<io::Error> for HandshakeError {
    fn from(_: io::Error) -> Self {
        HandshakeError::Io
    }
}

fn violation(_: ProtocolError) -> HandshakeError {
    HandshakeError::Violation
}

/// Runs the handshake on a fresh connection.
pub(crate) fn negotiate(stream: &Stream, server: &ServerInner) -> Result<Outcome, HandshakeError> {
    stream.send_all(&encode_greeting(HANDSHAKE_FLAGS))?;
    let mut flag_bytes = [0u8; CLIENT_FLAGS_BYTES];
    stream.recv_exact(&mut flag_bytes)?;
    let client_flags = decode_client_flags(&flag_bytes, HANDSHAKE_FLAGS).map_err(violation)?;
    if !client_flags.fixed_newstyle {
        // We offer nothing else (the spec lets servers refuse plain newstyle clients).
        return Err(HandshakeError::Violation);
    }
    let mut negotiation = Negotiation {
        stream,
        server,
        session: Session::default(),
        no_zeroes: client_flags.no_zeroes,
    };
    loop {
        let mut header_bytes = [0u8; OPTION_HEADER_BYTES];
        stream.recv_exact(&mut header_bytes)?;
        // Bad magic or a payload over the cap (we would have to buffer it) ends the connection.
        let header =
            decode_option_header(&header_bytes, DEFAULT_MAX_OPTION_BYTES).map_err(violation)?;
        let mut payload = vec![0u8; header.length_bytes as usize];
        stream.recv_exact(&mut payload)?;
        if let Some(outcome) = negotiation.handle(header.option, &payload)? {
            return Ok(outcome);
        }
    }
}

struct Negotiation<'a> {
    stream: &'a Stream,
    server: &'a ServerInner,
    session: Session,
    no_zeroes: bool,
}

type Step = Result<Option<Outcome>, HandshakeError>;

impl Negotiation<'_> {
    fn handle(&mut self, option: u32, payload: &[u8]) -> Step {
        if self.tls_required() && option != OPT_STARTTLS && option != OPT_ABORT {
            // FORCEDTLS: EXPORT_NAME cannot carry an error, so it ends the connection.
            if option == OPT_EXPORT_NAME {
                return Ok(Some(Outcome::Closed));
            }
            return self.error(
                option,
                REP_ERR_TLS_REQD,
                "this server requires TLS: connect with nbds:// (or --tls with qemu), with the certificates or PSK it was given",
            );
        }
        match option {
            OPT_EXPORT_NAME => self.export_name(payload),
            OPT_ABORT => {
                // The client may already be gone; it is leaving either way.
                let _ = self.stream.send_all(&encode_ack(option));
                Ok(Some(Outcome::Closed))
            }
            OPT_LIST => self.list(option, payload),
            OPT_INFO | OPT_GO => self.info(option, payload),
            OPT_STRUCTURED_REPLY => self.structured_reply(option, payload),
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => self.meta_context(option, payload),
            OPT_STARTTLS => self.start_tls(option, payload),
            _ => self.error(option, REP_ERR_UNSUP, "unknown option"),
        }
    }

    /// Whether options other than STARTTLS must wait for TLS.
    fn tls_required(&self) -> bool {
        let required =
            matches!(&self.server.config.tls, Some(tls) if tls.mode() == TlsMode::Require);
        required && !self.stream.is_tls()
    }

    /// `STARTTLS`: acknowledge, then the TLS handshake; all later traffic is TLS.
    fn start_tls(&mut self, option: u32, payload: &[u8]) -> Step {
        let Some(tls) = &self.server.config.tls else {
            return self.error(
                option,
                REP_ERR_UNSUP,
                "TLS is not enabled on this server (it needs --tls-certificates or --tls-psk)",
            );
        };
        if self.stream.is_tls() {
            return self.error(option, REP_ERR_INVALID, "TLS is already active");
        }
        if !payload.is_empty() {
            return self.error(option, REP_ERR_INVALID, "STARTTLS takes no data");
        }
        self.stream.send_all(&encode_ack(option))?;
        self.stream
            .start_tls(tls.context())
            .map_err(HandshakeError::Tls)?;
        // What was negotiated in the clear could have been tampered with: start over.
        self.session = Session::default();
        Ok(None)
    }

    /// `EXPORT_NAME` cannot carry an error, so an unknown name just closes the connection.
    fn export_name(&mut self, payload: &[u8]) -> Step {
        let name = decode_export_name(payload).map_err(violation)?;
        if !self.server.config.matches_export(&name) {
            return Ok(Some(Outcome::Closed));
        }
        let reply = encode_export_name_reply(
            self.server.export_size_bytes,
            self.server.transmission_flags,
            self.no_zeroes,
        );
        self.stream.send_all(&reply)?;
        Ok(Some(Outcome::Transmission(std::mem::take(
            &mut self.session,
        ))))
    }

    fn list(&mut self, option: u32, payload: &[u8]) -> Step {
        if !payload.is_empty() {
            return self.error(option, REP_ERR_INVALID, "LIST takes no data");
        }
        let mut reply =
            encode_server(option, &self.server.config.export_name).map_err(violation)?;
        reply.extend_from_slice(&encode_ack(option));
        self.stream.send_all(&reply)?;
        Ok(None)
    }

    /// `INFO` and `GO`: the export's size and flags, name, description and block sizes (sent
    /// whether asked for or not), then `ACK`; `GO` then enters transmission.
    fn info(&mut self, option: u32, payload: &[u8]) -> Step {
        let Ok(request) = InfoRequest::decode(payload) else {
            return self.error(option, REP_ERR_INVALID, "malformed INFO/GO request");
        };
        if !self.server.config.matches_export(&request.export_name) {
            return self.unknown_export(option);
        }
        let config = &self.server.config;
        let infos = [
            Info::Export {
                size_bytes: self.server.export_size_bytes,
                transmission_flags: self.server.transmission_flags,
            },
            Info::Name(config.export_name.clone()),
            Info::Description(config.description.clone()),
            Info::BlockSize(BlockSizeConstraints {
                minimum_bytes: MIN_BLOCK_BYTES,
                preferred_bytes: PREFERRED_BLOCK_BYTES,
                maximum_payload_bytes: MAX_PAYLOAD_BYTES,
            }),
        ];
        let mut reply = Vec::new();
        for info in &infos {
            reply.extend_from_slice(&info.encode_reply(option).map_err(violation)?);
        }
        reply.extend_from_slice(&encode_ack(option));
        self.stream.send_all(&reply)?;
        if option == OPT_GO {
            return Ok(Some(Outcome::Transmission(std::mem::take(
                &mut self.session,
            ))));
        }
        Ok(None)
    }

    fn structured_reply(&mut self, option: u32, payload: &[u8]) -> Step {
        if !payload.is_empty() {
            return self.error(option, REP_ERR_INVALID, "STRUCTURED_REPLY takes no data");
        }
        // Metadata contexts need structured replies first, so "already negotiated" also
        // covers a request after SET_META_CONTEXT.
        if self.session.structured {
            return self.error(
                option,
                REP_ERR_INVALID,
                "structured replies are already negotiated",
            );
        }
        self.session.structured = true;
        self.stream.send_all(&encode_ack(option))?;
        Ok(None)
    }

    /// `LIST_META_CONTEXT` and `SET_META_CONTEXT` over the contexts in `meta`.
    fn meta_context(&mut self, option: u32, payload: &[u8]) -> Step {
        if !self.session.structured {
            return self.error(
                option,
                REP_ERR_INVALID,
                "negotiate structured replies before metadata contexts",
            );
        }
        let Ok(request) = MetaContextRequest::decode(payload) else {
            return self.error(
                option,
                REP_ERR_INVALID,
                "malformed metadata context request",
            );
        };
        if !self.server.config.matches_export(&request.export_name) {
            return self.unknown_export(option);
        }
        let listing = option == OPT_LIST_META_CONTEXT;
        let checkpoints = self.server.export.checkpoint_names();
        let selection = Selection::of_queries(&request.queries, listing, &checkpoints);
        let mut reply = Vec::new();
        for (id, context) in selection.iter() {
            let context_id = if listing { LISTED_CONTEXT_ID } else { id };
            reply.extend_from_slice(
                &encode_meta_context(option, context_id, &context.name()).map_err(violation)?,
            );
        }
        if !listing {
            // SET replaces whatever an earlier SET selected (with no query: nothing).
            self.session.contexts = selection;
        }
        reply.extend_from_slice(&encode_ack(option));
        self.stream.send_all(&reply)?;
        Ok(None)
    }

    fn unknown_export(&mut self, option: u32) -> Step {
        let message = format!(
            "unknown export; this server exports {:?} (or use the empty name)",
            self.server.config.export_name
        );
        self.error(option, REP_ERR_UNKNOWN, &message)
    }

    /// Sends an error reply and stays in option haggling.
    fn error(&mut self, option: u32, reply_type: u32, message: &str) -> Step {
        let message = shorten(message, OPTION_ERROR_MESSAGE_MAX_BYTES);
        let reply = encode_error(option, reply_type, message).map_err(violation)?;
        self.stream.send_all(&reply)?;
        Ok(None)
    }
}
