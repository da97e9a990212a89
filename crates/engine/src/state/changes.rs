//! What changed since each checkpoint, in memory: one bit per 4 KiB disk block per checkpoint,
//! set under the state lock by every change the log records (a write, a zero range, a drop
//! range), and by recovery for every change entry of the log after the checkpoint's start.
//!
//! Bits are grouped in pages of `BLOCKS_PER_PAGE` blocks, the unit written to the cache device
//! (`bitmaps::fold`); a page set since it was last written is dirty, and remembers the log
//! sequence of the oldest change that dirtied it. It must be written only once that change is
//! about to leave the log (the log is the change record until then), so a page is written about
//! once per lap of the log, not at every reclaim. Bits only ever get set while a checkpoint
//! lives: a bitmap is a superset of the changes, never a subset.

use crate::format::checkpoints::{BLOCKS_PER_PAGE, PAGE_WORDS};

/// One checkpoint's bitmap and identity.
#[derive(Debug)]
pub struct Tracked {
    /// Its slot in the table and in the bitmap area.
    pub slot: u32,
    pub serial: u64,
    pub name: String,
    pub start_seq: u64,
    pub created_unix_ms: u64,
    /// `pages * PAGE_WORDS` words; bit i of word w of page p is block p*BLOCKS_PER_PAGE + 64w + i.
    words: Vec<u64>,
    /// Per page: the log sequence of the oldest change set since the page was last written
    /// (`CLEAN` when none). The page must be written before the head passes it.
    page_due_seq: Vec<u64>,
    /// Generation of the page copy last written (or loaded); the next write goes to the other copy.
    page_generation: Vec<u64>,
    set_bits: u64,
}

/// `page_due_seq` of a page with nothing unwritten.
const CLEAN: u64 = u64::MAX;

/// A page to write: which, and the generation its write gets. Its bits are copied later, one
/// page per lock hold (`Changes::copy_page`).
#[derive(Clone, Copy, Debug)]
pub struct PageWrite {
    pub slot: u32,
    pub serial: u64,
    pub page: u32,
    pub generation: u64,
}

impl Tracked {
    /// A checkpoint with no bit set; `page_generation` as written by `bitmaps::init_pages`.
    pub fn new(
        slot: u32,
        serial: u64,
        name: String,
        start_seq: u64,
        created_unix_ms: u64,
        pages: u32,
        page_generation: u64,
    ) -> Tracked {
        Tracked {
            slot,
            serial,
            name,
            start_seq,
            created_unix_ms,
            words: vec![0; pages as usize * PAGE_WORDS],
            page_due_seq: vec![CLEAN; pages as usize],
            page_generation: vec![page_generation; pages as usize],
            set_bits: 0,
        }
    }

    pub fn pages(&self) -> u32 {
        self.page_due_seq.len() as u32
    }

    /// Loads page `page` as read from the device (`None`: no valid copy, all ones, due at
    /// once so the next fold writes it back valid).
    pub fn load_page(&mut self, page: u32, loaded: Option<(&[u64], u64)>) {
        let p = page as usize;
        let dst = &mut self.words[p * PAGE_WORDS..(p + 1) * PAGE_WORDS];
        let before: u64 = dst.iter().map(|w| w.count_ones() as u64).sum();
        match loaded {
            Some((words, generation)) => {
                dst.copy_from_slice(words);
                self.page_generation[p] = generation;
            }
            None => {
                dst.fill(u64::MAX);
                self.page_generation[p] = 0;
                self.page_due_seq[p] = 0;
            }
        }
        let after: u64 = dst.iter().map(|w| w.count_ones() as u64).sum();
        self.set_bits = self.set_bits + after - before;
    }

