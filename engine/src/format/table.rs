//! The record table: where each record's bytes are, indexed directly.
//!
//! Format 1 is a 64-byte header and a 32-byte entry per record. Format 2
//! (`engine/DESIGN.md`) begins with a *sealed section* that compaction (or
//! a seal of a store written once) writes, in 4 KiB pages each covered by
//! its own CRC-32C:
//!
//! - **fixed**: records of one length, raw, back to back from offset 0 of
//!   each chunk; nothing per record. A page holds the CRC-32C of 1,023
//!   *blocks* of records (a block is at least 4 KiB of them), so a gather
//!   verifies the blocks it touches.
//! - **variable**: 12 bytes per record (chunk offset, logical length and
//!   codec, CRC-32C); a page holds 340 entries of one chunk, its stored
//!   lengths the differences of consecutive offsets.
//!
//! Records appended later follow the sealed section as format-1 entries.
//! A page is verified the first time a table handle reads it (a fixed
//! section of up to 16 MiB of pages, all of them when the table opens); the bitmap of
//! verified pages lives as long as the handle (a snapshot).
//!
//! Where mapping is off (`ZRING_MMAP=0`, or no SIGBUS guard in this process)
//! and once the mapping has faulted (the file shrank or a page could not be
//! read), entries are read through the file instead, where a short file is
//! [`Error::Corrupted`] naming it.

use crate::format::names::{table_name, HEAD_FILE, LOADERX_META, TABLE_HEADER_BYTES};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::error::{corrupted, io_err, Error, Result};
use crate::format::codec::Codec;
use crate::format::head::Layout;
use crate::format::record::{u32_at, u64_at, ChunkId, Entry, ENTRY_BYTES};
use crate::io::fs::Dir;
use crate::io::mmap::{Mapping, Residency};

const TABLE_MAGIC: &[u8; 4] = b"ZRTB";

const LOADERX_HEADER: usize = 16;
const LOADERX_ENTRY: usize = 16;

/// Bytes of a format-2 page (the header page and every sealed page).
pub(crate) const PAGE: usize = 4096;
/// Bytes of a variable page's header: CRC, chunk, end offset, reserved.
const VAR_HEADER: usize = 16;
/// Bytes of a variable record's entry.
pub(crate) const VAR_ENTRY: usize = 12;
/// Entries in a variable page.
pub(crate) const VAR_PER_PAGE: u64 = ((PAGE - VAR_HEADER) / VAR_ENTRY) as u64;
/// Block checksums in a fixed page (after the page's own CRC).
pub(crate) const CRCS_PER_PAGE: u64 = ((PAGE - 4) / 4) as u64;
/// A fixed store's block holds at least this many bytes of records.
pub(crate) const BLOCK_BYTES: u64 = 4096;
/// A fixed section of at most this many pages (16 MiB: the block checksums
/// of 4,190,208 blocks, at least 16 GiB of records) is read and verified
/// when the table opens.
const PRELOAD_PAGES: u64 = 4096;
/// The largest record (logical or stored) a variable section holds: 30 bits
/// of length, 2 of codec.
pub(crate) const VAR_MAX_RECORD: u64 = (1 << 30) - 1;

pub use crate::format::names::Format;

/// The format-1 header (64 bytes).
pub(crate) fn table_header(generation: u64) -> [u8; TABLE_HEADER_BYTES] {
    let mut b = [0u8; TABLE_HEADER_BYTES];
    b[0..4].copy_from_slice(TABLE_MAGIC);
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    b[8..16].copy_from_slice(&generation.to_le_bytes());
    b[16..20].copy_from_slice(&(ENTRY_BYTES as u32).to_le_bytes());
    let crc = crate::format::crc::crc32c(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    b
}

/// What a format-2 sealed section holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sealed {
    /// Records of `item_len` bytes, raw; chunk `first_chunk + c` holds
    /// records `c * chunk_records ..` from offset 0, in blocks of
    /// `block_records` (the chunk's last block may be short).
    Fixed { item_len: u32, block_records: u32, chunk_records: u64, first_chunk: u32 },
    /// Entries of 12 bytes, 340 to a page.
    Variable,
}

