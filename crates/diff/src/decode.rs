//! Reading an `rbd diff v1` stream (layout in [`crate::encode`]), strictly: the header, each
//! metadata record at most once and all before the data, a size record, data records sorted by
//! offset, disjoint and inside the image, an end record, and nothing after it. Anything else is
//! a [`DiffError`] naming the byte where it was found. Memory is bounded whatever the input: a
//! `w` record's data comes out in pieces of at most [`MAX_PIECE_BYTES`], names are capped at
//! [`crate::MAX_NAME_BYTES`].

use std::io::{self, Read};

use crate::{DiffError, Header, MAGIC_V1, MAGIC_V2, MAX_NAME_BYTES};
use crate::{TAG_DATA, TAG_END, TAG_FROM_SNAP, TAG_SIZE, TAG_TO_SNAP, TAG_ZERO};

/// The most data one [`Piece::Data`] carries; longer `w` records come out in several pieces.
pub const MAX_PIECE_BYTES: usize = 1 << 20;

/// What the image holds at a range, in stream order. A `w` record longer than
/// [`MAX_PIECE_BYTES`] comes out as several `Data` pieces with consecutive offsets.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    Data {
        offset_bytes: u64,
        bytes: &'a [u8],
    },
    Zero {
        offset_bytes: u64,
        length_bytes: u64,
    },
}

/// A stream being read. [`Decoder::new`] reads the header and metadata; [`Decoder::next_piece`]
/// the data until the end record, after which the whole stream has been checked.
pub struct Decoder<R: Read> {
    reader: R,
    /// Bytes of the stream consumed so far: where the next read starts.
    at_byte: u64,
    header: Header,
    /// The first data (or end) record's tag and where it was, read while looking for the end
    /// of the metadata.
    pending_tag: Option<(u8, u64)>,
    /// Where the previous data record ended: the next may not start before it.
    next_offset_bytes: u64,
    /// Inside a `w` record: where its next unread byte goes, and how many are left.
    data_offset_bytes: u64,
    data_left_bytes: u64,
    buf: Vec<u8>,
    ended: bool,
}

impl<R: Read> Decoder<R> {
    /// Reads the header and the metadata records.
    pub fn new(reader: R) -> Result<Decoder<R>, DiffError> {
        let mut d = Decoder {
            reader,
            at_byte: 0,
            header: Header {
                from_snap: None,
                to_snap: None,
                size_bytes: 0,
            },
            pending_tag: None,
            next_offset_bytes: 0,
            data_offset_bytes: 0,
            data_left_bytes: 0,
            buf: Vec::new(),
            ended: false,
        };
        let mut magic = [0u8; MAGIC_V1.len()];
        let n = d.read_some(&mut magic)?;
        if n == magic.len() && &magic == MAGIC_V2 {
            return Err(DiffError::Version2);
        }
        if n == 0 {
            return Err(DiffError::Empty);
        }
        if n < magic.len() && magic[..n] == MAGIC_V1[..n] {
            return Err(d.truncated("the header"));
        }
        if &magic != MAGIC_V1 {
            return Err(DiffError::NotADiff {
                found: String::from_utf8_lossy(&magic[..n]).into_owned(),
            });
        }
        let mut size_bytes = None;
        loop {
            let at_byte = d.at_byte;
            let tag = d.read_tag("the metadata records, before any end record")?;
            match tag {
                TAG_FROM_SNAP | TAG_TO_SNAP => {
                    let present = if tag == TAG_FROM_SNAP {
                        d.header.from_snap.is_some()
                    } else {
                        d.header.to_snap.is_some()
                    };
                    if present {
                        return Err(DiffError::Duplicate {
                            tag: tag as char,
                            at_byte,
                        });
                    }
                    let name = d.read_name()?;
                    if tag == TAG_FROM_SNAP {
                        d.header.from_snap = Some(name);
                    } else {
                        d.header.to_snap = Some(name);
                    }
                }
                TAG_SIZE => {
                    if size_bytes.is_some() {
                        return Err(DiffError::Duplicate { tag: 's', at_byte });
                    }
                    size_bytes = Some(d.read_u64("a size record")?);
                }
                TAG_DATA | TAG_ZERO | TAG_END => {
                    d.pending_tag = Some((tag, at_byte));
                    break;
                }
                _ => return Err(DiffError::UnknownTag { tag, at_byte }),
            }
        }
        let Some(size_bytes) = size_bytes else {
            let at_byte = d.pending_tag.map_or(d.at_byte, |(_, at)| at);
            return Err(DiffError::MissingSize { at_byte });
        };
        d.header.size_bytes = size_bytes;
        Ok(d)
    }

