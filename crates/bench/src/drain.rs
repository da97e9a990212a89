//! `logcache-bench drain`: how long writeback takes to drain the same 4 KiB-random dirty data
//! to a slow backing device, sorted versus unsorted, and what it does to foreground writes.
//!
//! The backing device is an EMULATED 7200 rpm hard disk (`HddDevice` over memory: it sleeps as
//! long as a disk would take); the cache device is memory. One seeded set of distinct random
//! blocks spread over the first `--span-mib` of the backing device (all of it by default), always
//! written in the same order, is measured
//! four ways:
//! (a) the same writes issued straight to the emulated disk, one by one, then a flush;
//! (b) written through the engine with writeback held off, then `drain` with
//!     `writeback_sorted = false` (log order, one IO per block);
//! (c) the same with sorted writeback (the default: batches sorted by address, runs merged);
//! (d) a paced writer (4 KiB random writes at a fixed rate over a small region) during a sorted
//!     drain of the data, then the same writer on the same engine with no writeback running;
//! (e) with `--order-flush-kib`: the price of `writeback_order = consistent` — the dirty set
//!     written with a client flush after every N KiB (0: none), drained in `consistent` order
//!     (one flush epoch at a time, a backing sync between epochs) and in `sorted` order (merged
//!     across flushes), alternated.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use logcache_engine::format::label::label_offset;
use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::tunables;
use logcache_engine::{format_cache, Engine, FormatOptions, OpenOptions};
use logcache_testkit::hdd::{HddDevice, HddParams, HddStats};
use logcache_testkit::rng::Rng;

use crate::histogram::Histogram;

const BLOCK_BYTES: u64 = 4096;
/// Size of the memory cache device: room for the dirty set and the writer's blocks without
/// reclaim pressure (allocated lazily).
const CACHE_BYTES: u64 = 1 << 30;

#[derive(Args)]
pub struct DrainBenchArgs {
    /// Dirty 4 KiB blocks to drain (distinct, random over the first --span-mib of the backing
    /// device).
    #[arg(long, default_value_t = 4096)]
    blocks: u64,
    /// The region the dirty blocks are spread over, MiB from the start of the backing device
    /// (0: all of it). The default, 16 MiB dirty over 128 MiB, has the density of a full cache
    /// in front of a disk 8 times its size (the default `serve` layout); what matters to the
    /// disk is the density, not the size.
    #[arg(long, default_value_t = 128)]
    span_mib: u64,
    /// Seed of the block addresses.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Backing device size in GiB (memory, allocated lazily).
    #[arg(long, default_value_t = 8)]
    backing_gib: u64,
    /// Writeback batch size (the writeback_batch_blocks tunable); default: the engine's.
    #[arg(long)]
    batch_blocks: Option<u64>,
    /// Writeback writes in flight (the writeback_io_depth tunable); default: the engine's.
    #[arg(long)]
    io_depth: Option<u64>,
    /// Emulated disk: spindle speed.
    #[arg(long, default_value_t = HddParams::default().rpm)]
    rpm: u32,
    /// Emulated disk: shortest seek (head settle), µs.
    #[arg(long, default_value_t = HddParams::default().settle_us)]
    settle_us: u64,
    /// Emulated disk: seek across the whole platter (1 TB), µs.
    #[arg(long, default_value_t = HddParams::default().full_stroke_us)]
    full_stroke_us: u64,
    /// Emulated disk: transfer rate, MB/s (10^6 bytes).
    #[arg(long, default_value_t = HddParams::default().bandwidth_bytes_per_s / 1_000_000)]
    bandwidth_mb_s: u64,
    /// Emulated disk: queued requests it reorders among.
    #[arg(long, default_value_t = HddParams::default().ncq_depth)]
    ncq_depth: usize,
    /// Foreground writer: writes per second.
    #[arg(long, default_value_t = 2000)]
    writer_rate: u64,
    /// Foreground writer: seconds per measurement (with and without writeback); 0 skips (d).
    #[arg(long, default_value_t = 10.0)]
    writer_seconds: f64,
    /// Foreground writer: size of the region it writes at random, MiB (at the start of the
    /// disk). Small, so that draining its blocks afterwards is cheap.
    #[arg(long, default_value_t = 4)]
    writer_span_mib: u64,
    /// (e): flush intervals to price `writeback_order`, KiB of writes between client flushes,
    /// comma-separated (0: no flush until the end); empty skips (e).
    #[arg(long, value_delimiter = ',')]
    order_flush_kib: Vec<u64>,
    /// (e): rounds of consistent/sorted pairs per flush interval.
    #[arg(long, default_value_t = 1)]
    order_rounds: u32,
}

