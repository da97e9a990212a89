//! Binary frames on the control socket, for `export-diff`'s stream: after the request, the
//! server sends frames `[u32 LE length][bytes]`, then a frame of length 0, then its usual
//! JSON reply line (`{"ok":true,...}` or `{"ok":false,"error":...}`).

use std::io::{self, Read, Write};

/// Most bytes in one frame: writes are buffered up to this.
pub const FRAME_MAX_BYTES: usize = 1 << 20;

/// Buffers writes into frames.
pub struct FrameWriter<W: Write> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: Write> FrameWriter<W> {
    pub fn new(inner: W) -> FrameWriter<W> {
        FrameWriter {
            inner,
            buf: Vec::with_capacity(FRAME_MAX_BYTES),
        }
    }

    fn send(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.inner
                .write_all(&(self.buf.len() as u32).to_le_bytes())?;
            self.inner.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Sends what is buffered and the end frame.
    pub fn end(mut self) -> io::Result<W> {
        self.send()?;
        self.inner.write_all(&0u32.to_le_bytes())?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for FrameWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(FRAME_MAX_BYTES - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == FRAME_MAX_BYTES {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()?;
        self.inner.flush()
    }
}

/// Copies frames from `from` to `to` until the end frame; returns the bytes copied.
pub fn copy_frames(from: &mut impl Read, to: &mut impl Write) -> io::Result<u64> {
    let mut total = 0;
    let mut buf = Vec::new();
    loop {
        let mut len = [0u8; 4];
        from.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len == 0 {
            return Ok(total);
        }
        if len > FRAME_MAX_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a control frame of {len} bytes"),
            ));
        }
        buf.resize(len, 0);
        from.read_exact(&mut buf)?;
        to.write_all(&buf)?;
        total += len as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let data: Vec<u8> = (0..(3 * FRAME_MAX_BYTES + 17)).map(|i| i as u8).collect();
        let mut w = FrameWriter::new(Vec::new());
        w.write_all(&data[..5]).unwrap();
        w.write_all(&data[5..]).unwrap();
        let wire = w.end().unwrap();
        let mut out = Vec::new();
        let n = copy_frames(&mut &wire[..], &mut out).unwrap();
        assert_eq!(n as usize, data.len());
        assert_eq!(out, data);
    }
}
