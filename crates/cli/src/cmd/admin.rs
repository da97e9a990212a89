//! `logcache status`, `set` and `drain`: talk to a running `serve` over its control socket.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use serde_json::{json, Value};

use crate::control::client::ControlClient;
use crate::defaults;

#[derive(Args)]
pub struct StatusArgs {
    /// Control socket of the running serve (default: the embedded default's).
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct SetArgs {
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// KEY=VALUE pairs; `logcache set` with none lists the tunables.
    pub assignments: Vec<String>,
}

#[derive(Args)]
pub struct DrainArgs {
    #[arg(long)]
    pub control: Option<PathBuf>,
}

fn connect(control: &Option<PathBuf>) -> Result<ControlClient> {
    let path = control.clone().unwrap_or_else(defaults::control_path);
    ControlClient::connect(&path)
}

pub fn status(args: &StatusArgs) -> Result<()> {
    let mut c = connect(&args.control)?;
    let reply = c.call(&json!({"cmd": "status"}), |_| {})?;
    let s = &reply["status"];
    if args.json {
        println!("{s}");
        return Ok(());
    }
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!(
        "logcache: {} ({}), disk {:.0} MiB, up {:.0} s",
        s["state"].as_str().unwrap_or("?"),
        s["mode"].as_str().unwrap_or("?"),
        mib(n("exported_size_bytes")),
        s["uptime_s"].as_f64().unwrap_or(0.0)
    );
    if let Some(f) = s["failure"].as_str() {
        println!("  FAILED: {f}");
    }
    let blocks = n("cache_blocks").max(1);
    println!(
        "  cache: {} of {} blocks cached ({:.1}%), {} dirty ({:.1}%), {} of {} segments of {} KiB in use",
        n("cached_blocks"),
        n("cache_blocks"),
        100.0 * n("cached_blocks") as f64 / blocks as f64,
        n("dirty_blocks"),
        100.0 * n("dirty_blocks") as f64 / blocks as f64,
        n("segments_in_use"),
        n("segment_count"),
        n("segment_size_bytes") / 1024
    );
    println!(
        "  segments: {} in RAM, {} on the cache device, {} free",
        n("segments_in_ram"),
        n("segments_on_disk"),
        n("segments_free")
    );
    println!(
        "  reads: {} requests, {:.1} MiB; blocks: hits {} full + {} partial, misses {} full + {} partial",
        n("reads"),
        mib(n("read_bytes")),
        n("read_hits_full"),
        n("read_hits_partial"),
        n("read_misses_full"),
        n("read_misses_partial")
    );
    println!(
        "  read cache: {}, {} blocks promoted ({} requests past the sequential cutoff, {} while the log was congested, {} raced)",
        if n("read_cache") == 1 { "on" } else { "off" },
        n("promotions"),
        n("promotions_sequential_skipped"),
        n("promotions_congested_skipped"),
        n("promotions_raced")
    );
    println!(
        "  writes: {} requests, {:.1} MiB; blocks: hits {} full + {} partial, misses {} full + {} partial; {} flushes, {} FUA",
        n("writes"),
        mib(n("write_bytes")),
        n("write_hits_full"),
        n("write_hits_partial"),
        n("write_misses_full"),
        n("write_misses_partial"),
        n("flushes"),
        n("fua_writes")
    );
    println!(
        "  discards: {} ({:.1} MiB), write-zeroes: {} ({:.1} MiB), {} cached blocks dropped; {} write-through, {} write-around writes",
        n("discards"),
        mib(n("discard_bytes")),
        n("write_zeroes"),
        mib(n("write_zeroes_bytes")),
        n("blocks_invalidated"),
        n("write_through_writes"),
        n("write_around_writes")
    );
    let rate = match (n("writeback_full_speed"), n("writeback_rate_blocks_per_s")) {
        (1, _) => "running at full speed".to_string(),
        (_, 0) => "idle".to_string(),
        (_, r) => format!("paced at {r} blocks/s"),
    };
    println!(
        "  writeback: {} blocks ({:.1} MiB) written back in {} batches, now {rate}",
        n("writeback_blocks"),
        mib(n("writeback_bytes")),
        n("writeback_batches")
    );
    if let Some(e) = s["writeback_error"].as_str() {
        println!("  WRITEBACK FAILING: {e}");
    }
    println!(
        "  errors: {} io, {} checksum; NBD: {} connections ({} total), {} protocol errors",
        n("io_errors"),
        n("checksum_errors"),
        n("nbd_connections_active"),
        n("nbd_connections_total"),
        n("nbd_protocol_errors")
    );
    println!(
        "  last open: {} recovery in {:.3} s, {} blocks recovered",
        if n("recovery_clean") == 1 {
            "clean"
        } else {
            "crash"
        },
        n("recovery_duration_us") as f64 / 1e6,
        n("recovery_blocks_recovered")
    );
    if let Value::Object(t) = &s["tunables"] {
        let list: Vec<String> = t
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("?")))
            .collect();
        println!("  tunables: {}", list.join(" "));
    }
    Ok(())
}

pub fn set(args: &SetArgs) -> Result<()> {
    let mut c = connect(&args.control)?;
    if args.assignments.is_empty() {
        let reply = c.call(&json!({"cmd": "tunables"}), |_| {})?;
        for t in reply["tunables"].as_array().into_iter().flatten() {
            println!(
                "{}={}  (default {}, {}{}) {}",
                t["name"].as_str().unwrap_or(""),
                t["value"].as_str().unwrap_or(""),
                t["default"].as_str().unwrap_or(""),
                t["range"].as_str().unwrap_or(""),
                if t["online"].as_bool() == Some(true) {
                    ""
                } else {
                    ", only at serve start"
                },
                t["help"].as_str().unwrap_or("")
            );
        }
        return Ok(());
    }
    let pairs = parse_assignments(&args.assignments)?;
    for (k, v) in pairs {
        c.call(&json!({"cmd": "set", "key": k, "value": v}), |_| {})?;
        println!("{k}={v}");
    }
    Ok(())
}

/// Splits KEY=VALUE arguments, rejecting malformed ones before anything changes.
pub fn parse_assignments(args: &[String]) -> Result<Vec<(String, String)>> {
    args.iter()
        .map(|a| match a.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => bail!("{a:?} is not KEY=VALUE (logcache set with no arguments lists the keys)"),
        })
        .collect()
}

pub fn drain(args: &DrainArgs) -> Result<()> {
    let mut c = connect(&args.control)?;
    let tty = std::io::stderr().is_terminal();
    let reply = c.call(&json!({"cmd": "drain"}), |p| {
        let start = p["dirty_blocks_at_start"].as_u64().unwrap_or(0);
        let left = p["dirty_blocks"].as_u64().unwrap_or(0);
        let done = p["written_back_blocks"].as_u64().unwrap_or(0);
        let pct = if start == 0 {
            100.0
        } else {
            100.0 * (start.saturating_sub(left)) as f64 / start as f64
        };
        let line = format!(
            "draining: {pct:5.1}% [{:<30}] {left} dirty blocks left, {done} written back",
            "#".repeat((pct / 100.0 * 30.0) as usize)
        );
        if tty {
            eprint!("\r{line}");
        } else {
            eprintln!("{line}");
        }
        let _ = std::io::stderr().flush();
    })?;
    if tty {
        eprintln!();
    }
    let dirty = reply["status"]["dirty_blocks"].as_u64().unwrap_or(0);
    println!("drained: {dirty} dirty blocks; the backing device holds the complete current image");
    Ok(())
}
