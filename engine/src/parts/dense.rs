//! Small parts' table entries in one array of the dataset ([`Dense`]).

use std::sync::atomic::AtomicBool;

/// Records a dataset copies the table entries of into one array ([`Dense`])
/// at most: [`DENSE_BYTES`] each, 128 MiB.
pub(super) const DENSE_MAX_RECORDS: u64 = 1 << 22;
/// A part's table is copied when it holds at most this many records.
pub(super) const DENSE_PART_MAX: u64 = 1 << 16;
/// Bytes of a record's entry in [`Dense`]: `offset u56 | codec u8`,
/// `chunk u32`, `stored u32`, `logical u32`, `crc u32`, `within u32`, `0 u32`,
/// little-endian (two to a cache line).
pub(super) const DENSE_BYTES: usize = 32;

/// The table entries of a dataset's small parts (of records of at least
/// twice [`DENSE_BYTES`] on average: the copy costs at most half the bytes it
/// indexes), copied into one array
/// indexed by the dataset's record index when the dataset opened, each
/// checked then as every read checks it ([`crate::snapshot::Snapshot::entry`]:
/// its own checksum, or its table page's, and the chunk bytes it names). A
/// random gather over a thousand parts then finds each record's entry with
/// one load from one array (on huge pages where the kernel gives them),
/// instead of each part's snapshot, table and table page: those are
/// scattered allocations and a small mapping per part, and each part touched
/// cost a translation miss of its own. A committed part does not change, so
/// the copy holds for the dataset's life; a part opened again whose chunks
/// differ is read through its table again. Every record's own checksum is
/// still checked on every read.
pub(super) struct Dense {
    pub(super) bytes: memmap2::Mmap,
    /// Whether each part's entries are in `bytes`.
    pub(super) ok: Vec<AtomicBool>,
    /// Each part's `(chunk_base, chunks)` when it was copied.
    pub(super) shape: Vec<(u32, usize)>,
}

impl Dense {
    /// Record `i`'s entry (its part's entries are in the array).
    #[inline]
    pub(super) fn entry(&self, i: u64) -> Option<crate::format::record::Entry> {
        let b = self.bytes.get(i as usize * DENSE_BYTES..)?.get(..DENSE_BYTES)?;
        let w = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let off = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
        Some(crate::format::record::Entry {
            chunk: crate::format::record::ChunkId(w(8)),
            offset: off & ((1 << 56) - 1),
            stored_len: w(12),
            logical_len: w(16),
            checksum: Some(w(20)),
            codec: crate::format::codec::Codec::from_tag((off >> 56) as u8)?,
            within: w(24),
        })
    }

    /// Copies the entries of `snap` (part `k`, whose first record is
    /// `start`) into `bytes`; false, with nothing to rely on, when an entry
    /// fails its checks or has no form here (no checksum: loaderx):
    /// the part is then read through its table, which reports it.
    pub(super) fn copy(bytes: &mut [u8], start: u64, snap: &crate::snapshot::Snapshot) -> bool {
        for i in 0..snap.records() {
            let Ok(e) = snap.entry(i) else { return false };
            let (Some(crc), true) = (e.checksum, e.offset < 1 << 56) else {
                return false;
            };
            let b = &mut bytes[(start + i) as usize * DENSE_BYTES..][..DENSE_BYTES];
            b[..8].copy_from_slice(&(e.offset | (e.codec as u64) << 56).to_le_bytes());
            b[8..12].copy_from_slice(&e.chunk.0.to_le_bytes());
            b[12..16].copy_from_slice(&e.stored_len.to_le_bytes());
            b[16..20].copy_from_slice(&e.logical_len.to_le_bytes());
            b[20..24].copy_from_slice(&crc.to_le_bytes());
            b[24..28].copy_from_slice(&e.within.to_le_bytes());
        }
        true
    }
}
