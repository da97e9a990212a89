//! logcache's test and benchmark scaffolding: devices that emulate what a machine does not have,
//! and the seeded RNG every simulation replays from. Production crates take it only as a
//! dev-dependency (the benchmark binary `logcache-bench` is the one exception: it emulates a
//! hard disk on purpose).
//!
//! - [`sim::SimDevice`]: an in-memory disk with a volatile write cache that loses or tears
//!   unflushed writes on a simulated crash, and panics on any breach of the device contract;
//! - [`fault::FaultDevice`]: a wrapper that makes chosen operations fail;
//! - [`gate::GateDevice`]: a wrapper that holds chosen operations until the test releases them;
//! - [`sched::SchedDevice`]: a wrapper whose every operation waits for a seeded scheduler;
//! - [`hdd::HddDevice`]: a wrapper that emulates a 7200 rpm hard disk's timing;
//! - [`rng::Rng`]: SplitMix64, stable forever, so a printed seed replays a run.

pub mod fault;
pub mod gate;
pub mod hdd;
pub mod rng;
pub mod sched;
pub mod sim;
