//! The reader's adaptive spin: before it sleeps in `recv` for a client that has every reply
//! (nothing buffered, nothing on a worker: a client at iodepth 1), the reader polls its socket
//! without blocking for up to `READER_SPIN_BUDGET`, so the client's next request finds it
//! awake. On this project's VMs a sleeping reader is a halted vCPU, and the client's `send`
//! then pays an IPI to wake it and the reader a wake-up from halt (docs/BENCHMARKS.md,
//! "Placement at iodepth 1").
//!
//! Spinning only pays while requests keep arriving within the budget; when they do not (an
//! idle or throttled client, or a loaded machine where the client waits for a CPU, perhaps
//! the one the spin holds) it costs a CPU for nothing. So the reader spins only while spins
//! recently succeeded (`SpinPolicy`): `SPIN_ON_MIN_HITS` of the last `SPIN_HISTORY` spins
//! found a request in time; otherwise it sleeps at once and tries a single spin again after
//! 2, 4, ... up to `SPIN_PROBE_MAX_WAITS` waits, and turns spinning back on after
//! `SPIN_PROBE_HITS_TO_RESUME` probes in a row succeed. A spin during which another task took
//! the reader's CPU counts as a miss even if the request came (the client on the same CPU, which
//! a spin only delays, or another tenant's task: the CPU is contended), as does one whose
//! request came after the budget. Between polls the reader yields its CPU (`spin_receive`).
//! Measured (docs/BENCHMARKS.md, "The reader's adaptive spin" and "... on the quiet machine"):
//! 4 KiB cached reads at iodepth 1 on a quiet machine, 2.61× not spinning with server and
//! client on two vCPUs, 2.18× unpinned, level on one vCPU; at load 5–12, 1.06 / 0.95 / 1.01.

use std::io;
use std::time::{Duration, Instant};

use crate::input::InputBuffer;
use crate::stream::Stream;

/// The longest one spin polls before the reader sleeps: longer than a client's turnaround on
/// another vCPU (fio's nbd engine: ~40-50 µs of its CPU per request there). 100 µs measured
/// 0.73 of 50 µs (server and fio on two vCPUs, load ~7): the longer spins missed more.
pub(crate) const READER_SPIN_BUDGET: Duration = Duration::from_micros(50);

/// Spins remembered (bits of `SpinPolicy::history`).
const SPIN_HISTORY: u32 = 16;
/// Hits among the last `SPIN_HISTORY` spins needed to go on spinning: most of them.
const SPIN_ON_MIN_HITS: u32 = 9;
/// Probes in a row that must hit before spinning resumes.
const SPIN_PROBE_HITS_TO_RESUME: u32 = 2;
/// The most waits between two probes while spinning is off.
const SPIN_PROBE_MAX_WAITS: u32 = 1024;
const _: () = assert!(SPIN_HISTORY == u16::BITS && SPIN_ON_MIN_HITS > SPIN_HISTORY / 2);

/// Whether the reader spins before its next wait, learnt from how its spins went.
#[derive(Debug, Clone)]
pub(crate) struct SpinPolicy {
    /// Spinning at every wait (else only probes).
    on: bool,
    /// The last `SPIN_HISTORY` spins' outcomes while on, newest in bit 0 (1: a hit).
    history: u16,
    /// While off: waits left before the next probe, the gap after a missed probe, and the
    /// probes that hit in a row.
    waits_to_probe: u32,
    probe_gap_waits: u32,
    probe_hits: u32,
}

impl Default for SpinPolicy {
    /// Off, probing at the first wait: a connection earns its spinning.
    fn default() -> SpinPolicy {
        SpinPolicy {
            on: false,
            history: 0,
            waits_to_probe: 0,
            probe_gap_waits: 1,
            probe_hits: 0,
        }
    }
}

impl SpinPolicy {
    /// Whether to spin before this wait (each wait asks once, spun or not).
    pub(crate) fn should_spin(&mut self) -> bool {
        if self.on {
            return true;
        }
        if self.waits_to_probe == 0 {
            return true;
        }
        self.waits_to_probe -= 1;
        false
    }

    /// How the spin went: `hit` when the request arrived within the budget.
    pub(crate) fn record(&mut self, hit: bool) {
        if self.on {
            self.history = (self.history << 1) | u16::from(hit);
            if self.history.count_ones() < SPIN_ON_MIN_HITS {
                self.on = false;
                self.probe_hits = 0;
                self.probe_gap_waits = 2;
                self.waits_to_probe = self.probe_gap_waits;
            }
            return;
        }
        if hit {
            self.probe_hits += 1;
            self.waits_to_probe = 0;
            if self.probe_hits >= SPIN_PROBE_HITS_TO_RESUME {
                self.on = true;
                // A full record of hits: it takes `SPIN_HISTORY - SPIN_ON_MIN_HITS + 1` misses
                // among the next spins to stop again.
                self.history = u16::MAX;
            }
        } else {
            self.probe_hits = 0;
            self.probe_gap_waits = (self.probe_gap_waits * 2).min(SPIN_PROBE_MAX_WAITS);
            self.waits_to_probe = self.probe_gap_waits;
        }
    }

    #[cfg(test)]
    fn is_on(&self) -> bool {
        self.on
    }
}

/// What one spin found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spun {
    /// Bytes arrived (into the buffer); `in_time` when within the budget.
    Received { in_time: bool },
    /// The client closed its side.
    Closed,
    /// Nothing arrived within the budget.
    Nothing,
}

