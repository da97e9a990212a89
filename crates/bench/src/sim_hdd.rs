//! `logcache-bench sim-hdd`: an EMULATED hard disk served over NBD, for tests and benchmarks. The data
//! lives in a file; every IO takes as long as a 7200 rpm disk would (the model is
//! `logcache_testkit::hdd`), so logcache and its peers can be measured against a slow,
//! seek-bound disk on a machine that has none. Serves until SIGTERM or SIGINT, then prints one
//! line of the disk's figures.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use logcache_engine::io::file::create_sparse;
use logcache_engine::io::{BlockDevice, SECTOR_SIZE_BYTES};
use logcache_server::{Server, ServerConfig};
use logcache_testkit::hdd::{HddDevice, HddParams};

use logcache_cli::cmd::serve::{absolute, block_termination_signals, uri_escape, wait_for_signal};
use logcache_cli::devices::lock_exclusive;
use logcache_cli::size::parse_size;

/// Shown to clients such as `nbdinfo`.
const DESCRIPTION: &str = "logcache-bench sim-hdd: an EMULATED hard disk for tests and benchmarks";

#[derive(Args)]
pub struct SimHddArgs {
    /// The file holding the disk's data: created if missing, extended to --size if shorter.
    #[arg(long)]
    pub file: PathBuf,
    /// The disk's size (e.g. 16G; K, M, G, T are powers of 1024), a multiple of 512.
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    /// Serve NBD on this Unix socket.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Serve NBD on this TCP address (HOST:PORT); loopback only unless --allow-remote.
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// Allow --listen on a non-loopback address (NBD has no authentication or encryption).
    #[arg(long)]
    pub allow_remote: bool,
    /// Model: spindle speed (one revolution takes 60 s / rpm).
    #[arg(long, default_value_t = HddParams::default().rpm)]
    pub rpm: u32,
    /// Model: track-to-track seek (head settle), µs.
    #[arg(long, default_value_t = HddParams::default().settle_us)]
    pub settle_us: u64,
    /// Model: seek across the whole platter, µs.
    #[arg(long, default_value_t = HddParams::default().full_stroke_us)]
    pub full_stroke_us: u64,
    /// Model: the capacity a full stroke spans, GiB: the whole disk this file is the start of
    /// [default: 931, i.e. 1 TB = 1_000_000_000_000 bytes].
    #[arg(long, value_name = "GIB")]
    pub platter_gib: Option<u64>,
    /// Model: media transfer rate, MB/s (10^6 bytes).
    #[arg(long, default_value_t = HddParams::default().bandwidth_bytes_per_s / 1_000_000)]
    pub bandwidth_mb_s: u64,
    /// Model: cost of a flush, µs.
    #[arg(long, default_value_t = HddParams::default().flush_us)]
    pub flush_us: u64,
    /// Model: queued requests the disk reorders among (1: strictly in arrival order).
    #[arg(long, default_value_t = HddParams::default().ncq_depth)]
    pub ncq_depth: usize,
}

/// The model's parameters from the options, checked.
fn params(args: &SimHddArgs) -> Result<HddParams> {
    let platter_bytes = match args.platter_gib {
        Some(gib) => gib
            .checked_mul(1 << 30)
            .context("--platter-gib is too large")?,
        None => HddParams::default().platter_bytes,
    };
    let params = HddParams {
        rpm: args.rpm,
        settle_us: args.settle_us,
        full_stroke_us: args.full_stroke_us,
        platter_bytes,
        bandwidth_bytes_per_s: args
            .bandwidth_mb_s
            .checked_mul(1_000_000)
            .context("--bandwidth-mb-s is too large")?,
        flush_us: args.flush_us,
        ncq_depth: args.ncq_depth,
    };
    params.check().context("invalid model options")?;
    Ok(params)
}