/// One (e) measurement: a flush interval, drained both ways.
struct OrderPrice {
    flush_kib: u64,
    consistent: Vec<Pass>,
    sorted: Vec<Pass>,
}

/// A timed pass over the dirty set.
struct Pass {
    seconds: f64,
    hdd: HddStats,
}

struct Latency {
    writes: u64,
    hist: Histogram,
}

struct WriterResult {
    idle: Latency,
    during: Latency,
    drain_seconds: f64,
    /// Whether the drain was still running when the writer stopped, i.e. every write of the
    /// second measurement met writeback.
    drain_ran_throughout: bool,
}

pub fn run(args: &DrainBenchArgs) -> anyhow::Result<()> {
    let backing_bytes = args
        .backing_gib
        .checked_mul(1 << 30)
        .context("--backing-gib is too large")?;
    let exported_bytes = label_offset(backing_bytes).context("--backing-gib must be at least 1")?;
    let exported_blocks = exported_bytes / BLOCK_BYTES;
    let span_blocks = match args.span_mib {
        0 => exported_blocks,
        mib => {
            let blocks = mib.saturating_mul(1 << 20) / BLOCK_BYTES;
            anyhow::ensure!(
                (1..=exported_blocks).contains(&blocks),
                "--span-mib must be from 1 MiB to the backing device's size"
            );
            blocks
        }
    };
    anyhow::ensure!(args.blocks >= 1, "--blocks must be at least 1");
    anyhow::ensure!(
        args.blocks <= span_blocks / 2,
        "--blocks must be at most half the span's {span_blocks} blocks"
    );
    anyhow::ensure!(args.writer_rate >= 1, "--writer-rate must be at least 1");
    anyhow::ensure!(
        args.writer_seconds.is_finite() && args.writer_seconds >= 0.0,
        "--writer-seconds must be a number of seconds, 0 or more"
    );
    let writer_span_blocks = args.writer_span_mib.saturating_mul(1 << 20) / BLOCK_BYTES;
    anyhow::ensure!(
        (1..=exported_blocks).contains(&writer_span_blocks),
        "--writer-span-mib must be from 1 MiB to the backing device's size"
    );
    let hdd = HddParams {
        rpm: args.rpm,
        settle_us: args.settle_us,
        full_stroke_us: args.full_stroke_us,
        bandwidth_bytes_per_s: args.bandwidth_mb_s.saturating_mul(1_000_000),
        ncq_depth: args.ncq_depth,
        ..HddParams::default()
    };
    hdd.check().context("the emulated disk's parameters")?;
    let batch_blocks = match args.batch_blocks {
        // Checked now rather than when the first cache opens, after minutes of (a).
        Some(b) => {
            tunables::parse("writeback_batch_blocks", &b.to_string())
                .context("--batch-blocks")?
                .1
        }
        None => tunables::SPECS[tunables::WRITEBACK_BATCH_BLOCKS].default,
    };
    let io_depth = match args.io_depth {
        Some(d) => {
            tunables::parse("writeback_io_depth", &d.to_string())
                .context("--io-depth")?
                .1
        }
        None => tunables::SPECS[tunables::WRITEBACK_IO_DEPTH].default,
    };
    let lbas = dirty_set(args.seed, args.blocks, span_blocks);
    let bench = Bench {
        args,
        batch_blocks,
        io_depth,
        backing_bytes,
        hdd,
        lbas,
        writer_span_blocks,
    };
    if !args.json {
        println!(
            "{} random 4 KiB blocks ({:.1} MiB) over {} MiB ({:.1}% dense) of a {} GiB device, seed {}, writeback batches of {batch_blocks} blocks, {io_depth} IOs in flight; backing: emulated {} rpm disk (settle {} us, full stroke {} us over {} GB, {} MB/s, NCQ {}); cache: memory",
            args.blocks,
            (args.blocks * BLOCK_BYTES) as f64 / (1 << 20) as f64,
            (span_blocks * BLOCK_BYTES) >> 20,
            args.blocks as f64 * 100.0 / span_blocks as f64,
            args.backing_gib,
            args.seed,
            args.rpm,
            args.settle_us,
            args.full_stroke_us,
            hdd.platter_bytes / 1_000_000_000,
            args.bandwidth_mb_s,
            hdd.ncq_depth
        );
    }
    let direct = bench.direct().context("(a) writing straight to the disk")?;
    print_pass(args, "(a) backing device alone", &direct);
    let unsorted = bench.drain(false).context("(b) unsorted drain")?;
    print_pass(args, "(b) drain, unsorted", &unsorted);
    let sorted = bench.drain(true).context("(c) sorted drain")?;
    print_pass(args, "(c) drain, sorted", &sorted);
    let speedup = unsorted.seconds / sorted.seconds;
    let vs_direct = direct.seconds / sorted.seconds;
    if !args.json {
        println!(
            "sorted vs unsorted: {speedup:.2}x (goal >= 3x: {}); sorted vs backing alone: {vs_direct:.2}x",
            if speedup >= 3.0 { "met" } else { "not met" }
        );
    }
    let writer = if args.writer_seconds > 0.0 {
        Some(bench.writer().context("(d) foreground writes")?)
    } else {
        None
    };
    if let Some(w) = &writer {
        if !args.json {
            println!(
                "(d) foreground writes, {}/s random 4 KiB over {} MiB, {} s each:",
                args.writer_rate, args.writer_span_mib, args.writer_seconds
            );
            print_latency("no writeback", &w.idle);
            print_latency("during the sorted drain", &w.during);
            println!(
                "    (drain with the writer: {:.2} s; it ran through the whole measurement: {})",
                w.drain_seconds,
                if w.drain_ran_throughout { "yes" } else { "NO" }
            );
        }
    }
    let mut prices = Vec::new();
    for &kib in &args.order_flush_kib {
        anyhow::ensure!(
            kib == 0 || kib % 4 == 0,
            "--order-flush-kib takes multiples of 4 KiB (0: no flushes)"
        );
        let flush_blocks = (kib > 0).then_some(kib / 4);
        let mut price = OrderPrice {
            flush_kib: kib,
            consistent: Vec::new(),
            sorted: Vec::new(),
        };
        for _ in 0..args.order_rounds.max(1) {
            price.consistent.push(
                bench
                    .drain_order("consistent", flush_blocks)
                    .context("(e) consistent drain")?,
            );
            price.sorted.push(
                bench
                    .drain_order("sorted", flush_blocks)
                    .context("(e) sorted drain")?,
            );
        }
        if !args.json {
            let what = if kib == 0 {
                "no flushes".to_string()
            } else {
                format!("a flush every {kib} KiB")
            };
            let (c, s) = (mean_seconds(&price.consistent), mean_seconds(&price.sorted));
            println!(
                "(e) {what}: drain consistent {c:.2} s, sorted {s:.2} s: consistent takes {:.2}x as long ({} rounds)",
                c / s,
                price.consistent.len()
            );
        }
        prices.push(price);
    }
    if args.json {
        let pass = |p: &Pass| {
            serde_json::json!({
                "seconds": p.seconds,
                "modelled_seconds": p.hdd.busy_us as f64 / 1e6,
                "backing_ios": p.hdd.ios,
            })
        };
        let mut v = serde_json::json!({
            "blocks": args.blocks,
            "block_size_bytes": BLOCK_BYTES,
            "backing_size_bytes": backing_bytes,
            "span_bytes": span_blocks * BLOCK_BYTES,
            "seed": args.seed,
            "writeback_batch_blocks": batch_blocks,
            "writeback_io_depth": io_depth,
            "hdd": {
                "rpm": hdd.rpm,
                "settle_us": hdd.settle_us,
                "full_stroke_us": hdd.full_stroke_us,
                "platter_bytes": hdd.platter_bytes,
                "bandwidth_bytes_per_s": hdd.bandwidth_bytes_per_s,
                "flush_us": hdd.flush_us,
                "ncq_depth": hdd.ncq_depth,
            },
            "direct": pass(&direct),
            "drain_unsorted": pass(&unsorted),
            "drain_sorted": pass(&sorted),
            "speedup_sorted_vs_unsorted": speedup,
            "speedup_sorted_vs_direct": vs_direct,
        });
        if !prices.is_empty() {
            v["writeback_order_price"] = prices
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "flush_every_kib": p.flush_kib,
                        "consistent": p.consistent.iter().map(pass).collect::<Vec<_>>(),
                        "sorted": p.sorted.iter().map(pass).collect::<Vec<_>>(),
                        "consistent_over_sorted":
                            mean_seconds(&p.consistent) / mean_seconds(&p.sorted),
                    })
                })
                .collect();
        }
        if let Some(w) = &writer {
            let lat = |l: &Latency| {
                serde_json::json!({
                    "writes": l.writes,
                    "p50_us": l.hist.quantile_ns(0.50) as f64 / 1000.0,
                    "p99_us": l.hist.quantile_ns(0.99) as f64 / 1000.0,
                    "p999_us": l.hist.quantile_ns(0.999) as f64 / 1000.0,
                })
            };
            v["foreground"] = serde_json::json!({
                "writer_rate_per_s": args.writer_rate,
                "seconds": args.writer_seconds,
                "span_bytes": writer_span_blocks * BLOCK_BYTES,
                "no_writeback": lat(&w.idle),
                "during_drain": lat(&w.during),
                "drain_seconds": w.drain_seconds,
                "drain_ran_throughout": w.drain_ran_throughout,
            });
        }
        println!("{v}");
    }
    Ok(())
}