    /// Sets the bits of blocks `[lba, lba + count)` (clipped to the bitmap), changed by the log
    /// chunk of sequence `seq` (or a later one: an earlier `seq` only makes the page due sooner).
    #[inline]
    pub fn mark(&mut self, lba: u64, count: u64, seq: u64) {
        let end = (lba + count).min(self.pages() as u64 * BLOCKS_PER_PAGE);
        let mut b = lba;
        while b < end {
            let (page, in_page) = (b / BLOCKS_PER_PAGE, b % BLOCKS_PER_PAGE);
            let (word, bit) = (in_page / 64, in_page % 64);
            // Pages hold whole words (BLOCKS_PER_PAGE is a multiple of 64): no word spans two.
            let n = (64 - bit).min(end - b);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << bit
            };
            let i = page as usize * PAGE_WORDS + word as usize;
            let old = self.words[i];
            let new = old | mask;
            if new != old {
                self.words[i] = new;
                self.set_bits += (new.count_ones() - old.count_ones()) as u64;
                let due = &mut self.page_due_seq[page as usize];
                *due = (*due).min(seq);
            }
            b += n;
        }
    }

    pub fn is_set(&self, lba: u64) -> bool {
        let (page, in_page) = (lba / BLOCKS_PER_PAGE, lba % BLOCKS_PER_PAGE);
        if page >= self.pages() as u64 {
            return false;
        }
        let w = self.words[page as usize * PAGE_WORDS + (in_page / 64) as usize];
        w & (1 << (in_page % 64)) != 0
    }

    /// Blocks whose bit is set.
    pub fn set_blocks(&self) -> u64 {
        self.set_bits
    }

    /// Blocks the bitmap covers (whole pages: may pass the disk's end, whose bits stay clear).
    pub fn blocks(&self) -> u64 {
        self.pages() as u64 * BLOCKS_PER_PAGE
    }

    /// From `lba` (below `end`): whether it is set, and how many blocks from it share that
    /// (blocks past the bitmap read as clear). Walks whole words: a 1 TiB disk's unchanged
    /// bitmap is 4 Mi words, not 256 Mi bits.
    pub fn run_at(&self, lba: u64, end: u64) -> (bool, u64) {
        assert!(lba < end, "empty run query");
        let limit = end.min(self.blocks());
        if lba >= limit {
            return (false, end - lba);
        }
        let set = self.is_set(lba);
        // Pages hold whole words, so block b is bit b % 64 of word b / 64 of `words`.
        let mut b = lba;
        while b < limit {
            let w = self.words[(b / 64) as usize];
            // Ones where a block differs from `set`, from bit b % 64 up.
            let differs = if set { !w } else { w } >> (b % 64);
            if differs != 0 {
                b += differs.trailing_zeros() as u64;
                break;
            }
            b = (b / 64 + 1) * 64;
        }
        let run_end = match b.min(limit) {
            // A clear run reaching the bitmap's end goes on to `end`.
            e if e == limit && !set => end,
            e => e,
        };
        debug_assert!(run_end > lba && run_end <= end);
        (set, run_end - lba)
    }

    /// Every run of set blocks, as (first block, count), in order.
    pub fn set_runs(&self) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        let blocks = self.blocks();
        let mut b = 0;
        while b < blocks {
            let (set, n) = self.run_at(b, blocks);
            if set {
                runs.push((b, n));
            }
            b += n;
        }
        runs
    }

    /// The pages holding a change of a chunk before `head_seq` (about to leave the log) not
    /// yet written, with the generation each write gets; they count as written from now on (a
    /// failed write fails the engine). A bit set after this dirties its page again, so a later
    /// fold writes it even if this fold's copy already holds it.
    pub fn take_due(&mut self, head_seq: u64, out: &mut Vec<PageWrite>) {
        for p in 0..self.page_due_seq.len() {
            if self.page_due_seq[p] >= head_seq {
                continue;
            }
            self.page_due_seq[p] = CLEAN;
            self.page_generation[p] += 1;
            out.push(PageWrite {
                slot: self.slot,
                serial: self.serial,
                page: p as u32,
                generation: self.page_generation[p],
            });
        }
    }
}

/// Every live checkpoint's bitmap.
#[derive(Debug, Default)]
pub struct Changes {
    pub tracked: Vec<Tracked>,
}

impl Changes {
    /// Blocks `[lba, lba + count)` changed, logged in chunk `seq`: every checkpoint's bits.
    /// The cost with no checkpoint is one branch.
    #[inline]
    pub fn mark(&mut self, lba: u64, count: u64, seq: u64) {
        for t in &mut self.tracked {
            t.mark(lba, count, seq);
        }
    }

    pub fn get(&self, name: &str) -> Option<&Tracked> {
        self.tracked.iter().find(|t| t.name == name)
    }

    /// Every checkpoint's pages due before the head moves to `head_seq` (`Tracked::take_due`).
    pub fn take_due(&mut self, head_seq: u64) -> Vec<PageWrite> {
        let mut out = Vec::new();
        for t in &mut self.tracked {
            t.take_due(head_seq, &mut out);
        }
        out
    }

