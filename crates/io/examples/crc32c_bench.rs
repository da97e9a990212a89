//! CRC32C speed: `logcache_io::crc32c` against the `crc32c` crate, per 4 KiB block salted as
//! the engine's `crc_block` is, on cache-hot and cold data, and right after an O_DIRECT read
//! (what the read path checks). Rounds alternate the two (and a loop that only reads one word
//! per cache line: the memory floor); each line prints the median GB/s of the rounds.
//!
//! `cargo run --release -p logcache-io --example crc32c_bench [FILE]`: FILE (≥ 64 MiB, e.g.
//! `head -c 1G /dev/urandom > /var/tmp/crc.dat`) adds the O_DIRECT case.

use std::hint::black_box;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::time::Instant;

const BLOCK_BYTES: usize = 4096;
const ROUNDS: usize = 5;

#[derive(Clone, Copy)]
enum Which {
    Crate,
    Ours,
    Touch,
}

fn block_crc(which: Which, lba: u64, data: &[u8]) -> u64 {
    let mut salt = [0u8; 16];
    salt[..8].copy_from_slice(&0x1234_5678_9abc_def0u64.to_le_bytes());
    salt[8..].copy_from_slice(&lba.to_le_bytes());
    match which {
        Which::Crate => crc32c::crc32c_append(crc32c::crc32c(&salt), data) as u64,
        Which::Ours => {
            logcache_io::crc32c::crc32c_append(logcache_io::crc32c::crc32c(&salt), data) as u64
        }
        // One load per cache line: what reading the data costs at the least.
        Which::Touch => data
            .chunks_exact(64)
            .map(|c| u64::from_le_bytes(c[..8].try_into().expect("8 bytes")))
            .fold(0, |a, b| a ^ black_box(b)),
    }
}

/// Fills `bytes` of anonymous memory with pseudo-random data (so every page is present).
fn random_buffer(bytes: usize) -> Vec<u8> {
    let mut r = 0x9E37_79B9_7F4A_7C15u64;
    let mut v = vec![0u8; bytes];
    for w in v.chunks_exact_mut(8) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        w.copy_from_slice(&r.to_le_bytes());
    }
    v
}

/// GB/s of checksumming `total_bytes`, taking `span_bytes` at each offset of `order` in turn.
fn run(which: Which, buf: &[u8], order: &[usize], span_bytes: usize, total_bytes: usize) -> f64 {
    let t = Instant::now();
    let (mut done, mut acc) = (0usize, 0u64);
    for &off in order.iter().cycle() {
        if done >= total_bytes {
            break;
        }
        for (j, b) in buf[off..off + span_bytes]
            .chunks_exact(BLOCK_BYTES)
            .enumerate()
        {
            acc ^= block_crc(which, (off / BLOCK_BYTES + j) as u64, b);
        }
        done += span_bytes;
    }
    black_box(acc);
    done as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

fn main() {
    println!("ours: {}", logcache_io::crc32c::implementation());
    let big_bytes = 1usize << 30;
    let big = random_buffer(big_bytes);
    let seq = |span: usize, step: usize| (0..span / step).map(|i| i * step).collect::<Vec<_>>();
    let mut r = 88_172_645_463_325_252u64;
    let random_4k: Vec<usize> = (0..big_bytes / BLOCK_BYTES)
        .map(|_| {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            (r % (big_bytes / BLOCK_BYTES) as u64) as usize * BLOCK_BYTES
        })
        .collect();
    let cases: Vec<(&str, Vec<usize>, usize)> = vec![
        ("4 KiB, cache-hot (one block)", vec![0], BLOCK_BYTES),
        (
            "4 KiB, sequential over 256 MiB",
            seq(256 << 20, BLOCK_BYTES),
            BLOCK_BYTES,
        ),
        (
            "4 KiB, sequential over 1 GiB",
            seq(1 << 30, BLOCK_BYTES),
            BLOCK_BYTES,
        ),
        ("4 KiB, random over 1 GiB", random_4k, BLOCK_BYTES),
        ("1 MiB, cache-hot (one 1 MiB)", vec![0], 1 << 20),
        (
            "1 MiB, sequential over 1 GiB",
            seq(1 << 30, 1 << 20),
            1 << 20,
        ),
    ];
    for (name, order, span) in &cases {
        let mut gb_s = [vec![], vec![], vec![]];
        for _ in 0..ROUNDS {
            for (i, w) in [Which::Crate, Which::Ours, Which::Touch]
                .into_iter()
                .enumerate()
            {
                gb_s[i].push(run(w, &big, order, *span, 1 << 30));
            }
        }
        let [c, o, t] = gb_s.map(median);
        println!(
            "{name:32} crate {c:6.2} GB/s  ours {o:6.2} GB/s  ours/crate {:.2}  per 4 KiB {:.3} -> {:.3} us  read floor {t:6.2} GB/s",
            o / c,
            BLOCK_BYTES as f64 / c / 1e3,
            BLOCK_BYTES as f64 / o / 1e3
        );
    }
    drop(big);

    let Some(path) = std::env::args().nth(1) else {
        return;
    };
    // 1 MiB O_DIRECT reads at random offsets into one buffer; only the checksum is timed.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .expect("open FILE with O_DIRECT");
    let mib = file.metadata().expect("stat FILE").len() >> 20;
    assert!(mib >= 64, "FILE should be at least 64 MiB");
    // Huge pages, as the server's reply buffer for large reads.
    let buf = logcache_io::aligned::AlignedBuf::new_huge_pages(1 << 20);
    let mut gb_s = [vec![], vec![], vec![]];
    for _ in 0..ROUNDS {
        let (mut secs, mut bytes) = ([0f64; 3], [0usize; 3]);
        for i in 0..600 {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            let off = (r % mib) << 20;
            // SAFETY: `buf` is 1 MiB of writable memory for the whole call.
            let got = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    1 << 20,
                    off as i64,
                )
            };
            assert_eq!(got, 1 << 20, "short read of FILE");
            let w = [Which::Crate, Which::Ours, Which::Touch][i % 3];
            let t = Instant::now();
            black_box(run(w, &buf[..1 << 20], &[0], 1 << 20, 1 << 20));
            secs[i % 3] += t.elapsed().as_secs_f64();
            bytes[i % 3] += 1 << 20;
        }
        for k in 0..3 {
            gb_s[k].push(bytes[k] as f64 / secs[k] / 1e9);
        }
    }
    let [c, o, t] = gb_s.map(median);
    println!(
        "{:32} crate {c:6.2} GB/s  ours {o:6.2} GB/s  ours/crate {:.2}  read floor {t:6.2} GB/s",
        "1 MiB right after O_DIRECT read",
        o / c
    );
}
