//! The `logcache` command. This first subcommand is `bench engine`; the serving and
//! administration commands grow here.

mod bench;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "logcache",
    version,
    about = "A log-structured write-back cache for block devices"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure logcache's speed.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCommand,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench { what } => bench::run(what),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: what went wrong, with its causes.
            eprintln!("logcache: {e:#}");
            ExitCode::FAILURE
        }
    }
}
