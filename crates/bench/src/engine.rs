//! `logcache-bench engine`: N threads write random 4 KiB blocks through the engine as fast as
//! they can, on memory-backed devices, with the real flusher thread running.
//!
//! The written span is a quarter of the cache, so the log wraps many times per second: the
//! head segment's blocks still live then (about 2%) are dirty, and writeback (consistent
//! order, the default) must write them back before the head can pass.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use logcache_engine::io::file::create_sparse;
use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, Engine, FormatOptions, OpenOptions};
use logcache_testkit::rng::Rng;

use crate::histogram::Histogram;
use crate::usage::{SchedTime, Usage};

#[derive(Args)]
pub struct EngineBenchArgs {
    /// Writer threads; without it, runs 1 and then 2.
    #[arg(long)]
    threads: Option<usize>,
    /// Seconds per run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Print one JSON object per run.
    #[arg(long)]
    json: bool,
    /// Cache device size in MiB (memory, allocated lazily).
    #[arg(long, default_value_t = 2048)]
    cache_mib: u64,
    /// Segment size in KiB.
    #[arg(long, default_value_t = 1024)]
    segment_kib: u64,
    /// Put the cache on this file (created sparse, O_DIRECT where possible) instead of memory.
    #[arg(long)]
    cache_file: Option<std::path::PathBuf>,
    /// Checkpoints created before the writers start (each tracks every write: issue 21's
    /// write-path cost); several values run one after another, e.g. 0,2,0,2.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    checkpoints: Vec<u32>,
}

/// A write this slow waited for something (room, the CPU, a parked lock) rather than ran.
const SLOW_WRITE_NS: u64 = 10_000;

struct RunResult {
    threads: usize,
    writes: u64,
    seconds: f64,
    hist: Histogram,
    relocated: u64,
    waits: u64,
    /// Of `waits`, those that found every RAM buffer taken; the rest found no free segment.
    waits_for_buffers: u64,
    /// The writers' time in those waits, summed.
    wait_us: u64,
    /// Writeback's paced pauses cut short because writers or the ring's head needed it.
    writeback_pauses_cut: u64,
    /// The whole process (writers, flusher, writeback and its helpers) while the writers ran.
    process: Usage,
    /// The writer threads alone, summed.
    writers: Usage,
    /// The writers' time on a CPU and waiting for one, summed, and their wall time summed.
    writers_sched: Option<SchedTime>,
    writers_wall_ns: u64,
}

pub fn run(args: &EngineBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    let threads: Vec<usize> = match args.threads {
        Some(0) => anyhow::bail!("--threads must be at least 1"),
        Some(n) => vec![n],
        None => vec![1, 2],
    };
    for (n, checkpoints) in threads
        .iter()
        .flat_map(|&n| args.checkpoints.iter().map(move |&c| (n, c)))
    {
        let r = run_one(args, n, checkpoints)?;
        let wps = r.writes as f64 / r.seconds;
        let p50_us = r.hist.quantile_ns(0.50) as f64 / 1000.0;
        let p99_us = r.hist.quantile_ns(0.99) as f64 / 1000.0;
        let p999_us = r.hist.quantile_ns(0.999) as f64 / 1000.0;
        // The share of the writers' time spent in calls of 10 µs or more (waits for room,
        // preemption, a parked lock): what separates writes/s from 1 / p50.
        let slow_share =
            r.hist.sum_ns_from(SLOW_WRITE_NS) as f64 / 1e9 / (r.seconds * r.threads as f64);
        if args.json {
            let mut v = serde_json::json!({
                "threads": r.threads,
                "writes_per_sec": wps.round() as u64,
                "p50_us": p50_us,
                "p99_us": p99_us,
                "p999_us": p999_us,
                "writes": r.writes,
                "seconds": r.seconds,
                "block_size_bytes": 4096,
                "segment_size_bytes": args.segment_kib * 1024,
                "cache_size_bytes": args.cache_mib << 20,
                "blocks_relocated": r.relocated,
                "write_waits": r.waits,
                "write_waits_for_buffers": r.waits_for_buffers,
                "write_wait_ms": r.wait_us / 1000,
                "writeback_pauses_cut": r.writeback_pauses_cut,
                "checkpoints": checkpoints,
                "slow_write_time_share": (slow_share * 1000.0).round() / 1000.0,
            });
            let o = v.as_object_mut().expect("an object");
            o.extend(r.process.per_op_json("process", r.writes));
            o.extend(r.writers.per_op_json("writer", r.writes));
            if let Some(s) = r.writers_sched {
                // Where the writers' wall time went: running, waiting for a CPU (other work on
                // the machine, or the engine's own threads), or asleep (room, a parked lock).
                let wall = r.writers_wall_ns.max(1) as f64;
                let share = |ns: u64| (ns as f64 / wall * 1000.0).round() / 1000.0;
                let asleep = r
                    .writers_wall_ns
                    .saturating_sub(s.on_cpu_ns + s.runnable_ns);
                o.insert("writer_on_cpu_share".into(), share(s.on_cpu_ns).into());
                o.insert("writer_runnable_share".into(), share(s.runnable_ns).into());
                o.insert("writer_asleep_share".into(), share(asleep).into());
            }
            println!("{v}");
        } else {
            println!(
                "threads {:>2}, checkpoints {checkpoints}: {:>10.0} writes/s  ({:>7.1} MiB/s)  p50 {:>6.2} us  p99 {:>7.2} us  p99.9 {:>8.2} us  ({} writes in {:.2} s, {} blocks relocated, {} waits, {:.0}% of the time in writes >= 10 us; CPU per write {:.2} us, writers {:.2} us)",
                r.threads,
                wps,
                wps * 4096.0 / (1 << 20) as f64,
                p50_us,
                p99_us,
                p999_us,
                r.writes,
                r.seconds,
                r.relocated,
                r.waits,
                slow_share * 100.0,
                r.process.cpu_seconds * 1e6 / r.writes.max(1) as f64,
                r.writers.cpu_seconds * 1e6 / r.writes.max(1) as f64,
            );
        }
    }
    Ok(())
}