fn mean_seconds(passes: &[Pass]) -> f64 {
    passes.iter().map(|p| p.seconds).sum::<f64>() / passes.len().max(1) as f64
}

fn print_pass(args: &DrainBenchArgs, name: &str, p: &Pass) {
    if args.json {
        return;
    }
    println!(
        "{name:<28} {:>8.2} s  (modelled {:>7.2} s, {:>6} backing IOs, {:>6.0} blocks/s)",
        p.seconds,
        p.hdd.busy_us as f64 / 1e6,
        p.hdd.ios,
        args.blocks as f64 / p.seconds
    );
}

fn print_latency(name: &str, l: &Latency) {
    println!(
        "    {name:<24} {:>7} writes  p50 {:>7.2} us  p99 {:>8.2} us  p99.9 {:>9.2} us",
        l.writes,
        l.hist.quantile_ns(0.50) as f64 / 1000.0,
        l.hist.quantile_ns(0.99) as f64 / 1000.0,
        l.hist.quantile_ns(0.999) as f64 / 1000.0
    );
}

/// `count` distinct block numbers below `blocks`, in a seeded random order (the write order).
fn dirty_set(seed: u64, count: u64, blocks: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    let mut seen = std::collections::HashSet::with_capacity(count as usize);
    let mut out = Vec::with_capacity(count as usize);
    while (out.len() as u64) < count {
        let lba = rng.below(blocks);
        if seen.insert(lba) {
            out.push(lba);
        }
    }
    out
}

