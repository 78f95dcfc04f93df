//! The record table: a memory-mapped array of fixed-size entries, one per
//! record, indexed directly.
//!
//! Where mapping is off (`ZRING_MMAP=0`, or no SIGBUS guard in this process)
//! and once the mapping has faulted (the file shrank or a page could not be
//! read), entries are read through the file instead, where a short file is
//! [`Error::Corrupted`] naming it.

use crate::format::names::{table_name, LOADERX_META, TABLE_HEADER_BYTES};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{corrupted, io_err, Error, Result};
use crate::format::names::FORMAT_VERSION;
use crate::format::record::{u32_at, u64_at, Entry, ENTRY_BYTES};
use crate::io::mmap::Mapping;

const TABLE_MAGIC: &[u8; 4] = b"ZRTB";

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

pub(crate) fn table_header(generation: u64) -> [u8; TABLE_HEADER_BYTES] {
    let mut b = [0u8; TABLE_HEADER_BYTES];
    b[0..4].copy_from_slice(TABLE_MAGIC);
    b[4..8].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    b[8..16].copy_from_slice(&generation.to_le_bytes());
    b[16..20].copy_from_slice(&(ENTRY_BYTES as u32).to_le_bytes());
    let crc = crate::format::crc::crc32c(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    b
}

/// A read-only view of `records` entries.
pub(crate) struct Table {
    /// The file's first `len` bytes, mapped; `None` where mapping is off.
    map: Option<Mapping>,
    file: File,
    path: PathBuf,
    /// Bytes of the file the store names: the header and `records` entries.
    len: usize,
    pub format: Format,
    pub records: u64,
}

impl Table {
    /// Maps a native table file of generation `generation` holding `records` entries.
    pub fn open_native(dir: &Path, generation: u64, records: u64) -> Result<Table> {
        Table::open_native_with(dir, generation, records, crate::io::mmap::allowed())
    }

    fn open_native_with(dir: &Path, generation: u64, records: u64, map: bool) -> Result<Table> {
        let path = dir.join(table_name(generation));
        let file = crate::io::fs::open_read(&path)?;
        let need = records
            .checked_mul(ENTRY_BYTES as u64)
            .and_then(|n| n.checked_add(TABLE_HEADER_BYTES as u64))
            .filter(|&n| usize::try_from(n).is_ok())
            .ok_or_else(|| corrupted("head", format!("a record count of {records} is impossible")))?;
        check_len(&file, &path, need, "table")?;
        let table = Table::new(file, path, need as usize, Format::Native, records, map);
        let mut h = [0u8; TABLE_HEADER_BYTES];
        table.read_at(&mut h, 0)?;
        if &h[0..4] != TABLE_MAGIC || crate::format::crc::crc32c(&h[..60]) != u32_at(&h, 60) {
            return Err(corrupted(table.path.display().to_string(), "bad table header"));
        }
        if u64_at(&h, 8) != generation || u32_at(&h, 16) as usize != ENTRY_BYTES {
            return Err(corrupted(
                table.path.display().to_string(),
                "table header names another generation or entry size",
            ));
        }
        Ok(table)
    }

    /// Maps loaderx's `meta.zr`; returns the table and loaderx's header fields
    /// `(tail_chunk, tail_offset)`.
    pub fn open_loaderx(dir: &Path) -> Result<(Table, u32, u64)> {
        let path = dir.join(LOADERX_META);
        let file = crate::io::fs::open_read(&path)?;
        let mut head = [0u8; LOADERX_HEADER];
        file.read_exact_at(&mut head, 0)
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
        let table = Table::new(file, path, need as usize, Format::Loaderx, records, crate::io::mmap::allowed());
        Ok((table, tail_chunk, tail_offset))
    }

    fn new(file: File, path: PathBuf, len: usize, format: Format, records: u64, map: bool) -> Table {
        // A mapping that cannot be made (no guard, every guard slot taken, a
        // file system without mmap) is no error: entries are read through
        // the file.
        let map = map.then(|| Mapping::new(&file, len).ok()).flatten();
        Table { map, file, path, len, format, records }
    }

    /// The entry of record `i` (caller checked `i < records`).
    pub fn entry(&self, i: u64) -> Result<Entry> {
        let (header, size) = match self.format {
            Format::Native => (TABLE_HEADER_BYTES, ENTRY_BYTES),
            Format::Loaderx => (LOADERX_HEADER, LOADERX_ENTRY),
        };
        let at = usize::try_from(i)
            .ok()
            .and_then(|i| i.checked_mul(size))
            .and_then(|o| o.checked_add(header))
            .filter(|&at| at + size <= self.len)
            .ok_or(Error::IndexOutOfRange { index: i, len: self.records })?;
        let decode = |b: &[u8]| match self.format {
            Format::Native => Entry::decode(i, b),
            Format::Loaderx => Entry::decode_loaderx(i, b),
        };
        if let Some(Ok(e)) = self.map.as_ref().and_then(|m| m.read(at, size, decode)) {
            return Ok(e);
        }
        // Not mapped, faulted, or bytes that do not decode: those may be the
        // zeros a mapping shows past a new end of the file inside its last
        // page (no fault there), so the file tells shrinkage from damage.
        let mut b = [0u8; ENTRY_BYTES];
        self.read_at(&mut b[..size], at)?;
        decode(&b[..size])
    }

    /// The raw native entry bytes of records `0..records` (for rewriting a
    /// table), copied out of the mapping, or read through the file where it is
    /// not mapped or the mapping faulted. A short or unreadable file is an
    /// error naming it.
    pub fn entry_bytes(&self) -> Result<Vec<u8>> {
        let n = self.len.saturating_sub(TABLE_HEADER_BYTES);
        if let Some(v) = self.map.as_ref().and_then(|m| m.read(TABLE_HEADER_BYTES, n, <[u8]>::to_vec)) {
            // A cut inside the last page does not fault: its tail reads as
            // zeros, so check the length the copy relied on.
            let len = self.file.metadata().map_err(io_err("stat", &self.path))?.len();
            if len >= self.len as u64 {
                return Ok(v);
            }
        }
        let mut v = vec![0u8; n];
        self.read_at(&mut v, TABLE_HEADER_BYTES)?;
        Ok(v)
    }

    /// Reads `buf.len()` bytes at `at` through the file. The file was checked
    /// at open to hold `len` bytes, so ending early means it shrank since.
    fn read_at(&self, buf: &mut [u8], at: usize) -> Result<()> {
        self.file.read_exact_at(buf, at as u64).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                corrupted(
                    self.path.display().to_string(),
                    format!(
                        "the file shrank while the store was open: bytes {at}..{} of the {} the head names are gone",
                        at + buf.len(),
                        self.len
                    ),
                )
            } else {
                Error::Io { op: "read", path: self.path.clone(), source: e }
            }
        })
    }
}

