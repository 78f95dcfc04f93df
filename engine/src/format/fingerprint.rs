//! Store fingerprints in O(1): what a checkpoint records so a resumed run can
//! tell that it reads the same records.
//!
//! The fingerprint of a store is its record count and a 32-bit *content*
//! value: crc32c run over every record's (stored crc32c, logical length) in
//! index order, from [`SEED`]. It changes when records are appended, deleted
//! (deletion moves the last record into the hole, so the order changes too)
//! or rewritten with other bytes, and when a store is re-encoded with another
//! codec (the stored checksums differ); compaction keeps it (it copies stored
//! bytes and keeps the order), and so do a new dictionary, reopening and
//! copying the store elsewhere.
//!
//! The head keeps the content of its committed records (bytes 56..60), so a
//! reader gets the fingerprint without touching the table. A sync extends it
//! over the appended entries only (reading back what it wrote: O(batch));
//! delete and compaction, which rewrite the table anyway, compute it over the
//! new table. A head written before the field existed holds 0 there, which
//! means "not known": a reader then computes it once per snapshot from the
//! table (O(records)), and the next commit stores it. A computed content that
//! happens to be 0 (one chance in 2^32) is stored as 0 too, and costs a
//! recomputation per snapshot instead of a wrong answer. loaderx stores keep
//! no checksums; their content covers the lengths only.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{io_err, Result};
use crate::format::head::Layout;
use crate::format::record::ENTRY_BYTES;
use crate::format::table::Table;

/// The content of a store with no records ("ZRNG" read as a number).
pub(crate) const SEED: u32 = 0x474e_525a;

/// What a checkpoint records of a store ([`crate::Store::fingerprint`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fingerprint {
    /// Records in the store.
    pub records: u64,
    /// crc32c over every record's stored crc32c and logical length, in
    /// index order (module docs).
    pub content: u32,
}

/// `h` extended by one record.
fn extend(h: u32, crc: u32, logical_len: u32) -> u32 {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&crc.to_le_bytes());
    b[4..].copy_from_slice(&logical_len.to_le_bytes());
    crate::format::crc::crc32c_append(h, &b)
}

/// `h` extended by records given as (stored crc32c, logical length).
pub(crate) fn over_records(h: u32, records: impl IntoIterator<Item = (u32, u32)>) -> u32 {
    records.into_iter().fold(h, |h, (crc, len)| extend(h, crc, len))
}

/// `h` extended by native table entries (`ENTRY_BYTES` each).
pub(crate) fn over_entries(mut h: u32, entries: &[u8]) -> u32 {
    for e in entries.chunks_exact(ENTRY_BYTES) {
        let logical = u32::from_le_bytes(e[16..20].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(e[20..24].try_into().expect("4 bytes"));
        h = extend(h, crc, logical);
    }
    h
}

/// `h` extended by records `from..to` of a native table file, read in
/// blocks.
pub(crate) fn over_file(mut h: u32, f: &File, path: &Path, layout: Layout, from: u64, to: u64) -> Result<u32> {
    const BLOCK: u64 = 32_768; // entries per read: 1 MiB
    let mut buf = Vec::new();
    let mut i = from;
    while i < to {
        let n = (to - i).min(BLOCK);
        buf.resize(n as usize * ENTRY_BYTES, 0);
        f.read_exact_at(&mut buf, layout.entry_at(i)).map_err(io_err("read", path))?;
        h = over_entries(h, &buf);
        i += n;
    }
    Ok(h)
}

/// `h` extended by records `from..to` of an open table (either format).
pub(crate) fn over_table(mut h: u32, table: &Table, from: u64, to: u64) -> Result<u32> {
    table.will_scan();
    for i in from..to {
        let e = table.entry(i)?;
        h = extend(h, e.checksum.unwrap_or(0), e.logical_len);
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::codec::Codec;
    use crate::format::record::{ChunkId, Entry};

    fn entry(crc: u32, len: u32) -> [u8; ENTRY_BYTES] {
        Entry {
            chunk: ChunkId(3),
            offset: 4096,
            stored_len: 10,
            logical_len: len,
            checksum: Some(crc),
            codec: Codec::Zstd,
            within: 0,
        }
        .encode()
    }

    #[test]
    fn content_depends_on_checksums_lengths_and_order_only() {
        let a = entry(1, 100);
        let b = entry(2, 100);
        let ab = [a, b].concat();
        let ba = [b, a].concat();
        assert_ne!(over_entries(SEED, &ab), over_entries(SEED, &ba), "order counts");
        assert_eq!(over_entries(over_entries(SEED, &a), &b), over_entries(SEED, &ab), "extends piecewise");
        let moved = Entry { chunk: ChunkId(9), offset: 0, ..Entry::decode(0, &a).unwrap() }.encode();
        assert_eq!(over_entries(SEED, &moved), over_entries(SEED, &a), "where the bytes are does not count");
        assert_ne!(over_entries(SEED, &entry(1, 101)), over_entries(SEED, &a));
    }
}
