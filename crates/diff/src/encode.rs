//! Writing an `rbd diff v1` stream. The layout (Ceph's `doc/dev/rbd-diff.rst`; integers
//! little-endian, no padding, no checksum):
//!
//! ```text
//! stream = | header | metadata record ... | data record ... | end record |
//!
//! header:  "rbd diff v1\n"  (12 bytes)
//!
//! metadata records, any order, each at most once, all before the first data record:
//!   from snapshot   | 0 | 1 | 'f' | 1 | 4 | name length n (le32) | 5 | n | name bytes
//!   to snapshot     | 0 | 1 | 't' | 1 | 4 | name length n (le32) | 5 | n | name bytes
//!   image size      | 0 | 1 | 's' | 1 | 8 | size in bytes (le64), after the changes
//!
//! data records, sorted by offset, disjoint, inside the image:
//!   updated data    | 0 | 1 | 'w' | 1 | 8 | offset (le64) | 9 | 8 | length l (le64) | 17 | l | data
//!   zero range      | 0 | 1 | 'z' | 1 | 8 | offset (le64) | 9 | 8 | length (le64)
//!
//! end record:       | 0 | 1 | 'e'
//! ```
//!
//! (| offset | length | field |, offsets within the record.) Ceph writes `s` in every stream;
//! this codec requires it, since without it neither a record past the end nor a target of the
//! wrong size can be told. A bytes-free `w` or `z` is never written. The order and disjointness
//! of data records is WalB's wdiff property: applying the records in any order gives the same
//! image, and a reader can check a stream in one pass.

use std::io::{self, Write};

use crate::{Header, MAGIC_V1, MAX_NAME_BYTES, TAG_DATA, TAG_END, TAG_FROM_SNAP, TAG_SIZE};
use crate::{TAG_TO_SNAP, TAG_ZERO};

/// Bytes of a data record before its data: tag, offset, length.
pub const EXTENT_HEADER_BYTES: usize = 17;

/// Writes one stream: the header and metadata at [`Encoder::new`], then data records in offset
/// order, then the end record at [`Encoder::finish`]. A caller that breaks the order, overlaps
/// two records or writes past the image size is a bug: the encoder panics rather than write a
/// stream `rbd import-diff` would apply wrongly.
pub struct Encoder<W: Write> {
    writer: W,
    size_bytes: u64,
    /// Where the previous data record ended: the next one may not start before it.
    next_offset_bytes: u64,
    records: u64,
}

impl<W: Write> Encoder<W> {
    /// Writes the header and the metadata records. Names longer than [`MAX_NAME_BYTES`] panic
    /// (check them with [`crate::check_name`] first).
    pub fn new(mut writer: W, header: &Header) -> io::Result<Encoder<W>> {
        writer.write_all(MAGIC_V1)?;
        for (tag, name) in [
            (TAG_FROM_SNAP, &header.from_snap),
            (TAG_TO_SNAP, &header.to_snap),
        ] {
            if let Some(name) = name {
                assert!(
                    name.len() <= MAX_NAME_BYTES,
                    "snapshot name of {} bytes",
                    name.len()
                );
                writer.write_all(&[tag])?;
                writer.write_all(&(name.len() as u32).to_le_bytes())?;
                writer.write_all(name)?;
            }
        }
        writer.write_all(&[TAG_SIZE])?;
        writer.write_all(&header.size_bytes.to_le_bytes())?;
        Ok(Encoder {
            writer,
            size_bytes: header.size_bytes,
            next_offset_bytes: 0,
            records: 0,
        })
    }

    /// A `w` record: `data` is what the image holds from `offset_bytes` on.
    pub fn data(&mut self, offset_bytes: u64, data: &[u8]) -> io::Result<()> {
        self.data_vectored(offset_bytes, &[data])
    }

    /// A `w` record whose data is `parts` one after another (so a caller need not copy blocks
    /// read separately into one buffer).
    pub fn data_vectored(&mut self, offset_bytes: u64, parts: &[&[u8]]) -> io::Result<()> {
        let length_bytes: u64 = parts.iter().map(|p| p.len() as u64).sum();
        self.extent(TAG_DATA, offset_bytes, length_bytes)?;
        for part in parts {
            self.writer.write_all(part)?;
        }
        Ok(())
    }

    /// A `z` record: `length_bytes` from `offset_bytes` read as zeros.
    pub fn zero(&mut self, offset_bytes: u64, length_bytes: u64) -> io::Result<()> {
        self.extent(TAG_ZERO, offset_bytes, length_bytes)
    }

