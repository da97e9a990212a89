//! The NBD wire protocol as pure data transformations: constants, encoders and decoders.
//!
//! This crate does no I/O. Headers decode from fixed-size arrays so a server can read exactly that
//! many bytes from a socket first; variable payloads decode from slices whose length the server
//! already learned from a header (and capped, see [`handshake::decode_option_header`]). Every
//! decoder returns a [`ProtocolError`] for malformed input instead of panicking, because all of
//! these bytes come from an untrusted peer. Everything is big-endian, as the spec requires.

pub mod consts;
pub mod error;
pub mod handshake;
pub mod option_reply;
pub mod reply;
pub mod request;
mod wire;

pub use error::{ProtocolError, Result};
