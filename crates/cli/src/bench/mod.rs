//! `logcache bench ...`: benchmarks that print figures, never tests.

mod drain;
mod engine;
pub mod histogram;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// 4 KiB random writes through the engine library on memory-backed cache and backing
    /// devices (no NBD): the engine's own ceiling.
    Engine(engine::EngineBenchArgs),
    /// Drain time of the same random 4 KiB dirty data to an emulated 7200 rpm disk, sorted
    /// versus unsorted, and foreground write latency while writeback runs.
    Drain(drain::DrainBenchArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Engine(args) => engine::run(&args),
        BenchCommand::Drain(args) => drain::run(&args),
    }
}
