//! Tunables: each has a name, a range, a default and whether it may change while serving.
//! Values live in atomics (read on hot paths without the state lock) and are persisted in the
//! superblock's tunables area, so a restart keeps them.
//!
//! A tunable's slot number is its place in the superblock and must never change; new tunables
//! take new slots.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::format::superblock::PersistedTunables;

/// What values a tunable takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An integer in `min..=max`, in `unit`.
    Number {
        min: u64,
        max: u64,
        unit: &'static str,
    },
    /// One of these names; the value is the index.
    Choice(&'static [&'static str]),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunableSpec {
    pub name: &'static str,
    /// Slot in the superblock's tunables area.
    pub slot: usize,
    pub kind: Kind,
    pub default: u64,
    /// Whether `set` may change it while the cache is served.
    pub online: bool,
    pub help: &'static str,
}

/// Index of each tunable in [`SPECS`].
pub const SEAL_INTERVAL_MS: usize = 0;
pub const WRITEBACK_THRESHOLD_PERCENT: usize = 1;
pub const WRITEBACK_RATE_MAX_MIB: usize = 2;
pub const WRITEBACK_BATCH_BLOCKS: usize = 3;
pub const WRITEBACK_IDLE_MS: usize = 4;
pub const CACHE_MODE: usize = 5;
pub const READ_CACHE: usize = 6;
pub const READ_SEQUENTIAL_CUTOFF_KIB: usize = 7;
pub const WRITEBACK_IO_DEPTH: usize = 8;
pub const WRITEBACK_ORDER: usize = 9;
pub const BACKING_READ_AHEAD_KIB: usize = 10;
pub const RAM_CACHE_MIB: usize = 11;

/// Values of `cache_mode`.
pub const MODE_WRITE_BACK: u64 = 0;
pub const MODE_WRITE_THROUGH: u64 = 1;
pub const MODE_WRITE_AROUND: u64 = 2;
pub const MODE_NAMES: &[&str] = &["write-back", "write-through", "write-around"];

/// Values of `writeback_order`.
pub const ORDER_CONSISTENT: u64 = 0;
pub const ORDER_SORTED: u64 = 1;
pub const ORDER_NAMES: &[&str] = &["consistent", "sorted"];

