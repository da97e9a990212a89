//! `logcache-bench`: test and benchmark tooling, kept out of the production `logcache` binary
//! so that it never ships the test scaffolding (`logcache-testkit`) it is built on.
//!
//! - `sim-hdd`: an EMULATED hard disk served over NBD, for tests and benchmarks;
//! - `engine`: the engine's own ceiling (4 KiB random writes on memory devices, no NBD);
//! - `drain`: writeback's drain time to an emulated disk, sorted versus unsorted;
//! - `read`: reads through the engine (or the backing device alone) in-process, no NBD.
//!
//! Benchmarks print figures, never tests. Errors are one `logcache-bench:` line, like
//! `logcache`'s.

mod drain;
mod engine;
mod histogram;
mod read;
mod sim_hdd;
mod usage;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use logcache_cli::exit::{die_quietly_on_broken_pipe, finish, usage_error};

#[derive(Parser)]
#[command(
    name = "logcache-bench",
    version,
    about = "Benchmarks of logcache, and the emulated hard disk they measure against (tests and benchmarks only)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve an EMULATED hard disk over NBD, for tests and benchmarks: the data lives in a
    /// file, and every IO takes as long as a 7200 rpm disk would (seeks, rotation, transfer,
    /// command queueing). Not a real disk and not part of the cache. Serves until SIGTERM or
    /// SIGINT, then prints the disk's figures.
    SimHdd(sim_hdd::SimHddArgs),
    /// 4 KiB random writes through the engine library on memory-backed cache and backing
    /// devices (no NBD): the engine's own ceiling.
    Engine(engine::EngineBenchArgs),
    /// Drain time of the same random 4 KiB dirty data to an emulated 7200 rpm disk, sorted
    /// versus unsorted, and foreground write latency while writeback runs.
    Drain(drain::DrainBenchArgs),
    /// Reads through the engine in this process (no NBD) from a formatted cache and its backing
    /// device, every read a miss, or from the backing device alone: the miss path's own cost.
    Read(read::ReadBenchArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e, "logcache-bench"),
    };
    if !matches!(cli.command, Command::SimHdd(_)) {
        die_quietly_on_broken_pipe();
    }
    let result = match cli.command {
        Command::SimHdd(a) => sim_hdd::run(&a),
        Command::Engine(a) => engine::run(&a),
        Command::Drain(a) => drain::run(&a),
        Command::Read(a) => read::run(&a),
    };
    finish(result, "logcache-bench")
}
