//! The export hold (`Engine::export_begin`): an export reads the disk as of its moment while
//! changes keep arriving — writes of any size, write-zeroes and TRIM, to blocks not yet
//! exported, already exported and never held, with writeback and log wrap in between — and
//! its bounds: one export at a time, a side area that overflows abandons the export (never a
//! write), and the hold ends when the export is dropped. Seeded; `LOGCACHE_EXPORT_CASES`
//! sets how many cases run.

mod common;

use common::*;
use logcache_engine::{Engine, Error};
use logcache_testkit::rng::Rng;

const BLOCK: u64 = 4096;
const KIB: u64 = 1024;

fn disk(e: &Engine) -> Vec<u8> {
    let mut buf = vec![0u8; e.size_bytes() as usize];
    e.read(0, &mut buf).expect("read the disk");
    buf
}

/// One random change; returns nothing, the caller reads the disk when it needs it.
fn change(e: &Engine, rng: &mut Rng, gen: u8) {
    let size = e.size_bytes();
    let len = [512, 4096, 8192, 65536][rng.below(4) as usize].min(size);
    let off = rng.below((size - len) / 512 + 1) * 512;
    match rng.below(8) {
        0 => e.write_zeroes(off, len, false).expect("write-zeroes"),
        1 => e.discard(off, len, false).expect("trim"),
        _ => e
            .write(off, &vec![gen; len as usize], rng.chance(1, 8))
            .expect("write"),
    }
    if rng.chance(1, 6) {
        e.writeback_step(256).expect("writeback");
    }
    if rng.chance(1, 6) {
        e.flush().expect("flush");
    }
}

