//! `logcache bench ...`: benchmarks that print figures, never tests.

mod engine;
pub mod histogram;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// 4 KiB random writes through the engine library on memory-backed cache and backing
    /// devices (no NBD): the engine's own ceiling.
    Engine(engine::EngineBenchArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Engine(args) => engine::run(&args),
    }
}