impl Sealed {
    fn blocks_per_chunk(block_records: u32, chunk_records: u64) -> u64 {
        chunk_records.div_ceil(u64::from(block_records))
    }

    /// Pages a section of `records` records of this kind takes.
    pub fn pages(&self, records: u64) -> u64 {
        match *self {
            Sealed::Variable => records.div_ceil(VAR_PER_PAGE),
            Sealed::Fixed { block_records, chunk_records, .. } => {
                let per = Self::blocks_per_chunk(block_records, chunk_records);
                let blocks =
                    records / chunk_records * per + (records % chunk_records).div_ceil(u64::from(block_records));
                blocks.div_ceil(CRCS_PER_PAGE)
            }
        }
    }

    /// The format-2 header page of table generation `generation`.
    pub fn header(&self, generation: u64, records: u64) -> Vec<u8> {
        let mut b = vec![0u8; PAGE];
        b[0..4].copy_from_slice(TABLE_MAGIC);
        b[4..8].copy_from_slice(&2u32.to_le_bytes());
        b[8..16].copy_from_slice(&generation.to_le_bytes());
        b[16..20].copy_from_slice(&(ENTRY_BYTES as u32).to_le_bytes());
        b[24..32].copy_from_slice(&records.to_le_bytes());
        b[32..40].copy_from_slice(&self.pages(records).to_le_bytes());
        match *self {
            Sealed::Variable => b[20..24].copy_from_slice(&2u32.to_le_bytes()),
            Sealed::Fixed { item_len, block_records, chunk_records, first_chunk } => {
                b[20..24].copy_from_slice(&1u32.to_le_bytes());
                b[40..44].copy_from_slice(&item_len.to_le_bytes());
                b[44..48].copy_from_slice(&block_records.to_le_bytes());
                b[48..56].copy_from_slice(&chunk_records.to_le_bytes());
                b[56..60].copy_from_slice(&first_chunk.to_le_bytes());
            }
        }
        let crc = crate::format::crc::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }
}

/// The CRC a sealed page `p` (counted from 0 after the header page) carries
/// in its first 4 bytes: over the page number and the rest of the page, so a
/// page written in another's place is caught too.
pub(crate) fn page_crc(p: u64, page: &[u8]) -> u32 {
    crate::format::crc::crc32c_append(crate::format::crc::crc32c(&p.to_le_bytes()), &page[4..])
}

/// The table's sealed section, as opened.
struct Section {
    kind: Sealed,
    records: u64,
    /// One bit per page: verified by this handle.
    verified: Vec<AtomicU64>,
}

/// A read-only view of `records` entries.
pub(crate) struct Table {
    /// The file's first `len` bytes, mapped; `None` where mapping is off.
    map: Option<Mapping>,
    /// The mapping's pages known to be in memory ([`Table::prefetch`]).
    pages: Residency,
    file: File,
    path: PathBuf,
    /// Bytes of the file the store names: the header, the sealed section and
    /// the entries of the records after it.
    len: usize,
    pub format: Format,
    pub records: u64,
    /// Where record `sealed.records`'s format-1 entry starts.
    tail_at: usize,
    sealed: Option<Section>,
}

impl Table {
    /// Maps the native table file of generation `generation` holding
    /// `records` records laid out as `layout` says.
    pub fn open_native(dir: &Dir, generation: u64, layout: Layout, records: u64) -> Result<Table> {
        Table::open_native_with(dir, generation, layout, records, crate::io::mmap::allowed())
    }