/// Polls `stream` into `input` without blocking until bytes arrive, the stream ends, it fails,
/// or `budget` has passed. Between polls it yields the CPU: a task waiting for this CPU (the
/// client itself, when both share one) runs at once, rather than after the spin or on the
/// other CPU (an idle CPU takes a task that waits, and the spin would then keep the two
/// apart: unpinned at iodepth 1, polling without yielding measured 0.70 of not polling).
pub(crate) fn spin_receive(
    input: &mut InputBuffer,
    stream: &Stream,
    budget: Duration,
) -> io::Result<Spun> {
    let start = Instant::now();
    // Read once the first poll finds nothing: before it no other task can have run.
    let mut preempted_before = None;
    loop {
        match input.fill(stream, true) {
            Ok(0) => return Ok(Spun::Closed),
            Ok(_) => {
                // Another task took this CPU while we polled (the client on the same CPU, or
                // anyone else's): not a hit, spinning did not get the request sooner.
                let alone = preempted_before.is_none_or(|before| involuntary_switches() == before);
                let in_time = alone && start.elapsed() <= budget;
                return Ok(Spun::Received { in_time });
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
        if preempted_before.is_none() {
            preempted_before = Some(involuntary_switches());
        }
        if start.elapsed() >= budget {
            return Ok(Spun::Nothing);
        }
        // SAFETY: no arguments; it gives up the CPU only if another task wants it.
        unsafe { libc::sched_yield() };
    }
}

/// This thread's involuntary context switches so far (a task preempted it); 0 where the
/// kernel does not say, so then no spin counts as preempted.
fn involuntary_switches() -> i64 {
    // SAFETY: `getrusage` writes a `rusage` into the zeroed value it is given.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_THREAD, &mut usage) != 0 {
            return 0;
        }
        usage.ru_nivcsw
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// Asks and records `n` waits with the same outcome; returns how many spun.
    fn waits(policy: &mut SpinPolicy, n: u32, hit: bool) -> u32 {
        let mut spun = 0;
        for _ in 0..n {
            if policy.should_spin() {
                policy.record(hit);
                spun += 1;
            }
        }
        spun
    }

    #[test]
    fn spins_only_after_probes_hit_and_stops_after_misses() {
        let mut policy = SpinPolicy::default();
        assert!(!policy.is_on());
        // Probes at consecutive waits while they hit; on after `SPIN_PROBE_HITS_TO_RESUME`.
        assert_eq!(waits(&mut policy, SPIN_PROBE_HITS_TO_RESUME, true), 2);
        assert!(policy.is_on());
        assert_eq!(waits(&mut policy, 100, true), 100);
        // On while most of the last 16 hit (9 or more): the 8th miss turns it off.
        assert_eq!(waits(&mut policy, 7, false), 7);
        assert!(policy.is_on());
        assert_eq!(waits(&mut policy, 1, false), 1);
        assert!(!policy.is_on());
        // Off, it skips waits before probing again.
        assert_eq!(waits(&mut policy, 2, true), 0);
        assert_eq!(waits(&mut policy, 2, true), 2);
        assert!(policy.is_on());
    }

    #[test]
    fn a_mostly_hitting_client_keeps_it_on() {
        let mut policy = SpinPolicy::default();
        waits(&mut policy, SPIN_PROBE_HITS_TO_RESUME, true);
        // One miss in four (a client that sometimes waits for a CPU) keeps it on throughout.
        for i in 0..1_000u32 {
            assert!(policy.should_spin(), "off at spin {i}");
            policy.record(i % 4 != 0);
        }
    }

    #[test]
    fn an_idle_or_slow_client_gets_ever_rarer_probes() {
        let mut policy = SpinPolicy::default();
        // Every spin misses: probes at waits 1, 3, 7, ... (gaps doubling up to the cap).
        let spun = waits(&mut policy, 10_000, false);
        assert!(!policy.is_on());
        assert!(spun <= 25, "{spun} probes in 10,000 waits");
        // Capped gaps: it keeps probing, so a client that speeds up is noticed.
        let spun = waits(&mut policy, 10 * SPIN_PROBE_MAX_WAITS, false);
        assert!((9..=11).contains(&spun), "{spun} probes");
        // And once probes hit again, it resumes within a few probe gaps.
        let mut waits_to_on = 0;
        while !policy.is_on() {
            waits(&mut policy, 1, true);
            waits_to_on += 1;
        }
        assert!(waits_to_on <= SPIN_PROBE_MAX_WAITS + SPIN_PROBE_HITS_TO_RESUME);
    }

    #[test]
    fn mixed_outcomes_below_the_bar_keep_it_mostly_off() {
        let mut policy = SpinPolicy::default();
        let mut spun = 0;
        // Every other wait's spin would hit: a probe that hits is followed by one that
        // misses, never two hits in a row, so never on.
        for i in 0..10_000u32 {
            if policy.should_spin() {
                policy.record(i % 2 == 0);
                spun += 1;
            }
        }
        assert!(!policy.is_on());
        assert!(spun < 100, "{spun} spins in 10,000 waits");
    }

    #[test]
    fn a_spin_receives_what_is_sent_reports_nothing_and_sees_the_end() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = (Stream::from(a), Stream::from(b));
        let mut input = InputBuffer::new(64);
        let budget = Duration::from_micros(10);
        assert_eq!(spin_receive(&mut input, &b, budget).unwrap(), Spun::Nothing);
        a.send_all(b"request").unwrap();
        assert!(matches!(
            spin_receive(&mut input, &b, Duration::from_secs(60)).unwrap(),
            Spun::Received { .. }
        ));
        assert_eq!(input.buffered(), b"request");
        drop(a);
        assert_eq!(
            spin_receive(&mut input, &b, Duration::from_secs(60)).unwrap(),
            Spun::Closed
        );
    }
}
