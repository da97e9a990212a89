//! Tests of [`FileDevice`](super::FileDevice) on real files in the temp directory (and on block
//! devices named by environment variables).

use super::bounce::BOUNCE_CHUNK_BYTES;
use super::sys::{BLKDISCARD, BLKGETSIZE64};
use super::*;
use crate::aligned::AlignedBuf;
use logcache_testkit::rng::Rng;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A file path in the temp directory, removed on drop.
struct TempPath(PathBuf);

impl TempPath {
    fn new(name: &str) -> TempPath {
        TempPath::in_dir(&std::env::temp_dir(), name)
    }

    fn in_dir(dir: &Path, name: &str) -> TempPath {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        TempPath(dir.join(format!("logcache-file-test-{pid}-{n}-{name}")))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn make_file(name: &str, size_bytes: u64) -> TempPath {
    let path = TempPath::new(name);
    create_sparse(&path.0, size_bytes).unwrap();
    path
}

fn open(path: &Path, direct: DirectIo) -> FileDevice {
    let opts = FileOptions {
        direct,
        writable: true,
    };
    FileDevice::open(path, opts).unwrap()
}

fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng::new(seed).fill(&mut v);
    v
}

/// A vectored write lands its pieces back to back, with O_DIRECT (aligned pieces, one
/// pwritev) and without (a misaligned piece: one write each), and is bounds-checked.
#[test]
fn vectored_writes_land_back_to_back() {
    for direct in [DirectIo::Auto, DirectIo::Never] {
        let path = make_file("vectored", 1 << 20);
        let dev = open(&path.0, direct);
        let mut a = AlignedBuf::new(8192);
        a.copy_from_slice(&random_bytes(3, 8192));
        let mut b = AlignedBuf::new(4096);
        b.copy_from_slice(&random_bytes(4, 4096));
        let c = random_bytes(5, 4096 + 1)[1..].to_vec(); // not aligned in memory
        dev.write_vectored_at(&[&a, &b], 64 * 1024).unwrap();
        dev.write_vectored_at(&[&b, &c[..]], 128 * 1024).unwrap();
        let mut back = AlignedBuf::new(12288);
        dev.read_at(&mut back, 64 * 1024).unwrap();
        assert_eq!(&back[..8192], &a[..]);
        assert_eq!(&back[8192..], &b[..]);
        let mut back = AlignedBuf::new(8192);
        dev.read_at(&mut back, 128 * 1024).unwrap();
        assert_eq!(&back[..4096], &b[..]);
        assert_eq!(&back[4096..], &c[..]);
        let err = dev
            .write_vectored_at(&[&a, &b], (1 << 20) - 8192)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}

/// Writes and reads back with aligned and misaligned memory, at 4 KiB and 512 granularity.
fn exercise(dev: &FileDevice) {
    // Aligned memory, aligned range.
    let mut aligned = AlignedBuf::new(16 * 1024);
    aligned.copy_from_slice(&random_bytes(1, 16 * 1024));
    dev.write_at(&aligned, 64 * 1024).unwrap();
    let mut back = AlignedBuf::new(16 * 1024);
    dev.read_at(&mut back, 64 * 1024).unwrap();
    assert_eq!(&back[..], &aligned[..]);

    // Misaligned memory (a Vec slice off by one byte).
    let mut raw = random_bytes(2, 8192 + 1);
    dev.write_at(&raw[1..], 128 * 1024).unwrap();
    let expected = raw[1..].to_vec();
    raw.fill(0);
    dev.read_at(&mut raw[1..], 128 * 1024).unwrap();
    assert_eq!(raw[1..], expected[..]);

    // 512-byte granularity inside a 4 KiB block, neighbours untouched.
    dev.write_at(&[0u8; 4096], 192 * 1024).unwrap();
    let small = random_bytes(3, 1536);
    dev.write_at(&small, 192 * 1024 + 1024).unwrap();
    let mut block = AlignedBuf::new(4096);
    dev.read_at(&mut block, 192 * 1024).unwrap();
    assert!(block[..1024].iter().all(|&b| b == 0));
    assert_eq!(&block[1024..2560], &small[..]);
    assert!(block[2560..].iter().all(|&b| b == 0));
    let mut part = vec![0u8; 512];
    dev.read_at(&mut part, 192 * 1024 + 1536).unwrap();
    assert_eq!(&part[..], &small[512..1024]);

    // A request spanning several bounce chunks, misaligned both in memory and on disk.
    let big = random_bytes(4, 3 * BOUNCE_CHUNK_BYTES as usize + 1024 + 1);
    dev.write_at(&big[1..], 256 * 1024 + 512).unwrap();
    let mut big_back = vec![0u8; big.len()];
    dev.read_at(&mut big_back[1..], 256 * 1024 + 512).unwrap();
    assert!(big_back[1..] == big[1..]);
    dev.flush().unwrap();
}

#[test]
fn round_trips_in_every_mode() {
    for direct in [DirectIo::Never, DirectIo::Auto] {
        let path = make_file("modes", 8 << 20);
        let dev = open(&path.0, direct);
        if direct == DirectIo::Never {
            assert!(!dev.is_direct());
        }
        exercise(&dev);
    }
}

#[test]
fn temp_dir_supports_direct_io() {
    // The test machine's temp dir is ext4, so Auto and Require must both get O_DIRECT;
    // elsewhere Require must fail with a clear message.
    let path = make_file("require", 1 << 20);
    let opts = FileOptions {
        direct: DirectIo::Require,
        writable: true,
    };
    match FileDevice::open(&path.0, opts) {
        Ok(dev) => {
            assert!(dev.is_direct());
            assert!(open(&path.0, DirectIo::Auto).is_direct());
            assert!([512, 4096].contains(&dev.direct_align_bytes()));
        }
        Err(e) => {
            assert_eq!(e.kind(), io::ErrorKind::Unsupported);
            assert!(e.to_string().contains("O_DIRECT"), "{e}");
            assert!(!open(&path.0, DirectIo::Auto).is_direct());
        }
    }
}

#[test]
fn widened_io_for_4k_direct_alignment() {
    // Pretend the device needs 4 KiB direct IO (as a 4Kn disk does): 4 KiB direct IO is
    // valid on 512-byte devices too, so this exercises the widen and read-modify-write
    // paths for real.
    let path = make_file("4kn", 8 << 20);
    let mut dev = open(&path.0, DirectIo::Auto);
    if !dev.is_direct() {
        eprintln!("skipped: no O_DIRECT in the temp dir");
        return;
    }
    dev.direct_align_bytes = 4096;
    exercise(&dev);
    // A single sector at the very end of the device.
    let last = dev.size_bytes() - 512;
    dev.write_at(&[0x5a; 512], last).unwrap();
    let mut buf = vec![0u8; 512];
    dev.read_at(&mut buf, last).unwrap();
    assert_eq!(buf, vec![0x5a; 512]);
}

#[test]
fn size_is_rounded_down_and_fixed() {
    let path = TempPath::new("size");
    std::fs::write(&path.0, vec![1u8; 3 * 4096 + 700]).unwrap();
    // Not a multiple of 512 on the tail: still opens; the partial sector is ignored.
    let dev = open(&path.0, DirectIo::Never);
    assert_eq!(dev.size_bytes(), 3 * 4096 + 512);
    assert!(!dev.is_block_device());
    assert_eq!(dev.describe(), path.0.display().to_string());
    assert_eq!(dev.path(), path.0.as_path());
    // Auto either uses direct IO (512-byte alignment) or falls back: both read the data.
    let auto = open(&path.0, DirectIo::Auto);
    assert_eq!(auto.size_bytes(), 3 * 4096 + 512);
    let mut buf = vec![0u8; 512];
    auto.read_at(&mut buf, 3 * 4096).unwrap();
    assert_eq!(buf, vec![1u8; 512]);
}

#[test]
fn out_of_range_and_unaligned_io_are_errors() {
    let path = make_file("range", 64 * 1024);
    let dev = open(&path.0, DirectIo::Auto);
    let mut buf = AlignedBuf::new(4096);
    for (offset, len) in [
        (64 * 1024, 4096),
        (60 * 1024 + 512, 4096),
        (100, 512),
        (0, 100),
    ] {
        let e = dev.read_at(&mut buf[..len], offset).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains(&*path.0.to_string_lossy()), "{e}");
        assert!(dev.write_at(&buf[..len], offset).is_err());
    }
    assert!(dev.discard(u64::MAX - 511, 512).is_err());
}

#[test]
fn short_read_is_an_error() {
    let path = make_file("short", 64 * 1024);
    let dev = open(&path.0, DirectIo::Auto);
    // Shrink the file behind the device's back.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path.0)
        .unwrap()
        .set_len(32 * 1024)
        .unwrap();
    let mut buf = AlignedBuf::new(4096);
    let e = dev.read_at(&mut buf, 48 * 1024).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    assert!(e.to_string().contains("short read"), "{e}");
}

#[test]
fn discard_punches_a_hole() {
    for direct in [DirectIo::Never, DirectIo::Auto] {
        let path = make_file("discard", 4 << 20);
        let dev = open(&path.0, direct);
        dev.write_at(&vec![0xEEu8; 4 << 20], 0).unwrap();
        dev.flush().unwrap();
        let blocks_before = std::fs::metadata(&path.0).unwrap().blocks();
        // Unaligned to 4 KiB at both ends, so the file system zeroes partial blocks too.
        dev.discard(512, (2 << 20) + 1024).unwrap();
        let mut all = vec![0u8; 4 << 20];
        dev.read_at(&mut all, 0).unwrap();
        for (i, &b) in all.iter().enumerate() {
            let discarded = (512..512 + (2 << 20) + 1024).contains(&i);
            assert_eq!(b, if discarded { 0 } else { 0xEE }, "byte {i} ({direct:?})");
        }
        let meta = std::fs::metadata(&path.0).unwrap();
        assert_eq!(meta.len(), 4 << 20, "discard must keep the size");
        assert!(meta.blocks() < blocks_before, "no space was freed");
    }
}

#[test]
fn read_only_device_refuses_writes() {
    let path = make_file("ro", 64 * 1024);
    let opts = FileOptions {
        direct: DirectIo::Auto,
        writable: false,
    };
    let dev = FileDevice::open(&path.0, opts).unwrap();
    let mut buf = AlignedBuf::new(4096);
    dev.read_at(&mut buf, 0).unwrap();
    let e = dev.write_at(&buf, 0).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    assert!(dev.discard(0, 4096).is_err());
    dev.flush().unwrap();
}

#[test]
fn open_errors_name_the_path() {
    let missing = TempPath::new("missing");
    let e = FileDevice::open(&missing.0, FileOptions::default())
        .err()
        .unwrap();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    assert!(e.to_string().contains(&*missing.0.to_string_lossy()), "{e}");
    let e = FileDevice::open(&std::env::temp_dir(), FileOptions::default())
        .err()
        .unwrap();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("not a regular file"), "{e}");
}