/// A block's content: its address, so the backing device can be checked afterwards.
fn stamp(buf: &mut [u8], lba: u64) {
    buf[..8].copy_from_slice(&lba.to_le_bytes());
}

struct Bench<'a> {
    args: &'a DrainBenchArgs,
    batch_blocks: u64,
    io_depth: u64,
    backing_bytes: u64,
    hdd: HddParams,
    lbas: Vec<u64>,
    writer_span_blocks: u64,
}

/// An engine on a memory cache in front of an emulated disk over memory.
struct Rig {
    engine: Engine,
    hdd: Arc<HddDevice>,
    mem: Arc<MemDevice>,
}

impl Bench<'_> {
    fn data(&self) -> Vec<u8> {
        let mut data = vec![0u8; BLOCK_BYTES as usize];
        Rng::new(self.args.seed).fill(&mut data);
        data
    }

    fn direct(&self) -> anyhow::Result<Pass> {
        let mem = Arc::new(MemDevice::new(self.backing_bytes));
        let hdd = HddDevice::new(mem, self.hdd).context("building the emulated disk")?;
        let mut data = self.data();
        let started = Instant::now();
        for &lba in &self.lbas {
            stamp(&mut data, lba);
            hdd.write_at(&data, lba * BLOCK_BYTES)
                .with_context(|| format!("writing block {lba}"))?;
        }
        hdd.flush().context("flushing")?;
        Ok(Pass {
            seconds: started.elapsed().as_secs_f64(),
            hdd: hdd.stats(),
        })
    }

    /// Formats and opens a cache with writeback held off, and writes the dirty set through it.
    fn rig(&self, sorted: bool) -> anyhow::Result<Rig> {
        self.rig_with(sorted, "consistent", None)
    }

    /// As `rig`, in `writeback_order` `order`, with a client flush after every `flush_blocks`
    /// writes.
    fn rig_with(
        &self,
        sorted: bool,
        order: &str,
        flush_blocks: Option<u64>,
    ) -> anyhow::Result<Rig> {
        let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(CACHE_BYTES));
        let mem = Arc::new(MemDevice::new(self.backing_bytes));
        // Formatting writes the label; it is setup, so it goes around the emulated disk.
        format_cache(&*cache, &*mem, &FormatOptions::default()).context("formatting")?;
        let hdd =
            Arc::new(HddDevice::new(mem.clone(), self.hdd).context("building the emulated disk")?);
        let opts = OpenOptions {
            writeback_sorted: sorted,
            ..OpenOptions::default()
        };
        let engine = Engine::open(cache, hdd.clone(), opts).context("opening the cache")?;
        // Writeback only when the drain asks: never by the dirty level, never for idleness.
        engine
            .set_tunable("writeback_threshold_percent", "100")
            .context("holding writeback off")?;
        engine
            .set_tunable("writeback_idle_ms", "0")
            .context("holding writeback off")?;
        engine
            .set_tunable("writeback_batch_blocks", &self.batch_blocks.to_string())
            .context("--batch-blocks")?;
        engine
            .set_tunable("writeback_io_depth", &self.io_depth.to_string())
            .context("--io-depth")?;
        engine
            .set_tunable("writeback_order", order)
            .context("writeback_order")?;
        let mut data = self.data();
        for (i, &lba) in self.lbas.iter().enumerate() {
            stamp(&mut data, lba);
            engine
                .write(lba * BLOCK_BYTES, &data, false)
                .with_context(|| format!("writing block {lba}"))?;
            if flush_blocks.is_some_and(|n| (i as u64 + 1).is_multiple_of(n)) {
                engine.flush().context("flushing the cache")?;
            }
        }
        engine.flush().context("flushing the cache")?;
        let s = engine.stats();
        anyhow::ensure!(
            s.dirty_blocks == self.lbas.len() as u64 && s.counters.writeback_blocks == 0,
            "writeback was not held off: {} dirty, {} written back",
            s.dirty_blocks,
            s.counters.writeback_blocks
        );
        Ok(Rig { engine, hdd, mem })
    }

    fn drain(&self, sorted: bool) -> anyhow::Result<Pass> {
        self.timed_drain(self.rig(sorted)?)
    }

    /// (e): the dirty set written with flushes, drained in `order`.
    fn drain_order(&self, order: &str, flush_blocks: Option<u64>) -> anyhow::Result<Pass> {
        self.timed_drain(self.rig_with(true, order, flush_blocks)?)
    }

    fn timed_drain(&self, rig: Rig) -> anyhow::Result<Pass> {
        let before = rig.hdd.stats();
        let started = Instant::now();
        rig.engine.drain(|_| {}).context("draining")?;
        let seconds = started.elapsed().as_secs_f64();
        let after = rig.hdd.stats();
        self.check_backing(&rig.mem)?;
        rig.engine.close().context("closing")?;
        Ok(Pass {
            seconds,
            hdd: HddStats {
                ios: after.ios - before.ios,
                busy_us: after.busy_us - before.busy_us,
                queued_max: after.queued_max,
            },
        })
    }

    /// Every block of the dirty set reached the backing device.
    fn check_backing(&self, mem: &MemDevice) -> anyhow::Result<()> {
        let mut buf = vec![0u8; BLOCK_BYTES as usize];
        for &lba in &self.lbas {
            mem.read_at(&mut buf, lba * BLOCK_BYTES)?;
            anyhow::ensure!(
                buf[..8] == lba.to_le_bytes(),
                "block {lba} did not reach the backing device"
            );
        }
        Ok(())
    }

    fn writer(&self) -> anyhow::Result<WriterResult> {
        let rig = self.rig(true)?;
        let seconds = self.args.writer_seconds;
        let done = Arc::new(AtomicBool::new(false));
        let drainer = {
            let engine = rig.engine.clone();
            let done = done.clone();
            std::thread::spawn(move || -> logcache_engine::Result<f64> {
                let started = Instant::now();
                let res = engine.drain(|_| {});
                done.store(true, Ordering::Release);
                res.map(|()| started.elapsed().as_secs_f64())
            })
        };
        let during = paced_writes(&rig.engine, self, seconds, 2);
        let drain_ran_throughout = !done.load(Ordering::Acquire);
        // Join first: a writer error must not leave the drain running unobserved.
        let drained = drainer
            .join()
            .map_err(|_| anyhow::anyhow!("the drain thread panicked"))?;
        let during = during.context("writer, during the drain")?;
        let drain_seconds = drained.context("draining with the writer")?;
        self.check_backing(&rig.mem)?;
        // Afterwards, so that the drain above need not also write back this writer's blocks.
        let idle = paced_writes(&rig.engine, self, seconds, 1).context("writer, no writeback")?;
        rig.engine.close().context("closing")?;
        Ok(WriterResult {
            idle,
            during,
            drain_seconds,
            drain_ran_throughout,
        })
    }
}

/// Random 4 KiB writes over the writer's span at the configured rate for `seconds`, each
/// timed around `Engine::write`. Writes are issued on a fixed schedule; one that is late goes
/// at once, and only its own call is timed (the delay before it is not).
fn paced_writes(engine: &Engine, b: &Bench, seconds: f64, stream: u64) -> anyhow::Result<Latency> {
    let mut rng = Rng::new(b.args.seed.wrapping_add(stream));
    let mut data = b.data();
    let interval = Duration::from_secs_f64(1.0 / b.args.writer_rate as f64);
    let total = (seconds * b.args.writer_rate as f64).round() as u64;
    let mut hist = Histogram::default();
    let started = Instant::now();
    for k in 0..total {
        let due = started + interval.mul_f64(k as f64);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let lba = rng.below(b.writer_span_blocks);
        stamp(&mut data, lba);
        let t0 = Instant::now();
        engine.write(lba * BLOCK_BYTES, &data, false)?;
        hist.record(t0.elapsed().as_nanos() as u64);
    }
    Ok(Latency {
        writes: total,
        hist,
    })
}
