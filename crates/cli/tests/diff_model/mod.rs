//! `rbd diff v1` streams from a model, for the tests of `import-diff` (`cli_import_diff.rs`) and
//! of the Ceph interop (`cli_ceph_rbd.rs`).

use logcache_diff::Encoder;

use crate::common::Rng;

/// Appends a record of `len` bytes at `at` to `e`, a zero range a third of the time and random
/// data otherwise, and changes `model` the same way.
pub fn random_record(e: &mut Encoder<Vec<u8>>, model: &mut [u8], rng: &mut Rng, at: u64, len: u64) {
    let range = at as usize..(at + len) as usize;
    if rng.below(3) == 0 {
        e.zero(at, len).unwrap();
        model[range].fill(0);
    } else {
        let data = rng.bytes(len as usize);
        e.data(at, &data).unwrap();
        model[range].copy_from_slice(&data);
    }
}
