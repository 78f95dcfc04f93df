//! Chunk-file descriptors: opened when a chunk is first read, and kept in one
//! bounded cache shared by every store of the process.
//!
//! A store used to open every chunk file when it opened (a second time with
//! O_DIRECT), per handle. With 1 GiB chunks a dataset past half a TiB then
//! needed more descriptors than the usual soft limit of 1,024, and several
//! streams or handles reached it sooner. Now a store only checks each chunk's
//! size when it opens ([`crate::read::gather::open_chunk`]); a [`ChunkFile`] opens
//! its descriptors on first use through this cache, and a chunk never read in
//! direct mode never gets an O_DIRECT descriptor.
//!
//! # Numbers
//!
//! * On first use the soft `RLIMIT_NOFILE` is raised to the hard limit where
//!   the hard limit allows (Go's runtime has done the same since 1.19): the
//!   soft limit of 1,024 exists for `select(2)`, and zring never hands
//!   descriptors to `select`.
//! * The cache keeps at most a quarter of the resulting soft limit open
//!   ([`capacity`], at least 16, at most 65,536), least recently used first
//!   out. The other three quarters belong to the program: Python and its
//!   libraries, sockets, each store's table and lock files, a writer's tail.
//! * One batch of reads names at most a sixteenth of the limit in distinct
//!   chunk files ([`batch_files`], at least 4): a batch holds its descriptors
//!   until its reads complete, outside the cache's count, and a process may
//!   run a gather on every core and every loader thread at once. Five such
//!   threads and a full cache use under half the limit. A gather of 256
//!   records scattered over 256 chunks under `ulimit -n 256` thus runs as
//!   16 batches instead of failing.
//! * An open that fails for want of descriptors (`EMFILE`, `ENFILE`) empties
//!   the cache and tries once more.
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

use std::fs::{File, OpenOptions};
use std::num::NonZeroUsize;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use lru::LruCache;

use crate::error::{Error, Result};
use crate::read::cache::StoreId;

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
    path: PathBuf,
    /// The identity of the store directory when the snapshot naming this
    /// file was read; `None` where it could not be taken.
    store: Option<StoreId>,
    direct: AtomicU8,
}

impl ChunkFile {
    /// The chunk file at `path` (not opened yet) of the store whose
    /// directory had identity `store` when its snapshot was read.
    pub fn new(path: PathBuf, store: Option<StoreId>) -> Arc<ChunkFile> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Arc::new(ChunkFile { id: NEXT.fetch_add(1, Relaxed), path, store, direct: AtomicU8::new(DIRECT_UNKNOWN) })
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
        if let Some(f) = lock().lru.get(&key) {
            return Ok(f.clone());
        }
        // Opened without the lock: an open can take long (a network file
        // system, a FIFO put in a chunk's place).
        let f = Arc::new(self.open(direct)?);
        let mut fds = lock();
        if let Some(existing) = fds.lru.get(&key) {
            return Ok(existing.clone());
        }
        fds.lru.put(key, f.clone());
        Ok(f)
    }

    /// Opens the file; [`Error::Stale`] when it is gone or the directory now
    /// holds another store (module docs of [`crate::read::pins`]: a writer honouring
    /// pins never removes a file a snapshot names).
    fn open(&self, direct: bool) -> Result<File> {
        let mut opts = OpenOptions::new();
        opts.read(true);
        if direct {
            opts.custom_flags(libc::O_DIRECT);
        }
        let f = match crate::io::fs::open(&self.path, &opts) {
            Err(Error::Io { source, .. }) if matches!(source.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                lock().lru.clear();
                crate::io::fs::open(&self.path, &opts)
            }
            r => r,
        };
        let dir = self.path.parent().unwrap_or(std::path::Path::new("."));
        let stale = |what: &str| Error::Stale { path: dir.to_path_buf(), detail: what.to_string() };
        match f {
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                let name = self.path.file_name().unwrap_or_default().to_string_lossy();
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
        fds.lru.pop(&(self.id, false));
        fds.lru.pop(&(self.id, true));
    }
}

pub(crate) struct Fds {
    pid: u32,
    lru: LruCache<(u64, bool), Arc<File>>,
}

static FDS: Mutex<Option<Fds>> = Mutex::new(None);

/// The process's descriptor cache, made (again, in a forked child) on first use.
fn lock() -> MappedFds {
    let mut g = lock_raw();
    let pid = std::process::id();
    if g.as_ref().is_none_or(|f| f.pid != pid) {
        // A parent's cache in a child: dropping it closes the child's copies
        // of the descriptors only.
        *g = Some(Fds { pid, lru: LruCache::new(NonZeroUsize::new(capacity()).expect("capacity is at least 16")) });
    }
    MappedFds(g)
}

/// The cache's lock itself (held across `fork()` by [`crate::fork`]).
pub(crate) fn lock_raw() -> MutexGuard<'static, Option<Fds>> {
    FDS.lock().unwrap_or_else(|p| p.into_inner())
}

struct MappedFds(MutexGuard<'static, Option<Fds>>);

impl std::ops::Deref for MappedFds {
    type Target = Fds;
    fn deref(&self) -> &Fds {
        self.0.as_ref().expect("made by lock()")
    }
}

impl std::ops::DerefMut for MappedFds {
    fn deref_mut(&mut self) -> &mut Fds {
        self.0.as_mut().expect("made by lock()")
    }
}

/// The soft descriptor limit, raised to the hard one first where allowed.
fn nofile_limit() -> u64 {
    static LIMIT: OnceLock<u64> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes the limits into `lim`, a valid rlimit.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            // SAFETY: setrlimit reads `raised`, a valid rlimit; raising the
            // soft limit up to the hard one needs no privilege, and a refusal
            // leaves the limit as it was.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
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
    (nofile_limit() / CACHE_SHARE).clamp(16, 65_536) as usize
}

/// Distinct chunk files one batch of reads may name (module docs).
pub(crate) fn batch_files() -> usize {
    (nofile_limit() / BATCH_SHARE).clamp(4, 16_384) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_shared_cached_and_closed_with_their_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c");
        std::fs::write(&p, b"abc").unwrap();
        let cf = ChunkFile::new(p.clone(), None);
        let a = cf.buffered().unwrap();
        let b = cf.buffered().unwrap();
        assert!(Arc::ptr_eq(&a, &b), "the second open is a cache hit");
        let other = ChunkFile::new(p, None);
        assert!(!Arc::ptr_eq(&a, &other.buffered().unwrap()), "another handle's file is another entry");
        let key = (cf.id, false);
        assert!(lock().lru.contains(&key));
        drop(cf);
        assert!(!lock().lru.contains(&key), "dropping the file closes its cached descriptor");
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let cf = ChunkFile::new(dir.path().join("gone"), None);
        let e = cf.buffered().unwrap_err().to_string();
        assert!(e.contains("gone"), "{e}");
    }

    #[test]
    fn limits_follow_the_descriptor_limit() {
        assert!(capacity() >= 16 && batch_files() >= 4);
        assert!(batch_files() <= capacity());
    }
}
