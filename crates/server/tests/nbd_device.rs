//! A plain device served as it is (`Server::for_device`), as `logcache-bench sim-hdd` does: an
//! emulated hard disk over memory, driven by nbdsh with many requests in flight at once.

mod server_support;

use std::sync::Arc;

use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_server::{Server, ServerConfig};
use logcache_testkit::hdd::{HddDevice, HddParams};
use server_support::*;

const DEVICE_BYTES: u64 = 64 * MIB;

/// An emulated disk (default 7200 rpm model) over memory, served on a Unix socket.
struct DiskFixture {
    dir: TestDir,
    memory: Arc<dyn BlockDevice>,
    disk: Arc<HddDevice>,
    server: Server,
}

impl DiskFixture {
    fn start(name: &str) -> DiskFixture {
        let dir = TestDir::new(name);
        let memory: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(DEVICE_BYTES));
        let disk = Arc::new(HddDevice::new(memory.clone(), HddParams::default()).unwrap());
        let server = Server::for_device(disk.clone(), ServerConfig::default());
        server
            .listen_unix(&dir.path.join("nbd.sock"))
            .expect("listen on the unix socket");
        DiskFixture {
            dir,
            memory,
            disk,
            server,
        }
    }

    fn uri(&self) -> String {
        unix_uri(&self.dir.path.join("nbd.sock"))
    }

    /// Reads straight from the memory under the emulated disk (any range: the device itself
    /// only takes whole sectors).
    fn stored(&self, offset_bytes: u64, length_bytes: usize) -> Vec<u8> {
        let start = offset_bytes - offset_bytes % 512;
        let end = (offset_bytes + length_bytes as u64).next_multiple_of(512);
        let mut sectors = vec![0u8; (end - start) as usize];
        self.memory.read_at(&mut sectors, start).unwrap();
        let head = (offset_bytes - start) as usize;
        sectors[head..head + length_bytes].to_vec()
    }
}

impl Drop for DiskFixture {
    fn drop(&mut self) {
        self.server.shutdown();
    }
}

#[test]
fn many_requests_in_flight_on_one_connection_reach_the_disk_together_and_all_complete() {
    let fixture = DiskFixture::start("slow-aio");
    // 64 writes sent at once, scattered over the device (some FUA, some unaligned), then a
    // flush, zeroing and trim, then 64 reads at once: every reply arrives with the right data.
    let script = r#"
N = 64
STRIDE = 1 << 20
size = h.get_size()
assert size == 64 << 20, size
order = [(i * 37) % N for i in range(N)]
cookies = []
for i in order:
    data = bytes([i + 1]) * 4096
    flags = nbd.CMD_FLAG_FUA if i % 8 == 0 else 0
    cookies.append(h.aio_pwrite(data, i * STRIDE, flags=flags))
cookies.append(h.aio_pwrite(b"\xee" * 100, 3 * STRIDE + 5000))
while h.aio_in_flight() > 0:
    h.poll(-1)
for c in cookies:
    assert h.aio_command_completed(c)
h.flush()
h.zero(4096, 5 * STRIDE)
h.trim(4096, 6 * STRIDE)
reads = [(i, nbd.Buffer(4096)) for i in order]
cookies = [h.aio_pread(buf, i * STRIDE) for (i, buf) in reads]
while h.aio_in_flight() > 0:
    h.poll(-1)
for c in cookies:
    assert h.aio_command_completed(c)
for i, buf in reads:
    expected = bytes(4096) if i in (5, 6) else bytes([i + 1]) * 4096
    assert buf.to_bytearray() == expected, i
assert h.pread(100, 3 * STRIDE + 5000) == b"\xee" * 100
assert h.pread(4096, 5 * STRIDE + 4096) == bytes(4096)
"#;
    nbdsh(&fixture.uri(), &[], script).expect_success("nbdsh aio on the emulated disk");

    for i in 0..64u64 {
        let expected = match i {
            5 => vec![0u8; 4096],
            // Trimmed: memory keeps whatever it had, which the spec allows.
            6 => continue,
            _ => vec![i as u8 + 1; 4096],
        };
        assert_eq!(fixture.stored(i * MIB, 4096), expected, "block {i}");
    }
    assert_eq!(fixture.stored(3 * MIB + 5000, 100), vec![0xee; 100]);
    // The disk had many of the requests queued at once (behind the one it was serving), which
    // is what lets it reorder them; served one at a time it would never see a queue.
    let stats = fixture.disk.stats();
    assert!(
        stats.queued_max >= 8,
        "the emulated disk saw at most {} requests queued: {stats:?}",
        stats.queued_max
    );
}

#[test]
fn nbdinfo_sees_the_device_size_and_flags() {
    let fixture = DiskFixture::start("slow-info");
    let export = nbdinfo_export(&fixture.uri());
    assert_eq!(export["export-size"], DEVICE_BYTES);
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
    ] {
        assert_eq!(export[flag], true, "{flag} in {export}");
    }
}

#[test]
fn fio_verifies_random_writes_at_queue_depth_64() {
    let fixture = DiskFixture::start("slow-fio");
    let uri_arg = format!("--uri={}", fixture.uri());
    let run = run_in(
        &fixture.dir.path,
        "fio",
        &[
            "--name=v",
            "--ioengine=nbd",
            &uri_arg,
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=64",
            "--size=2m",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_state_save=0",
        ],
    )
    .expect_success("fio");
    assert!(run.stdout.contains("err= 0"), "{}", run.describe());
    assert!(!run.stdout.contains("verify:"), "{}", run.describe());
}
