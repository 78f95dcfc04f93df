//! Snapshot pins: how a reader keeps the chunk files of the snapshot it
//! opened, while writers in any process compact the store under it.
//!
//! Chunk files are opened when first read ([`crate::io::fds`]), so a reader that
//! opened a store before a compaction still needs the old chunk files later.
//! A reader therefore *pins* its snapshot: an open file description
//! lock (`F_OFD_SETLK`) for reading on the store's `pins` file, over the byte
//! range `[chunk_base, chunk_base + chunk_count)`, one byte standing for each
//! chunk id: the chunks its snapshot names and no others. Chunk ids only grow
//! (appends add chunks after the last, compaction writes after every
//! committed chunk), so the chunks of later heads lie past the range: a
//! long-lived reader keeps at most its own snapshot's files, however many
//! compactions run after it. An append that extends the snapshot's last
//! chunk writes past the snapshot's length in a file the pin already
//! covers; one that adds chunks publishes (in the writer's own process) a
//! snapshot whose pin covers them too ([`Pin::covers`]); readers in other
//! processes never see chunks a committed head does not name.
//!
//! A process removes a chunk file that no committed head names only while it
//! holds a write lock on that chunk's byte, taken without waiting
//! ([`remove_unpinned`]): a pinned chunk stays on disk. The writer tries
//! again at its next sync, compaction or recovery, and the last handle to
//! close over superseded chunks, reader or writer, in any process, removes
//! those no one pins any more ([`sweep`]). A reader takes its pin *before*
//! it checks that its snapshot's chunk files exist, so either the remover
//! saw the pin and kept the files, or the reader sees a file gone and reads
//! the new head instead.
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
//! writable), writable by the store's writers and readable by its readers
//! ([`mode`]); readers only open it. A reader waits for a conflicting write
//! lock (a remover's, an instant) at most `ZRING_LOCK_WAIT_MS`, then fails
//! with [`Error::PinWait`]. Anyone who may read the store can read-lock any
//! range and so keep chunks on disk; removal never waits for that (see
//! `engine/DESIGN.md`, which argues why that is all a reader gains). A reader that finds none (a store no
//! writer of this version has opened yet) reads unpinned; one that finds
//! something else at its name (a FIFO, a device, a link) fails at once
//! naming it, as a writer does; a chunk removed under it
//! is then [`Error::Stale`], as is a store replaced under a reader
//! (`overwrite=True`, or deleted and written again): see
//! [`crate::io::fds::ChunkFile`].

use crate::format::names::PINS_FILE;
use std::fs::File;
use std::sync::Arc;

use crate::error::{io_err, Error, Result};
use crate::io::fs::Dir;

/// A reader's pin on chunks `base..base + count`; released when dropped.
#[derive(Debug)]
pub(crate) struct Pin {
    _file: File,
    base: u32,
    count: u32,
}

impl Pin {
    /// Whether this pin keeps every one of chunks `base..base + count`.
    pub fn covers(&self, base: u32, count: u32) -> bool {
        self.base <= base && u64::from(base) + u64::from(count) <= u64::from(self.base) + u64::from(self.count)
    }
}

/// Pins chunks `base..base + count` of the store at `dir` (module docs).
/// `None` when there is no pins file (or this reader may not open it) or
/// its file system has no OFD locks: the snapshot is read unpinned. A pins
/// file that is not a regular file is an error (`open ... pins: not a
/// regular file`) at once, never a wait.
pub(crate) fn pin(dir: &Dir, base: u32, count: u32) -> Result<Option<Pin>> {
    let p = dir.join(PINS_FILE);
    // Readers never write to the store's directory: a store no writer of
    // this version has opened yet has no pins file, and is read unpinned
    // (so is one whose pins file this reader may not open). Something other
    // than a regular file at its name (a FIFO, whose open is not waited
    // for; a device; a link) is an error naming it, as it is to a writer.
    let file = match dir.open_quiet(PINS_FILE, rustix::fs::OFlags::RDONLY) {
        Ok(file) => file,
        Err(Error::Io { source, .. }) if not_a_file(&source) => {
            return Err(io_err("open", &p)(crate::io::fs::not_regular()))
        }
        Err(_) => return Ok(None),
    };
    // A store always has a chunk; a count of 0 would mean "to infinity".
    let count = count.max(1);
    match lock(&file, libc::F_RDLCK as i16, base, count) {
        Ok(true) => Ok(Some(Pin { _file: file, base, count })),
        // A remover holds a chunk's byte only for the instant of its
        // removal; anyone who may write `pins` can hold one for longer.
        Ok(false) => {
            let bound = crate::io::locks::wait_bound();
            match crate::io::locks::lock_bounded(&file, libc::F_RDLCK, base, count, bound) {
                Ok(true) => Ok(Some(Pin { _file: file, base, count })),
                Ok(false) => Err(Error::PinWait {
                    path: p.clone(),
                    first: base,
                    end: u64::from(base) + u64::from(count),
                    waited_ms: bound.as_millis() as u64,
                }),
                Err(e) => Err(io_err("lock", &p)(e)),
            }
        }
        // A file system without OFD locks: read unpinned.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOLCK | libc::EOPNOTSUPP)) => Ok(None),
        Err(e) => Err(io_err("lock", &p)(e)),
    }
}

