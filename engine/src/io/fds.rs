//! Chunk-file descriptors: opened when a chunk is first read, and kept in one
//! bounded cache shared by every store of the process.
//!
//! Opening every chunk file when a store opens (a second time with O_DIRECT),
//! per handle, would need more descriptors than the usual soft limit of
//! 1,024 for a dataset past half a TiB of 1 GiB chunks, and sooner with
//! several streams or handles. So a store only checks each chunk's size when
//! it opens ([`crate::snapshot::chunk::open_chunk`]); a [`ChunkFile`] opens
//! its descriptors on first use through this cache, and a chunk never read in
//! direct mode never gets an O_DIRECT descriptor.
//!
//! # Numbers
//!
//! * The soft `RLIMIT_NOFILE` is taken as it is. (Raising it to the hard
//!   limit, as Go's runtime does, would pass the raised limit to every
//!   process the program starts, and a program that spawns workers with
//!   `posix_spawn` or `subprocess` has no hook to put it back.)
//! * The cache keeps at most a quarter of the soft limit open ([`capacity`],
//!   at least 16, at most 65,536), least recently used first out. The other
//!   three quarters belong to the program: Python and its libraries, sockets,
//!   each store's table and lock files, a writer's tail.
//! * One batch of reads names at most a sixteenth of the limit in distinct
//!   chunk files ([`batch_files`], at least 4): a batch holds its descriptors
//!   until its reads complete, outside the cache's count, and a process may
//!   run a gather on every core and every loader thread at once. Five such
//!   threads and a full cache use under half the limit. A gather of 256
//!   records scattered over 256 chunks under `ulimit -n 256` thus runs as
//!   16 batches instead of failing.
//! * An open that fails for want of descriptors (`EMFILE`, `ENFILE`) empties
//!   the cache and tries once more.
//! * A hit takes the cache's lock shared and stamps the entry's last use in
//!   an atomic, so the threads of a gather (one per core, and a loader's
//!   workers) never queue behind each other for a descriptor they all have;
//!   only a miss takes the lock exclusively, and a miss on a full cache
//!   evicts the entry used longest ago, found by a scan of the cache (at most
//!   [`capacity`] entries, next to an `open(2)` that costs as much).
//!
//! # Why a cached descriptor is never another file's
//!
//! Entries are keyed by a number each [`ChunkFile`] gets when a store handle
//! opens (never reused in the process), not by path: a store deleted and
//! created again at the same path, or a chunk replaced by compaction, gets new
//! numbers. Dropping the last reference to a `ChunkFile` (its handle and every
//! snapshot of it gone) closes its descriptors.
//!
//! # fork
//!
//! The cache is tagged with the pid that filled it; a forked child starts an
//! empty one (closing its copies of the parent's descriptors, which leaves the
//! parent's alone). Its lock is also one of those [`crate::fork`] holds across
//! `fork()`.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use crate::error::{io_err, Error, Result};
use crate::io::fs::Dir;
use crate::io::process::{PerProcess, Write};

/// Which store an entry belongs to: its directory's device, inode and birth
/// time (`memory::cache` module docs: why that identifies a store).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct StoreId {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    pub(crate) born: Option<SystemTime>,
}

impl StoreId {
    /// The identity of the store in directory `dir`.
    pub fn of(dir: &Path) -> Result<StoreId> {
        let m = std::fs::metadata(dir).map_err(io_err("stat", dir))?;
        Ok(StoreId { dev: m.dev(), ino: m.ino(), born: m.created().ok() })
    }

    /// The identity of the directory `dir` holds open.
    pub fn of_dir(dir: &Dir) -> Result<StoreId> {
        let m = dir.metadata()?;
        Ok(StoreId { dev: m.dev(), ino: m.ino(), born: m.created().ok() })
    }
}

/// Fraction (1/n) of the soft descriptor limit the cache may hold open.
const CACHE_SHARE: u64 = 4;
/// Fraction (1/n) of the soft limit one batch of reads may name in files.
const BATCH_SHARE: u64 = 16;

/// O_DIRECT support of a chunk file, learnt on its first direct open.
const DIRECT_UNKNOWN: u8 = 0;
const DIRECT_OK: u8 = 1;
const DIRECT_REFUSED: u8 = 2;

/// One chunk file of an open store; its descriptors live in the process's
/// cache (module docs).
#[derive(Debug)]
pub(crate) struct ChunkFile {
    id: u64,
    /// The store directory, by descriptor: the file is opened in it by name.
    dir: Arc<Dir>,
    name: String,
    /// `dir`'s path joined with `name`, for messages.
    path: PathBuf,
    /// The identity of the store directory when the snapshot naming this
    /// file was read; `None` where it could not be taken.
    store: Option<StoreId>,
    direct: AtomicU8,
}

