//! `logcache checkpoint create|list|delete [--control PATH]`: checkpoints of a running serve,
//! over its control socket (like `status`).

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::control::client::ControlClient;
use crate::defaults;
use crate::served::utc_text;
use crate::size::human;

#[derive(Args)]
pub struct CheckpointArgs {
    #[command(subcommand)]
    pub cmd: CheckpointCmd,
}

#[derive(Subcommand)]
pub enum CheckpointCmd {
    /// Create checkpoint NAME: from now on every block that changes is tracked (for
    /// qemu:dirty-bitmap:NAME and incremental backups).
    Create(NameArgs),
    /// List checkpoints: name, creation time (UTC), bytes changed since.
    List(ListArgs),
    /// Delete checkpoint NAME.
    Delete(NameArgs),
}

#[derive(Args)]
pub struct NameArgs {
    /// The checkpoint's name: 1 to 64 bytes, no spaces, '/' or ':'.
    pub name: String,
    /// Control socket of the running serve (default: the embedded default's).
    #[arg(long)]
    pub control: Option<PathBuf>,
}

#[derive(Args)]
pub struct ListArgs {
    /// Control socket of the running serve (default: the embedded default's).
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Print one JSON array.
    #[arg(long)]
    pub json: bool,
}

fn connect(control: &Option<PathBuf>) -> Result<ControlClient> {
    let path = control.clone().unwrap_or_else(defaults::admin_control_path);
    ControlClient::connect(&path)
}

pub fn run(args: &CheckpointArgs) -> Result<()> {
    match &args.cmd {
        CheckpointCmd::Create(a) => {
            let mut c = connect(&a.control)?;
            let reply = c.call(&json!({"cmd": "checkpoint_create", "name": a.name}), |_| {})?;
            let cp = &reply["checkpoint"];
            println!(
                "created checkpoint {} at {}",
                a.name,
                utc_text(cp["created_unix_ms"].as_u64().unwrap_or(0) / 1000)
            );
            Ok(())
        }
        CheckpointCmd::Delete(a) => {
            let mut c = connect(&a.control)?;
            c.call(&json!({"cmd": "checkpoint_delete", "name": a.name}), |_| {})?;
            println!("deleted checkpoint {}", a.name);
            Ok(())
        }
        CheckpointCmd::List(a) => {
            let mut c = connect(&a.control)?;
            let reply = c.call(&json!({"cmd": "checkpoint_list"}), |_| {})?;
            let list = &reply["checkpoints"];
            if a.json {
                println!("{list}");
            } else {
                print!("{}", render_list(list));
            }
            Ok(())
        }
    }
}

/// One line per checkpoint: name, created (UTC), changed bytes since (exact, then readable).
fn render_list(list: &Value) -> String {
    let empty = Vec::new();
    let items = list.as_array().unwrap_or(&empty);
    if items.is_empty() {
        return "no checkpoints (create one with logcache checkpoint create NAME)\n".into();
    }
    let width = items
        .iter()
        .map(|c| c["name"].as_str().unwrap_or("").len())
        .max()
        .unwrap_or(0)
        .max(4);
    let mut out = format!("{:width$}  {:20}  CHANGED_BYTES\n", "NAME", "CREATED");
    for c in items {
        let changed = c["changed_bytes"].as_u64().unwrap_or(0);
        out.push_str(&format!(
            "{:width$}  {:20}  {} ({})\n",
            c["name"].as_str().unwrap_or("?"),
            utc_text(c["created_unix_ms"].as_u64().unwrap_or(0) / 1000),
            changed,
            human(changed)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_renders_one_line_each() {
        let v = json!([
            {"name": "daily", "created_unix_ms": 1_764_079_387_000u64, "changed_bytes": 8192},
            {"name": "x", "created_unix_ms": 0, "changed_bytes": 0},
        ]);
        let text = render_list(&v);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[1].starts_with("daily  2025-11-25T14:03:07Z  8192 ("),
            "{text}"
        );
        assert!(render_list(&json!([])).contains("no checkpoints"));
    }
}
