//! The log: the flusher (the one writer of chunks to the cache device, and of every sync of
//! it) and the superblock checkpoint on the cache device.

pub mod checkpoint;
pub mod flusher;
