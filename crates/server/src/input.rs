//! The reader's input buffer: one large read brings many requests, which are then decoded and
//! (for writes) handed to the engine straight from this buffer, without copying.

use std::io;

use crate::stream::Stream;

pub(crate) struct InputBuffer {
    bytes: Box<[u8]>,
    /// Buffered, not yet consumed bytes are `bytes[start..end]`.
    start: usize,
    end: usize,
}

impl InputBuffer {
    pub(crate) fn new(capacity_bytes: usize) -> InputBuffer {
        assert!(capacity_bytes > 0);
        InputBuffer {
            bytes: vec![0u8; capacity_bytes].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    pub(crate) fn capacity_bytes(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn buffered(&self) -> &[u8] {
        &self.bytes[self.start..self.end]
    }

    pub(crate) fn buffered_bytes(&self) -> usize {
        self.end - self.start
    }

    pub(crate) fn consume(&mut self, length_bytes: usize) {
        assert!(
            length_bytes <= self.buffered_bytes(),
            "consumed {length_bytes} bytes of {} buffered",
            self.buffered_bytes()
        );
        self.start += length_bytes;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// One `recv` into the free space; returns the bytes read, 0 at end of stream.
    ///
    /// Buffered bytes (a partial request) move to the front first, so the read gets all the room
    /// there is and a request up to the capacity always fits.
    pub(crate) fn fill(&mut self, stream: &Stream, dont_wait: bool) -> io::Result<usize> {
        if self.start > 0 {
            self.bytes.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        assert!(self.end < self.bytes.len(), "fill called on a full buffer");
        let received = stream.recv(&mut self.bytes[self.end..], dont_wait)?;
        self.end += received;
        Ok(received)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn fills_consumes_and_compacts() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = (Stream::from(a), Stream::from(b));
        let mut input = InputBuffer::new(8);
        a.send_all(b"abcdef").unwrap();
        assert_eq!(input.fill(&b, false).unwrap(), 6);
        input.consume(4);
        assert_eq!(input.buffered(), b"ef");
        a.send_all(b"ghijkl").unwrap();
        // "ef" moves to the front, leaving room for 6 more bytes.
        assert_eq!(input.fill(&b, false).unwrap(), 6);
        assert_eq!(input.buffered(), b"efghijkl");
        input.consume(8);
        assert_eq!(input.buffered_bytes(), 0);
        assert_eq!(
            input.fill(&b, true).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        drop(a);
        assert_eq!(input.fill(&b, false).unwrap(), 0);
    }
}