    fn open_native_with(dir: &Dir, generation: u64, layout: Layout, records: u64, map: bool) -> Result<Table> {
        let path = dir.join(table_name(generation));
        let file = dir.open_read(&table_name(generation))?;
        let need = layout.table_bytes(records).filter(|&n| usize::try_from(n).is_ok()).ok_or_else(|| {
            corrupted(dir.join(HEAD_FILE).display().to_string(), format!("a record count of {records} is impossible"))
        })?;
        check_len(&file, &path, need)?;
        let mut table = Table::new(file, path, need as usize, Format::Native, records, map);
        let mut h = [0u8; TABLE_HEADER_BYTES];
        table.read_at(&mut h, 0)?;
        let bad = |why: &str| corrupted(table.path.display().to_string(), why.to_string());
        if &h[0..4] != TABLE_MAGIC || crate::format::crc::crc32c(&h[..60]) != u32_at(&h, 60) {
            return Err(bad("bad table header"));
        }
        if u64_at(&h, 8) != generation || u32_at(&h, 16) as usize != ENTRY_BYTES {
            return Err(bad("table header names another generation or entry size"));
        }
        if u32_at(&h, 4) != layout.version {
            return Err(bad(&format!("a format-{} table under a format-{} head", u32_at(&h, 4), layout.version)));
        }
        table.tail_at = layout.tail_at as usize;
        if layout.version == 1 {
            return Ok(table);
        }
        let kind = match u32_at(&h, 20) {
            1 => Sealed::Fixed {
                item_len: u32_at(&h, 40),
                block_records: u32_at(&h, 44),
                chunk_records: u64_at(&h, 48),
                first_chunk: u32_at(&h, 56),
            },
            2 => Sealed::Variable,
            k => return Err(bad(&format!("unknown sealed section kind {k}"))),
        };
        if let Sealed::Fixed { item_len, block_records, chunk_records, .. } = kind {
            let block = u64::from(item_len) * u64::from(block_records);
            if item_len == 0 || block_records == 0 || chunk_records == 0 || block > u64::from(u32::MAX) {
                return Err(bad("fixed section with a zero or oversized record, block or chunk"));
            }
        }
        let (sealed, pages) = (u64_at(&h, 24), u64_at(&h, 32));
        if sealed != layout.sealed
            || pages != kind.pages(sealed)
            || Some(layout.tail_at) != pages.checked_add(1).and_then(|p| p.checked_mul(PAGE as u64))
            || sealed > records
        {
            return Err(bad(&format!(
                "the table seals {sealed} records in {pages} pages, the head {} records before byte {}",
                layout.sealed, layout.tail_at
            )));
        }
        let words = pages.div_ceil(64) as usize;
        let sec = Section { kind, records: sealed, verified: (0..words).map(|_| AtomicU64::new(0)).collect() };
        if matches!(kind, Sealed::Fixed { .. }) && pages <= PRELOAD_PAGES {
            // Read (sequentially, so in a few transfers) and verify the
            // block checksums now: a cold gather then reads records only. A
            // damaged page is left for the gather that needs it to report.
            if let Some(m) = &table.map {
                m.will_need(PAGE, pages as usize * PAGE);
            }
            for p in 0..pages {
                let _ = table.verify_page(&sec, p);
            }
        }
        table.sealed = Some(sec);
        Ok(table)
    }

    /// Maps loaderx's `meta.zr`; returns the table and loaderx's header fields
    /// `(tail_chunk, tail_offset)`.
    pub fn open_loaderx(dir: &Dir) -> Result<(Table, u32, u64)> {
        let path = dir.join(LOADERX_META);
        let file = dir.open_read(LOADERX_META)?;
        let mut head = [0u8; LOADERX_HEADER];
        file.read_exact_at(&mut head, 0).map_err(|_| Error::NotAStore {
            path: dir.path().into(),
            reason: "meta.zr is shorter than its header".into(),
        })?;
        if &head[0..4] != b"ZREC" {
            return Err(Error::NotAStore { path: dir.path().into(), reason: "meta.zr has no ZREC magic".into() });
        }
        let version = u32::from(u16::from_le_bytes([head[4], head[5]]));
        if version != 3 {
            return Err(Error::UnsupportedVersion { path: path.clone(), found: version, supported: 3 });
        }
        let tail_chunk = u32::from(u16::from_le_bytes([head[6], head[7]]));
        let tail_offset = u64::from(u32_at(&head, 8));
        let records = u64::from(u32_at(&head, 12));
        let need = LOADERX_HEADER as u64 + LOADERX_ENTRY as u64 * records;
        check_len(&file, &path, need)?;
        let table = Table::new(file, path, need as usize, Format::Loaderx, records, crate::io::mmap::allowed());
        Ok((table, tail_chunk, tail_offset))
    }

