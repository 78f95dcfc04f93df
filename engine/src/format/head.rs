//! The head file: the one small file whose atomic replacement commits a state.

use crate::format::names::{FORMAT_VERSION, HEAD_FILE};
use std::path::Path;

use crate::error::{corrupted, io_err, Error, Result};
use crate::format::names::TABLE_HEADER_BYTES;
use crate::format::record::{u32_at, u64_at, ENTRY_BYTES};

/// Version of the native format this build reads and writes.
pub(crate) const HEAD_BYTES: usize = 64;
const MAGIC: &[u8; 4] = b"ZRNG";

/// The committed state of a native store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Head {
    pub generation: u64,
    pub records: u64,
    pub chunk_base: u32,
    pub chunk_count: u32,
    pub tail_len: u64,
    pub dict_len: u32,
    pub dict_crc: u32,
    pub chunk_target: u64,
    /// The fingerprint content of the committed records (0: not known, a
    /// head written before the field existed; [`crate::format::fingerprint`]).
    pub content: u32,
}

impl Head {
    pub fn encode(&self) -> [u8; HEAD_BYTES] {
        let mut b = [0u8; HEAD_BYTES];
        b[0..4].copy_from_slice(MAGIC);
        b[4..8].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.generation.to_le_bytes());
        b[16..24].copy_from_slice(&self.records.to_le_bytes());
        b[24..28].copy_from_slice(&self.chunk_base.to_le_bytes());
        b[28..32].copy_from_slice(&self.chunk_count.to_le_bytes());
        b[32..40].copy_from_slice(&self.tail_len.to_le_bytes());
        b[40..44].copy_from_slice(&self.dict_len.to_le_bytes());
        b[44..48].copy_from_slice(&self.dict_crc.to_le_bytes());
        b[48..56].copy_from_slice(&self.chunk_target.to_le_bytes());
        b[56..60].copy_from_slice(&self.content.to_le_bytes());
        let crc = crate::format::crc::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(path: &Path, b: &[u8]) -> Result<Head> {
        if b.len() < 8 || &b[0..4] != MAGIC {
            return Err(Error::NotAStore { path: path.into(), reason: "head.zr has no ZRNG magic".into() });
        }
        let version = u32_at(b, 4);
        if version != FORMAT_VERSION {
            return Err(Error::UnsupportedVersion { path: path.into(), found: version, supported: FORMAT_VERSION });
        }
        if b.len() != HEAD_BYTES {
            return Err(corrupted("head", format!("{} bytes, expected {HEAD_BYTES}", b.len())));
        }
        let want = u32_at(b, 60);
        let got = crate::format::crc::crc32c(&b[..60]);
        if want != got {
            return Err(corrupted("head", format!("checksum {got:#010x} != stored {want:#010x}")));
        }
        let h = Head {
            generation: u64_at(b, 8),
            records: u64_at(b, 16),
            chunk_base: u32_at(b, 24),
            chunk_count: u32_at(b, 28),
            tail_len: u64_at(b, 32),
            dict_len: u32_at(b, 40),
            dict_crc: u32_at(b, 44),
            chunk_target: u64_at(b, 48),
            content: u32_at(b, 56),
        };
        if h.chunk_count == 0 || h.chunk_target == 0 {
            return Err(corrupted("head", "no chunks or a zero chunk size"));
        }
        if h.chunk_base.checked_add(h.chunk_count).is_none() {
            return Err(corrupted("head", format!("chunk range {}+{} overflows", h.chunk_base, h.chunk_count)));
        }
        if h.records.checked_mul(ENTRY_BYTES as u64).and_then(|n| n.checked_add(TABLE_HEADER_BYTES as u64)).is_none() {
            return Err(corrupted("head", format!("a record count of {} is impossible", h.records)));
        }
        Ok(h)
    }

    pub fn read(dir: &Path) -> Result<Head> {
        let p = dir.join(HEAD_FILE);
        let b = crate::io::fs::read(&p).map_err(io_err("read", &p))?;
        Head::decode(dir, &b)
    }

    /// Replaces the head atomically: write a temporary file, fsync it, rename
    /// it over the old head, fsync the directory. A crash leaves either head.
    pub fn commit(&self, dir: &Path) -> Result<()> {
        crate::io::fs::write_atomic(dir, HEAD_FILE, &self.encode())
    }

    /// Length of the committed table file (checked in `decode` not to overflow).
    pub fn table_bytes(&self) -> u64 {
        TABLE_HEADER_BYTES as u64 + self.records * ENTRY_BYTES as u64
    }

    pub fn last_chunk(&self) -> u32 {
        self.chunk_base + self.chunk_count - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_round_trips_and_rejects_damage() {
        let h = Head {
            generation: 9,
            records: 1 << 33,
            chunk_base: 4,
            chunk_count: 2,
            tail_len: 77,
            dict_len: 0,
            dict_crc: 0,
            chunk_target: 1 << 30,
            content: 0x1234_5678,
        };
        let p = Path::new("x");
        assert_eq!(Head::decode(p, &h.encode()).unwrap(), h);
        let mut b = h.encode();
        b[20] ^= 1;
        assert!(matches!(Head::decode(p, &b), Err(Error::Corrupted { .. })));
        let mut b = h.encode();
        b[4] = 7;
        assert!(matches!(Head::decode(p, &b), Err(Error::UnsupportedVersion { found: 7, .. })));
        assert!(matches!(Head::decode(p, b"garbage"), Err(Error::NotAStore { .. })));
    }
}
