//! `logcache status`, `set` and `drain`: talk to a running `serve` over its control socket.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;
use logcache_engine::tunables;
use serde_json::{json, Value};

use crate::control::client::ControlClient;
use crate::defaults;
use crate::size::human;

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
    /// Control socket of the running serve (default: the embedded default's).
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// KEY=VALUE pairs, all checked before any is applied; with none, lists the tunables
    /// with their current values.
    pub assignments: Vec<String>,
}

#[derive(Args)]
pub struct DrainArgs {
    /// Control socket of the running serve (default: the embedded default's).
    #[arg(long)]
    pub control: Option<PathBuf>,
}

/// The tunables for `set --help`: key, range, default and meaning.
pub fn tunables_help() -> String {
    let mut out = String::from("Tunables (KEY: range, default; meaning):\n");
    let current = tunables::Tunables::from_persisted(&Default::default());
    for t in current.list() {
        out.push_str(&format!(
            "  {}: {}, default {}; {}\n",
            t.spec.name, t.range, t.default, t.spec.help
        ));
    }
    out
}

fn connect(control: &Option<PathBuf>) -> Result<ControlClient> {
    let path = control.clone().unwrap_or_else(defaults::admin_control_path);
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
    print!("{}", render_status(s));
    Ok(())
}

/// `status` for humans: sizes in KiB/MiB/GiB as lvmcache and bcache users read them, blocks
/// where a count of blocks is meant.
fn render_status(s: &Value) -> String {
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    let word = |k: &str| s[k].as_str().unwrap_or("?").to_string();
    let block = BLOCK_BYTES;
    let pct = |part: u64, whole: u64| 100.0 * part as f64 / whole.max(1) as f64;
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(format!(
        "logcache: {} ({}), disk {} bytes ({}), up {:.0} s",
        word("state"),
        word("mode"),
        n("exported_size_bytes"),
        human(n("exported_size_bytes")),
        s["uptime_s"].as_f64().unwrap_or(0.0)
    ));
    // A cache-device failure reads `cache failed: <reason>` (issue 25), whether the engine
    // serves from the backing device alone or failed as a whole.
    match (s["cache_failure"].as_str(), s["failure"].as_str()) {
        (Some(f), _) => line(format!("  {f}")),
        (None, Some(f)) => line(format!("  FAILED: {f}")),
        (None, None) => {}
    }
    if n("lost_at_failure_bytes") > 0 {
        line(format!(
            "  lost with the cache device: {} when it failed, {} ({} bytes) still lost (reads of it fail with EIO until written again)",
            human(n("lost_at_failure_bytes")),
            human(n("lost_bytes")),
            n("lost_bytes")
        ));
    }
    line(format!(
        "  devices: cache {}, backing {} (its 4 KiB label at byte {}, after the exported disk)",
        word("cache"),
        word("backing"),
        n("label_offset_bytes")
    ));
    let (cache, cached, dirty) = (n("cache_blocks"), n("cached_blocks"), n("dirty_blocks"));
    line(format!(
        "  cache: {} ring, {} cached ({:.1}%), {} dirty ({:.1}%); {} of {} segments of {} in use ({} in RAM, {} on the cache device, {} free)",
        human(cache * block),
        human(cached * block),
        pct(cached, cache),
        human(dirty * block),
        pct(dirty, cache),
        n("segments_in_use"),
        n("segment_count"),
        human(n("segment_size_bytes")),
        n("segments_in_ram"),
        n("segments_on_disk"),
        n("segments_free")
    ));
    line(format!(
        "  reads: {} requests, {}; 4 KiB blocks: hits {} full + {} partial, misses {} full + {} partial",
        n("reads"),
        human(n("read_bytes")),
        n("read_hits_full"),
        n("read_hits_partial"),
        n("read_misses_full"),
        n("read_misses_partial")
    ));
    line(format!(
        "  RAM cache: {} of {} held, {} block reads served from it ({} by reads over 64 KiB; their blocks stored on a second touch {}, first touches not stored {})",
        human(n("ram_cache_blocks") * block),
        human(n("ram_cache_bytes")),
        n("read_hits_ram_cache"),
        n("read_hits_ram_cache_large"),
        n("ram_cache_second_touch_blocks"),
        n("ram_cache_first_touch_blocks")
    ));
    line(format!(
        "  read cache: {}, {} promoted ({} requests past the sequential cutoff, {} while the log was congested, {} raced)",
        word("read_cache"),
        human(n("promotion_bytes")),
        n("promotions_sequential_skipped"),
        n("promotions_congested_skipped"),
        n("promotions_raced")
    ));
    line(format!(
        "  writes: {} requests, {}; 4 KiB blocks: hits {} full + {} partial, misses {} full + {} partial; {} flushes, {} FUA",
        n("writes"),
        human(n("write_bytes")),
        n("write_hits_full"),
        n("write_hits_partial"),
        n("write_misses_full"),
        n("write_misses_partial"),
        n("flushes"),
        n("fua_writes")
    ));
    line(format!(
        "  discards: {} ({}), write-zeroes: {} ({}), {} cached blocks dropped; {} write-through, {} write-around writes",
        n("discards"),
        human(n("discard_bytes")),
        n("write_zeroes"),
        human(n("write_zeroes_bytes")),
        n("blocks_invalidated"),
        n("write_through_writes"),
        n("write_around_writes")
    ));
    let rate = match (n("writeback_full_speed"), n("writeback_rate_blocks_per_s")) {
        (1, _) => "running at full speed".to_string(),
        (_, 0) => "idle".to_string(),
        (_, r) => format!("paced at {}/s", human(r * block)),
    };
    line(format!(
        "  writeback: {} of dirty blocks cleaned ({} blocks), {} copied to the backing device in {} batches; now {rate}",
        human(n("writeback_blocks") * block),
        n("writeback_blocks"),
        human(n("writeback_bytes")),
        n("writeback_batches")
    ));
    if let Some(e) = s["writeback_error"].as_str() {
        line(format!("  WRITEBACK FAILING: {e}"));
    }
    let behind = human(n("writeback_lag_bytes"));
    line(match (s["backing_consistent_as_of"].as_str(), s["writeback_lag_seconds"].as_f64()) {
        (Some(t), Some(lag)) => format!(
            "  backing device alone: the disk as of {t} ({lag:.0} s and {behind} behind; writeback_order={})",
            word("writeback_order")
        ),
        _ => format!(
            "  backing device alone: not a consistent disk until writeback catches up ({behind} behind; writeback_order={})",
            word("writeback_order")
        ),
    });
    line(format!(
        "  errors: {} io, {} checksum; NBD: {} connections ({} total), {} protocol errors",
        n("io_errors"),
        n("checksum_errors"),
        n("nbd_connections_active"),
        n("nbd_connections_total"),
        n("nbd_protocol_errors")
    ));
    line(format!(
        "  last open: {} recovery in {:.3} s, {} blocks recovered",
        if n("recovery_clean") == 1 {
            "clean"
        } else {
            "crash"
        },
        n("recovery_duration_us") as f64 / 1e6,
        n("recovery_blocks_recovered")
    ));
    if let Value::Object(t) = &s["tunables"] {
        let list: Vec<String> = t.iter().map(|(k, v)| format!("{k}={}", plain(v))).collect();
        line(format!("  tunables: {}", list.join(" ")));
    }
    out
}

