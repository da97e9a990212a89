//! The server's fixed limits and tuning constants, in one place so their reasons sit together.

use std::time::Duration;

/// Largest READ or WRITE payload we accept (the spec's portable maximum, 2^25). Advertised as
/// the maximum in `INFO_BLOCK_SIZE`; a WRITE announcing more is a protocol violation.
pub const MAX_PAYLOAD_BYTES: u32 = 32 << 20;
/// Advertised preferred block size: the engine's block, so aligned 4 KiB IO avoids partial blocks.
pub const PREFERRED_BLOCK_BYTES: u32 = 4096;
/// Advertised minimum block size: any byte range works (unaligned IO is read-modify-write).
pub const MIN_BLOCK_BYTES: u32 = 1;
/// The engine's addressing unit; requests not aligned to it take the slow path.
pub const SECTOR_BYTES: u64 = logcache_engine::io::SECTOR_SIZE_BYTES;

/// Per-connection input buffer: large so that one read syscall brings many requests.
pub const INPUT_BUFFER_BYTES: usize = 256 << 10;
/// The reader writes its batched replies once they reach this size even if more requests are
/// buffered, so a long burst cannot delay replies (or grow the buffer) without bound.
pub const OUTPUT_FLUSH_BYTES: usize = 256 << 10;
/// Reply and large-payload buffers larger than this are shrunk or dropped after use, so one
/// 32 MiB request does not pin 32 MiB per connection for its lifetime.
pub const BUFFER_KEEP_BYTES: usize = 4 << 20;

/// Longest READ the reader serves itself when the cache holds all of it: longer ones go to a
/// worker without being tried. While the reader serves one it decodes nothing, so the
/// client's next requests wait for its device read, CRCs and send: for a small read that
/// costs less than a thread wake-up, for a large one it starves the device (1 MiB reads at
/// iodepth 8 served inline kept 3.5-5 device reads in flight, not 8).
pub const INLINE_READ_MAX_BYTES: u32 = 128 << 10;
/// Longest READ the reader serves itself when it is the connection's only request: nothing
/// else buffered and nothing queued or running on a worker (a client at iodepth 1), so no
/// request waits behind it and handing it to a worker would only add two thread wake-ups (the
/// worker's for the job, the reader's preemption by it). The engine's lookup window (1 MiB):
/// a larger READ is not served by `read_if_cached` anyway.
pub const LONE_INLINE_READ_MAX_BYTES: u32 = 1 << 20;
/// READs from this size up are answered on a worker from a buffer of 2 MiB huge pages
/// (`answer::LargeReplyBuffer`): measured on 1 MiB cached reads at iodepth 8, the kernel's
/// pinning of 4 KiB pages for each O_DIRECT read (`gup_fast`) was ~4.5% of the server's CPU,
/// and with huge pages ~0.25%. Smaller READs keep ordinary buffers (a huge page per worker
/// for a 4 KiB read would be 2 MiB of memory for nothing).
pub const LARGE_READ_MIN_BYTES: u32 = 256 << 10;
/// The send buffer asked for on a Unix socket (`Stream::enlarge_send_buffer`): room for a
/// few 1 MiB replies, so a worker hands its reply to the kernel in one `send` and moves on.
pub const UNIX_SEND_BUFFER_BYTES: usize = 4 << 20;
/// Worker threads per connection serving the engine: every READ and every command that waits
/// for a device runs on one, so this is how many IOs one connection can have at the devices at
/// once. Cached reads need few (a worker takes up to `MAX_BATCHED_READS` small ones in one
/// device submission, and the reader serves bursts itself), but a read miss holds its worker
/// for the backing device's whole IO: 32 lets a client's queue of 32 misses wait at a disk
/// together, as deep as SATA's NCQ reorders. With 16, 4 KiB misses at iodepth 32 reached the
/// emulated HDD 16 at a time, 0.98 of the disk alone against 1.00 with 32 (BENCHMARKS.md,
/// 2026-11-27). Threads start on demand, so a connection that never has that many requests
/// waiting never starts them.
pub const MAX_WORKERS_PER_CONNECTION: usize = 32;
/// A worker that takes a small READ also takes the small READs queued right behind it, up to
/// this many in all, and serves them as one batch: their cache-device reads go to the kernel in
/// one submission (one system call, one doorbell for the device) instead of one `pread` and one
/// thread wake-up each (a profile of 4 KiB reads at iodepth 32 spent 13% of the server's
/// samples in the virtio doorbell, 34% in task switches).
pub const MAX_BATCHED_READS: usize = 8;
/// The most READs a connection's reader serves itself in one burst (`burst`): what arrived
/// together in one receive, up to this many and `BURST_MAX_BYTES` of data, looked up under one
/// lock hold, read in one submission, answered in one `sendmsg`. iodepth 32 fits in one.
pub const MAX_BURST_READS: usize = 32;
/// The data of one burst: it bounds the reply buffer the reader keeps (allocated once) and
/// stays within the engine's lookup window (1 MiB), so no READ is declined for its size.
pub const BURST_MAX_BYTES: u32 = 256 << 10;
/// Largest READ a burst takes; a larger one goes to a worker (or, alone, is served inline).
pub const BURST_READ_MAX_BYTES: u32 = 64 << 10;
/// Largest READ a batch takes (larger ones are few per second and their own IO is large): it
/// bounds the reply buffers a worker keeps for a batch.
pub const BATCHED_READ_MAX_BYTES: u32 = 64 << 10;
/// Worker threads per connection when the export is slow (a plain device) and every command
/// runs on a worker: as many as fio's usual queue depth, so a disk that reorders its queue
/// sees all of a client's requests at once.
pub const MAX_WORKERS_PER_SLOW_CONNECTION: usize = 64;
/// Requests one connection may have queued or running on its workers, and the payload and
/// read-reply bytes they may hold together; past either the reader waits for room before it
/// decodes more. One request larger than the byte budget still runs, alone.
pub const MAX_IN_FLIGHT_JOBS_PER_CONNECTION: usize = 256;
pub const MAX_IN_FLIGHT_BYTES_PER_CONNECTION: usize = 64 << 20;
/// Recycled payload buffers per connection for writes handed to workers, and the largest
/// buffer worth keeping there.
pub const PAYLOAD_POOL_BUFFERS: usize = 8;
pub const PAYLOAD_POOL_BUFFER_MAX_BYTES: usize = 1 << 20;

/// A client silent this long during option haggling is dropped, so idle sockets cannot hold
/// connection threads forever.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `shutdown` waits for connections to finish their received requests and send the
/// replies before it closes them hard (a client that stops reading replies would block us).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Most extents in one BLOCK_STATUS chunk (8 bytes each): a client asks again for the rest.
pub(crate) const MAX_BLOCK_STATUS_EXTENTS: usize = 1024;
