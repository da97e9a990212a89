//! Promotion bookkeeping: the guard a read miss checks before caching what it read, and the
//! pause of promotions after the relocator had to move dirty blocks (the log is congested).

use std::time::{Duration, Instant};

/// Longest pause, in doublings of `OpenOptions::promote_pause_after_relocation` (10 s → 160 s).
pub const PROMOTE_PAUSE_DOUBLINGS_MAX: u32 = 4;

#[derive(Debug, Default)]
pub struct Promotion {
    /// Bumped whenever the backing device's data for some block may change or the cache stops
    /// covering a block (eviction, ranges, writes around the cache): a read miss promotes what
    /// it read only if this did not move meanwhile, so it never caches stale data.
    guard: u64,
    /// When the relocator last moved dirty blocks: promotions pause for a while after.
    relocated_at: Option<Instant>,
    /// The pause is `pause_base` doubled this many times (`note_relocation`).
    pause_doublings: u32,
    /// `OpenOptions::promote_pause_after_relocation`.
    pause_base: Duration,
}

impl Promotion {
    pub fn new(pause_base: Duration) -> Promotion {
        Promotion {
            pause_base,
            ..Promotion::default()
        }
    }

    /// The guard value a read request remembers before it reads the backing device.
    pub fn guard(&self) -> u64 {
        self.guard
    }

    /// Something happened that could make a promotion in flight stale.
    pub fn invalidate(&mut self) {
        self.guard += 1;
    }

    /// The current pause of promotions after a relocation.
    fn pause(&self) -> Duration {
        assert!(self.pause_doublings <= PROMOTE_PAUSE_DOUBLINGS_MAX);
        self.pause_base * (1u32 << self.pause_doublings)
    }

    /// Whether promotions pause: the relocator moved dirty blocks less than a pause ago. `now`
    /// is `None` in manual mode, which promises replayable runs and so reads no clock: there
    /// any pause lasts until the engine is reopened.
    pub fn congested(&self, now: Option<Instant>) -> bool {
        let pause = self.pause();
        self.relocated_at.is_some_and(|at| match now {
            None => !pause.is_zero(),
            Some(now) => now.saturating_duration_since(at) < pause,
        })
    }

    /// Records that the relocator moved dirty blocks at `now`, and adapts the pause. Promotions
    /// resuming into a log that is still congested fill it again and bring the relocator
    /// straight back: in a 10-minute 64 × 64 soak every relocated block followed a burst of
    /// promotions, 2.6 relocated per promoted, each burst a latency spike. So relocation within
    /// another pause after promotions resumed doubles the pause; a log quiet for that long
    /// resets it.
    pub fn note_relocation(&mut self, now: Instant) {
        if let Some(prev) = self.relocated_at {
            let since = now.saturating_duration_since(prev);
            self.pause_doublings = next_pause_doublings(self.pause_doublings, since, self.pause());
        }
        self.relocated_at = Some(now);
        assert!(self.pause_doublings <= PROMOTE_PAUSE_DOUBLINGS_MAX);
    }
}

/// The pause's doublings after a relocation `since` the previous one, under a pause of `pause`.
fn next_pause_doublings(doublings: u32, since: Duration, pause: Duration) -> u32 {
    if since < pause {
        // Promotions were paused: this relocation is the writers' own.
        doublings
    } else if since < pause * 2 {
        (doublings + 1).min(PROMOTE_PAUSE_DOUBLINGS_MAX)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_promotion_pause_backs_off_while_promotions_refill_the_log() {
        let pause = Duration::from_secs(10);
        // Relocations during the pause leave it alone.
        assert_eq!(next_pause_doublings(0, Duration::from_secs(3), pause), 0);
        assert_eq!(next_pause_doublings(2, Duration::from_secs(3), pause), 2);
        // Relocation soon after promotions resumed doubles it, up to the cap.
        assert_eq!(next_pause_doublings(0, Duration::from_secs(12), pause), 1);
        assert_eq!(
            next_pause_doublings(PROMOTE_PAUSE_DOUBLINGS_MAX, Duration::from_secs(12), pause),
            PROMOTE_PAUSE_DOUBLINGS_MAX
        );
        // A log quiet for another pause after promotions resumed resets it.
        assert_eq!(next_pause_doublings(3, Duration::from_secs(20), pause), 0);
    }
}
