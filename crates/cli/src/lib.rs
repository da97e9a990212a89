//! The `logcache` command's modules, as a library so that the benchmark binary
//! (`logcache-bench`, crate `crates/bench`) reuses the same command-line plumbing (sizes, signal
//! handling, socket checks, file locks, one-line errors) without the production binary shipping
//! any test scaffolding.

pub mod cmd;
pub mod control;
pub mod defaults;
pub mod devices;
pub mod exit;
pub mod export_diff;
pub mod guard;
pub mod import_diff;
pub mod metrics;
pub mod offline;
pub mod owner;
pub mod served;
pub mod size;
pub mod sockets;
pub mod stop_deadline;
pub mod tls;
