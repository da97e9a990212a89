//! `logcache-bench read`: reads through logcache's engine in this process, no NBD, from a
//! formatted cache and its backing device (any `--backing` spec `logcache serve` takes), or
//! from the backing device alone. It separates what the miss path itself costs from what the
//! NBD hop between fio and `logcache serve` costs (issue 22: uncached 1 MiB reads of RBD).
//!
//! `--iodepth N` runs N reader threads, each with one read in flight; sequential readers take
//! the next `--bs` piece of the region from one shared cursor (fio's sequential job at iodepth
//! N: N neighbouring requests in flight), random ones a random aligned piece. With the engine,
//! `read_cache` is turned off first, so every read is a miss passed to the backing device.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use logcache_engine::io::aligned::AlignedBuf;
use logcache_engine::io::BlockDevice;
use logcache_engine::{Engine, OpenOptions};
use logcache_testkit::rng::Rng;

use crate::histogram::Histogram;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Target {
    /// `Engine::read` on the engine opened over the cache and the backing (the path a
    /// `logcache serve` worker runs for a read, without the NBD hop).
    Engine,
    /// `BlockDevice::read_at` on the backing device alone (logcache's device layer, e.g.
    /// logcache-rbd over librbd, with no engine).
    Backing,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Pattern {
    Seq,
    Rand,
}

#[derive(Args)]
pub struct ReadBenchArgs {
    /// The cache file, formatted for `--backing` by `logcache format` (used with `--target
    /// engine`; its contents are not changed except the `read_cache` tunable).
    #[arg(long)]
    cache: Option<std::path::PathBuf>,
    /// The backing device, as `logcache serve --backing` takes it (e.g. rbd:POOL/IMAGE?conf=PATH).
    #[arg(long)]
    backing: String,
    #[arg(long, value_enum, default_value_t = Target::Engine)]
    target: Target,
    #[arg(long, value_enum, default_value_t = Pattern::Seq)]
    pattern: Pattern,
    /// Bytes per read, in KiB (a multiple of 4).
    #[arg(long, default_value_t = 1024)]
    bs_kib: u64,
    /// Reader threads, one read in flight each.
    #[arg(long, default_value_t = 1)]
    iodepth: usize,
    /// The reads stay in the first this many MiB of the disk (sequential readers wrap).
    #[arg(long, default_value_t = 512)]
    region_mib: u64,
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// The backing device's own read-ahead window (`backing_read_ahead_kib`), both targets.
    #[arg(long, default_value_t = 16384)]
    read_ahead_kib: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// What one reader thread reads from.
enum Source {
    Engine(Engine),
    Backing(Arc<dyn BlockDevice>),
}

impl Source {
    fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> anyhow::Result<()> {
        match self {
            Source::Engine(e) => e.read(offset_bytes, buf).map_err(anyhow::Error::from),
            Source::Backing(d) => d.read_at(buf, offset_bytes).map_err(anyhow::Error::from),
        }
    }
}

pub fn run(args: &ReadBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    anyhow::ensure!(args.iodepth >= 1, "--iodepth must be at least 1");
    anyhow::ensure!(
        args.bs_kib >= 4 && args.bs_kib.is_multiple_of(4),
        "--bs-kib must be a multiple of 4"
    );
    let bs_bytes = args.bs_kib * 1024;
    let backing = logcache_cli::devices::open_backing(&args.backing)
        .with_context(|| format!("opening the backing device {}", args.backing))?;
    let region_bytes = (args.region_mib << 20).min(backing.size_bytes()) / bs_bytes * bs_bytes;
    anyhow::ensure!(
        region_bytes >= bs_bytes,
        "--region-mib holds no whole --bs-kib read"
    );
    let source = match args.target {
        Target::Backing => {
            backing.set_read_ahead_bytes(args.read_ahead_kib * 1024);
            Source::Backing(backing)
        }
        Target::Engine => {
            let path = args
                .cache
                .as_ref()
                .context("--target engine needs --cache (a cache formatted for --backing)")?;
            let cache = logcache_cli::devices::open_cache(path)
                .with_context(|| format!("opening the cache {}", path.display()))?;
            let engine = Engine::open(cache, backing, OpenOptions::default())
                .with_context(|| format!("opening the engine on {}", path.display()))?;
            engine.set_tunable("read_cache", "off")?;
            engine.set_tunable("backing_read_ahead_kib", &args.read_ahead_kib.to_string())?;
            Source::Engine(engine)
        }
    };
    let source = Arc::new(source);
    let cursor = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let cpu_before = process_cpu_seconds();
    let started = Instant::now();
    let handles: Vec<_> = (0..args.iodepth)
        .map(|t| {
            let (source, cursor, stop) = (source.clone(), cursor.clone(), stop.clone());
            let pattern = args.pattern;
            std::thread::spawn(move || -> anyhow::Result<Histogram> {
                let mut hist = Histogram::default();
                let mut buf = AlignedBuf::new(bs_bytes as usize);
                let mut rng = Rng::new(0x5eed_0000 + t as u64);
                let pieces = region_bytes / bs_bytes;
                while !stop.load(Ordering::Relaxed) {
                    let piece = match pattern {
                        Pattern::Seq => cursor.fetch_add(1, Ordering::Relaxed) % pieces,
                        Pattern::Rand => rng.below(pieces),
                    };
                    let t0 = Instant::now();
                    source.read(piece * bs_bytes, &mut buf)?;
                    hist.record(t0.elapsed().as_nanos() as u64);
                }
                Ok(hist)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(args.seconds));
    stop.store(true, Ordering::Relaxed);
    let mut hist = Histogram::default();
    for h in handles {
        let got = h
            .join()
            .map_err(|_| anyhow::anyhow!("a reader thread panicked"))??;
        hist.merge(&got);
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = process_cpu_seconds() - cpu_before;
    let reads = hist.count();
    let mb_s = (reads * bs_bytes) as f64 / seconds / 1e6;
    let target = match args.target {
        Target::Engine => "engine",
        Target::Backing => "backing",
    };
    let pattern = match args.pattern {
        Pattern::Seq => "seq",
        Pattern::Rand => "rand",
    };
    let p50_us = hist.quantile_ns(0.50) as f64 / 1e3;
    let p99_us = hist.quantile_ns(0.99) as f64 / 1e3;
    let cpu_us_per_read = cpu_seconds * 1e6 / reads.max(1) as f64;
    if args.json {
        println!(
            "{}",
            serde_json::json!({"target": target, "pattern": pattern, "bs_bytes": bs_bytes,
                "iodepth": args.iodepth, "seconds": seconds, "reads": reads, "mb_s": mb_s,
                "p50_us": p50_us, "p99_us": p99_us, "cpu_seconds": cpu_seconds,
                "cpu_us_per_read": cpu_us_per_read})
        );
    } else {
        println!(
            "read {target} {pattern} bs {bs_bytes} iodepth {}: {reads} reads in {seconds:.2} s, \
             {mb_s:.1} MB/s, p50 {p50_us:.0} µs, p99 {p99_us:.0} µs, process CPU \
             {cpu_us_per_read:.0} µs/read",
            args.iodepth
        );
    }
    Ok(())
}

/// This process's user + system CPU time, every thread (librbd's included).
fn process_cpu_seconds() -> f64 {
    crate::usage::Usage::process().cpu_seconds
}
