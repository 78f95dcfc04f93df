//! The head file: the one small file whose atomic replacement commits a state.

use crate::format::names::{FORMAT_VERSION, HEAD_FILE};
use std::path::Path;

use crate::error::{corrupted, io_err, Error, Result};
use crate::format::names::TABLE_HEADER_BYTES;
use crate::format::record::{u32_at, u64_at, ENTRY_BYTES};

/// Bytes of a format-1 head.
pub(crate) const HEAD_BYTES: usize = 64;
/// Bytes of a format-2 head: the format-1 fields, then where the table's
/// sealed section ends.
pub(crate) const HEAD2_BYTES: usize = 128;
const MAGIC: &[u8; 4] = b"ZRNG";

/// How the committed table is laid out: format 1 is a 64-byte header and a
/// 32-byte entry per record; format 2 begins with a sealed section (written
/// only by compaction, `engine/DESIGN.md`) holding records `0..sealed`, and
/// appended records follow it as format-1 entries from byte `tail_at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub version: u32,
    pub sealed: u64,
    pub tail_at: u64,
}

impl Layout {
    pub const V1: Layout = Layout { version: 1, sealed: 0, tail_at: TABLE_HEADER_BYTES as u64 };

    /// Byte offset of the format-1 entry of record `i` (`i >= sealed`).
    pub fn entry_at(&self, i: u64) -> u64 {
        self.tail_at + (i - self.sealed) * ENTRY_BYTES as u64
    }

    /// Length of a table of `records` records, `None` where it overflows.
    pub fn table_bytes(&self, records: u64) -> Option<u64> {
        records.checked_sub(self.sealed)?.checked_mul(ENTRY_BYTES as u64)?.checked_add(self.tail_at)
    }
}

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
    /// The table's layout (format 1, or format 2 with its sealed section).
    pub layout: Layout,
}

