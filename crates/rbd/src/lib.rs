//! A Ceph RBD image as logcache's backing device: `--backing rbd:POOL/IMAGE[?conf=PATH&id=USER]`.
//!
//! Modules: `spec` parses the backing SPEC; `ffi` declares the librados/librbd C calls;
//! `session` owns one connection (cluster, pool, open image with its exclusive lock) and its
//! asynchronous IO; `readahead` decides what a session reads ahead for sequential reads;
//! `device` is the [`logcache_io::BlockDevice`] that replaces a lost session. Links librbd and librados (Debian: librbd1, librados2; to build: librbd-dev).

mod device;
mod ffi;
mod readahead;
mod session;
mod spec;

pub use device::RbdDevice;
pub use session::{closes_abandoned, CallError};
pub use spec::{is_rbd_spec, RbdSpec, SpecError, RBD_PREFIX};