/// Whether opening the pins file failed because something other than a
/// regular file is at its name: [`crate::io::fs::not_regular`], or `ELOOP`
/// (a symbolic link, never followed).
fn not_a_file(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::InvalidInput || e.raw_os_error() == Some(libc::ELOOP)
}

/// Opens (creating it if needed) the pins file for a writer, which locks
/// chunk bytes for writing. It is made [`mode`]; one made before with
/// fewer of those bits (0644 in a group store) gets them where this
/// process may change its mode (its owner), so every writer can remove
/// chunks.
pub(crate) fn create(dir: &Dir) -> Result<File> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let want = mode(dir.metadata()?.mode());
    let file = dir.open_or_create_mode(PINS_FILE, want)?;
    let m = file.metadata().map_err(io_err("stat", dir.join(PINS_FILE)))?;
    if m.mode() & want != want && m.uid() == rustix::process::geteuid().as_raw() {
        let _ = file.set_permissions(std::fs::Permissions::from_mode((m.mode() | want) & 0o777));
    }
    Ok(file)
}

/// The mode of a store's `pins` file in a directory of mode `dir_mode`:
/// writable by those who may write the store ([`crate::io::fs::lock_mode`]),
/// readable by those who may read it, so each of its readers can pin.
pub(crate) fn mode(dir_mode: u32) -> u32 {
    crate::io::fs::lock_mode(dir_mode) | (dir_mode & 0o444)
}