    fn new(file: File, path: PathBuf, len: usize, format: Format, records: u64, map: bool) -> Table {
        // A mapping that cannot be made (no guard, every guard slot taken, a
        // file system without mmap) is no error: entries are read through
        // the file.
        let map = map.then(|| Mapping::new(&file, len).ok()).flatten();
        // A gather reads an entry here and there: without this, each cold
        // entry faults in the device's whole read-ahead window around it
        // (8 MiB on the test machine: a first gather of 1,024 records from a
        // 3.2 GB table read 2.6 GB). Scans ask for read-ahead themselves
        // ([`Table::will_scan`]).
        if let Some(m) = &map {
            m.advise(memmap2::Advice::Random);
        }
        let pages = Residency::new(if map.is_some() { len } else { 0 });
        Table { map, pages, file, path, len, format, records, tail_at: TABLE_HEADER_BYTES, sealed: None }
    }

    /// Starts reading the whole table ahead of a scan of every entry
    /// (statistics, compaction, a delete, a fingerprint).
    pub fn will_scan(&self) {
        if let Some(m) = &self.map {
            m.will_need(0, self.len);
        }
    }

    /// Records in the sealed section (0 for a format-1 table).
    pub fn sealed_records(&self) -> u64 {
        self.sealed.as_ref().map_or(0, |s| s.records)
    }

    /// The sealed section's kind, if any.
    pub fn sealed_kind(&self) -> Option<Sealed> {
        self.sealed.as_ref().map(|s| s.kind)
    }

    /// Bytes of table the store names (header, sealed pages, entries).
    pub fn bytes(&self) -> u64 {
        self.len as u64
    }

