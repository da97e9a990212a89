//! Seeded round trips: random headers and random sorted, disjoint runs of `w` and `z` records
//! (unaligned offsets and lengths, adjacent and spread out, long records that decode in several
//! pieces) are encoded, decoded and applied to an image; the decoded records and the image must
//! equal what was encoded. `LOGCACHE_SEED=<seed>` replays a failure.

use logcache_diff::{Decoder, Encoder, Header, Piece};
use logcache_testkit::rng::{seed_from_env, Rng};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Record {
    Data(u64, Vec<u8>),
    Zero(u64, u64),
}

fn random_name(rng: &mut Rng) -> Option<Vec<u8>> {
    if rng.chance(1, 3) {
        return None;
    }
    let mut name = vec![0u8; rng.below(24) as usize];
    rng.fill(&mut name);
    Some(name)
}

/// Sorted, disjoint records inside `size_bytes`.
fn random_records(rng: &mut Rng, size_bytes: u64) -> Vec<Record> {
    let mut records = Vec::new();
    let mut at = 0u64;
    loop {
        // Adjacent a third of the time, else a gap.
        if !rng.chance(1, 3) {
            at += rng.below(size_bytes / 8 + 1);
        }
        if at >= size_bytes {
            return records;
        }
        let max_len = (size_bytes - at).min(if rng.chance(1, 10) { 3 << 20 } else { 70_000 });
        let len = rng.range(1, max_len);
        if rng.chance(1, 2) {
            let mut data = vec![0u8; len as usize];
            rng.fill(&mut data);
            records.push(Record::Data(at, data));
        } else {
            records.push(Record::Zero(at, len));
        }
        at += len;
    }
}

/// Adjacent data records joined into one.
fn coalesce(records: &[Record]) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::new();
    for r in records {
        match (out.last_mut(), r) {
            (Some(Record::Data(o, d)), Record::Data(offset, data))
                if *o + d.len() as u64 == *offset =>
            {
                d.extend_from_slice(data)
            }
            _ => out.push(r.clone()),
        }
    }
    out
}

fn apply(image: &mut [u8], records: &[Record]) {
    for r in records {
        match r {
            Record::Data(offset, data) => {
                image[*offset as usize..*offset as usize + data.len()].copy_from_slice(data)
            }
            Record::Zero(offset, len) => image[*offset as usize..(*offset + *len) as usize].fill(0),
        }
    }
}

#[test]
fn random_streams_round_trip() {
    let seed = seed_from_env("LOGCACHE_SEED");
    let mut rng = Rng::new(seed);
    for case in 0..200 {
        let size_bytes = rng.range(1, 8 << 20);
        let header = Header {
            from_snap: random_name(&mut rng),
            to_snap: random_name(&mut rng),
            size_bytes,
        };
        let records = random_records(&mut rng, size_bytes);
        let mut e = Encoder::new(Vec::new(), &header).unwrap();
        for r in &records {
            match r {
                Record::Data(offset, data) => {
                    // Sometimes in parts, as a caller reading blocks one by one would.
                    let cut = rng.below(data.len() as u64 + 1) as usize;
                    e.data_vectored(*offset, &[&data[..cut], &data[cut..]])
                        .unwrap()
                }
                Record::Zero(offset, len) => e.zero(*offset, *len).unwrap(),
            }
        }
        assert_eq!(e.records(), records.len() as u64);
        let bytes = e.finish().unwrap();

        let mut d =
            Decoder::new(&bytes[..]).unwrap_or_else(|err| panic!("seed {seed} case {case}: {err}"));
        assert_eq!(d.header(), &header, "seed {seed} case {case}");
        let mut decoded: Vec<Record> = Vec::new();
        while let Some(p) = d
            .next_piece()
            .unwrap_or_else(|err| panic!("seed {seed} case {case}: {err}"))
        {
            decoded.push(match p {
                Piece::Data {
                    offset_bytes,
                    bytes,
                } => Record::Data(offset_bytes, bytes.to_vec()),
                Piece::Zero {
                    offset_bytes,
                    length_bytes,
                } => Record::Zero(offset_bytes, length_bytes),
            });
        }
        assert_eq!(d.position_bytes(), bytes.len() as u64);
        // A long record decodes in pieces: compare runs of data, not record boundaries.
        assert!(
            coalesce(&decoded) == coalesce(&records),
            "seed {seed} case {case}: records differ"
        );

        let mut base = vec![0u8; size_bytes as usize];
        rng.fill(&mut base);
        let mut want = base.clone();
        apply(&mut want, &records);
        let mut got = base;
        apply(&mut got, &decoded);
        assert!(got == want, "seed {seed} case {case}: images differ");
    }
}
