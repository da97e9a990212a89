//! `logcache serve`: resume the cache, serve it over NBD until SIGTERM or SIGINT, then stop
//! cleanly (finish requests in flight, seal, checkpoint) and exit 0.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, Engine, Error as EngineError, FormatOptions, OpenOptions};
use logcache_server::{Server, ServerConfig, TlsMode};

use crate::cmd::admin::{parse_assignments, validate_assignments};
use crate::control::server::ControlServer;
use crate::defaults;
use crate::devices::{
    control_path_for, lock_backing, lock_cache, open_backing_with_timeout, open_cache_for_serving,
    pick_read_engine, IoEngineArg,
};
use crate::guard::refuse_same_device;
use crate::metrics::MetricsServer;
use crate::owner::{refuse_live_owner, Heartbeat};
use crate::served::Served;
use crate::size::human;
use crate::stop_deadline::StopDeadline;
use logcache_engine::format::BLOCK_SIZE_BYTES as BLOCK_BYTES;
use logcache_nbd::uri::is_nbd_uri;

#[derive(Args)]
pub struct ServeArgs {
    /// The cache device (file or block device), formatted with `logcache format`.
    #[arg(long)]
    pub cache: Option<PathBuf>,
    /// The backing device: a path, an NBD URI, or rbd:POOL/IMAGE[?conf=PATH&id=USER].
    #[arg(long)]
    pub backing: Option<String>,
    /// Serve NBD on this Unix socket.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Serve NBD on this TCP address (HOST:PORT); loopback only unless TLS is required or
    /// --allow-remote is given.
    #[arg(long)]
    pub listen: Option<String>,
    /// Allow --listen on a non-loopback address without TLS. NBD without TLS has no
    /// authentication or encryption: whoever reaches the port can read and overwrite the disk.
    /// Use only on a trusted network (or serve TLS: --tls-certificates / --tls-psk).
    #[arg(long)]
    pub allow_remote: bool,
    #[command(flatten)]
    pub tls: crate::tls::TlsArgs,
    /// The control socket for status/set/drain (default: beside the cache, `<cache>.ctl`).
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics and JSON at /status.
    #[arg(long)]
    pub metrics: Option<String>,
    /// Set a tunable before serving (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Refuse writes.
    #[arg(long)]
    pub read_only: bool,
    /// With an NBD backing device (or an RBD image): seconds its server (the Ceph cluster) may
    /// take to answer a request before the connection counts as broken (the request fails,
    /// writeback retries, the next use reconnects). A stopped server or a network that drops
    /// packets costs this long per try.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub backing_timeout: f64,
    /// How the cache device's reads are served: io_uring (the runs of one request submitted
    /// together), sync (pread, one after another), or auto (io_uring where the kernel allows
    /// it, else sync).
    #[arg(long, value_enum, default_value_t = IoEngineArg::Auto)]
    pub io_engine: IoEngineArg,
}

struct Plan {
    cache: PathBuf,
    backing: String,
    socket: Option<PathBuf>,
    listen: Option<String>,
    control: PathBuf,
    embedded: bool,
    /// With TLS required: the query parameter the banner's URIs carry (libnbd's spelling).
    tls_query: Option<String>,
}

fn plan(args: &ServeArgs) -> Result<Plan> {
    match (&args.cache, &args.backing) {
        (Some(cache), Some(backing)) => {
            let socket = match (&args.socket, &args.listen) {
                (None, None) => {
                    let mut s = cache.as_os_str().to_owned();
                    s.push(".sock");
                    Some(PathBuf::from(s))
                }
                (s, _) => s.clone(),
            };
            Ok(Plan {
                cache: cache.clone(),
                backing: backing.clone(),
                socket,
                listen: args.listen.clone(),
                control: args
                    .control
                    .clone()
                    .unwrap_or_else(|| control_path_for(cache)),
                embedded: false,
                tls_query: None,
            })
        }
        (None, None) => Ok(Plan {
            cache: defaults::cache_path(),
            backing: defaults::backing_path().to_string_lossy().into_owned(),
            socket: Some(args.socket.clone().unwrap_or_else(defaults::socket_path)),
            listen: Some(
                args.listen
                    .clone()
                    .unwrap_or_else(|| defaults::TCP_LISTEN.to_string()),
            ),
            control: args.control.clone().unwrap_or_else(defaults::control_path),
            embedded: true,
            tls_query: None,
        }),
        _ => bail!(
            "give both --cache and --backing, or neither to serve the embedded default under ./{}",
            defaults::DATA_DIR
        ),
    }
}

