//! The backing-device consistency check for `writeback_order = consistent`, as a function over a
//! model's flush-epoch history and a backing image, so any simulation can call it.
//!
//! The guarantee: the backing device alone holds a state a power cut could have left the disk
//! in: every write of the epochs before some flush point, with its newest data, plus a subset
//! of the writes of the next epoch, never anything no write put there. Disks tear at sector
//! granularity, so the subset is judged per sector: each sector holds either its value after
//! the earlier epochs or one of the values the next epoch wrote to it.
//!
//! Sectors are named by the write that put them there (`sector_pattern` / `identify`); `None`
//! is zeros (never written, TRIM, write-zeroes).

use std::collections::HashMap;

use super::{identify, SECTOR};

/// A sector's content: the id of the write that put it there, or `None` for zeros.
pub type SectorValue = Option<u64>;

/// The disk's history in flush epochs. Epoch 0 starts from an all-zero disk.
#[derive(Clone, Debug)]
pub struct EpochHistory {
    sectors: u64,
    /// Per epoch, its writes in order: (first sector, sector count, value).
    epochs: Vec<Vec<(u64, u64, SectorValue)>>,
    /// The disk now (after every write so far).
    current: Vec<SectorValue>,
}

impl EpochHistory {
    pub fn new(sectors: u64) -> EpochHistory {
        EpochHistory {
            sectors,
            epochs: vec![Vec::new()],
            current: vec![None; sectors as usize],
        }
    }

    /// A write (or, with `None`, zeros) of `count` sectors from `first`, in the open epoch.
    pub fn write(&mut self, first: u64, count: u64, value: SectorValue) {
        assert!(first + count <= self.sectors);
        self.epochs.last_mut().unwrap().push((first, count, value));
        for s in first..first + count {
            self.current[s as usize] = value;
        }
    }

    /// A flush point (FLUSH, or after a FUA write): later writes are the next epoch.
    pub fn flush_point(&mut self) {
        if !self.epochs.last().unwrap().is_empty() {
            self.epochs.push(Vec::new());
        }
    }

    pub fn current(&self) -> &[SectorValue] {
        &self.current
    }

    pub fn epoch_count(&self) -> usize {
        self.epochs.len()
    }

    /// After a crash the disk holds `recovered` (a crash state of this history, which the
    /// caller checks first): the open epoch's writes stay possible for the backing device (it
    /// may hold ones written back before the crash), and writes of the recovered values end it,
    /// so the history's newest state is the recovered disk. Then a flush point: the reopened
    /// cache starts a new epoch.
    pub fn after_crash(&mut self, recovered: &[SectorValue]) {
        assert_eq!(recovered.len(), self.current.len());
        for s in 0..self.sectors {
            if self.current[s as usize] != recovered[s as usize] {
                self.write(s, 1, recovered[s as usize]);
            }
        }
        self.flush_point();
    }
}

/// Names every sector of `image` (from sector `first_sector` of the disk) by the write that
/// put it there. Bytes no write put there are an error.
pub fn identify_image(image: &[u8], first_sector: u64) -> Result<Vec<SectorValue>, String> {
    image
        .chunks(SECTOR)
        .enumerate()
        .map(|(i, bytes)| {
            let s = first_sector + i as u64;
            if bytes.iter().all(|&b| b == 0) {
                return Ok(None);
            }
            identify(s, bytes)
                .map(Some)
                .ok_or_else(|| format!("sector {s} holds bytes no write put there"))
        })
        .collect()
}

/// Checks that `image` is a crash state of `h`: the disk after epochs `0..k` plus a subset of
/// epoch `k`'s writes, for some `k`. Returns the largest such `k`, or why none fits (the
/// mismatch for the `k` that came closest).
pub fn check_backing_image(h: &EpochHistory, image: &[SectorValue]) -> Result<usize, String> {
    assert_eq!(image.len() as u64, h.sectors);
    let mut base: Vec<SectorValue> = vec![None; h.sectors as usize];
    let mut best: Option<usize> = None;
    let mut closest: (usize, String) = (usize::MAX, String::new());
    for (k, epoch) in h.epochs.iter().enumerate() {
        // The values epoch k wrote, per sector.
        let mut written: HashMap<u64, Vec<SectorValue>> = HashMap::new();
        for &(first, count, v) in epoch {
            for s in first..first + count {
                written.entry(s).or_default().push(v);
            }
        }
        let bad: Vec<u64> = (0..h.sectors)
            .filter(|&s| {
                let got = image[s as usize];
                got != base[s as usize] && !written.get(&s).is_some_and(|vs| vs.contains(&got))
            })
            .collect();
        if bad.is_empty() {
            best = Some(k);
        } else if bad.len() < closest.0 {
            let s = bad[0];
            closest = (
                bad.len(),
                format!(
                    "{} sector(s) fit no crash state; closest: epoch {k} of {}, sector {s} holds {:?} but after epoch {} it held {:?} and epoch {k} wrote {:?}",
                    bad.len(),
                    h.epochs.len(),
                    image[s as usize],
                    k as i64 - 1,
                    base[s as usize],
                    written.get(&s)
                ),
            );
        }
        for &(first, count, v) in epoch {
            for s in first..first + count {
                base[s as usize] = v;
            }
        }
    }
    best.ok_or(closest.1)
}
