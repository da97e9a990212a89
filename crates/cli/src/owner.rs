//! The owner record of an NBD backing device, which no local lock reaches: `serve` stamps who
//! serves it (host, pid) and a heartbeat into the label block and clears it on a clean stop;
//! `format` (even with `--force`) and a second `serve` refuse a live owner, and `--force` says
//! what it destroys when taking over from a stopped or dead one. Layout: docs/FORMAT.md,
//! "Owner record".

use std::sync::{mpsc, Arc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use logcache_engine::format::label::{label_offset, Label};
use logcache_engine::io::BlockDevice;

/// "LCOWNER" and the record's version, 1.
const OWNER_MAGIC: u64 = u64::from_le_bytes(*b"LCOWNER\x01");
/// Where the record lives inside the 4 KiB label block: its second 512-byte sector (the label
/// itself uses bytes 0..44 of the first).
const OWNER_OFFSET_IN_LABEL_BYTES: u64 = 512;
const OWNER_SIZE_BYTES: usize = 512;
const HOST_MAX_BYTES: usize = 64;
/// How often a serving process renews its heartbeat.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);
/// A heartbeat younger than this, from another host, counts as a live owner (6 intervals:
/// room for a slow backing server and for clocks that disagree by a few seconds).
pub const LIVE_WITHIN: Duration = Duration::from_secs(30);

/// Who serves (or last served) a backing device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub host: String,
    pub pid: u32,
    /// Wall-clock milliseconds since the Unix epoch of the last heartbeat; 0: stopped cleanly.
    pub heartbeat_unix_ms: u64,
}

impl Owner {
    fn encode(&self) -> Vec<u8> {
        assert!(self.host.len() <= HOST_MAX_BYTES);
        let mut b = vec![0u8; OWNER_SIZE_BYTES];
        b[0..8].copy_from_slice(&OWNER_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.heartbeat_unix_ms.to_le_bytes());
        b[16..20].copy_from_slice(&self.pid.to_le_bytes());
        b[20..22].copy_from_slice(&(self.host.len() as u16).to_le_bytes());
        b[22..22 + self.host.len()].copy_from_slice(self.host.as_bytes());
        let crc = crc32c::crc32c(&b[..OWNER_SIZE_BYTES - 4]);
        b[OWNER_SIZE_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// None: no record (never served by a version that writes one), or a damaged one, which
    /// counts as none: the label, not this record, decides what the backing device belongs to.
    fn decode(b: &[u8]) -> Option<Owner> {
        assert_eq!(b.len(), OWNER_SIZE_BYTES);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if u64_at(0) != OWNER_MAGIC {
            return None;
        }
        let crc = u32::from_le_bytes(b[OWNER_SIZE_BYTES - 4..].try_into().expect("4 bytes"));
        if crc != crc32c::crc32c(&b[..OWNER_SIZE_BYTES - 4]) {
            return None;
        }
        let host_len = u16::from_le_bytes([b[20], b[21]]) as usize;
        if host_len > HOST_MAX_BYTES {
            return None;
        }
        Some(Owner {
            heartbeat_unix_ms: u64_at(8),
            pid: u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")),
            host: String::from_utf8_lossy(&b[22..22 + host_len]).into_owned(),
        })
    }

    /// This process, now.
    fn me() -> Owner {
        Owner {
            host: host_name(),
            pid: std::process::id(),
            heartbeat_unix_ms: now_unix_ms(),
        }
    }

    /// Whether the owner is still serving: on this host, while its process lives; elsewhere,
    /// while its heartbeat is younger than [`LIVE_WITHIN`]. Never this process itself.
    fn is_live(&self) -> bool {
        if self.heartbeat_unix_ms == 0 {
            return false;
        }
        if self.host == host_name() {
            // SAFETY: kill with signal 0 only checks that the process exists.
            return self.pid != std::process::id()
                && unsafe { libc::kill(self.pid as libc::pid_t, 0) } == 0;
        }
        self.age() < LIVE_WITHIN
    }

    fn age(&self) -> Duration {
        Duration::from_millis(now_unix_ms().saturating_sub(self.heartbeat_unix_ms))
    }

    fn describe(&self) -> String {
        if self.heartbeat_unix_ms == 0 {
            return format!("process {} on {} (stopped cleanly)", self.pid, self.host);
        }
        format!(
            "process {} on {} (last heartbeat {} s ago)",
            self.pid,
            self.host,
            self.age().as_secs()
        )
    }
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let name = if rc == 0 {
        let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown".to_string()
    };
    // Cut on a character boundary so the record holds valid UTF-8.
    let mut cut = name.len().min(HOST_MAX_BYTES);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    name[..cut].to_string()
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u64)
        .max(1)
}

/// Byte offset of the owner record on `backing`, if it is large enough to carry a label.
fn record_offset(backing: &dyn BlockDevice) -> Option<u64> {
    label_offset(backing.size_bytes()).map(|l| l + OWNER_OFFSET_IN_LABEL_BYTES)
}

/// The owner recorded on `backing` with its label, if any.
fn read_owner(backing: &dyn BlockDevice) -> Result<(Option<Owner>, Option<Label>)> {
    let Some(label_at) = label_offset(backing.size_bytes()) else {
        return Ok((None, None));
    };
    let mut block = vec![0u8; 4096];
    backing
        .read_at(&mut block, label_at)
        .with_context(|| format!("reading the label of {}", backing.describe()))?;
    let label = Label::decode(&block).ok().flatten();
    let at = OWNER_OFFSET_IN_LABEL_BYTES as usize;
    Ok((Owner::decode(&block[at..at + OWNER_SIZE_BYTES]), label))
}

/// Refuses a backing device another live process serves. With `force`, says on stderr what taking over from a stopped or dead owner destroys.
pub fn refuse_live_owner(backing: &dyn BlockDevice, spec: &str, force: bool) -> Result<()> {
    let (owner, label) = read_owner(backing)?;
    let Some(owner) = owner else {
        return Ok(());
    };
    if owner.is_live() {
        bail!(
            "backing device {spec} is being served by logcache {}; a backing device serves one cache at a time: stop it first (--force does not override this; nothing was written)",
            owner.describe()
        );
    }
    if force && label.is_some() {
        eprintln!(
            "logcache: --force: {spec} was last served by logcache {}; the cache it was formatted for can no longer be opened, and any of its data not yet written back is lost",
            owner.describe()
        );
    }
    Ok(())
}

/// The heartbeat of a served NBD backing device: stamped at start, renewed every
/// [`HEARTBEAT_INTERVAL`] by a thread of its own, and marked stopped (heartbeat 0) when
/// dropped. A failed renewal is retried at the next interval (the backing server may be away;
/// writeback reports that); a renewal stuck on a server that does not answer never delays the
/// stop by more than [`STOP_WAIT`].
pub struct Heartbeat {
    stop: Option<mpsc::Sender<()>>,
    done: mpsc::Receiver<()>,
}

/// How long a stop waits for the heartbeat thread to record the clean stop.
const STOP_WAIT: Duration = Duration::from_secs(5);

impl Heartbeat {
    /// Stamps this process as the owner (which must succeed) and starts renewing it.
    pub fn start(backing: Arc<dyn BlockDevice>) -> Result<Heartbeat> {
        let offset = record_offset(&*backing).context("the backing device has no label block")?;
        stamp(&*backing, offset, &Owner::me())?;
        let (stop, stop_rx) = mpsc::channel::<()>();
        let (done_tx, done) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("owner-heartbeat".into())
            .spawn(move || loop {
                match stop_rx.recv_timeout(HEARTBEAT_INTERVAL) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        let _ = stamp(&*backing, offset, &Owner::me());
                    }
                    Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                        let stopped = Owner {
                            heartbeat_unix_ms: 0,
                            ..Owner::me()
                        };
                        let _ = stamp(&*backing, offset, &stopped);
                        let _ = done_tx.send(());
                        return;
                    }
                }
            })
            .context("starting the owner heartbeat thread")?;
        Ok(Heartbeat {
            stop: Some(stop),
            done,
        })
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
            let _ = self.done.recv_timeout(STOP_WAIT);
        }
    }
}