fn check_len(file: &File, path: &PathBuf, need: u64, what: &str) -> Result<()> {
    let len = file.metadata().map_err(io_err("stat", path))?.len();
    if len < need {
        return Err(corrupted(what, format!("{} is {len} bytes, the head needs {need}", path.display())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table read through its file (mapping off) gives the same entries
    /// as the mapping, and either way a table cut under it is Corrupted
    /// naming the file.
    #[test]
    fn file_and_mapping_agree_and_both_report_a_cut() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::Store::builder(dir.path()).codec(crate::Codec::Zstd).create().unwrap();
        let recs: Vec<Vec<u8>> = (0..300u32).map(|i| vec![i as u8; 100 + i as usize]).collect();
        let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
        store.append(&refs, None).unwrap();
        store.sync().unwrap();
        drop(store);
        let head = crate::format::head::Head::read(dir.path()).unwrap();
        let open = |map| Table::open_native_with(dir.path(), head.generation, head.records, map).unwrap();
        let (mapped, unmapped) = (open(true), open(false));
        assert!(mapped.map.is_some() && unmapped.map.is_none());
        for i in 0..300 {
            assert_eq!(mapped.entry(i).unwrap(), unmapped.entry(i).unwrap());
        }
        assert_eq!(mapped.entry_bytes().unwrap(), unmapped.entry_bytes().unwrap());
        assert_eq!(mapped.entry_bytes().unwrap().len(), 300 * ENTRY_BYTES);
        let path = dir.path().join(table_name(head.generation));
        // Entry 200 lies in the table's third page: the cut leaves two pages.
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(8192).unwrap();
        for t in [&mapped, &unmapped] {
            assert_eq!(t.entry(10).unwrap(), unmapped.entry(10).unwrap());
            for e in [t.entry(299).unwrap_err(), t.entry_bytes().unwrap_err()] {
                let Error::Corrupted { what, detail } = e else { panic!("{e:?}") };
                assert!(what.ends_with(&table_name(head.generation)) && detail.contains("shrank"), "{what}: {detail}");
            }
        }
        assert!(mapped.map.as_ref().unwrap().faulted());
    }
}
