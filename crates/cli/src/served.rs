//! What a running `serve` exposes to the control socket and the metrics endpoint: the engine,
//! the NBD server, and their status as JSON and as Prometheus text.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use logcache_engine::Engine;
use logcache_server::Server;
use serde_json::{json, Map, Value};

pub struct Served {
    pub engine: Engine,
    pub server: Server,
    pub started: Instant,
    /// The cache and backing device as named on the command line (status says where the
    /// backing device's label lives).
    pub cache_name: String,
    pub backing_name: String,
    /// Set when serve got SIGTERM/SIGINT: status then says "stopping" while the stop runs.
    pub stopping: AtomicBool,
}

/// One metric: name, value, and whether it only grows (a Prometheus counter).
struct Metric {
    name: String,
    value: f64,
    counter: bool,
}

impl Served {
    fn metrics(&self) -> (Vec<Metric>, Vec<(String, Value)>) {
        let s = self.engine.stats();
        let mut m = Vec::new();
        let mut gauge = |name: &str, value: f64| {
            m.push(Metric {
                name: name.to_string(),
                value,
                counter: false,
            })
        };
        gauge("exported_size_bytes", s.exported_size_bytes as f64);
        // 1: the cache device failed (serving from the backing device alone unless `failed`).
        gauge("cache_failed", s.cache_failed.is_some() as u8 as f64);
        // Bytes lost with the failed cache device and not written since (they read as EIO).
        gauge("lost_bytes", s.lost_bytes as f64);
        gauge("lost_at_failure_bytes", s.lost_at_failure_bytes as f64);
        // The label is the block right after the exported disk (docs/FORMAT.md).
        gauge("label_offset_bytes", s.exported_size_bytes as f64);
        gauge("segment_size_bytes", s.segment_size_bytes as f64);
        gauge("segment_count", s.segment_count as f64);
        gauge("segments_in_use", s.segments_in_use as f64);
        gauge("segments_in_ram", s.segments_in_ram as f64);
        gauge("segments_on_disk", s.segments_on_disk as f64);
        gauge("segments_free", s.segments_free as f64);
        gauge("read_cache", s.read_cache as u64 as f64);
        gauge("cache_blocks", s.cache_blocks as f64);
        gauge("cached_blocks", s.cached_blocks as f64);
        gauge("dirty_blocks", s.dirty_blocks as f64);
        let ratio = if s.cache_blocks == 0 {
            0.0
        } else {
            s.dirty_blocks as f64 / s.cache_blocks as f64
        };
        gauge("dirty_ratio", ratio);
        gauge("ram_buffers", s.ram_buffers as f64);
        gauge("ram_buffers_free", s.ram_buffers_free as f64);
        gauge("ram_buffer_bytes", s.ram_buffer_bytes as f64);
        gauge("index_memory_bytes", s.index_memory_bytes as f64);
        // The RAM cache of hot cached blocks (`ram_cache_mib`): its room and what it holds.
        gauge("ram_cache_bytes", s.ram_cache_bytes as f64);
        gauge("ram_cache_blocks", s.ram_cache_blocks as f64);
        gauge("zero_ranges", s.zero_ranges as f64);
        gauge("zero_blocks_forgotten", s.zero_blocks_forgotten as f64);
        // The engine reports u64::MAX for "unpaced"; keep the JSON numbers small and exact.
        let full_speed = s.writeback_rate_blocks_per_s == u64::MAX;
        gauge("writeback_full_speed", full_speed as u64 as f64);
        gauge(
            "writeback_rate_blocks_per_s",
            if full_speed {
                0.0
            } else {
                s.writeback_rate_blocks_per_s as f64
            },
        );
        gauge("uptime_s", self.started.elapsed().as_secs_f64());
        // How stale the backing device alone is (what a lost cache would cost).
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let as_of_ms = s.backing_consistent_as_of_unix_ms;
        if let Some(ms) = as_of_ms {
            gauge("backing_consistent_as_of_seconds", ms as f64 / 1000.0);
            gauge(
                "writeback_lag_seconds",
                now_ms.saturating_sub(ms) as f64 / 1000.0,
            );
        }
        gauge("writeback_lag_bytes", s.writeback_lag_bytes as f64);
        for (name, v) in s.counters.fields() {
            m.push(Metric {
                name: name.to_string(),
                value: v as f64,
                counter: true,
            });
        }
        for (name, v) in s.recovery.fields() {
            m.push(Metric {
                name: format!("recovery_{name}"),
                value: v as f64,
                counter: false,
            });
        }
        let n = self.server.stats();
        for (name, v, counter) in [
            ("nbd_connections_active", n.connections_active, false),
            ("nbd_connections_total", n.connections_total, true),
            ("nbd_requests", n.requests, true),
            ("nbd_protocol_errors", n.protocol_errors, true),
            ("nbd_reads_in_bursts", n.reads_in_bursts, true),
            (
                "nbd_lone_large_reads_inline",
                n.lone_large_reads_inline,
                true,
            ),
            ("nbd_reader_spins", n.reader_spins, true),
            ("nbd_reader_spin_hits", n.reader_spin_hits, true),
        ] {
            m.push(Metric {
                name: name.into(),
                value: v as f64,
                counter,
            });
        }
        let tunables: Vec<(String, Value)> = self
            .engine
            .tunables()
            .into_iter()
            .map(|t| (t.spec.name.to_string(), tunable_json(&t.value)))
            .collect();
        let (as_of, lag_s) = match as_of_ms {
            Some(ms) => (
                Value::String(utc_text(ms / 1000)),
                json!(now_ms.saturating_sub(ms) as f64 / 1000.0),
            ),
            None => (Value::Null, Value::Null),
        };
        let mut extra = vec![
            ("mode".to_string(), Value::String(s.mode.to_string())),
            (
                "writeback_order".to_string(),
                Value::String(s.writeback_order.to_string()),
            ),
            ("backing_consistent_as_of".to_string(), as_of),
            ("writeback_lag_seconds".to_string(), lag_s),
            ("cache".to_string(), Value::String(self.cache_name.clone())),
            (
                "backing".to_string(),
                Value::String(self.backing_name.clone()),
            ),
            (
                "state".to_string(),
                Value::String(match (&s.failed, s.serving_alone) {
                    (Some(_), _) => "failed".into(),
                    (None, true) => "cache failed".into(),
                    (None, false) if self.stopping.load(Ordering::Acquire) => "stopping".into(),
                    (None, false) => "serving".into(),
                }),
            ),
        ];
        if let Some(f) = s.failed {
            extra.push(("failure".into(), Value::String(f)));
        }
        if let Some(f) = s.cache_failed {
            extra.push(("cache_failure".into(), Value::String(f)));
        }
        if let Some(e) = s.writeback_error {
            extra.push(("writeback_error".into(), Value::String(e)));
        }
        extra.push((
            "tunables".into(),
            Value::Object(tunables.into_iter().collect()),
        ));
        (m, extra)
    }

