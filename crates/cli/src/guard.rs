//! Refusals made before anything is written: the cache and the backing device must be two
//! different devices, told by identity (device and inode of a file, major:minor of a block
//! device, partitions of one disk that overlap, a loop device over the other file, a file on a
//! filesystem on the other device), never by name; and the process holding a lock is named.

use std::fs::{self, File, Metadata};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use logcache_nbd::uri::is_nbd_uri;

/// Refuses a cache and a backing SPEC that are the same storage. An NBD backing is remote:
/// nothing local tells what it serves, so it passes (its label still names its cache).
/// Paths that do not exist pass too: opening them says so.
pub fn refuse_same_device(cache: &Path, backing: &str) -> Result<()> {
    if is_nbd_uri(backing) || backing.contains("://") {
        return Ok(());
    }
    let backing = Path::new(backing);
    let (Ok(c), Ok(b)) = (fs::metadata(cache), fs::metadata(backing)) else {
        return Ok(());
    };
    let (cn, bn) = (cache.display(), backing.display());
    let what = "one command would destroy both; give two different devices (nothing was written)";
    if let Some(why) = same_storage(&c, cache, &b, backing) {
        bail!("cache {cn} and backing device {bn} {why}: {what}");
    }
    Ok(())
}

/// Why two existing paths are the same storage, or None.
fn same_storage(c: &Metadata, cache: &Path, b: &Metadata, backing: &Path) -> Option<String> {
    let (c_block, b_block) = (
        c.file_type().is_block_device(),
        b.file_type().is_block_device(),
    );
    if !c_block && !b_block {
        if c.dev() == b.dev() && c.ino() == b.ino() {
            return Some(format!(
                "are the same file ({}, device {}, inode {})",
                canonical(cache).display(),
                dev_name(c.dev()),
                c.ino()
            ));
        }
        return None;
    }
    if c_block && b_block {
        if c.rdev() == b.rdev() {
            return Some(format!(
                "are the same block device ({})",
                dev_name(c.rdev())
            ));
        }
        if let (Some(rc), Some(rb)) = (Region::of(c.rdev()), Region::of(b.rdev())) {
            if rc.overlaps(&rb) {
                return Some(format!(
                    "overlap on disk {} (block devices {} and {})",
                    rc.disk.display(),
                    dev_name(c.rdev()),
                    dev_name(b.rdev())
                ));
            }
        }
        return None;
    }
    // One file, one block device.
    let (file, file_path, dev) = if c_block {
        (b, backing, c)
    } else {
        (c, cache, b)
    };
    if let Some(looped) = loop_backing_file(dev.rdev()) {
        if let Ok(l) = fs::metadata(&looped) {
            if l.dev() == file.dev() && l.ino() == file.ino() {
                return Some(format!(
                    "are the same storage: block device {} is a loop device over {}",
                    dev_name(dev.rdev()),
                    file_path.display()
                ));
            }
        }
    }
    let on_device = file.dev() == dev.rdev()
        || matches!(
            (Region::of(file.dev()), Region::of(dev.rdev())),
            (Some(f), Some(d)) if f.overlaps(&d)
        );
    if on_device {
        return Some(format!(
            "are the same storage: {} lives on a filesystem on block device {}",
            file_path.display(),
            dev_name(dev.rdev())
        ));
    }
    None
}