/// `--backing-timeout` as a duration: positive and at most a day.
fn backing_timeout(seconds: f64) -> Result<Duration> {
    if !(seconds > 0.0 && seconds <= 86_400.0) {
        bail!("--backing-timeout {seconds}: give a number of seconds above 0 and at most 86400");
    }
    Ok(Duration::from_secs_f64(seconds))
}

pub fn run(args: &ServeArgs) -> Result<()> {
    // Before any thread exists, so every thread inherits the mask and only sigwait sees them.
    let signals = block_termination_signals()?;
    // Every argument is checked before anything is created or opened: a mistake here must not
    // leave a cache that was opened and not closed cleanly.
    let tunable_sets = parse_assignments(&args.set)?;
    validate_assignments(&tunable_sets, "--set ")?;
    let mut plan = plan(args)?;
    let backing_timeout = backing_timeout(args.backing_timeout)?;
    // Declared before every device and thread of the serve, so that it is dropped (the stop
    // over) only after all of them: their closes run under its deadline.
    let stop = StopDeadline::new(stop_limit(backing_timeout), &plan.backing);
    let remote_listen = match &plan.listen {
        Some(addr) => crate::sockets::is_remote(addr)?,
        None => false,
    };
    let tls = args.tls.config(remote_listen)?;
    let tls_required = matches!(&tls, Some(t) if t.mode() == TlsMode::Require);
    if tls_required {
        plan.tls_query = args.tls.uri_query();
    }
    if let Some(addr) = &plan.listen {
        if !tls_required {
            crate::sockets::check_tcp_listen(addr, args.allow_remote)?;
            if remote_listen {
                eprintln!("logcache: warning: serving NBD on {addr} without requiring TLS (--allow-remote): anyone who can reach it can read and overwrite the disk");
            }
        }
        crate::sockets::check_tcp_free(addr)?;
    }
    if plan.embedded {
        defaults::ensure_files()?;
    }
    refuse_same_device(&plan.cache, &plan.backing)?;
    let read_engine = pick_read_engine(args.io_engine)?;
    let cache = open_cache_for_serving(&plan.cache, read_engine)?;
    let _lock = lock_cache(&plan.cache)?;
    let _backing_lock = lock_backing(&plan.backing)?;
    let backing = open_backing_with_timeout(&plan.backing, backing_timeout)?;
    let remote = is_nbd_uri(&plan.backing);
    if remote {
        refuse_live_owner(&*backing, &plan.backing, false)?;
    }
    let engine = open_engine(&plan, cache, backing.clone())?;
    // An NBD backing has no local lock: record this process as its owner while it serves
    // (marked stopped when dropped, before the engine closes).
    let heartbeat = match remote
        .then(|| Heartbeat::start(backing.clone()))
        .transpose()
    {
        Ok(h) => h,
        Err(e) => {
            let _ = engine.close();
            return Err(e.context("recording this serve as the backing device's owner"));
        }
    };
    for (k, v) in &tunable_sets {
        engine
            .set_tunable(k, v)
            .with_context(|| format!("--set {k}={v}"))?;
    }
    let server = Server::new(
        engine.clone(),
        ServerConfig {
            read_only: args.read_only,
            tls,
            ..ServerConfig::default()
        },
    );
    let served = Arc::new(Served {
        engine: engine.clone(),
        server: server.clone(),
        started: Instant::now(),
        cache_name: plan.cache.display().to_string(),
        backing_name: plan.backing.clone(),
        stopping: AtomicBool::new(false),
    });
    let mut result = serve_until_signal(&plan, args, &server, &served, &signals, &stop);
    // Whatever happened, stop serving and leave a clean checkpoint if the engine allows; each
    // step may wait for the backing device, so all of them run under the stop's deadline.
    stop.arm(engine.stats().dirty_blocks * BLOCK_BYTES);
    stop.step("finishing the NBD requests in flight");
    server.shutdown();
    stop.step("recording the stop on the NBD backing device");
    drop(heartbeat);
    stop.step("closing the cache: writing its log, stopping writeback");
    let closed = engine.close();
    let after = engine.stats();
    // Status answered during the stop (state "stopping"); no longer.
    stop.step("stopping the control and metrics servers");
    if let Ok(listeners) = result.as_mut() {
        listeners.stop();
    }
    stop.step("closing the backing device");
    let abandoned_before = logcache_backing::rbd_closes_abandoned();
    drop((served, server, engine, backing));
    let backing_closed = logcache_backing::rbd_closes_abandoned() == abandoned_before;
    drop(result?);
    closed.context("closing the cache")?;
    eprintln!(
        "logcache: {}",
        stopped_line(&after, &plan.backing, backing_closed)
    );
    Ok(())
}