/// Removes chunk file `name` of `dir` (chunk `id`) unless a reader pins it;
/// `true` when it is gone (or was already). `pins` is the writer's pins file.
pub(crate) fn remove_unpinned(pins: &File, dir: &Dir, name: &str, id: u32) -> Result<bool> {
    let path = &dir.join(name);
    match lock(pins, libc::F_WRLCK as i16, id, 1) {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        // No OFD locks here: nothing can pin, remove as before pins existed.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOLCK | libc::EOPNOTSUPP)) => {}
        Err(e) => return Err(io_err("lock", path)(e)),
    }
    let r = match dir.remove(name) {
        Ok(()) => Ok(true),
        Err(crate::error::Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(e),
    };
    let _ = lock(pins, libc::F_UNLCK as i16, id, 1);
    r
}

/// Removes every chunk file of the store at `dir` older than `base` (the
/// first chunk of a committed head, so no later head names them) that no
/// reader pins; returns the ids of those kept. `pins` is the pins file
/// opened for writing.
pub(crate) fn sweep(dir: &Dir, pins: &File, base: u32) -> Result<Vec<u32>> {
    let mut kept = Vec::new();
    for (name, _) in dir.entries()? {
        let id = name.strip_prefix("chunk-").and_then(|n| n.strip_suffix(".zr")?.parse::<u32>().ok());
        if let Some(id) = id.filter(|&id| id < base) {
            if !remove_unpinned(pins, dir, &name, id)? {
                kept.push(id);
            }
        }
    }
    Ok(kept)
}

/// What a handle does as it closes, after its snapshot (and pin) is gone:
/// when it may have held the last pin on superseded chunks, or knows of
/// chunks kept for a reader, it removes those that no one pins now
/// ([`sweep`]), so they do not wait for the next writer. Best effort: a
/// reader without write access to the store leaves them to one that has.
#[derive(Debug, Default)]
pub(crate) struct Closing {
    /// The store's directory, and the first chunk of the snapshot the
    /// handle closed with; `None`: nothing to do (unpinned, a loaderx
    /// store, a forked child's copy).
    pub at: Option<(Arc<Dir>, u32)>,
    /// A writer's: the first chunk of its last head, when it knew of chunks
    /// kept for readers (a writer that knew of none has nothing to sweep).
    pub deferred: Option<u32>,
    /// Whether the handle was a writer.
    pub writer: bool,
}

impl Drop for Closing {
    fn drop(&mut self) {
        let Some((dir, base)) = self.at.take() else { return };
        let head_base = match (self.writer, self.deferred) {
            (true, None) => return,
            (true, Some(b)) => b,
            (false, _) => match crate::format::head::Head::read(&dir) {
                Ok(h) if h.chunk_base > base => h.chunk_base,
                _ => return,
            },
        };
        let Ok(pins) = dir.open_quiet(PINS_FILE, rustix::fs::OFlags::RDWR) else { return };
        let _ = sweep(&dir, &pins, head_base);
    }
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

/// Takes (or with `F_UNLCK` releases) an OFD lock without waiting: `Ok(false)`
/// when another description holds a conflicting one.
pub(crate) fn lock(file: &File, kind: i16, start: u32, len: u32) -> std::io::Result<bool> {
    crate::io::locks::lock(file, kind.into(), start, len, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Issue 36: `pins` was 0644 whatever the store's mode, so a second
    /// group member could not write a group store at all. It is writable
    /// by those who may write the directory and readable by those who may
    /// read it; an older 0644 one gains the group's bits from its owner.
    #[test]
    fn pins_is_writable_by_the_stores_writers_and_readable_by_its_readers() {
        for (dir_mode, want) in [(0o755, 0o644), (0o775, 0o664), (0o2770, 0o660), (0o700, 0o600), (0o777, 0o666)] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(dir_mode)).unwrap();
            assert_eq!(mode(dir_mode), want, "dir {dir_mode:o}");
            // An older file, and one the umask stripped, get the bits.
            std::fs::write(dir.path().join(PINS_FILE), b"").unwrap();
            std::fs::set_permissions(dir.path().join(PINS_FILE), std::fs::Permissions::from_mode(0o644 & want))
                .unwrap();
            drop(create(&Dir::open(dir.path()).unwrap()).unwrap());
            let got = std::fs::metadata(dir.path().join(PINS_FILE)).unwrap().permissions().mode() & 0o777;
            assert_eq!(got & want, want, "dir {dir_mode:o}: pins {got:o}");
        }
    }

    /// A FIFO at `pins` made every reader's open wait (for a writer of the
    /// FIFO, forever). Something other than a regular file there is an
    /// error naming the file, at once; no pins file at all reads unpinned.
    #[test]
    fn a_pins_file_that_is_not_a_regular_file_is_an_error_not_a_wait() {
        let dir = tempfile::tempdir().unwrap();
        let d = std::sync::Arc::new(Dir::open(dir.path()).unwrap());
        assert!(pin(&d, 0, 1).unwrap().is_none(), "no pins file: read unpinned");
        let pins = dir.path().join(PINS_FILE);
        let fifo = || {
            let mode = rustix::fs::Mode::from_raw_mode(0o644);
            rustix::fs::mknodat(rustix::fs::CWD, &pins, rustix::fs::FileType::Fifo, mode, 0).unwrap();
        };
        let planted: [(&str, &dyn Fn()); 3] = [
            ("a FIFO", &fifo),
            ("a directory", &|| std::fs::create_dir(&pins).unwrap()),
            ("a link", &|| std::os::unix::fs::symlink("elsewhere", &pins).unwrap()),
        ];
        for (what, plant) in planted {
            plant();
            let (tx, rx) = std::sync::mpsc::channel();
            let d2 = std::sync::Arc::clone(&d);
            std::thread::spawn(move || tx.send(pin(&d2, 0, 1).map(|p| p.is_some())));
            let got = rx.recv_timeout(std::time::Duration::from_secs(10));
            let err = match got {
                Ok(Err(e)) => e.to_string(),
                other => panic!("{what} at pins: {other:?}, want an error at once"),
            };
            assert!(err.contains("pins") && err.contains("not a regular file"), "{what}: {err}");
            let _ = std::fs::remove_file(&pins).or_else(|_| std::fs::remove_dir(&pins));
        }
        // A writer refuses it as well.
        fifo();
        assert!(create(&d).unwrap_err().to_string().contains("not a regular file"));
    }

    #[test]
    fn a_pin_keeps_its_own_chunks_only_and_frees_them_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let d = Dir::open(dir.path()).unwrap();
        let writer = create(&d).unwrap();
        for id in 0..8 {
            std::fs::write(dir.path().join(format!("c{id}")), b"x").unwrap();
        }
        let p = pin(&d, 3, 3).unwrap().expect("OFD locks on the test file system");
        assert!(p.covers(3, 3) && p.covers(4, 2) && !p.covers(3, 4) && !p.covers(2, 1));
        assert!(!pinned(&writer, 2) && !pinned(&writer, 6) && !pinned(&writer, 1000));
        assert!(pinned(&writer, 3) && pinned(&writer, 5));
        assert!(remove_unpinned(&writer, &d, "c2", 2).unwrap());
        assert!(!remove_unpinned(&writer, &d, "c4", 4).unwrap());
        // The chunks of a later head are not the reader's to keep.
        assert!(remove_unpinned(&writer, &d, "c6", 6).unwrap());
        assert!(!dir.path().join("c2").exists() && dir.path().join("c4").exists());
        assert!(!dir.path().join("c6").exists() && dir.path().join("c7").exists());
        // A second reader's pin in the same process is its own.
        let q = pin(&d, 4, 1).unwrap().unwrap();
        drop(p);
        assert!(remove_unpinned(&writer, &d, "c3", 3).unwrap());
        assert!(!remove_unpinned(&writer, &d, "c4", 4).unwrap());
        drop(q);
        assert!(remove_unpinned(&writer, &d, "c4", 4).unwrap());
        assert!(!dir.path().join("c4").exists());
    }
}
