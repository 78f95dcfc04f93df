//! The record table: a memory-mapped array of fixed-size entries, one per
//! record, indexed directly.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{corrupted, io_err, Error, Result};
use crate::head::FORMAT_VERSION;
use crate::record::{u32_at, u64_at, Entry, ENTRY_BYTES};

pub(crate) const TABLE_HEADER_BYTES: usize = 64;
const TABLE_MAGIC: &[u8; 4] = b"ZRTB";

/// loaderx 0.7.3: `meta.zr` is a 16-byte header and 16-byte entries.
pub(crate) const LOADERX_META: &str = "meta.zr";
const LOADERX_HEADER: usize = 16;
const LOADERX_ENTRY: usize = 16;

/// Which on-disk layout a store has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// zring's own format (engine/DESIGN.md).
    Native,
    /// A store written by loaderx 0.7.3, read in place.
    Loaderx,
}

pub(crate) fn table_name(generation: u64) -> String {
    format!("table-{generation:06}.zr")
}

pub(crate) fn table_header(generation: u64) -> [u8; TABLE_HEADER_BYTES] {
    let mut b = [0u8; TABLE_HEADER_BYTES];
    b[0..4].copy_from_slice(TABLE_MAGIC);
    b[4..8].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    b[8..16].copy_from_slice(&generation.to_le_bytes());
    b[16..20].copy_from_slice(&(ENTRY_BYTES as u32).to_le_bytes());
    let crc = crc32c::crc32c(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    b
}

/// A read-only view of `records` entries.
pub(crate) struct Table {
    map: Option<Mmap>,
    pub format: Format,
    pub records: u64,
}

impl Table {
    /// Maps a native table file of generation `generation` holding `records` entries.
    pub fn open_native(dir: &Path, generation: u64, records: u64) -> Result<Table> {
        let path = dir.join(table_name(generation));
        let file = crate::fs::open_read(&path)?;
        let need = records
            .checked_mul(ENTRY_BYTES as u64)
            .and_then(|n| n.checked_add(TABLE_HEADER_BYTES as u64))
            .filter(|&n| usize::try_from(n).is_ok())
            .ok_or_else(|| corrupted("head", format!("a record count of {records} is impossible")))?;
        check_len(&file, &path, need, "table")?;
        let map = crate::mmap::map_table(&file, need as usize).map_err(io_err("mmap", &path))?;
        let h = &map[..TABLE_HEADER_BYTES];
        if &h[0..4] != TABLE_MAGIC || crc32c::crc32c(&h[..60]) != u32_at(h, 60) {
            return Err(corrupted(path.display().to_string(), "bad table header"));
        }
        if u64_at(h, 8) != generation || u32_at(h, 16) as usize != ENTRY_BYTES {
            return Err(corrupted(path.display().to_string(), "table header names another generation or entry size"));
        }
        Ok(Table { map: Some(map), format: Format::Native, records })
    }

    /// Maps loaderx's `meta.zr`; returns the table and loaderx's header fields
    /// `(tail_chunk, tail_offset)`.
    pub fn open_loaderx(dir: &Path) -> Result<(Table, u32, u64)> {
        let path = dir.join(LOADERX_META);
        let file = crate::fs::open_read(&path)?;
        let mut head = [0u8; LOADERX_HEADER];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut head, 0)
            .map_err(|_| Error::NotAStore { path: dir.into(), reason: "meta.zr is shorter than its header".into() })?;
        if &head[0..4] != b"ZREC" {
            return Err(Error::NotAStore { path: dir.into(), reason: "meta.zr has no ZREC magic".into() });
        }
        let version = u32::from(u16::from_le_bytes([head[4], head[5]]));
        if version != 3 {
            return Err(Error::UnsupportedVersion { path: path.clone(), found: version, supported: 3 });
        }
        let tail_chunk = u32::from(u16::from_le_bytes([head[6], head[7]]));
        let tail_offset = u64::from(u32_at(&head, 8));
        let records = u64::from(u32_at(&head, 12));
        let need = LOADERX_HEADER as u64 + LOADERX_ENTRY as u64 * records;
        check_len(&file, &path, need, "loaderx meta.zr")?;
        let map = crate::mmap::map_table(&file, need as usize).map_err(io_err("mmap", &path))?;
        Ok((Table { map: Some(map), format: Format::Loaderx, records }, tail_chunk, tail_offset))
    }

    /// The entry of record `i` (caller checked `i < records`).
    pub fn entry(&self, i: u64) -> Result<Entry> {
        let map = self.map.as_ref().ok_or(Error::IndexOutOfRange { index: i, len: 0 })?;
        match self.format {
            Format::Native => {
                let at = TABLE_HEADER_BYTES + i as usize * ENTRY_BYTES;
                Entry::decode(i, &map[at..at + ENTRY_BYTES])
            }
            Format::Loaderx => {
                let at = LOADERX_HEADER + i as usize * LOADERX_ENTRY;
                Entry::decode_loaderx(i, &map[at..at + LOADERX_ENTRY])
            }
        }
    }

    /// The raw native entry bytes of records `0..records` (for rewriting a table).
    pub fn native_bytes(&self) -> &[u8] {
        match &self.map {
            Some(m) => &m[TABLE_HEADER_BYTES..],
            None => &[],
        }
    }
}

fn check_len(file: &File, path: &PathBuf, need: u64, what: &str) -> Result<()> {
    let len = file.metadata().map_err(io_err("stat", path))?.len();
    if len < need {
        return Err(corrupted(what, format!("{} is {len} bytes, the head needs {need}", path.display())));
    }
    Ok(())
}