    /// Copies the bits of page `p` into `out` (`PAGE_WORDS` words). The checkpoint must still
    /// live: the fold holds the table lock, which create and delete take too.
    pub fn copy_page(&self, p: &PageWrite, out: &mut [u64]) {
        let t = self
            .tracked
            .iter()
            .find(|t| t.slot == p.slot)
            .expect("a folded page's checkpoint lives while the table lock is held");
        assert_eq!(
            t.serial, p.serial,
            "slot {} changed hands during a fold",
            p.slot
        );
        let at = p.page as usize * PAGE_WORDS;
        out.copy_from_slice(&t.words[at..at + PAGE_WORDS]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logcache_testkit::rng::{seed_from_env, Rng};

    /// The bit-by-bit answer `run_at` had before it walked words: the reference.
    fn run_at_by_bits(t: &Tracked, lba: u64, end: u64) -> (bool, u64) {
        let set = t.is_set(lba);
        let mut b = lba + 1;
        while b < end && t.is_set(b) == set {
            b += 1;
        }
        (set, b - lba)
    }

    fn set_runs_by_bits(t: &Tracked) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for b in (0..t.blocks()).filter(|&b| t.is_set(b)) {
            match runs.last_mut() {
                Some(last) if last.0 + last.1 == b => last.1 += 1,
                _ => runs.push((b, 1)),
            }
        }
        runs
    }

    /// A bitmap of `pages` pages marked at random: sparse single blocks, runs across word and
    /// page boundaries, and (sometimes) whole-word and page-sized stretches.
    fn random_bitmap(rng: &mut Rng, pages: u32) -> Tracked {
        let mut t = Tracked::new(0, 1, "r".into(), 1, 0, pages, 1);
        let blocks = t.blocks();
        let density = rng.range(0, 3);
        for _ in 0..rng.range(0, 40 * (density + 1)) {
            let count = match rng.below(4) {
                0 => 1,
                1 => rng.range(1, 130),
                2 => rng.range(60, 70),
                _ => rng.range(1, 2 * BLOCKS_PER_PAGE),
            };
            t.mark(rng.below(blocks), count, 1);
        }
        t
    }

    #[test]
    fn word_walks_agree_with_the_bit_by_bit_answer_on_random_bitmaps() {
        let seed = seed_from_env("LOGCACHE_BITMAP_SEED");
        let mut rng = Rng::new(seed);
        for case in 0..60 {
            let pages = rng.range(1, 3) as u32;
            let t = random_bitmap(&mut rng, pages);
            let ctx = format!("seed {seed} (LOGCACHE_BITMAP_SEED) case {case}");
            assert_eq!(t.set_runs(), set_runs_by_bits(&t), "{ctx}");
            let covered: u64 = t.set_runs().iter().map(|r| r.1).sum();
            assert_eq!(covered, t.set_blocks(), "{ctx}");
            for _ in 0..200 {
                // Ends up to a page past the bitmap: those blocks read as clear.
                let lba = rng.below(t.blocks() + BLOCKS_PER_PAGE);
                let span = rng.range(1, 3 * BLOCKS_PER_PAGE);
                let end = lba + span;
                assert_eq!(
                    t.run_at(lba, end),
                    run_at_by_bits(&t, lba, end),
                    "{ctx}: run_at({lba}, {end})"
                );
            }
        }
    }

    #[test]
    fn marks_count_once_and_dirty_their_page() {
        let mut t = Tracked::new(0, 1, "a".into(), 5, 0, 3, 1);
        t.mark(10, 1, 7);
        t.mark(10, 1, 7);
        assert_eq!(t.set_blocks(), 1);
        t.mark(60, 10, 7); // across a word boundary
        assert_eq!(t.set_blocks(), 11);
        t.mark(BLOCKS_PER_PAGE - 2, 4, 8); // across a page boundary
        assert_eq!(t.set_blocks(), 15);
        assert!(t.is_set(BLOCKS_PER_PAGE + 1) && !t.is_set(BLOCKS_PER_PAGE + 2));
        t.mark(3 * BLOCKS_PER_PAGE - 1, 100, 9); // clipped at the end
        assert_eq!(t.set_blocks(), 16);
        let pages = |w: &[PageWrite]| w.iter().map(|p| p.page).collect::<Vec<_>>();
        // Page 0's oldest change is in chunk 7, page 1's in 8, page 2's in 9: each is due once
        // the head passes that chunk, not before.
        let mut w = Vec::new();
        t.take_due(7, &mut w);
        assert!(w.is_empty());
        t.take_due(9, &mut w);
        assert_eq!(pages(&w), vec![0, 1]);
        assert!(w.iter().all(|p| p.generation == 2));
        // A change after the take makes page 0 due again from its own chunk on.
        t.mark(11, 1, 12);
        let mut again = Vec::new();
        t.take_due(12, &mut again);
        assert_eq!(pages(&again), vec![2]);
        again.clear();
        t.take_due(u64::MAX, &mut again);
        assert_eq!(pages(&again), vec![0]);
        assert_eq!(again[0].generation, 3);
        again.clear();
        t.take_due(u64::MAX, &mut again);
        assert!(again.is_empty());
        assert_eq!(t.run_at(60, 100), (true, 10));
        assert_eq!(t.run_at(70, 100), (false, 30));
    }

    #[test]
    fn a_page_without_a_valid_copy_reads_all_ones() {
        let mut t = Tracked::new(0, 1, "a".into(), 5, 0, 2, 1);
        t.mark(0, 1, 3);
        t.load_page(1, None);
        let mut w = Vec::new();
        t.take_due(1, &mut w);
        assert_eq!(w.iter().map(|p| p.page).collect::<Vec<_>>(), vec![1]);
        assert_eq!(t.set_blocks(), 1 + BLOCKS_PER_PAGE);
        let words = vec![0u64; PAGE_WORDS];
        t.load_page(1, Some((&words, 7)));
        assert_eq!(t.set_blocks(), 1);
    }
}