fn run_one(args: &EngineBenchArgs, threads: usize, checkpoints: u32) -> anyhow::Result<RunResult> {
    let cache: Arc<dyn BlockDevice> = match &args.cache_file {
        Some(path) => {
            create_sparse(path, args.cache_mib << 20)
                .with_context(|| format!("creating {}", path.display()))?;
            Arc::new(logcache_backing::open_file(path, || {
                format!("opening {}", path.display())
            })?)
        }
        None => Arc::new(MemDevice::new_prefaulted(args.cache_mib << 20)),
    };
    let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(8 << 30));
    // The writers touch only the first `span_bytes` of the backing device; fault that part in
    // now, as the cache is, so writeback's first write to each page does not pay the kernel
    // for zeroing a fresh page of RAM (15% of the process's CPU samples, under writeback's
    // copies, before this): a disk or remote backing device has no such cost. Writeback
    // still reads, checks and writes every block it writes back.
    let span_bytes = (args.cache_mib << 20) / 4;
    let zeros = vec![0u8; 1 << 20];
    for off in (0..span_bytes).step_by(zeros.len()) {
        let len = zeros.len().min((span_bytes - off) as usize);
        backing
            .write_at(&zeros[..len], off)
            .context("faulting in the backing device's written span")?;
    }
    let fopts = FormatOptions {
        segment_size_bytes: args.segment_kib * 1024,
        ..FormatOptions::default()
    };
    format_cache(&*cache, &*backing, &fopts).context("formatting the memory cache")?;
    let engine = Engine::open(cache, backing, OpenOptions::default()).context("opening")?;
    for i in 0..checkpoints {
        engine
            .checkpoint_create(&format!("bench{i}"))
            .context("creating a checkpoint")?;
    }
    let span_blocks = span_bytes / 4096;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let process_before = Usage::process();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let e = engine.clone();
            let stop = stop.clone();
            std::thread::spawn(
                move || -> anyhow::Result<(u64, Histogram, Usage, Option<SchedTime>, u64)> {
                    let usage_before = Usage::thread();
                    let sched_before = SchedTime::thread();
                    let wall = Instant::now();
                    let mut rng = Rng::new(0x5eed + t as u64);
                    let mut data = vec![0u8; 4096];
                    rng.fill(&mut data);
                    let mut hist = Histogram::default();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        // Check the clock and flag once per batch, not per write.
                        for _ in 0..256 {
                            let lba = rng.below(span_blocks);
                            data[0..8].copy_from_slice(&n.to_le_bytes());
                            let t0 = Instant::now();
                            e.write(lba * 4096, &data, false)?;
                            hist.record(t0.elapsed().as_nanos() as u64);
                            n += 1;
                        }
                    }
                    let sched = sched_before
                        .zip(SchedTime::thread())
                        .map(|(b, a)| a.since(b));
                    let wall_ns = wall.elapsed().as_nanos() as u64;
                    Ok((n, hist, Usage::thread() - usage_before, sched, wall_ns))
                },
            )
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(args.seconds));
    stop.store(true, Ordering::Relaxed);
    let mut hist = Histogram::default();
    let mut writes = 0;
    let mut writers = Usage::default();
    let mut writers_sched = Some(SchedTime::default());
    let mut writers_wall_ns = 0;
    for w in workers {
        let (n, h, u, sched, wall_ns) = w
            .join()
            .map_err(|_| anyhow::anyhow!("a writer thread panicked"))??;
        writes += n;
        hist.merge(&h);
        writers = writers.plus(u);
        writers_sched = writers_sched.zip(sched).map(|(a, b)| a.plus(b));
        writers_wall_ns += wall_ns;
    }
    let seconds = started.elapsed().as_secs_f64();
    let process = Usage::process() - process_before;
    let stats = engine.stats();
    engine.close().context("closing")?;
    Ok(RunResult {
        threads,
        writes,
        seconds,
        hist,
        relocated: stats.counters.blocks_relocated,
        waits: stats.counters.write_waits,
        waits_for_buffers: stats.counters.write_waits_for_buffers,
        wait_us: stats.counters.write_wait_us,
        writeback_pauses_cut: stats.counters.writeback_pauses_cut,
        process,
        writers,
        writers_sched,
        writers_wall_ns,
    })
}
