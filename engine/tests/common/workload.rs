//! The fault tests' workload: records that carry their id, so a store's
//! contents can be read back as the ids it holds, and torn records are seen.

use zring_engine::{Codec, Error, Store};

/// Record `id`: its id, then 200 to 296 bytes derived from it.
pub fn rec(id: u64) -> Vec<u8> {
    let mut v = id.to_le_bytes().to_vec();
    v.extend((0..200 + id % 97).map(|i| (i * 31 + id) as u8 % 17));
    v
}

/// The ids a store holds, in index order.
pub fn ids(s: &Store) -> Vec<u64> {
    (0..s.len())
        .map(|i| {
            let n = s.record_len(i).unwrap() as usize;
            let mut b = vec![0u8; n];
            s.gather(&zring_engine::Gather::fixed(&[i], n), &mut b).unwrap();
            let id = u64::from_le_bytes(b[..8].try_into().unwrap());
            assert_eq!(b, rec(id), "record {i} is torn");
            id
        })
        .collect()
}

/// Appends the records of `range` (zstd) and syncs.
pub fn append(s: &Store, range: std::ops::Range<u64>) -> Result<(), Error> {
    let recs: Vec<Vec<u8>> = range.map(rec).collect();
    let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
    s.append(&refs, Some(Codec::Zstd))?;
    s.sync()
}
