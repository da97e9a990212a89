//! Replies the reader and the workers build alike: a READ answered straight into the reply
//! buffer, and the reply to any other command's result (success, or the engine's error as an
//! NBD errno with its message).

use logcache_nbd::request::Request;

use crate::connection::Connection;
use crate::{errno, ops, reply};

/// READ: the reply header, then the data read straight into the reply buffer behind it (the
/// reader's batch, or a worker's reply).
pub(crate) fn read(
    connection: &Connection,
    replies: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
    request: &Request,
) {
    let structured = connection.session.structured;
    let length_bytes = request.length_bytes as usize;
    let reply_start = replies.len();
    reply::push_read_header(
        replies,
        structured,
        request.cookie,
        request.offset_bytes,
        request.length_bytes,
    );
    let data_start = replies.len();
    replies.resize(data_start + length_bytes, 0);
    if let Err(error) = ops::read(
        &*connection.server.export,
        request.offset_bytes,
        &mut replies[data_start..],
        scratch,
    ) {
        replies.truncate(reply_start);
        push_result(replies, structured, request.cookie, Err(error));
    }
}

/// Appends the reply to a command that returned `result`.
pub(crate) fn push_result(
    replies: &mut Vec<u8>,
    structured: bool,
    cookie: u64,
    result: logcache_engine::Result<()>,
) {
    match result {
        Ok(()) => reply::push_success(replies, structured, cookie),
        Err(error) => reply::push_error(
            replies,
            structured,
            cookie,
            errno::from_engine(&error),
            &error.to_string(),
        ),
    }
}