#[test]
fn create_sparse_creates_and_extends_but_never_shrinks() {
    let path = TempPath::new("sparse");
    create_sparse(&path.0, 1 << 30).unwrap();
    let meta = std::fs::metadata(&path.0).unwrap();
    assert_eq!(meta.len(), 1 << 30);
    assert!(meta.blocks() * 512 < 1 << 20, "file is not sparse");
    std::fs::write(&path.0, [7u8; 1000]).unwrap();
    create_sparse(&path.0, 4096).unwrap();
    assert_eq!(std::fs::metadata(&path.0).unwrap().len(), 4096);
    assert_eq!(&std::fs::read(&path.0).unwrap()[..1000], &[7u8; 1000]);
    create_sparse(&path.0, 512).unwrap();
    assert_eq!(std::fs::metadata(&path.0).unwrap().len(), 4096);
    assert!(create_sparse(&std::env::temp_dir(), 4096).is_err());
}

#[test]
fn tmpfs_opens_in_auto_mode() {
    // tmpfs refuses O_DIRECT on older kernels and accepts it on newer ones; Auto must
    // work either way.
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return;
    }
    let path = TempPath::in_dir(shm, "tmpfs");
    create_sparse(&path.0, 8 << 20).unwrap();
    exercise(&open(&path.0, DirectIo::Auto));
}