pub fn run(args: &SimHddArgs) -> Result<()> {
    // Before any thread exists, so every thread inherits the mask and only sigwait sees them.
    let signals = block_termination_signals()?;
    // Everything the options alone decide is checked before the file is touched.
    if args.size == 0 || !args.size.is_multiple_of(SECTOR_SIZE_BYTES) {
        bail!(
            "--size {} must be a positive multiple of {SECTOR_SIZE_BYTES} bytes",
            args.size
        );
    }
    let endpoint = match (&args.socket, &args.listen) {
        (None, None) => bail!("give --socket PATH or --listen HOST:PORT to serve the disk on"),
        (Some(_), Some(_)) => bail!("give --socket or --listen, not both"),
        (Some(socket), None) => Endpoint::Unix(socket),
        (None, Some(addr)) => {
            logcache_cli::sockets::check_tcp_listen(addr, args.allow_remote)?;
            Endpoint::Tcp(addr)
        }
    };
    let params = params(args)?;

    let path = &args.file;
    // Its errors name the path.
    create_sparse(path, args.size).context("preparing the disk's file")?;
    let _lock = lock_exclusive(path, |holder| {
        format!("{} is in use by {holder}; stop it first", path.display())
    })?;
    let file = Arc::new(logcache_backing::open_file(path, || {
        "opening the disk's file".into()
    })?);
    if file.size_bytes() != args.size {
        bail!(
            "{} is {} bytes, more than --size {}; sim-hdd never shortens a file: give --size {} or another file",
            path.display(),
            file.size_bytes(),
            args.size,
            file.size_bytes()
        );
    }
    let disk =
        Arc::new(HddDevice::new(file.clone(), params).context("building the emulated disk")?);
    let server = Server::for_device(
        disk.clone(),
        ServerConfig {
            description: DESCRIPTION.to_owned(),
            ..ServerConfig::default()
        },
    );
    let started = Instant::now();
    let result = serve_until_signal(args, endpoint, &server, &params, &signals);
    // Whatever happened, stop serving; then make what the clients wrote durable, since the
    // model has no volatile cache a client would have to flush.
    server.shutdown();
    let flushed = file.flush();
    let signal = result?;
    flushed.with_context(|| format!("flushing {}", path.display()))?;
    let stats = disk.stats();
    let up_s = started.elapsed().as_secs_f64();
    let busy_s = stats.busy_us as f64 / 1e6;
    println!(
        "logcache-bench: {signal}: stopped; the emulated disk served {} IOs, busy {busy_s:.3} s of {up_s:.3} s ({:.0}%), at most {} queued",
        stats.ios,
        100.0 * busy_s / up_s.max(1e-9),
        stats.queued_max
    );
    Ok(())
}

/// Where to serve: exactly one of --socket and --listen.
enum Endpoint<'a> {
    Unix(&'a Path),
    Tcp(&'a str),
}

/// Listens, prints the startup lines, and waits for SIGTERM or SIGINT; returns its name.
fn serve_until_signal(
    args: &SimHddArgs,
    endpoint: Endpoint,
    server: &Server,
    params: &HddParams,
    signals: &libc::sigset_t,
) -> Result<&'static str> {
    let endpoint = match endpoint {
        Endpoint::Unix(socket) => {
            server
                .listen_unix(socket)
                .with_context(|| format!("serving NBD on {}", socket.display()))?;
            format!(
                "nbd+unix:///?socket={}",
                uri_escape(&absolute(socket).to_string_lossy())
            )
        }
        Endpoint::Tcp(addr) => {
            let bound = server
                .listen_tcp(addr)
                .with_context(|| format!("serving NBD on {addr}"))?;
            format!("nbd://{bound}")
        }
    };
    println!(
        "logcache-bench: serving an EMULATED hard disk (timing emulation for tests and benchmarks, not a real disk) of {:.0} MiB in {} on {endpoint}",
        args.size as f64 / (1u64 << 20) as f64,
        args.file.display(),
    );
    println!(
        "  model: {} rpm, settle {} us, full stroke {} us across {} bytes, {} MB/s, flush {} us, NCQ depth {}",
        params.rpm,
        params.settle_us,
        params.full_stroke_us,
        params.platter_bytes,
        params.bandwidth_bytes_per_s / 1_000_000,
        params.flush_us,
        params.ncq_depth
    );
    Ok(wait_for_signal(signals))
}
