//! Serves a RAM-backed engine (1 GiB cache, 4 GiB backing, both `MemDevice`) on a Unix socket
//! until killed; for benchmarking the server against e.g. `nbdkit null`:
//!
//! ```text
//! cargo run --release -p logcache-server --example serve_mem -- /tmp/logcache.sock [NAME=VALUE...]
//! fio --name=w --ioengine=nbd --uri='nbd+unix:///?socket=/tmp/logcache.sock' \
//!     --rw=randwrite --bs=4k --iodepth=64 --size=512m --time_based --runtime=10
//! ```
//!
//! `NAME=VALUE` arguments set engine tunables (e.g. `writeback_threshold_percent=100` keeps
//! writeback out of the measurement). Both devices are prefaulted (about 5 GiB of RAM) so the
//! numbers show the steady state rather than the kernel zeroing fresh pages.

use std::path::PathBuf;
use std::sync::Arc;

use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, Engine, FormatOptions, OpenOptions};
use logcache_server::{Server, ServerConfig};

const CACHE_BYTES: u64 = 1 << 30;
const BACKING_BYTES: u64 = 4 << 30;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(socket) = args.next().map(PathBuf::from) else {
        eprintln!("usage: serve_mem SOCKET_PATH [TUNABLE=VALUE...]");
        std::process::exit(2);
    };
    let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new_prefaulted(CACHE_BYTES));
    let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new_prefaulted(BACKING_BYTES));
    format_cache(&*cache, &*backing, &FormatOptions::default()).expect("formatting the cache");
    let engine = Engine::open(cache, backing, OpenOptions::default()).expect("opening the cache");
    for setting in args {
        let Some((name, value)) = setting.split_once('=') else {
            eprintln!("serve_mem: expected TUNABLE=VALUE, got {setting:?}");
            std::process::exit(2);
        };
        if let Err(error) = engine.set_tunable(name, value) {
            eprintln!("serve_mem: {error}");
            std::process::exit(2);
        }
    }
    let server = Server::new(engine, ServerConfig::default());
    if let Err(error) = server.listen_unix(&socket) {
        eprintln!("serve_mem: {error}");
        std::process::exit(1);
    }
    eprintln!("serve_mem: serving on {}", socket.display());
    loop {
        std::thread::park();
    }
}
