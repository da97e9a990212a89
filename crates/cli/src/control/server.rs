//! The serving side of the control socket: one thread accepts, one thread per client.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use logcache_server::{wait_for_client, Readiness, SocketFile};

use crate::control::frames::FrameWriter;
use crate::served::Served;
use crate::sockets::bind_unix;

pub struct ControlServer {
    /// The socket file, removed on stop if it is still the one bound.
    file: Option<SocketFile>,
    /// Writing to it wakes the accept loop. (Connecting to the socket's path did, until the
    /// file was removed under a running serve: then a SIGTERMed serve waited for the stop's
    /// deadline and exited without a clean checkpoint, blaming the backing device.)
    waker: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    pub fn start(path: &Path, served: Arc<Served>) -> Result<ControlServer> {
        let listener = bind_unix(path).context("starting the control socket")?;
        listener
            .set_nonblocking(true)
            .context("starting the control socket")?;
        let file = SocketFile::of(path).ok();
        let (waker, wake) = UnixStream::pair().context("starting the control socket's waker")?;
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || accept_loop(listener, &wake, served))
            .context("starting the control thread")?;
        Ok(ControlServer {
            file,
            waker,
            thread: Some(thread),
        })
    }

    /// Stops accepting and removes the socket file (if it is still ours: a newer serve may
    /// own the path). Clients mid-request (a long drain) keep their thread until the engine
    /// closes under them.
    pub fn stop(&mut self) {
        let _ = self.waker.write_all(&[1]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(file) = self.file.take() {
            file.remove_if_ours();
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Accepts clients until `wake` is written to (`ControlServer::stop`).
fn accept_loop(listener: UnixListener, wake: &UnixStream, served: Arc<Served>) {
    while wait_for_client(listener.as_raw_fd(), wake) == Readiness::Client {
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
