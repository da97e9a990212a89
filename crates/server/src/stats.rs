//! Server-wide counters: updated with relaxed atomics (the reader adds its request count once per
//! batch, not per request) and read as a snapshot.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of the server's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerStats {
    /// Connections accepted since the server started.
    pub connections_total: u64,
    /// Connections currently open (in the handshake or transmission phase).
    pub connections_active: u64,
    /// Transmission-phase requests received (counted per batch, so it may lag a little).
    pub requests: u64,
    /// Client protocol violations: requests rejected as invalid, and connections dropped for a
    /// bad handshake, bad magic or an oversized payload.
    pub protocol_errors: u64,
    /// READs a connection's reader served itself in a burst of several (`burst`), without a
    /// worker.
    pub reads_in_bursts: u64,
    /// READs larger than the reader's usual inline limit that it served itself because they were
    /// the connection's only request (`LONE_INLINE_READ_MAX_BYTES`).
    pub lone_large_reads_inline: u64,
    /// Times a connection's reader polled its socket before sleeping (`spin`), and of those
    /// the times a request arrived while it polled.
    pub reader_spins: u64,
    pub reader_spin_hits: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub connections_total: AtomicU64,
    pub connections_active: AtomicU64,
    pub requests: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub reads_in_bursts: AtomicU64,
    pub lone_large_reads_inline: AtomicU64,
    pub reader_spins: AtomicU64,
    pub reader_spin_hits: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, amount: u64) {
        counter.fetch_add(amount, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ServerStats {
        ServerStats {
            connections_total: self.connections_total.load(Ordering::Relaxed),
            connections_active: self.connections_active.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            protocol_errors: self.protocol_errors.load(Ordering::Relaxed),
            reads_in_bursts: self.reads_in_bursts.load(Ordering::Relaxed),
            lone_large_reads_inline: self.lone_large_reads_inline.load(Ordering::Relaxed),
            reader_spins: self.reader_spins.load(Ordering::Relaxed),
            reader_spin_hits: self.reader_spin_hits.load(Ordering::Relaxed),
        }
    }
}