    /// The stream's metadata.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Bytes of the stream read so far.
    pub fn position_bytes(&self) -> u64 {
        self.at_byte
    }

    /// The next piece of data, or `None` after the end record (and once the stream is known to
    /// hold nothing after it).
    pub fn next_piece(&mut self) -> Result<Option<Piece<'_>>, DiffError> {
        if self.data_left_bytes == 0 {
            if self.ended {
                return Ok(None);
            }
            let (tag, at_byte) = match self.pending_tag.take() {
                Some(pending) => pending,
                None => {
                    let at_byte = self.at_byte;
                    (
                        self.read_tag("the data records, before any end record")?,
                        at_byte,
                    )
                }
            };
            match tag {
                TAG_DATA | TAG_ZERO => {
                    let (offset_bytes, length_bytes) = self.read_extent(tag, at_byte)?;
                    if tag == TAG_ZERO {
                        return Ok(Some(Piece::Zero {
                            offset_bytes,
                            length_bytes,
                        }));
                    }
                    self.data_offset_bytes = offset_bytes;
                    self.data_left_bytes = length_bytes;
                }
                TAG_END => {
                    self.ended = true;
                    let mut probe = [0u8; 1];
                    if self.read_some(&mut probe)? > 0 {
                        return Err(DiffError::TrailingBytes {
                            at_byte: self.at_byte - 1,
                        });
                    }
                    return Ok(None);
                }
                TAG_FROM_SNAP | TAG_TO_SNAP | TAG_SIZE => {
                    return Err(DiffError::MetadataAfterData {
                        tag: tag as char,
                        at_byte,
                    })
                }
                _ => return Err(DiffError::UnknownTag { tag, at_byte }),
            }
        }
        let n = self.data_left_bytes.min(MAX_PIECE_BYTES as u64) as usize;
        if self.buf.len() < n {
            self.buf.resize(n, 0);
        }
        let mut buf = std::mem::take(&mut self.buf);
        let got = self.read_some(&mut buf[..n]);
        self.buf = buf;
        if got? < n {
            return Err(self.truncated("the data of a 'w' record"));
        }
        let offset_bytes = self.data_offset_bytes;
        self.data_offset_bytes += n as u64;
        self.data_left_bytes -= n as u64;
        Ok(Some(Piece::Data {
            offset_bytes,
            bytes: &self.buf[..n],
        }))
    }

    /// Reads a `w` or `z` record's offset and length and checks them against the previous
    /// record and the image size.
    fn read_extent(&mut self, tag: u8, at_byte: u64) -> Result<(u64, u64), DiffError> {
        let inside = if tag == TAG_DATA {
            "a 'w' record's offset and length"
        } else {
            "a 'z' record's offset and length"
        };
        let offset_bytes = self.read_u64(inside)?;
        let length_bytes = self.read_u64(inside)?;
        let tag = tag as char;
        if length_bytes == 0 {
            return Err(DiffError::EmptyRecord {
                tag,
                at_byte,
                offset_bytes,
            });
        }
        if offset_bytes < self.next_offset_bytes {
            return Err(DiffError::OutOfOrder {
                tag,
                at_byte,
                offset_bytes,
                length_bytes,
                previous_end_bytes: self.next_offset_bytes,
            });
        }
        let size_bytes = self.header.size_bytes;
        match offset_bytes.checked_add(length_bytes) {
            Some(end_bytes) if end_bytes <= size_bytes => {
                self.next_offset_bytes = end_bytes;
                Ok((offset_bytes, length_bytes))
            }
            _ => Err(DiffError::PastEnd {
                tag,
                at_byte,
                offset_bytes,
                length_bytes,
                size_bytes,
            }),
        }
    }

    fn read_name(&mut self) -> Result<Vec<u8>, DiffError> {
        let len_at = self.at_byte;
        let mut len = [0u8; 4];
        self.read_exact(&mut len, "a snapshot name's length")?;
        let len_bytes = u32::from_le_bytes(len) as u64;
        if len_bytes > MAX_NAME_BYTES as u64 {
            return Err(DiffError::NameTooLong {
                len_bytes,
                at_byte: Some(len_at),
            });
        }
        let mut name = vec![0u8; len_bytes as usize];
        self.read_exact(&mut name, "a snapshot name")?;
        Ok(name)
    }

    fn read_tag(&mut self, inside: &'static str) -> Result<u8, DiffError> {
        let mut tag = [0u8; 1];
        self.read_exact(&mut tag, inside)?;
        Ok(tag[0])
    }

    fn read_u64(&mut self, inside: &'static str) -> Result<u64, DiffError> {
        let mut v = [0u8; 8];
        self.read_exact(&mut v, inside)?;
        Ok(u64::from_le_bytes(v))
    }

    fn read_exact(&mut self, buf: &mut [u8], inside: &'static str) -> Result<(), DiffError> {
        if self.read_some(buf)? < buf.len() {
            return Err(self.truncated(inside));
        }
        Ok(())
    }

    /// Reads until `buf` is full or the stream ends; returns the bytes read.
    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize, DiffError> {
        let mut done = 0;
        while done < buf.len() {
            match self.reader.read(&mut buf[done..]) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(DiffError::Read(e)),
            }
        }
        self.at_byte += done as u64;
        Ok(done)
    }

    fn truncated(&self, inside: &'static str) -> DiffError {
        DiffError::Truncated {
            at_byte: self.at_byte,
            inside,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Encoder;

    /// Every piece of a stream, data copied out.
    #[derive(Debug, PartialEq, Eq)]
    enum Owned {
        Data(u64, Vec<u8>),
        Zero(u64, u64),
    }

    fn decode_all(bytes: &[u8]) -> Result<(Header, Vec<Owned>), DiffError> {
        let mut d = Decoder::new(bytes)?;
        let mut out = Vec::new();
        while let Some(p) = d.next_piece()? {
            out.push(match p {
                Piece::Data {
                    offset_bytes,
                    bytes,
                } => Owned::Data(offset_bytes, bytes.to_vec()),
                Piece::Zero {
                    offset_bytes,
                    length_bytes,
                } => Owned::Zero(offset_bytes, length_bytes),
            });
        }
        Ok((d.header().clone(), out))
    }

    fn stream(tail: &[u8]) -> Vec<u8> {
        let mut v = MAGIC_V1.to_vec();
        v.extend_from_slice(tail);
        v
    }

    fn extent(tag: u8, offset: u64, len: u64) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend(offset.to_le_bytes());
        v.extend(len.to_le_bytes());
        v
    }

    fn size(bytes: u64) -> Vec<u8> {
        let mut v = vec![b's'];
        v.extend(bytes.to_le_bytes());
        v
    }

    #[test]
    fn reads_a_hand_built_stream() {
        let mut tail = vec![b't', 1, 0, 0, 0, b'B'];
        tail.extend(size(8192));
        tail.extend([b'f', 2, 0, 0, 0, b'A', b'A']);
        tail.extend(extent(b'w', 512, 3));
        tail.extend([7, 8, 9]);
        tail.extend(extent(b'z', 515, 1000));
        tail.push(b'e');
        let (h, pieces) = decode_all(&stream(&tail)).unwrap();
        assert_eq!(h.from_snap.as_deref(), Some(&b"AA"[..]));
        assert_eq!(h.to_snap.as_deref(), Some(&b"B"[..]));
        assert_eq!(h.size_bytes, 8192);
        assert_eq!(
            pieces,
            vec![Owned::Data(512, vec![7, 8, 9]), Owned::Zero(515, 1000)]
        );
    }

    #[test]
    fn long_data_comes_out_in_bounded_pieces() {
        let header = Header {
            from_snap: None,
            to_snap: None,
            size_bytes: 4 << 20,
        };
        let data: Vec<u8> = (0..(MAX_PIECE_BYTES * 2 + 100)).map(|i| i as u8).collect();
        let mut e = Encoder::new(Vec::new(), &header).unwrap();
        e.data(4096, &data).unwrap();
        let bytes = e.finish().unwrap();
        let (_, pieces) = decode_all(&bytes).unwrap();
        assert_eq!(pieces.len(), 3);
        let mut joined = Vec::new();
        let mut at = 4096;
        for p in pieces {
            let Owned::Data(offset, d) = p else {
                panic!("{p:?}")
            };
            assert_eq!(offset, at);
            assert!(d.len() <= MAX_PIECE_BYTES);
            at += d.len() as u64;
            joined.extend(d);
        }
        assert_eq!(joined, data);
    }

    fn err(bytes: &[u8]) -> DiffError {
        match decode_all(bytes) {
            Ok(r) => panic!("decoded {r:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn refuses_what_is_not_a_v1_stream() {
        assert!(matches!(
            err(b"hello world, this is long"),
            DiffError::NotADiff { .. }
        ));
        assert!(matches!(err(b""), DiffError::Empty));
        assert!(matches!(
            err(b"rbd di"),
            DiffError::Truncated { at_byte: 6, .. }
        ));
        assert!(matches!(err(b"rbd diff v2\nxx"), DiffError::Version2));
        let e = err(b"\x00\x01binary");
        assert!(
            e.to_string().starts_with("not an rbd diff v1 stream"),
            "{e}"
        );
    }

    #[test]
    fn refuses_a_truncated_stream_at_every_cut() {
        let mut tail = vec![b'f', 1, 0, 0, 0, b'A'];
        tail.extend(size(1 << 20));
        tail.extend(extent(b'w', 0, 4));
        tail.extend([1, 2, 3, 4]);
        tail.extend(extent(b'z', 4096, 4096));
        tail.push(b'e');
        let full = stream(&tail);
        decode_all(&full).unwrap();
        for cut in 1..full.len() {
            let e = err(&full[..cut]);
            match e {
                DiffError::Truncated { at_byte, .. } => assert_eq!(at_byte, cut as u64),
                other => panic!("cut at {cut}: {other}"),
            }
        }
    }

    #[test]
    fn refuses_unknown_tags_and_misplaced_metadata() {
        let mut tail = size(4096);
        tail.push(b'x');
        assert!(matches!(
            err(&stream(&tail)),
            DiffError::UnknownTag {
                tag: b'x',
                at_byte: 21
            }
        ));
        let mut tail = size(4096);
        tail.extend(extent(b'z', 0, 512));
        tail.extend([b'f', 0, 0, 0, 0]);
        assert!(matches!(
            err(&stream(&tail)),
            DiffError::MetadataAfterData {
                tag: 'f',
                at_byte: 38
            }
        ));
        let mut tail = size(4096);
        tail.extend(size(4096));
        assert!(matches!(
            err(&stream(&tail)),
            DiffError::Duplicate {
                tag: 's',
                at_byte: 21
            }
        ));
        let tail = extent(b'z', 0, 512);
        assert!(matches!(
            err(&stream(&tail)),
            DiffError::MissingSize { at_byte: 12 }
        ));
        let mut tail = size(4096);
        tail.extend([b'e', b'e']);
        assert!(matches!(
            err(&stream(&tail)),
            DiffError::TrailingBytes { at_byte: 22 }
        ));
        let mut tail = vec![b't'];
        tail.extend(5000u32.to_le_bytes());
        assert!(matches!(
            err(&stream(&tail)),
            DiffError::NameTooLong {
                len_bytes: 5000,
                at_byte: Some(13)
            }
        ));
    }

    #[test]
    fn refuses_records_out_of_order_overlapping_empty_or_past_the_end() {
        let case = |records: &[(u8, u64, u64)]| {
            let mut tail = size(8192);
            for &(tag, offset, len) in records {
                tail.extend(extent(tag, offset, len));
                if tag == b'w' {
                    tail.extend(vec![0u8; len as usize]);
                }
            }
            tail.push(b'e');
            decode_all(&stream(&tail)).map(|_| ())
        };
        case(&[(b'z', 0, 512), (b'w', 512, 10), (b'z', 522, 7670)]).unwrap();
        assert!(matches!(
            case(&[(b'z', 1024, 512), (b'w', 0, 10)]),
            Err(DiffError::OutOfOrder {
                previous_end_bytes: 1536,
                ..
            })
        ));
        assert!(matches!(
            case(&[(b'w', 0, 10), (b'z', 9, 10)]),
            Err(DiffError::OutOfOrder {
                offset_bytes: 9,
                ..
            })
        ));
        assert!(matches!(
            case(&[(b'z', 4096, 0)]),
            Err(DiffError::EmptyRecord { tag: 'z', .. })
        ));
        assert!(matches!(
            case(&[(b'z', 8000, 193)]),
            Err(DiffError::PastEnd {
                size_bytes: 8192,
                ..
            })
        ));
        assert!(matches!(
            case(&[(b'z', 1, u64::MAX)]),
            Err(DiffError::PastEnd { .. })
        ));
        let e = case(&[(b'w', 100, 10), (b'w', 50, 10)]).unwrap_err();
        assert!(e.to_string().contains("sorted by offset"), "{e}");
    }

    /// A reader that fails: its error comes out as `Read`, not as a truncation.
    #[test]
    fn a_failing_reader_is_a_read_error() {
        struct Failing;
        impl Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("disk on fire"))
            }
        }
        let e = Decoder::new(Failing).err().unwrap();
        assert!(matches!(e, DiffError::Read(_)));
        assert!(e.to_string().contains("disk on fire"), "{e}");
    }
}