#[test]
fn an_export_reads_the_moment_while_changes_keep_coming_seeded() {
    let cases = std::env::var("LOGCACHE_EXPORT_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24u64);
    let mut kept_total = 0;
    for seed in 0..cases {
        let mut rng = Rng::new(seed);
        let pair = SimPair::new((1 << 20) + 16 * 64 * KIB, 2 << 20, 64 * KIB);
        let e = Engine::open(pair.cache(), pair.backing(), manual(256 * KIB)).expect("open");
        for g in 0..rng.range(10, 60) {
            change(&e, &mut rng, g as u8 + 1);
        }
        e.checkpoint_create("since").expect("checkpoint");
        for g in 0..rng.range(20, 120) {
            change(&e, &mut rng, 100 + g as u8);
        }
        let mut export = e
            .export_begin("moment", "since", 64 << 20)
            .unwrap_or_else(|err| panic!("seed {seed}: {err}"));
        let moment = disk(&e);
        let runs = export.runs().to_vec();
        let mut exported = moment.clone();
        // Blank what the export must fill, so a piece it does not read shows.
        for &(f, n) in &runs {
            exported[(f * BLOCK) as usize..((f + n) * BLOCK) as usize].fill(0xEE);
        }
        for (f, n) in runs {
            let mut b = f;
            while b < f + n {
                let k = rng.range(1, (f + n - b).min(8));
                for _ in 0..rng.below(4) {
                    let gen = 200 + rng.below(50) as u8;
                    change(&e, &mut rng, gen);
                }
                let at = (b * BLOCK) as usize;
                export
                    .read(b, &mut exported[at..at + (k * BLOCK) as usize])
                    .unwrap_or_else(|err| panic!("seed {seed}: {err}"));
                b += k;
            }
        }
        kept_total += export.kept_blocks();
        assert!(
            exported == moment,
            "seed {seed}: the export differs from the disk at its moment"
        );
        drop(export);
        // The hold is gone: changes go on, and a new export may begin.
        change(&e, &mut rng, 1);
        drop(
            e.export_begin("next", "moment", 1 << 20)
                .expect("a second export"),
        );
        e.close().expect("close");
    }
    // The cases must exercise the copies (else this test could not fail for want of them).
    assert!(
        kept_total > 0,
        "no case changed a held block before it was exported"
    );
    eprintln!("{cases} cases, {kept_total} blocks kept for exports");
}

#[test]
fn a_side_area_that_overflows_abandons_the_export_never_a_write() {
    let pair = SimPair::new((1 << 20) + 16 * 64 * KIB, 2 << 20, 64 * KIB);
    let e = Engine::open(pair.cache(), pair.backing(), manual(256 * KIB)).expect("open");
    e.checkpoint_create("since").unwrap();
    e.write(0, &vec![1u8; 64 * 1024], false).unwrap();
    let mut export = e.export_begin("moment", "since", 16 * 1024).unwrap();
    assert_eq!(export.runs(), &[(0, 16)]);
    // A second export is refused while this one runs.
    let second = e
        .export_begin("other", "since", 1 << 20)
        .err()
        .expect("one at a time");
    assert!(
        second
            .to_string()
            .contains("another export-diff is running"),
        "{second}"
    );
    // 16 KiB of copies fit; the fifth block does not.
    e.write(0, &vec![2u8; 16 * 1024], false).unwrap();
    e.write(16 * 1024, &vec![3u8; 4096], false).unwrap();
    let mut buf = vec![0u8; 4096];
    let err = export.read(0, &mut buf).expect_err("abandoned");
    assert!(matches!(err, Error::Export(_)), "{err}");
    assert!(err.to_string().contains("more than 16 KiB"), "{err}");
    // The writes all landed.
    let now = disk(&e);
    assert!(now[..16 * 1024].iter().all(|&b| b == 2));
    assert!(now[16 * 1024..20 * 1024].iter().all(|&b| b == 3));
    assert!(now[20 * 1024..64 * 1024].iter().all(|&b| b == 1));
    drop(export);
    e.close().unwrap();
}

/// The model across power cuts: a copy of the disk as of checkpoint `c` (taken after
/// a flush), then changes with writeback, log wrap and power cuts between any two steps
/// (each device keeps, loses or tears its unsynced writes), and at random points an export
/// since `c` applied onto the copy: it must equal the disk at the export's moment. A bitmap
/// that under-reported after a cut would leave a block of the copy stale.
#[test]
fn an_export_applied_to_the_copy_is_the_disk_across_power_cuts_seeded() {
    let cases = std::env::var("LOGCACHE_EXPORT_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24u64);
    let (mut cuts, mut exports) = (0, 0);
    for seed in 0..cases {
        let mut rng = Rng::new(1000 + seed);
        let pair = SimPair::new((1 << 20) + 16 * 64 * KIB, 2 << 20, 64 * KIB);
        let open = || Engine::open(pair.cache(), pair.backing(), manual(256 * KIB));
        let mut e = open().expect("open");
        for g in 0..rng.range(10, 40) {
            change(&e, &mut rng, g as u8 + 1);
        }
        e.flush().unwrap();
        e.checkpoint_create("c").unwrap();
        let copy = disk(&e);
        for step in 0..rng.range(20, 80) {
            match rng.below(10) {
                0 => {
                    e.crash();
                    pair.cache.crash(&mut rng);
                    pair.backing.crash(&mut rng);
                    e = open().unwrap_or_else(|err| panic!("seed {seed}: reopen: {err}"));
                    cuts += 1;
                }
                1 => {
                    let name = format!("n{step}");
                    let mut x = e.export_begin(&name, "c", 64 << 20).unwrap();
                    let moment = disk(&e);
                    let mut restored = copy.clone();
                    for (f, n) in x.runs().to_vec() {
                        let at = (f * BLOCK) as usize;
                        x.read(f, &mut restored[at..at + (n * BLOCK) as usize])
                            .unwrap_or_else(|err| panic!("seed {seed}: {err}"));
                    }
                    assert!(
                        restored == moment,
                        "seed {seed} step {step}: the copy plus the export is not the disk"
                    );
                    drop(x);
                    e.checkpoint_delete(&name).unwrap();
                    exports += 1;
                }
                _ => change(&e, &mut rng, 50 + (step % 200) as u8),
            }
        }
        e.close().unwrap();
    }
    eprintln!("{cases} cases: {cuts} power cuts, {exports} exports checked");
    assert!(cuts > 0 && exports > 0);
}

/// What a writer thread's op did to its block: a write of its pattern, or write-zeroes.
#[derive(Clone, Copy)]
struct Op {
    block: u64,
    zeroes: bool,
}

/// The 4 KiB a writer's op `gen` (1-based) leaves in `block`; gen 0 is the setup's write.
fn pattern(writer: u64, gen: u64, block: u64) -> Vec<u8> {
    let mut out = vec![0u8; BLOCK as usize];
    for (i, s) in out.chunks_mut(SECTOR).enumerate() {
        sector_pattern((writer << 32) | gen, block * 8 + i as u64, s);
    }
    out
}

/// What `block` of `writer` holds after the writer's first `done` ops.
fn expected(ops: &[Op], writer: u64, done: usize, block: u64) -> Vec<u8> {
    match ops[..done].iter().rposition(|o| o.block == block) {
        Some(i) if ops[i].zeroes => vec![0u8; BLOCK as usize],
        Some(i) => pattern(writer, i as u64 + 1, block),
        None => pattern(writer, 0, block),
    }
}

/// Sets its flag when dropped, unwinding included.
struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// The export hold under real concurrency: writer threads keep writing (and zeroing) 4 KiB
/// blocks while the export is begun and read piece by piece, with the engine's own flusher
/// and writeback threads running and the log wrapping. Each writer owns the blocks `b % W ==
/// w` and issues one op at a time, so "the disk at one moment" means: for every writer there
/// is one count of its ops, between those acknowledged before `export_begin` was called and
/// those started before it returned, that explains every exported block of the writer; every
/// block written before that point is in the export's runs; every block written after it is
/// in the new checkpoint. The export's reads wait for the writers to make progress between
/// pieces (not for time), so writes reach blocks still to export. Without the hold's copies
/// the export fails (its defence) or ships newer data (this check).
#[test]
fn an_export_while_writer_threads_keep_writing_is_the_disk_at_one_moment() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const WRITERS: u64 = 3;
    let cases = cases_from_env("LOGCACHE_EXPORT_CASES", 6);
    let mut kept_total = 0;
    for case in 0..cases {
        let pair = SimPair::new((1 << 20) + 16 * 64 * KIB, 2 << 20, 64 * KIB);
        let opts = logcache_engine::OpenOptions {
            manual_flusher: false,
            ..manual(256 * KIB)
        };
        let e = Engine::open(pair.cache(), pair.backing(), opts).expect("open");
        let blocks = e.size_bytes() / BLOCK;
        for b in 0..blocks {
            e.write(b * BLOCK, &pattern(b % WRITERS, 0, b), false)
                .expect("setup write");
        }
        e.flush().expect("flush");
        e.checkpoint_create("since").expect("checkpoint");
        let started: Vec<AtomicU64> = (0..WRITERS).map(|_| AtomicU64::new(0)).collect();
        let acked: Vec<AtomicU64> = (0..WRITERS).map(|_| AtomicU64::new(0)).collect();
        let stop = AtomicBool::new(false);
        let (ops, window, pieces, x_runs, kept) = std::thread::scope(|s| {
            // A failure below stops the writers, else the scope would wait for them forever.
            let _stop_writers = StopOnDrop(&stop);
            let writers: Vec<_> = (0..WRITERS)
                .map(|w| {
                    let (e, started, acked, stop) =
                        (&e, &started[w as usize], &acked[w as usize], &stop);
                    s.spawn(move || {
                        let mut rng = Rng::new(case * 100 + w);
                        let mut ops = Vec::new();
                        while !stop.load(Ordering::Acquire) {
                            let block = rng.below(blocks / WRITERS) * WRITERS + w;
                            let zeroes = rng.chance(1, 8);
                            ops.push(Op { block, zeroes });
                            started.fetch_add(1, Ordering::AcqRel);
                            if zeroes {
                                e.write_zeroes(block * BLOCK, BLOCK, false)
                                    .expect("write-zeroes");
                            } else {
                                let gen = ops.len() as u64;
                                e.write(block * BLOCK, &pattern(w, gen, block), rng.chance(1, 16))
                                    .expect("write");
                            }
                            acked.fetch_add(1, Ordering::AcqRel);
                            if rng.chance(1, 32) {
                                e.flush().expect("flush");
                            }
                        }
                        ops
                    })
                })
                .collect();
            let total = || acked.iter().map(|a| a.load(Ordering::Acquire)).sum::<u64>();
            let wait_for = |n: u64| {
                let from = total();
                while total() < from + n && !writers.iter().any(|h| h.is_finished()) {
                    std::thread::yield_now();
                }
            };
            // Changes since the checkpoint, so that the export has blocks to ship.
            wait_for(blocks / 2);
            let lo: Vec<u64> = acked.iter().map(|a| a.load(Ordering::Acquire)).collect();
            let mut x = e.export_begin("moment", "since", 64 << 20).expect("export");
            let hi: Vec<u64> = started.iter().map(|a| a.load(Ordering::Acquire)).collect();
            let runs = x.runs().to_vec();
            let mut pieces = Vec::new();
            for &(f, n) in &runs {
                for b in f..f + n {
                    wait_for(2);
                    let mut buf = vec![0u8; BLOCK as usize];
                    x.read(b, &mut buf)
                        .unwrap_or_else(|err| panic!("case {case}: {err}"));
                    pieces.push((b, buf));
                }
            }
            let kept = x.kept_blocks();
            drop(x);
            wait_for(blocks / 4);
            stop.store(true, Ordering::Release);
            let ops: Vec<Vec<Op>> = writers.into_iter().map(|h| h.join().unwrap()).collect();
            (ops, (lo, hi), pieces, runs, kept)
        });
        kept_total += kept;
        let in_runs = |b: u64| x_runs.iter().any(|&(f, n)| f <= b && b < f + n);
        let (lo, hi) = window;
        for w in 0..WRITERS {
            let ops = &ops[w as usize];
            let mine: Vec<&(u64, Vec<u8>)> =
                pieces.iter().filter(|(b, _)| b % WRITERS == w).collect();
            // The writer's count of ops at the moment: one that explains every exported block.
            // Ops that leave a block as it was (zeroes on zeros) make several counts explain
            // it; the true one lies between the first and the last.
            let explains: Vec<usize> = (lo[w as usize] as usize..=hi[w as usize] as usize)
                .filter(|&n| {
                    mine.iter()
                        .all(|(b, data)| *data == expected(ops, w, n, *b))
                })
                .collect();
            let (Some(&first), Some(&last)) = (explains.first(), explains.last()) else {
                panic!(
                    "case {case}: writer {w}'s exported blocks are the disk at no one moment between {} and {} of its ops",
                    lo[w as usize], hi[w as usize]
                )
            };
            for o in &ops[..first] {
                assert!(
                    in_runs(o.block),
                    "case {case}: block {} changed before the moment is not in the export",
                    o.block
                );
            }
            for o in &ops[last..] {
                let changed = e
                    .checkpoint_changes("moment", o.block * BLOCK, BLOCK, 1)
                    .expect("changes");
                assert!(
                    changed.iter().all(|&(_, set)| set),
                    "case {case}: block {} changed after the moment is not in checkpoint moment",
                    o.block
                );
            }
        }
        e.close().expect("close");
    }
    assert!(
        kept_total > 0,
        "no write reached a block still to export: the hold was not exercised"
    );
    eprintln!("{cases} cases, {kept_total} blocks kept for exports");
}
