//! The client side of the control socket, used by `status`, `set` and `drain`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

pub struct ControlClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl ControlClient {
    pub fn connect(path: &Path) -> Result<ControlClient> {
        let stream = UnixStream::connect(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => anyhow!(
                "no logcache is serving with control socket {} ({e}); start logcache serve, or pass --control PATH",
                path.display()
            ),
            _ => anyhow!("connecting to control socket {}: {e}", path.display()),
        })?;
        let writer = stream.try_clone().context("cloning the control socket")?;
        Ok(ControlClient {
            reader: BufReader::new(stream),
            writer,
        })
    }

    /// Sends one request whose answer is a framed byte stream (`frames`), copied to `out`;
    /// returns the final reply.
    pub fn call_stream(&mut self, request: &Value, out: &mut impl Write) -> Result<Value> {
        let mut line = serde_json::to_string(request)?;
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .context("sending to the control socket")?;
        super::frames::copy_frames(&mut self.reader, out)
            .context("receiving the stream from the control socket (did logcache stop?)")?;
        out.flush().context("writing the stream")?;
        self.call_reply()
    }

    fn call_reply(&mut self) -> Result<Value> {
        let v = self.read_reply()?;
        final_reply(v)
    }

    /// One JSON line from the control socket.
    fn read_reply(&mut self) -> Result<Value> {
        let mut reply = String::new();
        let n = self
            .reader
            .read_line(&mut reply)
            .context("reading from the control socket")?;
        if n == 0 {
            bail!("logcache closed the control connection before replying (did it stop?)");
        }
        serde_json::from_str(&reply)
            .with_context(|| format!("bad reply on the control socket: {reply:?}"))
    }

    /// Sends one request and returns the final reply, handing each progress line to
    /// `on_progress` on the way.
    pub fn call(&mut self, request: &Value, mut on_progress: impl FnMut(&Value)) -> Result<Value> {
        let mut line = serde_json::to_string(request)?;
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .context("sending to the control socket")?;
        loop {
            let v = self.read_reply()?;
            if let Some(p) = v.get("progress") {
                on_progress(p);
                continue;
            }
            return final_reply(v);
        }
    }
}

/// A final reply: itself when it says ok, else its error as the message.
fn final_reply(v: Value) -> Result<Value> {
    if v.get("ok") == Some(&Value::Bool(true)) {
        return Ok(v);
    }
    let msg = v
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("unknown error");
    bail!("{msg}");
}
