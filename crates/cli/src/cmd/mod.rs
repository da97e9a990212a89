//! One file per group of subcommands.

pub mod admin;
pub mod checkpoint;
pub mod detach;
pub mod diff;
pub mod format;
pub mod inspect;
pub mod serve;