    /// Writes the end record and returns the writer (not flushed: the caller owns it).
    pub fn finish(mut self) -> io::Result<W> {
        self.writer.write_all(&[TAG_END])?;
        Ok(self.writer)
    }

    /// Data records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    fn extent(&mut self, tag: u8, offset_bytes: u64, length_bytes: u64) -> io::Result<()> {
        assert!(length_bytes > 0, "an empty '{}' record", tag as char);
        assert!(
            offset_bytes >= self.next_offset_bytes,
            "'{}' record at {offset_bytes} before the previous record's end {}: records must be \
             sorted and disjoint",
            tag as char,
            self.next_offset_bytes
        );
        let end_bytes = offset_bytes
            .checked_add(length_bytes)
            .expect("record end overflows");
        assert!(
            end_bytes <= self.size_bytes,
            "'{}' record {offset_bytes}+{length_bytes} past the image size {}",
            tag as char,
            self.size_bytes
        );
        let mut head = [0u8; EXTENT_HEADER_BYTES];
        head[0] = tag;
        head[1..9].copy_from_slice(&offset_bytes.to_le_bytes());
        head[9..17].copy_from_slice(&length_bytes.to_le_bytes());
        self.writer.write_all(&head)?;
        self.next_offset_bytes = end_bytes;
        self.records += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream built by hand from the documented layout, byte by byte: the encoder must write
    /// exactly these bytes.
    #[test]
    fn writes_the_documented_layout() {
        let header = Header {
            from_snap: Some(b"a".to_vec()),
            to_snap: Some(b"bc".to_vec()),
            size_bytes: 0x1_0000,
        };
        let mut e = Encoder::new(Vec::new(), &header).unwrap();
        e.data(0x200, &[0xAA, 0xBB]).unwrap();
        e.zero(0x202, 0x1000).unwrap();
        e.data_vectored(0x2000, &[&[1], &[2, 3]]).unwrap();
        assert_eq!(e.records(), 3);
        let got = e.finish().unwrap();

        let mut want = b"rbd diff v1\n".to_vec();
        want.extend([b'f', 1, 0, 0, 0, b'a']);
        want.extend([b't', 2, 0, 0, 0, b'b', b'c']);
        want.extend([b's', 0, 0, 1, 0, 0, 0, 0, 0]);
        want.extend([
            b'w', 0, 2, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0xAA, 0xBB,
        ]);
        want.extend([b'z', 2, 2, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0]);
        want.extend([
            b'w', 0, 0x20, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3,
        ]);
        want.push(b'e');
        assert_eq!(got, want);
    }

    #[test]
    fn an_image_with_no_changes_is_header_size_and_end() {
        let header = Header {
            from_snap: None,
            to_snap: None,
            size_bytes: 512,
        };
        let got = Encoder::new(Vec::new(), &header).unwrap().finish().unwrap();
        assert_eq!(got, b"rbd diff v1\ns\x00\x02\x00\x00\x00\x00\x00\x00e");
    }

    fn encoder(size_bytes: u64) -> Encoder<Vec<u8>> {
        let header = Header {
            from_snap: None,
            to_snap: None,
            size_bytes,
        };
        Encoder::new(Vec::new(), &header).unwrap()
    }

    #[test]
    #[should_panic(expected = "sorted and disjoint")]
    fn an_overlapping_record_is_a_bug() {
        let mut e = encoder(4096);
        e.data(0, &[0; 512]).unwrap();
        e.zero(511, 1).unwrap();
    }

    #[test]
    #[should_panic(expected = "sorted and disjoint")]
    fn an_unsorted_record_is_a_bug() {
        let mut e = encoder(4096);
        e.zero(1024, 512).unwrap();
        e.data(0, &[0; 512]).unwrap();
    }

    #[test]
    #[should_panic(expected = "past the image size")]
    fn a_record_past_the_end_is_a_bug() {
        encoder(4096).zero(4095, 2).unwrap();
    }

    #[test]
    #[should_panic(expected = "empty")]
    fn an_empty_record_is_a_bug() {
        encoder(4096).data(0, &[]).unwrap();
    }

    #[test]
    fn adjacent_records_are_fine() {
        let mut e = encoder(4096);
        e.data(0, &[1; 512]).unwrap();
        e.zero(512, 512).unwrap();
        e.data(1024, &[2; 3072]).unwrap();
        e.finish().unwrap();
    }
}
