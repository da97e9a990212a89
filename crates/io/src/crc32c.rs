//! CRC32C (Castagnoli, reflected polynomial 0x82F63B78, initial and final value all ones): the
//! checksum of every block and structure on the cache device.
//!
//! Same values as the `crc32c` crate (which is the fallback); faster on CPUs with AVX-512 and
//! VPCLMULQDQ, where the data is folded 256 bytes per step with carry-less multiplications
//! instead of 8 bytes per `crc32` instruction (the instruction's 3-cycle latency bounds that
//! method to about 8 bytes per cycle even with three streams).
//!
//! The math (reflected bit order: bit `j` of a 128-bit lane holds the coefficient of
//! `x^(127-j)`, so the first message bit is the highest power):
//! - A lane `A = Q0·x^64 + Q1` (`Q0` its low, earlier quadword) moved `F` bits further into the
//!   message is `A·x^F ≡ Q0·(x^(F+64) mod P) + Q1·(x^F mod P)`: two 64×32-bit carry-less
//!   products, less than 128 bits, xored into the data found `F` bits later.
//! - `clmul(q, k)` of a reflected quadword `q` and a reflected 32-bit constant `k` in the low
//!   half, read as a reflected 128-bit lane, is `x^33·Q·K`; so the constant for a factor `x^D`
//!   is `x^(D-33) mod P`.
//! - The last 128-bit lane `A` is congruent to the message so far; its CRC register value is
//!   `A·x^32 mod P`, which is what the `crc32` instruction computes from register 0 over the
//!   lane's 16 bytes. The remaining bytes follow with the instruction, and the initial register
//!   value is xored into the first 4 bytes, as the instruction would start from it.

#[cfg(target_arch = "x86_64")]
use std::sync::atomic::{AtomicU8, Ordering};

/// CRC32C of `data`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// CRC32C of the bytes whose CRC32C is `crc` followed by `data` (`crc32c_append(crc32c(a), b)
/// == crc32c(a ++ b)`).
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if level() == LEVEL_FOLD512 {
        // SAFETY: `level` returns LEVEL_FOLD512 only when the CPU has every feature
        // `x86::append_fold512` is compiled for.
        return unsafe { x86::append_fold512(crc, data) };
    }
    crc32c::crc32c_append(crc, data)
}

/// The name of the implementation this CPU uses (for status and benchmark notes).
pub fn implementation() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if level() == LEVEL_FOLD512 {
        return "avx512-vpclmulqdq";
    }
    "crc32c-crate"
}

#[cfg(target_arch = "x86_64")]
const LEVEL_UNKNOWN: u8 = 0;
#[cfg(target_arch = "x86_64")]
const LEVEL_FALLBACK: u8 = 1;
#[cfg(target_arch = "x86_64")]
const LEVEL_FOLD512: u8 = 2;

/// The detected level, cached: `is_x86_feature_detected!` is cheap but this is one load.
#[cfg(target_arch = "x86_64")]
static LEVEL: AtomicU8 = AtomicU8::new(LEVEL_UNKNOWN);

#[cfg(target_arch = "x86_64")]
#[inline]
fn level() -> u8 {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != LEVEL_UNKNOWN {
        return l;
    }
    let l = if x86::fold512_supported() {
        LEVEL_FOLD512
    } else {
        LEVEL_FALLBACK
    };
    LEVEL.store(l, Ordering::Relaxed);
    l
}

/// `x^n mod P` in reflected form (bit `t` holds the coefficient of `x^(31-t)`).
const fn x_pow_mod(n: u32) -> u32 {
    let mut v: u32 = 1 << 31; // x^0
    let mut i = 0;
    while i < n {
        // Multiplying by x shifts towards bit 0; x^32 wraps to P's lower terms.
        v = if v & 1 != 0 {
            (v >> 1) ^ 0x82F6_3B78
        } else {
            v >> 1
        };
        i += 1;
    }
    v
}