impl ChunkFile {
    /// Where the file is.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The chunk file `name` (not opened yet) in `dir`, the store whose
    /// directory had identity `store` when its snapshot was read.
    pub fn new(dir: Arc<Dir>, name: String, store: Option<StoreId>) -> Arc<ChunkFile> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = dir.join(&name);
        Arc::new(ChunkFile {
            id: NEXT.fetch_add(1, Relaxed),
            dir,
            name,
            path,
            store,
            direct: AtomicU8::new(DIRECT_UNKNOWN),
        })
    }

    /// The identity of the store the file belongs to.
    pub fn store(&self) -> Option<StoreId> {
        self.store
    }

    /// A descriptor reading through the page cache.
    pub fn buffered(&self) -> Result<Arc<File>> {
        self.get(false)
    }

    /// A descriptor opened with O_DIRECT, or `None` where the file system
    /// refuses O_DIRECT (tmpfs, some network file systems): read it buffered.
    pub fn direct(&self) -> Result<Option<Arc<File>>> {
        if self.direct_refused() {
            return Ok(None);
        }
        match self.get(true) {
            Ok(f) => {
                self.direct.store(DIRECT_OK, Relaxed);
                Ok(Some(f))
            }
            Err(Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                self.direct.store(DIRECT_REFUSED, Relaxed);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether an O_DIRECT open of this file was refused.
    pub fn direct_refused(&self) -> bool {
        self.direct.load(Relaxed) == DIRECT_REFUSED
    }

    fn get(&self, direct: bool) -> Result<Arc<File>> {
        let key = (self.id, direct);
        {
            if let Some(f) = FDS.read().and_then(|fds| fds.hit(&key)) {
                return Ok(f);
            }
        }
        // Opened without the lock: an open can take long (a network file
        // system, a FIFO put in a chunk's place).
        let f = Arc::new(self.open(direct)?);
        Ok(lock().insert(key, f, capacity()))
    }

    /// Opens the file, relative to the store directory's descriptor and
    /// never through a link ([`crate::io::fs`]); [`Error::Stale`] when it is
    /// gone or the directory now holds another store (module docs of
    /// [`crate::snapshot::pins`]: a writer honouring pins never removes a
    /// file a snapshot names).
    fn open(&self, direct: bool) -> Result<File> {
        let mut flags = rustix::fs::OFlags::RDONLY;
        if direct {
            flags |= rustix::fs::OFlags::DIRECT;
        }
        let f = match self.dir.open_with(&self.name, flags) {
            Err(Error::Io { source, .. }) if matches!(source.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                lock().map.clear();
                self.dir.open_with(&self.name, flags)
            }
            r => r,
        };
        let dir = self.dir.path();
        let stale = |what: &str| Error::Stale { path: dir.to_path_buf(), detail: what.to_string() };
        match f {
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                let name = &self.name;
                Err(stale(&format!("{name}, which this handle's snapshot names, is gone")))
            }
            // Opened: if the directory is still the store the snapshot was
            // read from, the file is that store's (a replacement after this
            // point does not change what an open descriptor reads).
            Ok(_) if self.store.is_some() && StoreId::of(dir).ok() != self.store => {
                Err(stale("the directory now holds another store (replaced since this handle opened it)"))
            }
            r => r,
        }
    }
}

impl Drop for ChunkFile {
    fn drop(&mut self) {
        let mut fds = lock();
        fds.map.remove(&(self.id, false));
        fds.map.remove(&(self.id, true));
    }
}

pub(crate) struct Fds {
    map: HashMap<(u64, bool), Entry>,
    /// Stamps of use, ascending.
    clock: AtomicU64,
}

impl Fds {
    /// Caches `file` under `key` (or returns the one another thread cached
    /// first), evicting the entry used longest ago when `capacity` is reached.
    fn insert(&mut self, key: (u64, bool), file: Arc<File>, capacity: usize) -> Arc<File> {
        if let Some(existing) = self.map.get(&key) {
            return existing.file.clone();
        }
        if self.map.len() >= capacity {
            let oldest = self.map.iter().min_by_key(|(_, e)| e.used.load(Relaxed)).map(|(k, _)| *k);
            if let Some(k) = oldest {
                self.map.remove(&k);
            }
        }
        let used = AtomicU64::new(self.clock.fetch_add(1, Relaxed));
        self.map.insert(key, Entry { file: file.clone(), used });
        file
    }

    /// The cached descriptor of `key`, stamped as used now.
    fn hit(&self, key: &(u64, bool)) -> Option<Arc<File>> {
        let e = self.map.get(key)?;
        e.used.store(self.clock.fetch_add(1, Relaxed), Relaxed);
        Some(e.file.clone())
    }
}

struct Entry {
    file: Arc<File>,
    /// The clock's value at the last use.
    used: AtomicU64,
}

/// The process's descriptor cache, made (again, in a forked child) on first
/// use; a parent's cache in a child is dropped, which closes the child's
/// copies of the descriptors only.
static FDS: PerProcess<Fds> = PerProcess::new(2, true);

fn lock() -> Write<Fds> {
    FDS.write(|_| Fds { map: HashMap::new(), clock: AtomicU64::new(0) })
}

/// The soft descriptor limit (module docs: why it is not raised).
pub(crate) fn nofile_limit() -> u64 {
    static LIMIT: OnceLock<u64> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes the limits into `lim`, a valid rlimit.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return 1024;
        }
        if lim.rlim_cur == libc::RLIM_INFINITY {
            u64::MAX
        } else {
            lim.rlim_cur
        }
    })
}

