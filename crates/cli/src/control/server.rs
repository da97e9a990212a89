//! The serving side of the control socket: one thread accepts, one thread per client.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::control::frames::FrameWriter;
use crate::served::Served;
use crate::sockets::bind_unix;

pub struct ControlServer {
    path: PathBuf,
    /// The socket file's identity, to remove it on stop only if it is still the one we bound.
    file_id: Option<(u64, u64)>,
    stopping: Arc<AtomicBool>,
    /// Writing to it wakes the accept loop. (Connecting to `path` did, until the file was
    /// removed under a running serve: then a SIGTERMed serve waited for the stop's deadline
    /// and exited without a clean checkpoint, blaming the backing device.)
    waker: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    pub fn start(path: &Path, served: Arc<Served>) -> Result<ControlServer> {
        let listener = bind_unix(path).context("starting the control socket")?;
        listener
            .set_nonblocking(true)
            .context("starting the control socket")?;
        let file_id = std::fs::symlink_metadata(path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        let (waker, wake) = UnixStream::pair().context("starting the control socket's waker")?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || accept_loop(listener, &wake, served, stop))
            .context("starting the control thread")?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            file_id,
            stopping,
            waker,
            thread: Some(thread),
        })
    }

    /// Stops accepting and removes the socket file (if it is still ours: a newer serve may
    /// own the path). Clients mid-request (a long drain) keep their thread until the engine
    /// closes under them.
    pub fn stop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = self.waker.write_all(&[1]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| Some((m.dev(), m.ino())) == self.file_id);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Accepts clients until `wake` is readable (or closed). Polls both, so the loop ends whatever
/// happened to the socket file.
fn accept_loop(
    listener: UnixListener,
    wake: &UnixStream,
    served: Arc<Served>,
    stopping: Arc<AtomicBool>,
) {
    let events = libc::POLLIN;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd structures for the whole call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // Cannot wait for clients any more: the control socket stops answering; serving
            // goes on.
            eprintln!("logcache: warning: the control socket stopped accepting clients: {e}");
            break;
        }
        if fds[1].revents != 0 || stopping.load(Ordering::SeqCst) {
            break;
        }
        if fds[0].revents == 0 {
            continue;
        }
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            // A client gone before its accept (the listener does not block: `poll` waits).
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            // Out of descriptors, say: a pause, not a spin.
            Err(_) => {
                std::thread::sleep(std::time::Duration::from_millis(20));
                continue;
            }
        };
        // Accepted sockets do not inherit the listener's non-blocking mode (accept4 without
        // SOCK_NONBLOCK); said again in case a platform differs.
        let _ = stream.set_nonblocking(false);
        let served = served.clone();
        let _ = std::thread::Builder::new()
            .name("control-client".into())
            .spawn(move || {
                let _ = serve_client(stream, &served);
            });
    }
}

fn serve_client(stream: UnixStream, served: &Served) -> std::io::Result<()> {
    let mut writer = stream.try_clone()?;
    let reader = BufReader::new(stream);
    for line in reader.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(req) if req.get("cmd").and_then(Value::as_str) == Some("export_diff") => {
                export_diff(&req, served, &mut writer)?
            }
            Ok(req) => handle(&req, served, &mut writer),
            Err(e) => json!({"ok": false, "error": format!("bad request {line:?}: {e}")}),
        };
        send(&mut writer, &reply)?;
    }
    Ok(())
}

fn send(w: &mut UnixStream, v: &Value) -> std::io::Result<()> {
    let mut line = v.to_string();
    line.push('\n');
    w.write_all(line.as_bytes())
}

/// `export_diff`: the stream in frames, then the reply. A client that goes away mid-stream
/// makes the export fail (and its checkpoint be deleted).
fn export_diff(req: &Value, served: &Served, writer: &mut UnixStream) -> std::io::Result<Value> {
    let since = req.get("since").and_then(Value::as_str).unwrap_or("");
    let new = req.get("checkpoint").and_then(Value::as_str);
    let mut frames = FrameWriter::new(&mut *writer);
    let res = crate::export_diff::export(&served.engine, since, new, &mut frames);
    frames.end()?;
    Ok(match res {
        Ok(e) => json!({
            "ok": true,
            "checkpoint": e.checkpoint,
            "data_bytes": e.data_bytes,
            "zero_bytes": e.zero_bytes,
            "kept_bytes": e.kept_bytes,
        }),
        Err(e) => json!({"ok": false, "error": format!("{e:#}")}),
    })
}

fn checkpoint_json(c: &logcache_engine::CheckpointInfo) -> Value {
    json!({
        "name": c.name,
        "created_unix_ms": c.created_unix_ms,
        "changed_bytes": c.changed_bytes,
    })
}

fn handle(req: &Value, served: &Served, writer: &mut UnixStream) -> Value {
    let fail = |e: String| json!({"ok": false, "error": e});
    match req.get("cmd").and_then(Value::as_str) {
        Some("status") => json!({"ok": true, "status": served.status()}),
        Some("tunables") => json!({"ok": true, "tunables": served.tunables_json()}),
        Some("set") => {
            let key = req.get("key").and_then(Value::as_str).unwrap_or("");
            let value = req.get("value").and_then(Value::as_str).unwrap_or("");
            match served.engine.set_tunable(key, value) {
                Ok(()) => json!({"ok": true}),
                Err(e) => fail(e.to_string()),
            }
        }
        Some("drain") => {
            let res = served.engine.drain(|p| {
                let _ = send(
                    writer,
                    &json!({"progress": {
                        "dirty_blocks": p.dirty_blocks,
                        "dirty_blocks_at_start": p.dirty_blocks_at_start,
                        "written_back_blocks": p.written_back_blocks,
                    }}),
                );
            });
            match res {
                Ok(()) => json!({"ok": true, "status": served.status()}),
                Err(e) => fail(e.to_string()),
            }
        }
        Some("checkpoint_create") => {
            let name = req.get("name").and_then(Value::as_str).unwrap_or("");
            match served.engine.checkpoint_create(name) {
                Ok(c) => json!({"ok": true, "checkpoint": checkpoint_json(&c)}),
                Err(e) => fail(e.to_string()),
            }
        }
        Some("checkpoint_delete") => {
            let name = req.get("name").and_then(Value::as_str).unwrap_or("");
            match served.engine.checkpoint_delete(name) {
                Ok(()) => json!({"ok": true}),
                Err(e) => fail(e.to_string()),
            }
        }
        Some("checkpoint_list") => {
            let list: Vec<Value> = served
                .engine
                .checkpoints()
                .iter()
                .map(checkpoint_json)
                .collect();
            json!({"ok": true, "checkpoints": list})
        }
        Some(other) => fail(format!(
            "unknown command {other:?}; known: status, tunables, set, drain, checkpoint_create, checkpoint_delete, checkpoint_list, export_diff"
        )),
        None => fail("request lacks \"cmd\"".into()),
    }
}
