//! The `logcache` command: format, serve, administer and inspect a cache. Subcommand names,
//! flags and JSON keys are a contract scripts rely on (see README).

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use logcache_cli::cmd;
use logcache_cli::exit::{die_quietly_on_broken_pipe, finish, usage_error};

#[derive(Parser)]
#[command(
    name = "logcache",
    version,
    about = "A log-structured write-back cache for block devices, served over NBD"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Make a cache device ready to cache a backing device (fast: O(1) in the cache size).
    Format(cmd::format::FormatArgs),
    /// Serve the cached disk over NBD until SIGTERM or SIGINT. With neither --cache nor
    /// --backing, serves the embedded default under ./logcache-data.
    Serve(cmd::serve::ServeArgs),
    /// Show what a running serve is doing.
    Status(cmd::admin::StatusArgs),
    /// Create, list or delete checkpoints of a running serve (changed-block tracking for
    /// incremental backups).
    Checkpoint(cmd::checkpoint::CheckpointArgs),
    /// Change tunables of a running serve (KEY=VALUE...); with none, list them.
    Set(cmd::admin::SetArgs),
    /// Write every dirty block back to the backing device, with progress; returns when none
    /// is dirty.
    Drain(cmd::admin::DrainArgs),
    /// Verify a cache that is not being served, and say what was found.
    Check(cmd::inspect::CheckArgs),
    /// The cache device is lost: mark the backing device detached (giving up the cache's data
    /// not yet written back) and say which past state of the disk it holds.
    Detach(cmd::detach::DetachArgs),
    /// Print a cache's segment metadata for humans.
    Dump(cmd::inspect::DumpArgs),
    /// Apply an rbd diff v1 stream (rbd export-diff's format) to a file, block device, NBD
    /// export or RBD image of the same size, then flush it.
    ImportDiff(cmd::diff::ImportDiffArgs),
    /// Write the changes since a checkpoint of a running serve as an rbd diff v1 stream (for
    /// import-diff or rbd import-diff).
    ExportDiff(cmd::diff::ExportDiffArgs),
}

fn main() -> ExitCode {
    let cli = match command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => return usage_error(e, "logcache"),
    };
    if !matches!(cli.command, Command::Serve(_)) {
        die_quietly_on_broken_pipe();
    }
    let result = match cli.command {
        Command::Format(a) => cmd::format::run(&a),
        Command::Serve(a) => cmd::serve::run(&a),
        Command::Status(a) => cmd::admin::status(&a),
        Command::Checkpoint(a) => cmd::checkpoint::run(&a),
        Command::Set(a) => cmd::admin::set(&a),
        Command::Drain(a) => cmd::admin::drain(&a),
        Command::Check(a) => match cmd::inspect::check(&a) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
        Command::Dump(a) => cmd::inspect::dump(&a),
        Command::Detach(a) => cmd::detach::run(&a),
        Command::ImportDiff(a) => cmd::diff::import(&a),
        Command::ExportDiff(a) => cmd::diff::export(&a),
    };
    finish(result, "logcache")
}

/// The command line: every subcommand takes "-1" as a value (so a negative number gets a
/// range message, not "unexpected argument"), and `set --help` lists the tunables.
fn command() -> clap::Command {
    let cmd = negative_numbers_are_values(Cli::command());
    cmd.mut_subcommand("set", |s| s.after_help(cmd::admin::tunables_help()))
}

fn negative_numbers_are_values(cmd: clap::Command) -> clap::Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    let mut cmd = cmd.allow_negative_numbers(true);
    for name in names {
        cmd = cmd.mut_subcommand(&name, negative_numbers_are_values);
    }
    cmd
}