/// The two fold constants of a 128-bit lane moved `f_bits` further: (for the low quadword,
/// for the high quadword).
const fn fold_constants(f_bits: u32) -> (u64, u64) {
    (
        x_pow_mod(f_bits + 64 - 33) as u64,
        x_pow_mod(f_bits - 33) as u64,
    )
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::fold_constants;
    use std::arch::x86_64::*;

    /// Below this many bytes the plain instruction loop is as fast as setting up the fold.
    const FOLD_MIN_BYTES: usize = 256;

    pub(crate) fn fold512_supported() -> bool {
        is_x86_feature_detected!("sse4.2")
            && is_x86_feature_detected!("pclmulqdq")
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("vpclmulqdq")
    }

    /// The register loop: 8 bytes per `crc32` instruction, then single bytes. `reg` is the raw
    /// register (already inverted).
    #[target_feature(enable = "sse4.2")]
    fn crc32_bytes(mut reg: u32, data: &[u8]) -> u32 {
        let mut words = data.chunks_exact(8);
        let mut r = reg as u64;
        for w in &mut words {
            r = _mm_crc32_u64(r, u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        reg = r as u32;
        for &b in words.remainder() {
            reg = _mm_crc32_u8(reg, b);
        }
        reg
    }

    // Evaluated at compile time (a `const fn` called at run time would loop each call).
    const K128: (u64, u64) = fold_constants(128);
    const K256: (u64, u64) = fold_constants(256);
    const K384: (u64, u64) = fold_constants(384);
    const K512: (u64, u64) = fold_constants(512);
    const K2048: (u64, u64) = fold_constants(2048);

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn constants512((lo, hi): (u64, u64)) -> __m512i {
        _mm512_broadcast_i32x4(_mm_set_epi64x(hi as i64, lo as i64))
    }

    /// Every 128-bit lane of `acc` moved by the constants' distance, xored into `data`.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold512(acc: __m512i, k: __m512i, data: __m512i) -> __m512i {
        let lo = _mm512_clmulepi64_epi128(acc, k, 0x00);
        let hi = _mm512_clmulepi64_epi128(acc, k, 0x11);
        _mm512_ternarylogic_epi64(lo, hi, data, 0x96) // lo ^ hi ^ data
    }

    #[inline]
    #[target_feature(enable = "pclmulqdq")]
    fn fold128(acc: __m128i, k: __m128i, data: __m128i) -> __m128i {
        let lo = _mm_clmulepi64_si128(acc, k, 0x00);
        let hi = _mm_clmulepi64_si128(acc, k, 0x11);
        _mm_xor_si128(_mm_xor_si128(lo, hi), data)
    }

    /// # Safety
    /// The CPU must have sse4.2, pclmulqdq, avx512f and vpclmulqdq (`fold512_supported`).
    #[target_feature(enable = "sse4.2,pclmulqdq,avx512f,vpclmulqdq")]
    pub(crate) unsafe fn append_fold512(crc: u32, data: &[u8]) -> u32 {
        if data.len() < FOLD_MIN_BYTES {
            return !crc32_bytes(!crc, data);
        }
        let load = |at: usize| -> __m512i {
            let b = &data[at..at + 64];
            // SAFETY: `b` is 64 readable bytes; the load has no alignment requirement.
            unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
        };

        // Four accumulators of four lanes each take 256 bytes per step, so a lane moves
        // 2048 bits; four independent chains hide the multiply's latency.
        let reg = _mm512_zextsi128_si512(_mm_cvtsi32_si128(!crc as i32));
        let mut z0 = _mm512_xor_si512(load(0), reg);
        let mut z1 = load(64);
        let mut z2 = load(128);
        let mut z3 = load(192);
        let mut at = 256;
        let k2048 = constants512(K2048);
        while data.len() - at >= 256 {
            z0 = fold512(z0, k2048, load(at));
            z1 = fold512(z1, k2048, load(at + 64));
            z2 = fold512(z2, k2048, load(at + 128));
            z3 = fold512(z3, k2048, load(at + 192));
            at += 256;
        }
        let k512 = constants512(K512);
        let mut z = fold512(z0, k512, z1);
        z = fold512(z, k512, z2);
        z = fold512(z, k512, z3);
        while data.len() - at >= 64 {
            z = fold512(z, k512, load(at));
            at += 64;
        }

        // The four lanes into one: lane i moves (3 - i) * 128 bits; lane 3 stays.
        let (l0, h0) = K384;
        let (l1, h1) = K256;
        let (l2, h2) = K128;
        let k_lanes = _mm512_set_epi64(
            0, 0, h2 as i64, l2 as i64, h1 as i64, l1 as i64, h0 as i64, l0 as i64,
        );
        let lo = _mm512_clmulepi64_epi128(z, k_lanes, 0x00);
        let hi = _mm512_clmulepi64_epi128(z, k_lanes, 0x11);
        let last_lane = _mm512_maskz_mov_epi64(0b1100_0000, z);
        let t = _mm512_ternarylogic_epi64(lo, hi, last_lane, 0x96);
        let mut a = _mm_xor_si128(
            _mm_xor_si128(
                _mm512_extracti32x4_epi32::<0>(t),
                _mm512_extracti32x4_epi32::<1>(t),
            ),
            _mm_xor_si128(
                _mm512_extracti32x4_epi32::<2>(t),
                _mm512_extracti32x4_epi32::<3>(t),
            ),
        );

        let (l, h) = K128;
        let k128 = _mm_set_epi64x(h as i64, l as i64);
        while data.len() - at >= 16 {
            let b = &data[at..at + 16];
            // SAFETY: `b` is 16 readable bytes; the load has no alignment requirement.
            let d = unsafe { _mm_loadu_si128(b.as_ptr().cast()) };
            a = fold128(a, k128, d);
            at += 16;
        }

        let r = _mm_crc32_u64(0, _mm_cvtsi128_si64(a) as u64);
        let r = _mm_crc32_u64(r, _mm_extract_epi64::<1>(a) as u64) as u32;
        !crc32_bytes(r, &data[at..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (tests must replay).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut rng = Rng(seed | 1);
        (0..len).map(|_| rng.next() as u8).collect()
    }

    #[test]
    fn known_vectors() {
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        // RFC 3720 (iSCSI), B.4: 32 bytes of zeros, of ones, ascending, descending.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        let up: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&up), 0x46DD_794E);
        let down: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c(&down), 0x113F_DB5C);
        // A 4 KiB block of zeros goes through the fold, and so does a 1 MiB one.
        assert_eq!(crc32c(&vec![0u8; 4096]), crc32c::crc32c(&vec![0u8; 4096]));
        assert_eq!(crc32c(&vec![0u8; 4096]), 0x98F9_4189);
    }

    #[test]
    fn x_pow_mod_is_the_crc_of_a_single_one_bit() {
        // By linearity the start and end inversions cancel between two messages of one length:
        // crc(m1) ^ crc(m2) = (M1 + M2)·x^32 mod P. A message whose only set bit is its first
        // (the highest power, x^(8·len - 1)) against zeros gives x^(8·len + 31) mod P.
        for len in 1..600usize {
            let mut m = vec![0u8; len];
            m[0] = 1;
            let diff = crc32c::crc32c(&m) ^ crc32c::crc32c(&vec![0u8; len]);
            assert_eq!(diff, x_pow_mod(8 * len as u32 + 31), "{len} bytes");
        }
    }

    #[test]
    fn every_length_up_to_1024_matches_the_crate() {
        let data = random_bytes(1024 + 64, 7);
        for len in 0..=1024 {
            for start in [0, 1, 3, 8, 13] {
                let b = &data[start..start + len];
                assert_eq!(crc32c(b), crc32c::crc32c(b), "len {len} start {start}");
            }
        }
    }

    #[test]
    fn random_lengths_and_alignments_match_the_crate() {
        let data = random_bytes(70_000 + 64, 11);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..2_000 {
            let len = rng.below(70_000);
            let start = rng.below(64);
            let prev = rng.next() as u32;
            let b = &data[start..start + len];
            assert_eq!(crc32c(b), crc32c::crc32c(b), "len {len} start {start}");
            assert_eq!(
                crc32c_append(prev, b),
                crc32c::crc32c_append(prev, b),
                "len {len} start {start} prev {prev:#x}"
            );
        }
    }

    #[test]
    fn append_at_any_split_equals_the_whole() {
        let data = random_bytes(9_000, 3);
        let whole = crc32c::crc32c(&data);
        for split in (0..data.len())
            .step_by(97)
            .chain([0, 16, 255, 256, 4096, 8999, 9000])
        {
            let (a, b) = data.split_at(split);
            assert_eq!(crc32c_append(crc32c(a), b), whole, "split {split}");
        }
    }

    #[test]
    fn the_fold_itself_matches_when_the_cpu_has_it() {
        #[cfg(target_arch = "x86_64")]
        if x86::fold512_supported() {
            assert_eq!(implementation(), "avx512-vpclmulqdq");
            let data = random_bytes(20_000, 5);
            for len in (0..20_000)
                .step_by(61)
                .chain([256, 257, 4096, 4096 + 16, 20_000])
            {
                // SAFETY: the CPU has the features (checked above).
                let ours = unsafe { x86::append_fold512(0x1234_5678, &data[..len]) };
                assert_eq!(
                    ours,
                    crc32c::crc32c_append(0x1234_5678, &data[..len]),
                    "len {len}"
                );
            }
            return;
        }
        eprintln!(
            "this CPU uses {}; the fold is not tested here",
            implementation()
        );
    }
}
