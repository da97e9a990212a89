//! Replies the reader and the workers build: a READ answered straight into the worker's reply
//! buffer, the reply to any other command's result (success, or the engine's error as an
//! NBD errno with its message), and BLOCK_STATUS: one chunk per selected metadata context.

use logcache_engine::io::aligned::AlignedBuf;
use logcache_engine::CachedRead;
use logcache_nbd::consts::CMD_FLAG_REQ_ONE;
use logcache_nbd::reply::BlockDescriptor;
use logcache_nbd::request::Request;

use crate::connection::Connection;
use crate::limits::MAX_BLOCK_STATUS_EXTENTS;
use crate::meta::{base_allocation_flags, MetaContext, DIRTY_BITMAP_CHANGED};
use crate::{errno, ops, reply};

/// READ on a worker: the reply built in `out` (a buffer the worker keeps) so that the data
/// starts on a 4 KiB boundary, which lets the engine read the cache device straight into it
/// (O_DIRECT, no bounce) and the reply go out from there: no copy of the data in between.
/// `out` only grows (it is never zero-filled again); returns the reply, a slice of it.
pub(crate) fn read_aligned<'a, B: ReplyBuffer>(
    connection: &Connection,
    out: &'a mut B,
    header: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
    request: &Request,
) -> &'a [u8] {
    let export = &*connection.server.export;
    let served = read_into_reply(connection, out, header, request, |offset_bytes, data| {
        ops::read(export, offset_bytes, data, scratch).map(|()| true)
    });
    served.expect("a full read always serves")
}

/// READ on a connection's reader: as [`read_aligned`], but only if the export can serve it
/// without a slow device (`Export::read_if_cached`); `None` (nothing sent or read) otherwise,
/// and then a worker serves it. Sector-aligned requests of at most `max_bytes` only (others
/// need read-modify-write scratch and are rare).
pub(crate) fn read_cached<'a, B: ReplyBuffer>(
    connection: &Connection,
    out: &'a mut B,
    header: &mut Vec<u8>,
    request: &Request,
    max_bytes: u32,
) -> Option<&'a [u8]> {
    let sector_bytes = crate::limits::SECTOR_BYTES;
    if !request.offset_bytes.is_multiple_of(sector_bytes)
        || u64::from(request.length_bytes) % sector_bytes != 0
        || request.length_bytes > max_bytes
    {
        return None;
    }
    let export = &*connection.server.export;
    read_into_reply(connection, out, header, request, |offset_bytes, data| {
        export.read_if_cached(offset_bytes, data)
    })
}

/// Lays out a READ reply in `out` (header, then the data on a 4 KiB boundary) and lets `read`
/// fill the data: `None` if it declined (`Ok(false)`), the error reply if it failed.
fn read_into_reply<'a, B: ReplyBuffer>(
    connection: &Connection,
    out: &'a mut B,
    header: &mut Vec<u8>,
    request: &Request,
    read: impl FnOnce(u64, &mut [u8]) -> logcache_engine::Result<bool>,
) -> Option<&'a [u8]> {
    let layout = ReadLayout::new(connection, out, header, request);
    let out = out.bytes_mut();
    match read(request.offset_bytes, layout.data(out)) {
        Ok(true) => Some(layout.finish(connection, out, header, request, Ok(()))),
        Ok(false) => None,
        Err(error) => Some(layout.finish(connection, out, header, request, Err(error))),
    }
}

/// Where a READ reply lies in its buffer: the header (already in `header`) goes just before
/// the data, which starts on a 4 KiB boundary so the engine reads the cache device straight
/// into it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadLayout {
    start: usize,
    data_start: usize,
    length_bytes: usize,
}

impl ReadLayout {
    /// Builds the reply header in `header` and makes room in `out` (which only grows: it is
    /// never zero-filled again).
    pub(crate) fn new(
        connection: &Connection,
        out: &mut impl ReplyBuffer,
        header: &mut Vec<u8>,
        request: &Request,
    ) -> ReadLayout {
        let length_bytes = request.length_bytes as usize;
        header.clear();
        reply::push_read_header(
            header,
            connection.session.structured,
            request.cookie,
            request.offset_bytes,
            request.length_bytes,
        );
        let total_bytes = DATA_ALIGN_BYTES + header.len() + length_bytes;
        let out = out.room(total_bytes);
        let data_start = aligned_data_start(out.as_ptr() as usize, 0, header.len());
        let start = data_start - header.len();
        ReadLayout {
            start,
            data_start,
            length_bytes,
        }
    }

    /// The data's place in `out` (the buffer `new` laid out).
    pub(crate) fn data(self, out: &mut [u8]) -> &mut [u8] {
        &mut out[self.data_start..self.data_start + self.length_bytes]
    }

    /// Once the data is read (`Ok`) or the read failed: the whole reply, a slice of `out`.
    pub(crate) fn finish<'a>(
        self,
        connection: &Connection,
        out: &'a mut [u8],
        header: &mut Vec<u8>,
        request: &Request,
        result: logcache_engine::Result<()>,
    ) -> &'a [u8] {
        if let Err(error) = result {
            header.clear();
            push_result(
                header,
                connection.session.structured,
                request.cookie,
                Err(error),
            );
            return header_as_reply(out, header);
        }
        out[self.start..self.data_start].copy_from_slice(header);
        &out[self.start..self.data_start + self.length_bytes]
    }
}