    /// The JSON status: the contract keys (`mode`, `cache_blocks`, `dirty_blocks`,
    /// `segment_size_bytes`, `read_hits`, `read_misses`, `write_hits`, `write_misses`,
    /// `writeback_blocks`) and every other figure, flat, plus `tunables`.
    pub fn status(&self) -> Value {
        let (metrics, extra) = self.metrics();
        let mut obj = Map::new();
        for (k, v) in extra {
            obj.insert(k, v);
        }
        for m in metrics {
            let v = if m.value.fract() == 0.0 && m.value.abs() < 9.0e15 {
                json!(m.value as i64)
            } else {
                json!(m.value)
            };
            obj.insert(m.name, v);
        }
        // One spelling per value: `read_cache` reads as its tunable does ("on"/"off"), not 1/0
        // (Prometheus keeps the number).
        let read_cache = obj["tunables"]["read_cache"].clone();
        assert!(read_cache.is_string());
        obj.insert("read_cache".into(), read_cache);
        Value::Object(obj)
    }

    pub fn tunables_json(&self) -> Value {
        Value::Array(
            self.engine
                .tunables()
                .into_iter()
                .map(|t| {
                    json!({"name": t.spec.name, "value": tunable_json(&t.value),
                           "default": tunable_json(&t.default),
                           "range": t.range, "online": t.spec.online, "help": t.spec.help})
                })
                .collect(),
        )
    }

    /// Prometheus text exposition format.
    pub fn prometheus(&self) -> String {
        let (metrics, extra) = self.metrics();
        let mut out = String::new();
        for m in metrics {
            let kind = if m.counter { "counter" } else { "gauge" };
            let _ = writeln!(out, "# TYPE logcache_{} {kind}", m.name);
            let _ = writeln!(out, "logcache_{} {}", m.name, m.value);
        }
        if let Some((_, Value::String(mode))) = extra.iter().find(|(k, _)| k == "mode") {
            let _ = writeln!(out, "# TYPE logcache_mode gauge");
            let _ = writeln!(out, "logcache_mode{{mode=\"{mode}\"}} 1");
        }
        out
    }
}

/// A tunable's value in JSON: a number for numeric tunables, the name for a choice.
fn tunable_json(text: &str) -> Value {
    match text.parse::<u64>() {
        Ok(n) => json!(n),
        Err(_) => Value::String(text.to_string()),
    }
}

/// `2026-11-25T14:03:07Z` for a time in seconds since 1970 (UTC).
pub fn utc_text(unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let secs = unix_s % 86_400;
    // Days since 1970-01-01 to a civil date (proleptic Gregorian), by 400-year eras.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + (month <= 2) as i64;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::utc_text;

    #[test]
    fn utc_text_matches_known_dates() {
        assert_eq!(utc_text(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_text(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_text(1_795_618_987), "2026-11-25T15:03:07Z");
        assert_eq!(utc_text(4_107_542_399), "2100-02-28T23:59:59Z");
    }
}