fn canonical(p: &Path) -> PathBuf {
    fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

fn dev_name(dev: u64) -> String {
    format!("{}:{}", libc::major(dev), libc::minor(dev))
}

/// Where a block device lies on its disk: the disk's sysfs directory and a range of 512-byte
/// sectors (sysfs' unit).
#[derive(Debug, PartialEq, Eq)]
struct Region {
    disk: PathBuf,
    start_sectors: u64,
    size_sectors: u64,
}

impl Region {
    /// From /sys/dev/block/MAJ:MIN: a partition lies at `start` on its parent disk; a whole
    /// disk at 0. None when sysfs does not say (no such device, not mounted).
    fn of(dev: u64) -> Option<Region> {
        let dir = fs::canonicalize(format!("/sys/dev/block/{}", dev_name(dev))).ok()?;
        let read = |p: PathBuf| -> Option<u64> { fs::read_to_string(p).ok()?.trim().parse().ok() };
        let size_sectors = read(dir.join("size"))?;
        if dir.join("partition").exists() {
            let start_sectors = read(dir.join("start"))?;
            Some(Region {
                disk: dir.parent()?.to_path_buf(),
                start_sectors,
                size_sectors,
            })
        } else {
            Some(Region {
                disk: dir,
                start_sectors: 0,
                size_sectors,
            })
        }
    }

    fn overlaps(&self, other: &Region) -> bool {
        self.disk == other.disk
            && self.start_sectors < other.start_sectors.saturating_add(other.size_sectors)
            && other.start_sectors < self.start_sectors.saturating_add(self.size_sectors)
    }
}

/// The file a loop block device reads and writes, if it is one.
fn loop_backing_file(dev: u64) -> Option<PathBuf> {
    let text = fs::read_to_string(format!(
        "/sys/dev/block/{}/loop/backing_file",
        dev_name(dev)
    ))
    .ok()?;
    let name = text.trim_end_matches('\n');
    (!name.is_empty()).then(|| PathBuf::from(name))
}

/// Who holds the flock on `file`, as "process PID (COMMAND LINE)", from /proc/locks; None
/// when that does not say (another PID namespace, a lock gone meanwhile).
pub fn lock_holder(file: &File) -> Option<String> {
    let meta = file.metadata().ok()?;
    let me = std::process::id() as i64;
    let locks = fs::read_to_string("/proc/locks").ok()?;
    let pid = holder_pid(&locks, meta.dev(), meta.ino(), me)?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut cmd: String = String::from_utf8_lossy(&cmdline)
        .split('\0')
        .filter(|a| !a.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if cmd.chars().count() > 120 {
        cmd = cmd.chars().take(117).collect::<String>() + "...";
    }
    Some(if cmd.is_empty() {
        format!("process {pid}")
    } else {
        format!("process {pid} ({cmd})")
    })
}

/// The pid of a FLOCK in /proc/locks text on inode `ino` of device `dev`, other than `me`.
/// Lines read `1: FLOCK  ADVISORY  WRITE 1234 fe:00:5335238 0 EOF`; the device is hex
/// major:minor, the inode decimal.
fn holder_pid(locks: &str, dev: u64, ino: u64, me: i64) -> Option<i64> {
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // A blocked waiter's line starts with "->" and has one more field.
        let f = if fields.first() == Some(&"->") {
            &fields[1..]
        } else {
            &fields[..]
        };
        if f.len() < 6 || f[1] != "FLOCK" || f[5] != want {
            return None;
        }
        let pid: i64 = f[4].parse().ok()?;
        (pid > 0 && pid != me).then_some(pid)
    })
}

/// Whether the descriptor's flock is free (taken and kept if so, with the rest of `file`).
pub fn try_flock(file: &File) -> std::io::Result<bool> {
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(disk: &str, start_sectors: u64, size_sectors: u64) -> Region {
        Region {
            disk: PathBuf::from(disk),
            start_sectors,
            size_sectors,
        }
    }

    #[test]
    fn partitions_of_one_disk_overlap_only_where_their_sectors_do() {
        let disk = region("/sys/devices/x/block/sda", 0, 1000);
        let p1 = region("/sys/devices/x/block/sda", 2048, 500);
        let p2 = region("/sys/devices/x/block/sda", 2548, 500);
        let other = region("/sys/devices/x/block/sdb", 2048, 500);
        assert!(p1.overlaps(&p1));
        assert!(!p1.overlaps(&p2) && !p2.overlaps(&p1));
        assert!(!p1.overlaps(&other));
        assert!(!disk.overlaps(&p1), "the disk's size ends before p1 here");
        let whole = region("/sys/devices/x/block/sda", 0, 10_000);
        assert!(whole.overlaps(&p1) && p2.overlaps(&whole));
        let crossing = region("/sys/devices/x/block/sda", 2500, 100);
        assert!(crossing.overlaps(&p1) && crossing.overlaps(&p2));
    }

    #[test]
    fn the_lock_holder_is_read_from_proc_locks() {
        let dev = libc::makedev(254, 0);
        let locks = "1: POSIX  ADVISORY  WRITE 77 fe:00:42 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4321 fe:00:42 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 999 fe:00:42 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 55 fe:00:43 0 EOF\n";
        assert_eq!(holder_pid(locks, dev, 42, 1), Some(4321));
        assert_eq!(holder_pid(locks, dev, 43, 1), Some(55));
        assert_eq!(holder_pid(locks, dev, 44, 1), None);
        assert_eq!(holder_pid(locks, dev, 43, 55), None, "never names itself");
        assert_eq!(
            holder_pid(locks, libc::makedev(8, 1), 42, 1),
            None,
            "another device"
        );
    }

    #[test]
    fn a_file_is_the_same_storage_as_itself_through_a_symlink() {
        let dir = std::env::temp_dir().join(format!("lc-guard-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a.img");
        let b = dir.join("b.img");
        fs::write(&a, [0u8; 4096]).unwrap();
        fs::write(&b, [0u8; 4096]).unwrap();
        let link = dir.join("link.img");
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&a, &link).unwrap();
        let spelled = dir.join(".").join("a.img");
        assert!(refuse_same_device(&a, &link.to_string_lossy()).is_err());
        assert!(refuse_same_device(&link, &spelled.to_string_lossy()).is_err());
        assert!(refuse_same_device(&a, &b.to_string_lossy()).is_ok());
        assert!(refuse_same_device(&a, "nbd://127.0.0.1:1/x").is_ok());
        fs::remove_dir_all(&dir).unwrap();
    }
}