/// A buffer READ replies are laid out in (`ReadLayout`): it only grows, so it is not
/// zero-filled again per request.
pub(crate) trait ReplyBuffer {
    /// At least `bytes` of room, the whole buffer.
    fn room(&mut self, bytes: usize) -> &mut [u8];
    /// The whole buffer as it is.
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl ReplyBuffer for Vec<u8> {
    fn room(&mut self, bytes: usize) -> &mut [u8] {
        if self.len() < bytes {
            self.resize(bytes, 0);
        }
        self
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// The reply buffer of a worker's large READs (`LARGE_READ_MIN_BYTES` and up): whole 2 MiB
/// huge pages (`AlignedBuf::new_huge_pages`), so the kernel pins a few pages per O_DIRECT
/// read rather than one per 4 KiB, and the CRC pass and the send's copy walk few TLB entries.
/// Empty until the first large READ; replaced by a larger one when a READ needs more.
#[derive(Default)]
pub(crate) struct LargeReplyBuffer(Option<AlignedBuf>);

impl LargeReplyBuffer {
    pub(crate) fn len_bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |buf| buf.len())
    }

    /// Lets the memory go (after a READ larger than the connection keeps buffers for).
    pub(crate) fn release(&mut self) {
        self.0 = None;
    }
}

impl ReplyBuffer for LargeReplyBuffer {
    fn room(&mut self, bytes: usize) -> &mut [u8] {
        if self.len_bytes() < bytes {
            // Dropped first, so two large buffers are never mapped at once.
            self.0 = None;
            self.0 = Some(AlignedBuf::new_huge_pages(bytes));
        }
        self.bytes_mut()
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().unwrap_or_default()
    }
}

/// An error reply built in `header`, returned as the reply slice (copied into `out`).
fn header_as_reply<'a>(out: &'a mut [u8], header: &[u8]) -> &'a [u8] {
    out[..header.len()].copy_from_slice(header);
    &out[..header.len()]
}

/// The alignment O_DIRECT needs of the memory a device reads into.
pub(crate) const DATA_ALIGN_BYTES: usize = 4096;

/// Where a READ reply's data starts in a buffer at `base_address` when its header (of
/// `header_bytes`) may start at `from` or later: the first offset after the header whose
/// address is 4 KiB-aligned (at most `DATA_ALIGN_BYTES - 1` bytes of padding before the header).
pub(crate) fn aligned_data_start(base_address: usize, from: usize, header_bytes: usize) -> usize {
    let misalignment = (base_address + from + header_bytes) % DATA_ALIGN_BYTES;
    let data_start = from + header_bytes + (DATA_ALIGN_BYTES - misalignment) % DATA_ALIGN_BYTES;
    debug_assert_eq!((base_address + data_start) % DATA_ALIGN_BYTES, 0);
    data_start
}

/// Empties `reads` and hands its allocation back with another lifetime, so a worker (or the
/// reader, for its bursts) keeps one `Vec` for every batch (no allocation per batch) although
/// each borrows other buffers. The types differ only in lifetime, so `collect` reuses the
/// allocation in place.
pub(crate) fn recycle_reads<'b>(mut reads: Vec<CachedRead<'_>>) -> Vec<CachedRead<'b>> {
    reads.clear();
    reads.into_iter().map(|_| unreachable!("emptied")).collect()
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
    let last_id = session.contexts.last_id();
    let mut extents = Vec::new();
    let mut runs = Vec::new();
    let mut descriptors = Vec::new();
    for (id, context) in session.contexts.iter() {
        let export = &*connection.server.export;
        let (offset, length) = (request.offset_bytes, u64::from(request.length_bytes));
        descriptors.clear();
        let result = match context {
            MetaContext::BaseAllocation => export
                .block_status(offset, length, max_extents, &mut extents)
                .map(|()| {
                    descriptors.extend(extents.iter().map(|extent| {
                        BlockDescriptor {
                            length_bytes: u32::try_from(extent.length_bytes)
                                .expect("extents lie inside a request of at most 4 GiB"),
                            status_flags: base_allocation_flags(extent.kind),
                        }
                    }))
                }),
            MetaContext::DirtyBitmap(name) => export
                .changed_runs(name, offset, length, max_extents, &mut runs)
                .map(|()| {
                    descriptors.extend(runs.iter().map(|&(length_bytes, changed)| {
                        BlockDescriptor {
                            length_bytes: u32::try_from(length_bytes)
                                .expect("runs lie inside a request of at most 4 GiB"),
                            status_flags: if changed { DIRTY_BITMAP_CHANGED } else { 0 },
                        }
                    }))
                }),
        };
        if let Err(error) = result {
            push_result(replies, true, request.cookie, Err(error));
            return;
        }
        assert!(!descriptors.is_empty() && descriptors.len() <= max_extents);
        let done = Some(id) == last_id;
        reply::push_block_status(replies, request.cookie, id, &descriptors, done);
    }
}
