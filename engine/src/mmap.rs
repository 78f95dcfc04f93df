//! Read-only mappings of record tables.

use std::fs::File;
use std::io;

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

/// A chunk's read-only mapping and the pages of it seen in memory.
///
/// Asking the kernel (mincore) for every record would cost a system call per
/// record, about as much as the copy it saves. Pages once seen resident are
/// remembered in a bitmap; a page evicted afterwards costs a synchronous page
/// fault on the next copy (slow, never wrong). Eviction is rare where this
/// path is used: stores larger than half of memory read with O_DIRECT instead.
pub(crate) struct ChunkMap {
    map: Mmap,
    seen: Box<[std::sync::atomic::AtomicU64]>,
}

impl ChunkMap {
    pub fn new(file: &File, len: usize) -> io::Result<ChunkMap> {
        let map = map_chunk(file, len)?;
        let pages = len.div_ceil(PAGE);
        let seen = (0..pages.div_ceil(64)).map(|_| std::sync::atomic::AtomicU64::new(0)).collect();
        Ok(ChunkMap { map, seen })
    }

    fn pages(&self, offset: usize, len: usize) -> std::ops::Range<usize> {
        offset / PAGE..(offset + len).div_ceil(PAGE)
    }

    fn all_seen(&self, pages: std::ops::Range<usize>) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        pages.into_iter().all(|p| self.seen[p / 64].load(Relaxed) & (1 << (p % 64)) != 0)
    }

    /// Records that the pages of `offset..offset + len` are in memory.
    pub fn mark(&self, offset: usize, len: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        if len == 0 || offset + len > self.map.len() {
            return;
        }
        for p in self.pages(offset, len) {
            self.seen[p / 64].fetch_or(1 << (p % 64), Relaxed);
        }
    }

    /// The bytes at `offset..offset + len` if their pages are in memory.
    pub fn resident(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len).filter(|&e| e <= self.map.len())?;
        if len == 0 {
            return Some(&[]);
        }
        if !self.all_seen(self.pages(offset, len)) {
            if !resident(&self.map, offset, len) {
                return None;
            }
            self.mark(offset, len);
        }
        Some(&self.map[offset..end])
    }
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
