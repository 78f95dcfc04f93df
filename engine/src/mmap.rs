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