impl Head {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; if self.layout.version == 1 { HEAD_BYTES } else { HEAD2_BYTES }];
        b[0..4].copy_from_slice(MAGIC);
        b[4..8].copy_from_slice(&self.layout.version.to_le_bytes());
        b[8..16].copy_from_slice(&self.generation.to_le_bytes());
        b[16..24].copy_from_slice(&self.records.to_le_bytes());
        b[24..28].copy_from_slice(&self.chunk_base.to_le_bytes());
        b[28..32].copy_from_slice(&self.chunk_count.to_le_bytes());
        b[32..40].copy_from_slice(&self.tail_len.to_le_bytes());
        b[40..44].copy_from_slice(&self.dict_len.to_le_bytes());
        b[44..48].copy_from_slice(&self.dict_crc.to_le_bytes());
        b[48..56].copy_from_slice(&self.chunk_target.to_le_bytes());
        b[56..60].copy_from_slice(&self.content.to_le_bytes());
        if self.layout.version == 1 {
            let crc = crate::format::crc::crc32c(&b[..60]);
            b[60..64].copy_from_slice(&crc.to_le_bytes());
        } else {
            b[64..72].copy_from_slice(&self.layout.sealed.to_le_bytes());
            b[72..80].copy_from_slice(&self.layout.tail_at.to_le_bytes());
            let crc = crate::format::crc::crc32c(&b[..124]);
            b[124..128].copy_from_slice(&crc.to_le_bytes());
        }
        b
    }

    /// Whether `content` is the fingerprint of the committed records: a
    /// format-1 head written before the field existed holds 0 for "not
    /// known"; every format-2 head was written with it.
    pub fn content_known(&self) -> bool {
        self.content != 0 || self.layout.version >= 2
    }

    /// Decodes the head of the store in directory `path`.
    pub fn decode(path: &Path, b: &[u8]) -> Result<Head> {
        if b.len() < 8 || &b[0..4] != MAGIC {
            return Err(Error::NotAStore { path: path.into(), reason: format!("{HEAD_FILE} has no ZRNG magic") });
        }
        let version = u32_at(b, 4);
        if version == 0 || version > FORMAT_VERSION {
            return Err(Error::UnsupportedVersion {
                path: path.join(HEAD_FILE),
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        // Every error names the file: a training log shows which store broke.
        let file = path.join(HEAD_FILE).display().to_string();
        let size = if version == 1 { HEAD_BYTES } else { HEAD2_BYTES };
        if b.len() != size {
            return Err(corrupted(file, format!("{} bytes, a format-{version} head has {size}", b.len())));
        }
        let want = u32_at(b, size - 4);
        let got = crate::format::crc::crc32c(&b[..size - 4]);
        if want != got {
            return Err(corrupted(
                file,
                format!(
                    "bytes 0..{} have checksum {got:#010x}, bytes {}..{size} store {want:#010x}",
                    size - 4,
                    size - 4
                ),
            ));
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
            layout: if version == 1 {
                Layout::V1
            } else {
                Layout { version, sealed: u64_at(b, 64), tail_at: u64_at(b, 72) }
            },
        };
        if h.chunk_count == 0 || h.chunk_target == 0 {
            return Err(corrupted(file, "no chunks or a zero chunk size (bytes 28..32, 48..56)"));
        }
        if h.chunk_base.checked_add(h.chunk_count).is_none() {
            return Err(corrupted(
                file,
                format!("chunk range {}+{} overflows (bytes 24..32)", h.chunk_base, h.chunk_count),
            ));
        }
        if h.layout.table_bytes(h.records).filter(|&n| usize::try_from(n).is_ok()).is_none() {
            return Err(corrupted(
                file,
                format!("a record count of {} is impossible ({} sealed; bytes 16..24)", h.records, h.layout.sealed),
            ));
        }
        Ok(h)
    }

    pub fn read(dir: &crate::io::fs::Dir) -> Result<Head> {
        let p = dir.join(HEAD_FILE);
        let b = dir.read(HEAD_FILE).map_err(io_err("read", &p))?;
        Head::decode(dir.path(), &b)
    }

    /// Replaces the head atomically: write a temporary file, fsync it, rename
    /// it over the old head, fsync the directory. A crash leaves either head.
    pub fn commit(&self, dir: &crate::io::fs::Dir) -> Result<()> {
        dir.write_atomic(HEAD_FILE, &self.encode())
    }

    /// Length of the committed table file (checked in `decode` not to overflow).
    pub fn table_bytes(&self) -> u64 {
        self.layout.table_bytes(self.records).expect("checked when the head was made")
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
            layout: Layout::V1,
        };
        let p = Path::new("x");
        assert_eq!(Head::decode(p, &h.encode()).unwrap(), h);
        let h2 = Head { layout: Layout { version: 2, sealed: 1 << 30, tail_at: 1 << 20 }, ..h };
        assert_eq!(h2.encode().len(), HEAD2_BYTES);
        assert_eq!(Head::decode(p, &h2.encode()).unwrap(), h2);
        for bit in [70 * 8, 100 * 8, 125 * 8] {
            let mut b = h2.encode();
            b[bit / 8] ^= 1;
            let e = Head::decode(p, &b).unwrap_err();
            assert!(matches!(e, Error::Corrupted { .. }), "bit {bit}");
            assert!(e.to_string().contains("x/head.zr: bytes 0..124 have checksum"), "bit {bit}: {e}");
        }
        let mut b = h.encode();
        b[20] ^= 1;
        assert!(matches!(Head::decode(p, &b), Err(Error::Corrupted { .. })));
        let mut b = h.encode();
        b[4] = 7;
        assert!(matches!(Head::decode(p, &b), Err(Error::UnsupportedVersion { found: 7, .. })));
        // A format-1 head read as 128 bytes, or a format-2 head cut to 64.
        assert!(matches!(Head::decode(p, &h2.encode()[..64]), Err(Error::Corrupted { .. })));
        assert!(matches!(Head::decode(p, b"garbage"), Err(Error::NotAStore { .. })));
    }
}
