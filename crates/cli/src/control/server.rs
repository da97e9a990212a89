//! The serving side of the control socket: one thread accepts, one thread per client.

use std::io::{BufRead, BufReader, Write};
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
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    pub fn start(path: &Path, served: Arc<Served>) -> Result<ControlServer> {
        let listener = bind_unix(path).context("starting the control socket")?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || accept_loop(listener, served, stop))
            .context("starting the control thread")?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            stopping,
            thread: Some(thread),
        })
    }

    /// Stops accepting and removes the socket file. Clients mid-request (a long drain) keep
    /// their thread until the engine closes under them.
    pub fn stop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wake the accept call.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: UnixListener, served: Arc<Served>, stopping: Arc<AtomicBool>) {
    for stream in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else { continue };
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