pub static SPECS: &[TunableSpec] = &[
    TunableSpec {
        name: "seal_interval_ms",
        slot: 0,
        kind: Kind::Number {
            min: 0,
            max: 3_600_000,
            unit: "ms",
        },
        default: 1000,
        online: true,
        help: "unflushed writes are made durable after at most this long (0: only on flush)",
    },
    TunableSpec {
        name: "writeback_threshold_percent",
        slot: 1,
        kind: Kind::Number {
            min: 0,
            max: 100,
            unit: "%",
        },
        default: 10,
        online: true,
        help: "above this share of the cache dirty, writeback runs at a rate that keeps the dirty level from growing",
    },
    TunableSpec {
        name: "writeback_rate_max_mib",
        slot: 2,
        kind: Kind::Number {
            min: 0,
            max: 1 << 20,
            unit: "MiB/s",
        },
        default: 0,
        online: true,
        help: "cap on background writeback (0: no cap); drain and a full log ignore it",
    },
    TunableSpec {
        name: "writeback_batch_blocks",
        slot: 3,
        kind: Kind::Number {
            min: 16,
            max: 8192,
            unit: "4K blocks",
        },
        default: 4096,
        online: true,
        help: "blocks per writeback batch; each batch ends with a sync of the backing device",
    },
    TunableSpec {
        name: "writeback_idle_ms",
        slot: 4,
        kind: Kind::Number {
            min: 0,
            max: 3_600_000,
            unit: "ms",
        },
        default: 1000,
        online: true,
        help: "after this long without reads or writes, write back everything at full speed (0: never)",
    },
    TunableSpec {
        name: "cache_mode",
        slot: 5,
        kind: Kind::Choice(MODE_NAMES),
        default: MODE_WRITE_BACK,
        online: true,
        help: "write-back: writes are acknowledged once in the log; write-through: once on the backing device too; write-around: writes go to the backing device only and drop cached copies. Leaving write-back drains first",
    },
    TunableSpec {
        name: "read_cache",
        slot: 6,
        kind: Kind::Choice(&["off", "on"]),
        default: 1,
        online: true,
        help: "promote read misses into the cache as clean blocks",
    },
    TunableSpec {
        name: "read_sequential_cutoff_kib",
        slot: 7,
        kind: Kind::Number {
            min: 0,
            max: 1 << 30,
            unit: "KiB",
        },
        default: 4096,
        online: true,
        help: "reads of a sequential stream past this length are not promoted (0: no cutoff)",
    },
    TunableSpec {
        name: "writeback_io_depth",
        slot: 8,
        kind: Kind::Number {
            min: 1,
            max: 64,
            unit: "IOs",
        },
        default: 16,
        online: true,
        help: "writeback writes in flight to the backing device at once; a disk serves a queue in its own best order and never misses the next sector while it waits for us",
    },
    TunableSpec {
        name: "writeback_order",
        slot: 9,
        kind: Kind::Choice(ORDER_NAMES),
        default: ORDER_CONSISTENT,
        online: true,
        help: "consistent: write back one flush epoch at a time, so the backing device alone is always a past state of the disk (what a power cut could have left); sorted: merge dirty blocks across flushes for fewer seeks, and the backing device alone may be torn until a drain",
    },
    TunableSpec {
        name: "backing_read_ahead_kib",
        slot: 10,
        kind: Kind::Number {
            min: 0,
            max: 16384,
            unit: "KiB",
        },
        default: 16384,
        online: true,
        help: "how far ahead of a sequential reader of missed blocks the backing device reads on its own (0: off); only an RBD backing reads ahead",
    },
    TunableSpec {
        name: "ram_cache_mib",
        slot: 11,
        kind: Kind::Number {
            min: 0,
            max: 1 << 20,
            unit: "MiB",
        },
        default: 1024,
        online: true,
        help: "RAM for copies of cached blocks read from the cache device, so hot blocks are read from RAM (0: off): every block of a read up to 64 KiB and of a write up to 64 KiB (stored once written to the cache device, while reads come in and the flusher has slack, at most 8,192 a second), a larger read's when it reads the same blocks a second time, within the cache's size of large reads (a scan read once stores nothing); never more than 1/8 of physical memory (or of the cgroup memory limit); a change drops the copies",
    },
];

impl TunableSpec {
    /// The largest value the tunable takes.
    pub fn max_value(&self) -> u64 {
        match self.kind {
            Kind::Number { max, .. } => max,
            Kind::Choice(names) => names.len() as u64 - 1,
        }
    }
}

/// A tunable as an operator sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TunableValue {
    /// Name, online flag, help and the rest of the registry's entry.
    pub spec: TunableSpec,
    pub value: String,
    pub default: String,
    /// "0..=3600000 ms" or "write-back|write-through|write-around".
    pub range: String,
}

/// The current values, one atomic per tunable.
pub struct Tunables {
    values: Vec<AtomicU64>,
}

impl Tunables {
    /// Persisted values where present and in range, defaults elsewhere.
    pub fn from_persisted(p: &PersistedTunables) -> Tunables {
        let values = SPECS
            .iter()
            .map(|s| {
                let v = p
                    .get(s.slot)
                    .filter(|&v| in_range(s, v))
                    .unwrap_or(s.default);
                AtomicU64::new(v)
            })
            .collect();
        Tunables { values }
    }

    pub fn get(&self, index: usize) -> u64 {
        self.values[index].load(Ordering::Relaxed)
    }

    pub fn set(&self, index: usize, value: u64) {
        assert!(in_range(&SPECS[index], value));
        self.values[index].store(value, Ordering::Relaxed);
    }