/// How long a stop may take: the backing device's timeout (a request in flight, a reconnect)
/// and room for the rest.
fn stop_limit(backing_timeout: Duration) -> Duration {
    backing_timeout.saturating_add(Duration::from_secs(20))
}

/// The last line of a serve that stopped with its cache checkpointed: clean, or what was left
/// undone because the backing device did not answer.
fn stopped_line(s: &logcache_engine::Stats, backing: &str, backing_closed: bool) -> String {
    let why = match (&s.writeback_error, backing_closed) {
        (_, false) => "closing it timed out".to_string(),
        (Some(e), true) if s.dirty_blocks > 0 => e.clone(),
        _ => return "stopped cleanly; the cache is checkpointed".to_string(),
    };
    let mut line = format!(
        "stopped; the cache is checkpointed with {} of dirty data, but the backing device \
         {backing} does not answer ({why}): the next serve writes the dirty data back once it does",
        human(s.dirty_blocks * BLOCK_BYTES)
    );
    if !backing_closed {
        line.push_str(
            "; until the cluster drops this client (osd client watch timeout), the image's \
             exclusive lock stays with it",
        );
    }
    line
}

fn serve_until_signal(
    plan: &Plan,
    args: &ServeArgs,
    server: &Server,
    served: &Arc<Served>,
    signals: &libc::sigset_t,
    stop: &StopDeadline,
) -> Result<Listeners> {
    let mut endpoints = Vec::new();
    if let Some(sock) = &plan.socket {
        server
            .listen_unix(sock)
            .with_context(|| format!("serving NBD on {}", sock.display()))?;
        let socket = uri_escape(&absolute(sock).to_string_lossy());
        endpoints.push(match &plan.tls_query {
            Some(query) => format!("nbds+unix:///?socket={socket}&{query}"),
            None => format!("nbd+unix:///?socket={socket}"),
        });
    }
    if let Some(addr) = &plan.listen {
        let bound = server
            .listen_tcp(addr)
            .with_context(|| format!("serving NBD on {addr}"))?;
        endpoints.push(match &plan.tls_query {
            Some(query) => format!("nbds://{bound}/?{query}"),
            None => format!("nbd://{bound}"),
        });
    }
    let control = ControlServer::start(&plan.control, served.clone())?;
    let metrics = args
        .metrics
        .as_deref()
        .map(|addr| MetricsServer::start(addr, served.clone()))
        .transpose()?;
    // The embedded default says where its control socket is, so `logcache status` finds it
    // from any directory (withdrawn when this returns).
    let announced = plan
        .embedded
        .then(|| defaults::announce_control(&plan.control))
        .flatten();
    let s = served.engine.stats();
    println!(
        "logcache: serving {} (disk of {} bytes = {}: the backing device minus its last 4 KiB, logcache's label; cache {} with {} segments) on {}",
        plan.backing,
        s.exported_size_bytes,
        human(s.exported_size_bytes),
        plan.cache.display(),
        s.segment_count,
        endpoints.join(" and ")
    );
    println!("  control: {}", absolute(&plan.control).display());
    if let Some(m) = &metrics {
        println!("  metrics: http://{}/metrics", m.local_addr());
    }
    if plan.embedded {
        let status = admin_command(if announced.is_some() {
            None
        } else {
            Some(&plan.control)
        });
        print_how_to_connect(&endpoints[0], &status);
    }
    let sig = wait_for_signal(signals);
    served.stopping.store(true, Ordering::Release);
    stop.arm(served.engine.stats().dirty_blocks * BLOCK_BYTES);
    eprintln!("logcache: {sig}: finishing requests in flight and checkpointing");
    Ok(Listeners { control, metrics })
}

/// The control socket and metrics endpoint, kept answering until the engine is closed, so
/// that status works during a stop that waits for the backing device.
struct Listeners {
    control: ControlServer,
    metrics: Option<MetricsServer>,
}

impl Listeners {
    fn stop(&mut self) {
        self.control.stop();
        if let Some(m) = self.metrics.as_mut() {
            m.stop();
        }
    }
}