/// A JSON number or string as text, without quotes.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub fn set(args: &SetArgs) -> Result<()> {
    let mut c = connect(&args.control)?;
    if args.assignments.is_empty() {
        let reply = c.call(&json!({"cmd": "tunables"}), |_| {})?;
        for t in reply["tunables"].as_array().into_iter().flatten() {
            println!(
                "{}={}  (default {}, {}{}) {}",
                t["name"].as_str().unwrap_or(""),
                plain(&t["value"]),
                plain(&t["default"]),
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
    validate_assignments(&pairs, "")?;
    for (k, v) in pairs {
        c.call(&json!({"cmd": "set", "key": k, "value": v}), |_| {})?;
        println!("{k}={v}");
    }
    Ok(())
}

/// Checks every KEY=VALUE (name, range, online) before any is applied, so a command applies
/// all of them or none. `what` prefixes the pair in the message ("--set " at serve start).
pub fn validate_assignments(pairs: &[(String, String)], what: &str) -> Result<()> {
    for (k, v) in pairs {
        let (index, _) = tunables::parse(k, v)
            .map_err(|e| anyhow::anyhow!("{what}{k}={v}: {e}; nothing was changed"))?;
        assert!(index < tunables::SPECS.len());
        if !tunables::SPECS[index].online {
            bail!(
                "{what}{k}={v}: {k} cannot change while the cache is served; nothing was changed"
            );
        }
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

/// Bytes per cache block (the unit of the block counts in status and drain progress).
const BLOCK_BYTES: u64 = 4096;

/// "12.5 MiB/s, about 40 s left" from `done` blocks written back in `elapsed` and `left` to go.
fn rate_and_eta(done: u64, left: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    if done == 0 || secs < 0.5 {
        return "measuring the rate".to_string();
    }
    let blocks_per_s = done as f64 / secs;
    assert!(blocks_per_s > 0.0);
    let eta_s = left as f64 / blocks_per_s;
    let eta = if eta_s < 120.0 {
        format!("{eta_s:.0} s")
    } else if eta_s < 7200.0 {
        format!("{:.0} min", eta_s / 60.0)
    } else {
        format!("{:.1} h", eta_s / 3600.0)
    };
    format!(
        "{}/s, about {eta} left",
        human((blocks_per_s * BLOCK_BYTES as f64) as u64)
    )
}

pub fn drain(args: &DrainArgs) -> Result<()> {
    let mut c = connect(&args.control)?;
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
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
            "draining: {pct:5.1}% [{:<30}] {} dirty left, {} written back, {}",
            "#".repeat((pct / 100.0 * 30.0) as usize),
            human(left * BLOCK_BYTES),
            human(done * BLOCK_BYTES),
            rate_and_eta(done, left, started.elapsed())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_rate_and_eta_read_naturally() {
        let sec = Duration::from_secs(1);
        assert_eq!(rate_and_eta(0, 100, 10 * sec), "measuring the rate");
        assert_eq!(rate_and_eta(256, 2560, sec), "1.0 MiB/s, about 10 s left");
        assert_eq!(
            rate_and_eta(256, 256 * 600, sec),
            "1.0 MiB/s, about 10 min left"
        );
        assert_eq!(
            rate_and_eta(1, 3600 * 10, sec),
            "4.0 KiB/s, about 10.0 h left"
        );
    }
}