    /// Every tunable, to store in the superblock.
    pub fn to_persisted(&self) -> PersistedTunables {
        let mut p = PersistedTunables::default();
        for (i, s) in SPECS.iter().enumerate() {
            p.put(s.slot, self.get(i));
        }
        p
    }

    pub fn list(&self) -> Vec<TunableValue> {
        SPECS
            .iter()
            .enumerate()
            .map(|(i, s)| TunableValue {
                spec: *s,
                value: render(s, self.get(i)),
                default: render(s, s.default),
                range: match s.kind {
                    Kind::Number { min, max, unit } => format!("{min}..={max} {unit}"),
                    Kind::Choice(names) => names.join("|"),
                },
            })
            .collect()
    }
}

/// Finds a tunable by name and parses `text` for it.
pub fn parse(name: &str, text: &str) -> Result<(usize, u64)> {
    let Some(index) = SPECS.iter().position(|s| s.name == name) else {
        let names: Vec<&str> = SPECS.iter().map(|s| s.name).collect();
        return Err(Error::InvalidArgument(format!(
            "unknown tunable {name:?}; the tunables are: {}",
            names.join(", ")
        )));
    };
    let spec = &SPECS[index];
    let value = match spec.kind {
        Kind::Number { min, max, unit } => {
            let v: u64 = text.trim().parse().map_err(|_| {
                Error::InvalidArgument(format!(
                    "{name} takes a whole number of {unit} ({min}..={max}), not {text:?}"
                ))
            })?;
            if !(min..=max).contains(&v) {
                return Err(Error::InvalidArgument(format!(
                    "{name} must be within {min}..={max} {unit}; {v} is not"
                )));
            }
            v
        }
        Kind::Choice(names) => names
            .iter()
            .position(|n| *n == text.trim())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{name} is one of {}, not {text:?}",
                    names.join(", ")
                ))
            })? as u64,
    };
    Ok((index, value))
}

fn in_range(s: &TunableSpec, v: u64) -> bool {
    match s.kind {
        Kind::Number { min, max, .. } => (min..=max).contains(&v),
        Kind::Choice(names) => (v as usize) < names.len(),
    }
}

fn render(s: &TunableSpec, v: u64) -> String {
    match s.kind {
        Kind::Number { .. } => v.to_string(),
        Kind::Choice(names) => names.get(v as usize).copied().unwrap_or("?").to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::superblock::TUNABLE_SLOTS;

    #[test]
    fn slots_are_unique_and_fit_the_superblock() {
        let mut seen = [false; TUNABLE_SLOTS];
        for s in SPECS {
            assert!(s.slot < TUNABLE_SLOTS && !seen[s.slot], "{}", s.name);
            seen[s.slot] = true;
            assert!(in_range(s, s.default), "{} default out of range", s.name);
        }
    }

    #[test]
    fn parse_checks_names_and_ranges() {
        assert_eq!(
            parse("seal_interval_ms", "250").unwrap(),
            (SEAL_INTERVAL_MS, 250)
        );
        assert!(parse("seal_interval_ms", "-1").is_err());
        assert!(parse("seal_interval_ms", "99999999").is_err());
        let e = parse("no_such", "1").unwrap_err().to_string();
        assert!(e.contains("seal_interval_ms"), "{e}");
    }

    #[test]
    fn persisted_values_round_trip_and_bad_ones_fall_back() {
        let t = Tunables::from_persisted(&PersistedTunables::default());
        assert_eq!(t.get(SEAL_INTERVAL_MS), 1000);
        t.set(SEAL_INTERVAL_MS, 0);
        let p = t.to_persisted();
        assert_eq!(Tunables::from_persisted(&p).get(SEAL_INTERVAL_MS), 0);
        let mut bad = PersistedTunables::default();
        bad.put(0, 1 << 40);
        assert_eq!(Tunables::from_persisted(&bad).get(SEAL_INTERVAL_MS), 1000);
    }
}