/// `status` as a command that works from any directory: `logcache status` when `logcache` on
/// PATH is this binary, else this binary's full path; with `--control` unless the default
/// finds this serve.
fn admin_command(control: Option<&Path>) -> String {
    let exe = std::env::current_exe().ok();
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("logcache"))
            .find(|c| c.is_file())
    });
    let same = match (&exe, &on_path) {
        (Some(e), Some(p)) => std::fs::canonicalize(p).ok().as_ref() == Some(e),
        _ => false,
    };
    let mut cmd = match exe {
        Some(e) if !same => e.to_string_lossy().into_owned(),
        _ => "logcache".to_string(),
    };
    cmd.push_str(" status");
    if let Some(c) = control {
        cmd.push_str(&format!(" --control {}", absolute(c).display()));
    }
    cmd
}

fn print_how_to_connect(uri: &str, status: &str) {
    println!(
        "\nConnect with:\n  nbdinfo '{uri}'\n  qemu-io -f raw '{uri}' -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M'\n  fio --name=w --ioengine=nbd --uri='{uri}' --rw=randwrite --bs=4k --iodepth=64 --size=1g --runtime=30 --time_based\n  mkdir -p /tmp/lc && nbdfuse /tmp/lc/disk '{uri}' &   # then: losetup -f --show /tmp/lc/disk; mkfs.xfs; mount\nStatus: {status}   Stop: Ctrl-C (or SIGTERM); everything is checkpointed.\n"
    );
}

/// Percent-encodes what a URI query value cannot hold literally, so the printed URI works in
/// every client (libnbd rejects a raw space).
pub fn uri_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Opens the engine; on the embedded default, formats a cache that holds no superblock yet.
/// Prints an elapsed-time line if recovery takes more than a moment.
fn open_engine(
    plan: &Plan,
    cache: Arc<dyn BlockDevice>,
    backing: Arc<dyn BlockDevice>,
) -> Result<Engine> {
    let done = Arc::new(AtomicBool::new(false));
    let ticker = {
        let done = done.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            let tty = std::io::stderr().is_terminal();
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                let t = start.elapsed();
                if t >= Duration::from_secs(1) && !done.load(Ordering::Relaxed) {
                    if tty {
                        eprint!(
                            "\rlogcache: recovering the cache log... {:.1} s",
                            t.as_secs_f64()
                        );
                    } else if t.as_millis() % 5000 < 100 {
                        eprintln!(
                            "logcache: recovering the cache log... {:.0} s",
                            t.as_secs_f64()
                        );
                    }
                }
            }
        })
    };
    let mut res = Engine::open(cache.clone(), backing.clone(), OpenOptions::default());
    if plan.embedded {
        if let Err(EngineError::NotFormatted(_)) = res {
            format_cache(&*cache, &*backing, &FormatOptions::default())
                .context("formatting the embedded default cache")?;
            eprintln!(
                "logcache: formatted the embedded default ({} GiB cache, {} GiB backing) under ./{}",
                defaults::CACHE_SIZE_BYTES >> 30,
                defaults::BACKING_SIZE_BYTES >> 30,
                defaults::DATA_DIR
            );
            res = Engine::open(cache, backing, OpenOptions::default());
        }
    }
    done.store(true, Ordering::Relaxed);
    let _ = ticker.join();
    match res {
        Ok(engine) => {
            let r = engine.stats().recovery;
            if !r.clean {
                eprintln!(
                    "logcache: recovered after an unclean stop in {:.3} s: {} chunks replayed, {} discarded, {} blocks",
                    r.duration_us as f64 / 1e6,
                    r.chunks_replayed,
                    r.chunks_discarded,
                    r.blocks_recovered
                );
            }
            Ok(engine)
        }
        Err(EngineError::NotFormatted(msg)) => bail!(
            "{msg}: run logcache format --cache {} --backing {}",
            plan.cache.display(),
            plan.backing
        ),
        Err(e) => Err(e).with_context(|| format!("opening cache {}", plan.cache.display())),
    }
}

pub fn block_termination_signals() -> Result<libc::sigset_t> {
    // SAFETY: plain libc signal-mask calls on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            bail!("blocking SIGTERM/SIGINT failed: errno {rc}");
        }
        Ok(set)
    }
}

pub fn wait_for_signal(set: &libc::sigset_t) -> &'static str {
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` was initialised by block_termination_signals.
        let rc = unsafe { libc::sigwait(set, &mut sig) };
        if rc == 0 {
            return if sig == libc::SIGINT {
                "SIGINT"
            } else {
                "SIGTERM"
            };
        }
    }
}
