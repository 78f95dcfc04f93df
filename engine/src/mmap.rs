//! Read-only mappings of record tables.

use std::fs::File;
use std::io;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use memmap2::{Mmap, MmapOptions};

/// Maps the first `len` bytes of a table file read-only.
///
/// The caller has checked that the file is at least `len` bytes long, so no
/// mapped page lies past the end of the file when the map is made.
pub(crate) fn map_table(file: &File, len: usize) -> io::Result<Mmap> {
    // SAFETY: a published table prefix is never modified or truncated by zring:
    // appends write past the committed length, and deletes and compactions write
    // a new table file and rename. Within this process nothing writes through
    // another mapping of it. A different program truncating the file while it is
    // mapped is outside the store's contract (documented in DESIGN.md), as for
    // every mmap-based store.
    unsafe { MmapOptions::new().len(len).map(file) }
}

/// Maps the first `len` bytes of a chunk file read-only, for copying hot
/// records straight out of the page cache. `len` must be non-zero and at most
/// the file's length.
pub(crate) fn map_chunk(file: &File, len: usize) -> io::Result<Mmap> {
    // SAFETY: committed chunk bytes are never modified or truncated while a
    // store is open: appends write past the committed length, compaction writes
    // new files and unlinks old ones (a mapping keeps an unlinked file alive),
    // and recovery only cuts bytes past the committed length, before any
    // reader of that process exists. `len` is at most the file's length (the
    // caller checked it against the file's size), so no mapped page lies past
    // the end of the file.
    // No MADV_RANDOM: records are copied from this mapping only once their
    // pages are known to be in memory, so faults are minor, and the kernel's
    // fault-around (mapping neighbouring cached pages with each fault) saves
    // most of them.
    unsafe { MmapOptions::new().len(len).map(file) }
}

const PAGE: usize = 4096;

/// A chunk's read-only mapping, for copying records whose pages are in the
/// page cache without a system call per record.
///
/// Residency is asked of the kernel (mincore) the first time a page is
/// needed and then remembered in a bitmap. A remembered page can go stale
/// when the kernel evicts it; copying it would then fault it back in
/// synchronously, with the kernel's readahead (measured: 14 times the bytes a
/// cold gather needs). So the bitmap is tied to the machine's count of evicted
/// page-cache pages ([`evictions`]): when that count has moved, the bitmap is
/// cleared and pages are asked about again. Evictions it does not count (a
/// `posix_fadvise(DONTNEED)` by another program) cost synchronous faults,
/// never wrong bytes.
pub(crate) struct ChunkMap {
    map: Mmap,
    seen: Box<[AtomicU64]>,
    /// The eviction count the bitmap is valid for.
    epoch: AtomicU64,
}

impl ChunkMap {
    pub fn new(file: &File, len: usize) -> io::Result<ChunkMap> {
        let map = map_chunk(file, len)?;
        let seen = (0..len.div_ceil(PAGE).div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Ok(ChunkMap { map, seen, epoch: AtomicU64::new(u64::MAX) })
    }

    /// The bytes at `offset..offset + len` if their pages are in memory.
    /// `epoch` is [`evictions`] read at the start of the gather, or `None` to
    /// ask the kernel without consulting the bitmap (small gathers, where one
    /// read of the counters costs more than asking per record).
    pub fn resident(&self, offset: usize, len: usize, epoch: Option<u64>) -> Option<&[u8]> {
        let end = offset.checked_add(len).filter(|&e| e <= self.map.len())?;
        let Some(epoch) = epoch else {
            return resident(&self.map, offset, len).then(|| &self.map[offset..end]);
        };
        if self.epoch.load(Relaxed) != epoch {
            for w in self.seen.iter() {
                w.store(0, Relaxed);
            }
            self.epoch.store(epoch, Relaxed);
        }
        let pages = offset / PAGE..end.div_ceil(PAGE);
        let known = pages.clone().all(|p| self.seen[p / 64].load(Relaxed) & (1 << (p % 64)) != 0);
        if !known {
            if !resident(&self.map, offset, len) {
                return None;
            }
            for p in pages {
                self.seen[p / 64].fetch_or(1 << (p % 64), Relaxed);
            }
        }
        Some(&self.map[offset..end])
    }
}

/// The machine's count of page-cache pages evicted so far (reclaimed under
/// memory pressure, or dropped through `drop_caches`), from `/proc/vmstat`;
/// `None` where it cannot be read (then every record is asked about).
pub(crate) fn evictions() -> Option<u64> {
    static VMSTAT: std::sync::OnceLock<Option<File>> = std::sync::OnceLock::new();
    let f = VMSTAT.get_or_init(|| File::open("/proc/vmstat").ok()).as_ref()?;
    let mut buf = [0u8; 8192];
    let n = std::os::unix::fs::FileExt::read_at(f, &mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    let mut sum = 0u64;
    let mut found = false;
    for line in text.lines() {
        let mut it = line.split_ascii_whitespace();
        if let (Some(k), Some(v)) = (it.next(), it.next()) {
            if k == "pgsteal_file" || k == "drop_pagecache" {
                sum = sum.wrapping_add(v.parse::<u64>().ok()?);
                found = true;
            }
        }
    }
    found.then_some(sum)
}

/// Whether every page of `map[offset..offset + len]` is in memory, so copying
/// it performs no I/O.
fn resident(map: &Mmap, offset: usize, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    let start = offset / PAGE * PAGE;
    let end = offset + len;
    if end > map.len() {
        return false;
    }
    let pages = (end - start).div_ceil(PAGE);
    let mut vec = [0u8; 64];
    let mut heap;
    let out: &mut [u8] = if pages <= vec.len() {
        &mut vec[..pages]
    } else {
        heap = vec![0u8; pages];
        &mut heap
    };
    // SAFETY: `start` is page aligned (mappings start at a page boundary) and
    // `start..end` lies inside the mapping, so the kernel reads only our
    // mapping's page tables; `out` has one byte per page of the range.
    let r = unsafe { libc::mincore(map.as_ptr().add(start) as *mut libc::c_void, end - start, out.as_mut_ptr()) };
    r == 0 && out.iter().all(|b| b & 1 == 1)
}
