//! Shared helpers for the cross-crate scenarios in `tests/tests/`.
//!
//! - [`test_dir`]: a temporary directory under `ZRING_TEST_DIR` (or the system
//!   temp dir), removed when dropped. Point `ZRING_TEST_DIR` at a real disk to
//!   exercise O_DIRECT and real fsyncs; `/tmp` may be tmpfs.
//! - [`Rng`]: a small seeded PRNG (SplitMix64), so every scenario is
//!   reproducible from the seed it prints.
//! - [`record`] / [`record_id`]: record contents as a pure function of an id
//!   embedded in the first eight bytes, so a record can be checked wherever a
//!   delete's swap-last moved it.

use std::path::Path;

use zring_engine::{Codec, Store};

/// A temporary directory for one test's stores, under `ZRING_TEST_DIR` when
/// set, else the system temp dir.
pub fn test_dir() -> tempfile::TempDir {
    let mut b = tempfile::Builder::new();
    b.prefix("zring-test-");
    match std::env::var_os("ZRING_TEST_DIR") {
        Some(d) if !d.is_empty() => {
            std::fs::create_dir_all(&d).expect("create ZRING_TEST_DIR");
            b.tempdir_in(d).expect("tempdir in ZRING_TEST_DIR")
        }
        _ => b.tempdir().expect("tempdir"),
    }
}

/// SplitMix64 finaliser: a bijective 64-bit mixer.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seeded SplitMix64 generator; deterministic for a given seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator with the given seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0.wrapping_sub(0x9E37_79B9_7F4A_7C15))
    }

    /// A value in `lo..=hi` (slightly biased; fine for tests).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi);
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next_u64() % n
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

/// Length of record `id`'s contents under [`record`]: mostly small, sometimes
/// a few KiB, never shorter than the 8-byte id prefix unless `max_len` is.
pub fn record_len(id: u64, max_len: usize) -> usize {
    let h = mix64(id ^ 0x5EED_1E46);
    let len = match h % 8 {
        0 => 8,
        1..=5 => 8 + (h >> 8) as usize % 256,
        _ => 8 + (h >> 8) as usize % 4096,
    };
    len.min(max_len)
}

/// The contents of record `id`: the id (little-endian u64) followed by bytes
/// derived from it; half the ids give compressible text-like bytes, half
/// random bytes, so zstd stores some compressed and some raw.
pub fn record(id: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&id.to_le_bytes()[..len.min(8)]);
    let mut rng = Rng::new(id ^ 0xC0FF_EE00);
    let compressible = mix64(id) & 1 == 0;
    while out.len() < len {
        let w = rng.next_u64();
        if compressible {
            let word: &[u8] = match w % 4 {
                0 => b"zring ",
                1 => b"record ",
                2 => b"store ",
                _ => b"chunk ",
            };
            let n = word.len().min(len - out.len());
            out.extend_from_slice(&word[..n]);
        } else {
            let b = w.to_le_bytes();
            let n = b.len().min(len - out.len());
            out.extend_from_slice(&b[..n]);
        }
    }
    out
}

/// Record `id` at its default length ([`record_len`] with no cap).
pub fn record_for(id: u64) -> Vec<u8> {
    record(id, record_len(id, usize::MAX))
}

/// The id embedded in a record made by [`record_for`], if the record is
/// exactly what [`record_for`] gives for that id.
pub fn record_id(bytes: &[u8]) -> Option<u64> {
    let id = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    (record_for(id) == bytes).then_some(id)
}

/// An order-sensitive hash of a sequence of ids (a store's contents in index order).
pub fn ids_hash(ids: &[u64]) -> u64 {
    ids.iter().fold(0x1234_5678_9ABC_DEF0u64, |h, &id| mix64(h ^ id))
}

/// Every record of `store`, in index order, read with one ragged gather.
pub fn read_all(store: &Store) -> zring_engine::Result<Vec<Vec<u8>>> {
    let n = store.len();
    let idx: Vec<u64> = (0..n).collect();
    let mut lens = vec![0u64; idx.len()];
    store.lengths(&idx, &mut lens)?;
    let mut offsets = Vec::with_capacity(lens.len());
    let mut total = 0u64;
    for l in &lens {
        offsets.push(total);
        total += l;
    }
    let mut buf = vec![0u8; total as usize];
    store.gather(&zring_engine::Gather::ragged(&idx, &offsets), &mut buf)?;
    Ok(offsets.iter().zip(&lens).map(|(&o, &l)| buf[o as usize..(o + l) as usize].to_vec()).collect())
}

/// The three codecs, in tag order.
pub const CODECS: [Codec; 3] = [Codec::Raw, Codec::Zstd, Codec::ZstdDict];

/// Samples good enough for zstd to train a small dictionary on.
pub fn dict_samples() -> Vec<Vec<u8>> {
    (0..400u64).map(|i| record(i * 2, 64 + (i as usize % 200))).collect()
}

/// Trains a dictionary on `store` (writable) from [`dict_samples`].
pub fn train(store: &Store) {
    let samples = dict_samples();
    let refs: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
    store.train_dict(&refs, 4096).expect("train dictionary");
}

/// Copies every regular file of `from` into `to` (created), skipping `lock`.
pub fn copy_store(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create copy dir");
    for e in std::fs::read_dir(from).expect("list store") {
        let e = e.expect("dir entry");
        if e.file_type().expect("file type").is_file() && e.file_name() != "lock" {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy store file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_carry_their_id() {
        for id in [0u64, 1, 7, 1 << 40, u64::MAX] {
            let r = record_for(id);
            assert!(r.len() >= 8);
            assert_eq!(record_id(&r), Some(id));
            let mut bad = r.clone();
            let last = bad.len() - 1;
            bad[last] ^= 1;
            if bad.len() > 8 {
                assert_eq!(record_id(&bad), None);
            }
        }
    }

    #[test]
    fn rng_is_deterministic() {
        let a: Vec<u64> = (0..5).scan(Rng::new(3), |r, _| Some(r.next_u64())).collect();
        let b: Vec<u64> = (0..5).scan(Rng::new(3), |r, _| Some(r.next_u64())).collect();
        assert_eq!(a, b);
        assert_ne!(a[0], a[1]);
    }
}