fn stamp(backing: &dyn BlockDevice, offset: u64, owner: &Owner) -> Result<()> {
    backing
        .write_at(&owner.encode(), offset)
        .and_then(|()| backing.flush())
        .with_context(|| format!("recording the owner of {}", backing.describe()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_round_trips_and_damage_reads_as_none() {
        let o = Owner {
            host: "storage-7".into(),
            pid: 4242,
            heartbeat_unix_ms: 1_700_000_000_123,
        };
        let raw = o.encode();
        assert_eq!(Owner::decode(&raw), Some(o.clone()));
        let mut bad = raw.clone();
        bad[30] ^= 1;
        assert_eq!(Owner::decode(&bad), None);
        assert_eq!(Owner::decode(&[0u8; OWNER_SIZE_BYTES]), None);
    }

    #[test]
    fn liveness_by_process_here_and_by_heartbeat_elsewhere() {
        let me = Owner::me();
        assert!(!me.is_live(), "never live for itself");
        let init_here = Owner {
            pid: 1,
            ..Owner::me()
        };
        assert!(init_here.is_live(), "pid 1 lives");
        let stopped = Owner {
            heartbeat_unix_ms: 0,
            ..init_here.clone()
        };
        assert!(!stopped.is_live());
        let far = |age: Duration| Owner {
            host: format!("{}-elsewhere", host_name()),
            pid: 1,
            heartbeat_unix_ms: now_unix_ms() - age.as_millis() as u64,
        };
        assert!(far(Duration::from_secs(3)).is_live());
        assert!(!far(LIVE_WITHIN + Duration::from_secs(1)).is_live());
    }
}
