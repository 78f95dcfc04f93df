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

/// A chunk's read-only mapping, for copying records whose pages are in the
/// page cache without a system call per record.
///
/// Residency is asked of the kernel (mincore) for every record, right before
/// the copy. Remembering pages seen resident would save that call but goes
/// stale when the kernel evicts pages (memory pressure, `drop_caches`,
/// `fadvise(DONTNEED)`), and copying an evicted page faults it back in
/// synchronously, with the kernel's readahead: measured here, 14 times the
/// bytes a cold gather needs.
pub(crate) struct ChunkMap {
    map: Mmap,
}

impl ChunkMap {
    pub fn new(file: &File, len: usize) -> io::Result<ChunkMap> {
        Ok(ChunkMap { map: map_chunk(file, len)? })
    }

    /// The bytes at `offset..offset + len` if their pages are in memory.
    pub fn resident(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len).filter(|&e| e <= self.map.len())?;
        resident(&self.map, offset, len).then(|| &self.map[offset..end])
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