/// Descriptors the cache keeps open at most (module docs).
pub(crate) fn capacity() -> usize {
    capacity_for(nofile_limit())
}

/// Distinct chunk files one batch of reads may name (module docs).
pub(crate) fn batch_files() -> usize {
    batch_files_for(nofile_limit())
}

fn capacity_for(limit: u64) -> usize {
    (limit / CACHE_SHARE).clamp(16, 65_536) as usize
}

fn batch_files_for(limit: u64) -> usize {
    (limit / BATCH_SHARE).clamp(4, 16_384) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_shared_cached_and_closed_with_their_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c");
        std::fs::write(&p, b"abc").unwrap();
        let d = Arc::new(Dir::open(dir.path()).unwrap());
        let cf = ChunkFile::new(Arc::clone(&d), "c".into(), None);
        let a = cf.buffered().unwrap();
        let b = cf.buffered().unwrap();
        assert!(Arc::ptr_eq(&a, &b), "the second open is a cache hit");
        let other = ChunkFile::new(d, "c".into(), None);
        assert!(!Arc::ptr_eq(&a, &other.buffered().unwrap()), "another handle's file is another entry");
        let key = (cf.id, false);
        assert!(lock().map.contains_key(&key));
        drop(cf);
        assert!(!lock().map.contains_key(&key), "dropping the file closes its cached descriptor");
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let cf = ChunkFile::new(Arc::new(Dir::open(dir.path()).unwrap()), "gone".into(), None);
        let e = cf.buffered().unwrap_err().to_string();
        assert!(e.contains("gone"), "{e}");
    }

    #[test]
    fn limits_are_shares_of_the_descriptor_limit_within_bounds() {
        assert_eq!((capacity_for(1024), batch_files_for(1024)), (256, 64));
        assert_eq!((capacity_for(256), batch_files_for(256)), (64, 16));
        // Tiny limits keep a working minimum; huge ones a sane maximum.
        assert_eq!((capacity_for(20), batch_files_for(20)), (16, 4));
        assert_eq!((capacity_for(u64::MAX), batch_files_for(u64::MAX)), (65_536, 16_384));
    }

    #[test]
    fn the_soft_limit_is_left_as_it_was() {
        let mut before = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes into `before`, a valid rlimit.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut before) }, 0);
        let _ = capacity();
        let mut after = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut after) }, 0);
        assert_eq!(before.rlim_cur, after.rlim_cur, "children would inherit a raised limit");
    }

    #[test]
    fn a_full_cache_evicts_the_descriptor_used_longest_ago() {
        let dir = tempfile::tempdir().unwrap();
        let file = Arc::new(File::create(dir.path().join("f")).unwrap());
        let mut fds = Fds { map: HashMap::new(), clock: AtomicU64::new(0) };
        for k in 0..3 {
            fds.insert((k, false), file.clone(), 3);
        }
        assert!(fds.hit(&(0, false)).is_some()); // used again: the oldest is now 1
        fds.insert((3, false), file.clone(), 3);
        let mut keys: Vec<u64> = fds.map.keys().map(|k| k.0).collect();
        keys.sort();
        assert_eq!(keys, [0, 2, 3]);
        // A key cached already keeps its descriptor.
        let other = Arc::new(File::open(dir.path().join("f")).unwrap());
        assert!(Arc::ptr_eq(&fds.insert((2, false), other, 3), &file));
    }
}
