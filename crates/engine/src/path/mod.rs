//! The request paths, run on the callers' threads: writes into the open chunk, reads from RAM,
//! the cache device or the backing device, writes that bypass the cache (write-through,
//! write-around, TRIM, write-zeroes), and fair admission of writers to log room.

pub mod admission;
pub mod alone;
pub mod bypass;
pub mod hot;
pub mod in_ram;
pub mod lost;
pub mod prefetch;
pub mod read;
pub mod reserve;
pub mod write;