    /// `N` bytes at `at`: from the mapping, else (not mapped, or faulted)
    /// through the file.
    fn small<const N: usize>(&self, at: usize) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        let mapped = self.map.as_ref().and_then(|m| m.read(at, N, |s| b.copy_from_slice(s)));
        if mapped.is_none() {
            self.read_at(&mut b, at)?;
        }
        Ok(b)
    }

    /// Checks sealed page `p` once per handle.
    fn verify_page(&self, sec: &Section, p: u64) -> Result<()> {
        let (word, bit) = (&sec.verified[(p / 64) as usize], 1u64 << (p % 64));
        if word.load(Relaxed) & bit != 0 {
            return Ok(());
        }
        let at = (p as usize + 1) * PAGE;
        let page: [u8; PAGE] = self.small(at)?;
        let (want, got) = (u32_at(&page, 0), page_crc(p, &page));
        if want != got {
            let what = match sec.kind {
                Sealed::Variable => {
                    format!("entries of records {}..{}", p * VAR_PER_PAGE, ((p + 1) * VAR_PER_PAGE).min(sec.records))
                }
                Sealed::Fixed { .. } => format!("checksums of blocks {}..", p * CRCS_PER_PAGE),
            };
            return Err(corrupted(
                self.path.display().to_string(),
                format!("table page {p} ({what}) has checksum {got:#010x}, stored {want:#010x}"),
            ));
        }
        word.fetch_or(bit, Relaxed);
        Ok(())
    }

    /// The path of the table file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `e` naming this file and `bytes` in it: entry decoding knows only
    /// the record's index.
    fn locate(&self, e: Error, bytes: std::ops::Range<usize>) -> Error {
        match e {
            Error::Corrupted { what, detail } => corrupted(
                format!("{}, {what}", self.path.display()),
                format!("{detail} (bytes {}..{})", bytes.start, bytes.end),
            ),
            e => e,
        }
    }

    /// The entry of sealed record `i`.
    fn sealed_entry(&self, sec: &Section, i: u64) -> Result<Entry> {
        match sec.kind {
            Sealed::Variable => {
                let (p, j) = (i / VAR_PER_PAGE, (i % VAR_PER_PAGE) as usize);
                self.verify_page(sec, p)?;
                let page = (p as usize + 1) * PAGE;
                let h: [u8; 8] = self.small(page + 4)?;
                let last = j as u64 + 1 == VAR_PER_PAGE || i + 1 == sec.records;
                let at = page + VAR_HEADER + j * VAR_ENTRY;
                let (e, end) = if last {
                    let e: [u8; VAR_ENTRY] = self.small(at)?;
                    (e, u32_at(&h, 4))
                } else {
                    let b: [u8; 2 * VAR_ENTRY] = self.small(at)?;
                    (b[..VAR_ENTRY].try_into().expect("12 bytes"), u32_at(&b, VAR_ENTRY))
                };
                let offset = u32_at(&e, 0);
                let word = u32_at(&e, 4);
                let bytes = at..at + VAR_ENTRY;
                let codec = Codec::from_tag((word >> 30) as u8).ok_or_else(|| {
                    let e = corrupted(format!("table entry {i}"), format!("unknown codec tag {}", word >> 30));
                    self.locate(e, bytes.clone())
                })?;
                let stored_len = end.checked_sub(offset).ok_or_else(|| {
                    let e =
                        corrupted(format!("table entry {i}"), format!("offsets go backwards ({offset} then {end})"));
                    self.locate(e, bytes.clone())
                })?;
                let e = Entry {
                    chunk: ChunkId(u32_at(&h, 0)),
                    offset: u64::from(offset),
                    stored_len,
                    logical_len: word & ((1 << 30) - 1),
                    checksum: Some(u32_at(&e, 8)),
                    codec,
                    within: 0,
                };
                e.check_shape(i).map_err(|e| self.locate(e, bytes))?;
                Ok(e)
            }
            Sealed::Fixed { item_len, block_records, chunk_records, first_chunk } => {
                let (c, r) = (i / chunk_records, i % chunk_records);
                let br = u64::from(block_records);
                let b = c * Sealed::blocks_per_chunk(block_records, chunk_records) + r / br;
                self.verify_page(sec, b / CRCS_PER_PAGE)?;
                let at = (b / CRCS_PER_PAGE + 1) as usize * PAGE + 4 + (b % CRCS_PER_PAGE) as usize * 4;
                let crc: [u8; 4] = self.small(at)?;
                let first = r / br * br;
                let n = br.min(chunk_records - first).min(sec.records - (c * chunk_records + first));
                let chunk = u32::try_from(c).ok().and_then(|c| first_chunk.checked_add(c)).ok_or_else(|| {
                    self.locate(corrupted(format!("table entry {i}"), "chunk number overflows"), 56..60)
                })?;
                Ok(Entry {
                    chunk: ChunkId(chunk),
                    offset: first * u64::from(item_len),
                    stored_len: (n * u64::from(item_len)) as u32,
                    logical_len: item_len,
                    checksum: Some(u32::from_le_bytes(crc)),
                    codec: Codec::Raw,
                    within: ((r - first) * u64::from(item_len)) as u32,
                })
            }
        }
    }

    /// Byte offset of the table bytes [`Table::entry`] reads first for record
    /// `i` (its format-1 entry, or its sealed page's entry or block checksum).
    fn entry_at(&self, i: u64) -> Option<usize> {
        let at = match &self.sealed {
            Some(sec) if i < sec.records => match sec.kind {
                Sealed::Variable => {
                    (i / VAR_PER_PAGE + 1) * PAGE as u64 + (VAR_HEADER + VAR_ENTRY * (i % VAR_PER_PAGE) as usize) as u64
                }
                Sealed::Fixed { block_records, chunk_records, .. } => {
                    let (c, r) = (i / chunk_records, i % chunk_records);
                    let b = c * Sealed::blocks_per_chunk(block_records, chunk_records) + r / u64::from(block_records);
                    (b / CRCS_PER_PAGE + 1) * PAGE as u64 + 4 + (b % CRCS_PER_PAGE) * 4
                }
            },
            _ => {
                let (header, size) = match self.format {
                    Format::Native => (self.tail_at, ENTRY_BYTES as u64),
                    Format::Loaderx => (LOADERX_HEADER, LOADERX_ENTRY as u64),
                };
                let sealed = self.sealed.as_ref().map_or(0, |s| s.records);
                i.checked_sub(sealed)?.checked_mul(size)?.checked_add(header as u64)?
            }
        };
        usize::try_from(at).ok()
    }

    /// Prepares reading the entries of `indices` ([`Table::entry`] of each
    /// follows). The pages holding them that are not in memory are read all at
    /// once, without waiting, so a cold gather waits for one round of table
    /// reads rather than a fault per entry in turn (the mapping is read at
    /// random, so the kernel reads nothing ahead). Then their cache lines are
    /// loaded into the CPU cache: entries of a random batch lie in scattered
    /// lines, and reading them one after another waits for each miss in turn.
    pub fn prefetch(&self, indices: &[u64]) {
        let Some(map) = self.map.as_ref() else { return };
        let epoch = crate::io::mmap::evictions();
        if let Some(e) = epoch {
            map.confirm(&self.pages, e);
        }
        let mut cold = Vec::new();
        for &i in indices {
            if let Some(p) = self.entry_at(i).map(|at| at / PAGE) {
                if epoch.is_none() || !self.pages.known(p..p + 1) {
                    cold.push(p);
                }
            }
        }
        if !cold.is_empty() {
            map.will_need_pages(&self.pages, &mut cold);
        }
        for &i in indices {
            if let Some(at) = self.entry_at(i) {
                map.prefetch(at);
            }
        }
    }

    /// Loads the cache lines holding the entries of `indices` into the CPU
    /// cache, and no more: a gather over many tables (a dataset of parts)
    /// touching a record or two of each, whose tables are in memory (read
    /// when the parts opened), would pay [`Table::prefetch`]'s residency
    /// checks, system calls included, once per table.
    pub fn prefetch_lines(&self, indices: &[u64]) {
        let Some(map) = self.map.as_ref() else { return };
        map.prefetch_guard();
        for &i in indices {
            if let Some(at) = self.entry_at(i) {
                map.prefetch(at);
                // The word of the sealed page's "verified" bit (`verify_page`).
                let sealed = self.sealed.as_ref().filter(|sec| i < sec.records);
                if let Some(w) = sealed.and_then(|sec| sec.verified.get((at / PAGE).checked_sub(1)? / 64)) {
                    crate::io::prefetch::prefetch_line(w);
                }
            }
        }
    }

    /// The entry of record `i` (caller checked `i < records`).
    pub fn entry(&self, i: u64) -> Result<Entry> {
        let mut i_tail = i;
        if let Some(sec) = &self.sealed {
            if i < sec.records {
                return self.sealed_entry(sec, i);
            }
            i_tail = i - sec.records;
        }
        let (header, size) = match self.format {
            Format::Native => (self.tail_at, ENTRY_BYTES),
            Format::Loaderx => (LOADERX_HEADER, LOADERX_ENTRY),
        };
        let at = usize::try_from(i_tail)
            .ok()
            .and_then(|i| i.checked_mul(size))
            .and_then(|o| o.checked_add(header))
            .filter(|&at| at + size <= self.len)
            .ok_or(Error::IndexOutOfRange { index: i, len: self.records })?;
        let decode = |b: &[u8]| {
            match self.format {
                Format::Native => Entry::decode(i, b),
                Format::Loaderx => Entry::decode_loaderx(i, b),
            }
            .map_err(|e| self.locate(e, at..at + size))
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

fn check_len(file: &File, path: &PathBuf, need: u64) -> Result<()> {
    let len = file.metadata().map_err(io_err("stat", path))?.len();
    if len < need {
        return Err(corrupted(
            path.display().to_string(),
            format!("{len} bytes, the head names {need}: bytes {len}..{need} are missing"),
        ));
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
        let head = crate::format::head::Head::read(&crate::io::fs::Dir::open(dir.path()).unwrap()).unwrap();
        let open = |map| {
            Table::open_native_with(
                &crate::io::fs::Dir::open(dir.path()).unwrap(),
                head.generation,
                head.layout,
                head.records,
                map,
            )
            .unwrap()
        };
        let (mapped, unmapped) = (open(true), open(false));
        assert!(mapped.map.is_some() && unmapped.map.is_none());
        for i in 0..300 {
            assert_eq!(mapped.entry(i).unwrap(), unmapped.entry(i).unwrap());
        }
        let path = dir.path().join(table_name(head.generation));
        // Entry 200 lies in the table's third page: the cut leaves two pages.
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(8192).unwrap();
        for t in [&mapped, &unmapped] {
            assert_eq!(t.entry(10).unwrap(), unmapped.entry(10).unwrap());
            let e = t.entry(299).unwrap_err();
            let Error::Corrupted { what, detail } = e else { panic!("{e:?}") };
            assert!(what.ends_with(&table_name(head.generation)) && detail.contains("shrank"), "{what}: {detail}");
        }
        assert!(mapped.map.as_ref().unwrap().faulted());
    }
}