#[test]
fn concurrent_misaligned_io_from_many_threads() {
    // Each thread uses its own bounce buffer; blocks are disjoint per thread.
    let path = make_file("threads", 4 << 20);
    let dev = Arc::new(open(&path.0, DirectIo::Auto));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let dev = Arc::clone(&dev);
            std::thread::spawn(move || {
                let mut rng = Rng::new(t);
                let mut data = vec![0u8; 4097];
                let mut back = vec![0u8; 4097];
                for _ in 0..200 {
                    let block = rng.below(256) * 4 + t;
                    rng.fill(&mut data);
                    dev.write_at(&data[1..], block * 4096).unwrap();
                    dev.read_at(&mut back[1..], block * 4096).unwrap();
                    assert!(back[1..] == data[1..]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn ioctl_numbers_match_the_kernel_headers() {
    assert_eq!(BLKGETSIZE64, 0x8008_1272);
    assert_eq!(BLKDISCARD, 0x1277);
}

#[test]
fn block_device_from_env() {
    // Set LOGCACHE_TEST_BLOCK_DEVICE to a block device to check size and a direct read;
    // it is opened read-only and never written.
    let Ok(dev_path) = std::env::var("LOGCACHE_TEST_BLOCK_DEVICE") else {
        return;
    };
    let opts = FileOptions {
        direct: DirectIo::Auto,
        writable: false,
    };
    let dev = FileDevice::open(Path::new(&dev_path), opts).unwrap();
    assert!(dev.is_block_device());
    assert!(dev.size_bytes() > 0 && dev.size_bytes() & 511 == 0);
    let mut buf = vec![0u8; 4096 + 1];
    dev.read_at(&mut buf[1..], dev.size_bytes() - 4096).unwrap();
    eprintln!(
        "{dev_path}: {} bytes, direct {}, align {}",
        dev.size_bytes(),
        dev.is_direct(),
        dev.direct_align_bytes()
    );
}

#[test]
fn scratch_block_device_from_env() {
    // DESTRUCTIVE: set LOGCACHE_TEST_SCRATCH_BLOCK_DEVICE to a throwaway block device (e.g.
    // a loop device, also one made with `losetup --sector-size 4096`) to run the read/write
    // and discard checks on it.
    let Ok(dev_path) = std::env::var("LOGCACHE_TEST_SCRATCH_BLOCK_DEVICE") else {
        return;
    };
    for direct in [DirectIo::Never, DirectIo::Auto] {
        let dev = open(Path::new(&dev_path), direct);
        assert!(dev.is_block_device());
        eprintln!(
            "{dev_path}: {} bytes, direct {}, align {}, discard align {}",
            dev.size_bytes(),
            dev.is_direct(),
            dev.direct_align_bytes(),
            dev.discard_align_bytes
        );
        exercise(&dev);
        dev.write_at(&vec![0xEEu8; 1 << 20], 0).unwrap();
        dev.discard(0, 1 << 20).unwrap();
        dev.flush().unwrap();
        let mut back = AlignedBuf::new(1 << 20);
        dev.read_at(&mut back, 0).unwrap();
        // Discarded contents are unspecified, but loop devices read zeros back.
        eprintln!("zeros after discard: {}", back.iter().all(|&b| b == 0));
    }
}

#[test]
fn allocation_reports_a_sparse_files_holes_and_data() {
    let path = make_file("allocation", 1 << 20);
    let dev = FileDevice::open(&path.0, FileOptions::default()).unwrap();
    let block = AlignedBuf::new(4096);
    dev.write_at(&block, 64 << 10).unwrap();
    let hole = Allocation::ZeroHole;
    assert_eq!(dev.allocation(0, 1 << 20).unwrap(), (64 << 10, hole));
    assert_eq!(dev.allocation(100, 4096).unwrap(), (4096, hole));
    assert_eq!(
        dev.allocation(64 << 10, 1 << 19).unwrap(),
        (4096, Allocation::Data)
    );
    assert_eq!(
        dev.allocation((64 << 10) + 100, 10).unwrap().1,
        Allocation::Data
    );
    let after_bytes = (1 << 20) - (68 << 10);
    assert_eq!(
        dev.allocation(68 << 10, after_bytes).unwrap(),
        (after_bytes, hole)
    );
    // A punched hole is a hole again.
    dev.write_zeroes(64 << 10, 4096).unwrap();
    assert_eq!(dev.allocation(0, 1 << 20).unwrap(), (1 << 20, hole));
}

/// A batch of reads (several runs of one request) returns what positional reads return, with
/// either engine: each op its own bytes, and an op that fails (past the end of a file that
/// shrank under the device: a short read) fails alone, the ops around it still served.
#[test]
fn a_read_batch_serves_each_op_and_fails_only_the_failing_one() {
    let size_bytes = 4u64 << 20;
    let data = random_bytes(7, size_bytes as usize);
    let (detected, why) = ReadEngine::detect();
    if let Some(e) = why {
        eprintln!("io_uring unavailable here ({e}): only the sync engine is tested");
    }
    for engine in [ReadEngine::Sync, detected] {
        let path = make_file("batch", size_bytes);
        let mut dev = open(&path.0, DirectIo::Auto);
        dev.set_read_engine(engine);
        dev.write_at(&aligned_copy(&data), 0).unwrap();
        // Four runs, out of device order, one of them unaligned in memory (bounced).
        let offsets = [3u64 << 20, 4096, 2 << 20, (1 << 20) + 512];
        let lens = [64 * 1024usize, 4096, 1 << 20, 8192];
        let mut bufs: Vec<AlignedBuf> = lens.iter().map(|&l| AlignedBuf::new(l + 4096)).collect();
        let batches_before = ReadEngine::io_uring_batches();
        {
            let mut ops: Vec<ReadOp<'_>> = bufs
                .iter_mut()
                .zip(offsets.iter().zip(lens))
                .map(|(b, (&off, len))| ReadOp::new(&mut b[..len], off))
                .collect();
            dev.read_batch(&mut ops);
            for (i, op) in ops.iter().enumerate() {
                op.result.as_ref().unwrap();
                let at = offsets[i] as usize;
                assert!(op.buf[..] == data[at..at + lens[i]], "{engine:?} op {i}");
            }
        }
        if engine == ReadEngine::IoUring {
            assert!(
                ReadEngine::io_uring_batches() > batches_before,
                "the ring served it"
            );
        }
        // The file shrinks to 2 MiB + 4 KiB: the third op (2 MiB .. 3 MiB) reads short.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path.0)
            .unwrap()
            .set_len((2 << 20) + 4096)
            .unwrap();
        let mut ops: Vec<ReadOp<'_>> = bufs
            .iter_mut()
            .zip(offsets.iter().zip(lens))
            .map(|(b, (&off, len))| ReadOp::new(&mut b[..len], off))
            .collect();
        ops.swap(0, 2);
        // Now: [2 MiB: fails] [4 KiB] [3 MiB: fails] [1 MiB + 512] — failures first and
        // in the middle.
        dev.read_batch(&mut ops);
        for (i, op) in ops.iter().enumerate() {
            let fails = op.offset >= 2 << 20;
            assert_eq!(
                op.result.is_err(),
                fails,
                "{engine:?} op {i} at {}",
                op.offset
            );
            if !fails {
                let at = op.offset as usize;
                assert!(
                    op.buf[..] == data[at..at + op.buf.len()],
                    "{engine:?} op {i}"
                );
            }
        }
    }
}

fn aligned_copy(data: &[u8]) -> AlignedBuf {
    let mut b = AlignedBuf::new(data.len());
    b.copy_from_slice(data);
    b
}
