//! A record's table entry: where its bytes live and how to turn them back into
//! the caller's bytes.

use crate::error::{corrupted, Error, Result};
use crate::format::codec::Codec;

/// Size in bytes of one native table entry.
pub(crate) const ENTRY_BYTES: usize = 32;

/// Index of a chunk file. Chunk `7` lives in `chunk-000007.zr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkId(pub u32);

/// Everything the store knows about one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub chunk: ChunkId,
    pub offset: u64,
    pub stored_len: u32,
    pub logical_len: u32,
    /// crc32c of the stored bytes; `None` for loaderx stores, which keep none.
    pub checksum: Option<u32>,
    pub codec: Codec,
    /// Where the record starts inside the stored bytes: non-zero only for a
    /// record of a fixed sealed section (format 2), whose stored bytes are
    /// the whole checksummed block it lies in.
    pub within: u32,
}

impl Entry {
    /// Native layout, little-endian:
    /// `offset u64 | chunk u32 | stored u32 | logical u32 | crc u32 | codec u8 | 0 u8 | 0 u16 | entry_crc u32`.
    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        debug_assert!(!self.is_part(), "a block entry has no format-1 form");
        let mut b = [0u8; ENTRY_BYTES];
        b[0..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.chunk.0.to_le_bytes());
        b[12..16].copy_from_slice(&self.stored_len.to_le_bytes());
        b[16..20].copy_from_slice(&self.logical_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.checksum.unwrap_or(0).to_le_bytes());
        b[24] = self.codec as u8;
        let crc = crate::format::crc::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a native entry, checking its own crc so a damaged table is an
    /// error rather than a wild read.
    pub fn decode(index: u64, b: &[u8]) -> Result<Entry> {
        let b: &[u8; ENTRY_BYTES] =
            b.try_into().map_err(|_| corrupted(format!("table entry {index}"), "short entry"))?;
        let want = u32_at(b, 28);
        let got = crate::format::crc::crc32c(&b[..28]);
        if want != got {
            return Err(corrupted(
                format!("table entry {index}"),
                format!("entry checksum {got:#010x} != stored {want:#010x}"),
            ));
        }
        let codec = Codec::from_tag(b[24])
            .ok_or_else(|| corrupted(format!("table entry {index}"), format!("unknown codec tag {}", b[24])))?;
        let e = Entry {
            offset: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            chunk: ChunkId(u32_at(b, 8)),
            stored_len: u32_at(b, 12),
            logical_len: u32_at(b, 16),
            checksum: Some(u32_at(b, 20)),
            codec,
            within: 0,
        };
        e.check_shape(index)?;
        Ok(e)
    }

    /// loaderx 0.7.3 layout (16 bytes, little-endian):
    /// `offset u32 | stored u32 | logical u32 | chunk u16 | codec u8 | reserved u8`.
    pub fn decode_loaderx(index: u64, b: &[u8]) -> Result<Entry> {
        if b.len() != 16 {
            return Err(corrupted(format!("loaderx entry {index}"), "short entry"));
        }
        let codec = Codec::from_tag(b[14])
            .ok_or_else(|| corrupted(format!("loaderx entry {index}"), format!("unknown codec tag {}", b[14])))?;
        let e = Entry {
            offset: u64::from(u32_at(b, 0)),
            stored_len: u32_at(b, 4),
            logical_len: u32_at(b, 8),
            chunk: ChunkId(u32::from(u16::from_le_bytes([b[12], b[13]]))),
            checksum: None,
            codec,
            within: 0,
        };
        e.check_shape(index)?;
        Ok(e)
    }

    /// Whether the stored bytes are a block of several raw records, this one
    /// `logical_len` bytes of it from `within` (fixed sealed sections).
    pub fn is_part(&self) -> bool {
        self.codec == Codec::Raw && (self.within != 0 || self.stored_len != self.logical_len)
    }

    /// The bytes of the record itself on disk: its stored length, or its
    /// logical length inside a block.
    pub fn own_len(&self) -> u32 {
        if self.is_part() {
            self.logical_len
        } else {
            self.stored_len
        }
    }

    pub(crate) fn check_shape(&self, index: u64) -> Result<()> {
        if self.codec == Codec::Raw && self.stored_len != self.logical_len {
            return Err(corrupted(
                format!("table entry {index}"),
                format!("raw record stored as {} bytes but {} logical", self.stored_len, self.logical_len),
            ));
        }
        Ok(())
    }

    pub fn end(&self) -> u64 {
        self.offset + u64::from(self.stored_len)
    }
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Checks that a user-supplied index is in range.
pub(crate) fn check_index(index: u64, len: u64) -> Result<()> {
    if index < len {
        Ok(())
    } else {
        Err(Error::IndexOutOfRange { index, len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_entry_round_trips_and_detects_flips() {
        let e = Entry {
            chunk: ChunkId(3),
            offset: 1 << 40,
            stored_len: 77,
            logical_len: 123,
            checksum: Some(0xdead_beef),
            codec: Codec::Zstd,
            within: 0,
        };
        let b = e.encode();
        assert_eq!(Entry::decode(0, &b).unwrap(), e);
        for bit in 0..(ENTRY_BYTES * 8) {
            let mut c = b;
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(Entry::decode(0, &c).is_err(), "flip of bit {bit} went unnoticed");
        }
    }
}
