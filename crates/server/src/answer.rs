//! Replies the reader and the workers build alike: a READ answered straight into the reply
//! buffer, and the reply to any other command's result (success, or the engine's error as an
//! NBD errno with its message), and BLOCK_STATUS: one chunk per selected metadata context.

use logcache_nbd::consts::CMD_FLAG_REQ_ONE;
use logcache_nbd::reply::BlockDescriptor;
use logcache_nbd::request::Request;

use crate::connection::Connection;
use crate::limits::MAX_BLOCK_STATUS_EXTENTS;
use crate::meta::{MetaContext, BASE_ALLOCATION_ZERO_HOLE};
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

/// BLOCK_STATUS (validated: non-empty, inside the export, a context selected): one chunk per
/// selected context, the last marked done; with `REQ_ONE`, one extent per chunk.
pub(crate) fn block_status(connection: &Connection, replies: &mut Vec<u8>, request: &Request) {
    let session = &connection.session;
    assert!(session.structured && !session.contexts.is_empty());
    assert!(request.length_bytes > 0);
    let max_extents = if request.has_flag(CMD_FLAG_REQ_ONE) {
        1
    } else {
        MAX_BLOCK_STATUS_EXTENTS
    };
    let last_id = session.contexts.iter().last().map(MetaContext::id);
    let mut extents = Vec::new();
    let mut descriptors = Vec::new();
    for context in session.contexts.iter() {
        let export = &*connection.server.export;
        let result = match context {
            MetaContext::BaseAllocation => export.block_status(
                request.offset_bytes,
                u64::from(request.length_bytes),
                max_extents,
                &mut extents,
            ),
        };
        if let Err(error) = result {
            push_result(replies, true, request.cookie, Err(error));
            return;
        }
        descriptors.clear();
        descriptors.extend(extents.iter().map(|extent| {
            BlockDescriptor {
                length_bytes: u32::try_from(extent.length_bytes)
                    .expect("extents lie inside a request of at most 4 GiB"),
                status_flags: if extent.zero_hole {
                    BASE_ALLOCATION_ZERO_HOLE
                } else {
                    0
                },
            }
        }));
        assert!(!descriptors.is_empty() && descriptors.len() <= max_extents);
        let done = Some(context.id()) == last_id;
        reply::push_block_status(replies, request.cookie, context.id(), &descriptors, done);
    }
}
