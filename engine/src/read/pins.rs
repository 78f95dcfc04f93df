//! Snapshot pins: how a reader keeps the chunk files of the snapshot it
//! opened, while writers in any process compact the store under it.
//!
//! Chunk files are opened when first read ([`crate::io::fds`]), so a reader that
//! opened a store before a compaction still needs the old chunk files later.
//! A reader therefore *pins* its snapshot: an open file description
//! lock (`F_OFD_SETLK`) for reading on the store's `pins` file, over the byte
//! range `[chunk_base, ∞)`, one byte standing for each chunk id. Chunk ids only
//! grow (appends add chunks after the last, compaction writes after every
//! committed chunk), so that range covers every chunk the snapshot names and
//! every chunk appended after it, and none that an older snapshot alone needs.
//!
//! A writer removes a chunk file that no committed head names only while it
//! holds a write lock on that chunk's byte, taken without waiting
//! ([`remove_unpinned`]): a pinned chunk stays on disk, and the writer tries
//! again at its next sync, compaction or recovery. A reader takes its pin
//! *before* it checks that its snapshot's chunk files exist, so either the
//! writer saw the pin and kept the files, or the reader sees a file gone and
//! reads the new head instead.
//!
//! Why these locks: OFD locks belong to the open file description, not the
//! process, so two handles in one process exclude each other exactly as two
//! processes do, and closing one descriptor does not drop another's lock
//! (classic POSIX record locks fail both); the kernel releases them when the
//! description closes, so a reader that dies unpins at once, with nothing to
//! clean up. `flock` locks only whole files. The pins file is separate from
//! the writer's `lock`: on NFS `flock` is emulated with byte-range locks and
//! the two would collide.
//!
//! Writers create the pins file (a new store, or an older one opened
//! writable); readers only open it. A reader that finds none (a store no
//! writer of this version has opened yet) reads unpinned; a chunk removed under it
//! is then [`Error::Stale`], as is a store replaced under a reader
//! (`overwrite=True`, or deleted and written again): see
//! [`crate::io::fds::ChunkFile`].

use crate::format::names::PINS_FILE;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{io_err, Result};

/// A reader's pin on the chunks from `base` on; released when dropped.
#[derive(Debug)]
pub(crate) struct Pin {
    _file: File,
}

/// Pins chunks `base..` of the store at `dir` (module docs). `None` when the
/// pins file can neither be opened nor created: the snapshot is read unpinned.
pub(crate) fn pin(dir: &Path, base: u32) -> Result<Option<Pin>> {
    let p = dir.join(PINS_FILE);
    // Readers never write to the store's directory: a store no writer of
    // this version has opened yet has no pins file, and is read unpinned.
    let Ok(file) = OpenOptions::new().read(true).open(&p) else { return Ok(None) };
    match lock(&file, libc::F_RDLCK as i16, base, 0) {
        Ok(true) => Ok(Some(Pin { _file: file })),
        // A writer holds a chunk's byte only for the instant of its removal.
        Ok(false) => match lock_wait(&file, libc::F_RDLCK as i16, base) {
            Ok(()) => Ok(Some(Pin { _file: file })),
            Err(e) => Err(io_err("lock", &p)(e)),
        },
        // A file system without OFD locks: read unpinned.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOLCK | libc::EOPNOTSUPP)) => Ok(None),
        Err(e) => Err(io_err("lock", &p)(e)),
    }
}

/// Opens (creating it if needed) the pins file for a writer, which locks
/// chunk bytes for writing.
pub(crate) fn create(dir: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o644).open(dir.join(PINS_FILE))
}

/// Removes chunk file `path` (chunk `id`) unless a reader pins it; `true`
/// when it is gone (or was already). `pins` is the writer's pins file.
pub(crate) fn remove_unpinned(pins: &File, path: &Path, id: u32) -> Result<bool> {
    match lock(pins, libc::F_WRLCK as i16, id, 1) {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        // No OFD locks here: nothing can pin, remove as before pins existed.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOLCK | libc::EOPNOTSUPP)) => {}
        Err(e) => return Err(io_err("lock", path)(e)),
    }
    let r = match crate::io::fs::remove(path) {
        Ok(()) => Ok(true),
        Err(crate::error::Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(e),
    };
    let _ = lock(pins, libc::F_UNLCK as i16, id, 1);
    r
}

/// Whether chunk `id` is pinned by some reader now (a test of
/// [`remove_unpinned`]'s rule, for tests and reports).
#[cfg(test)]
pub(crate) fn pinned(pins: &File, id: u32) -> bool {
    let got = lock(pins, libc::F_WRLCK as i16, id, 1);
    if got.as_ref().is_ok_and(|&ok| ok) {
        let _ = lock(pins, libc::F_UNLCK as i16, id, 1);
    }
    matches!(got, Ok(false))
}

pub(crate) fn flock(kind: i16, start: u32, len: u32) -> libc::flock {
    // SAFETY: `flock` is a plain C struct of integers; all-zero is a valid value.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind;
    l.l_whence = libc::SEEK_SET as i16;
    l.l_start = libc::off_t::from(start);
    // 0 = to the end of the file and beyond.
    l.l_len = libc::off_t::from(len);
    l
}

/// Takes (or with `F_UNLCK` releases) an OFD lock without waiting: `Ok(false)`
/// when another description holds a conflicting one.
pub(crate) fn lock(file: &File, kind: i16, start: u32, len: u32) -> std::io::Result<bool> {
    let l = flock(kind, start, len);
    // SAFETY: the descriptor is open for as long as `file` is borrowed, and
    // F_OFD_SETLK reads the `flock` struct `l` points to, which outlives the call.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &l) };
    if r == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Takes an OFD lock, waiting for conflicting ones to go.
fn lock_wait(file: &File, kind: i16, start: u32) -> std::io::Result<()> {
    let l = flock(kind, start, 0);
    loop {
        // SAFETY: as in `lock`; F_OFD_SETLKW reads `l` only.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLKW, &l) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_keeps_its_chunks_and_later_ones_and_frees_them_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let writer = create(dir.path()).unwrap();
        for id in 0..6 {
            std::fs::write(dir.path().join(format!("c{id}")), b"x").unwrap();
        }
        let p = pin(dir.path(), 3).unwrap().expect("OFD locks on the test file system");
        assert!(!pinned(&writer, 2));
        assert!(pinned(&writer, 3) && pinned(&writer, 5) && pinned(&writer, 1000));
        assert!(remove_unpinned(&writer, &dir.path().join("c2"), 2).unwrap());
        assert!(!remove_unpinned(&writer, &dir.path().join("c4"), 4).unwrap());
        assert!(!dir.path().join("c2").exists() && dir.path().join("c4").exists());
        // A second reader's pin in the same process is its own.
        let q = pin(dir.path(), 4).unwrap().unwrap();
        drop(p);
        assert!(remove_unpinned(&writer, &dir.path().join("c3"), 3).unwrap());
        assert!(!remove_unpinned(&writer, &dir.path().join("c4"), 4).unwrap());
        drop(q);
        assert!(remove_unpinned(&writer, &dir.path().join("c4"), 4).unwrap());
        assert!(!dir.path().join("c4").exists());
    }
}
