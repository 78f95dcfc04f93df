//! A dataset's chunk files filled line by line as they are read, within a
//! hard cap, evicting what the plan needs furthest in the future.
//!
//! A lazy stage ([`crate::StageOptions::lazy`]) leaves the chunk files of a
//! share as holes of their full size; the engine reads the folder as any
//! dataset once a [`LineCache`] is its [`Fill`]. A line is `line` bytes of
//! one chunk file (8 MiB, aligned), present when the file has no hole in
//! it (`SEEK_HOLE`), evicted by punching it out
//! (`fallocate(PUNCH_HOLE | KEEP_SIZE)`), so the blocks the cache holds
//! are what the file system allocates, which the cap bounds.
//!
//! - **Fill.** The lines of a read are pinned, then the missing ones are
//!   fetched (ranged GETs with `If-Match`, `parallel` in flight), after
//!   room is made for them: the cap holds before every fetch, not only
//!   after.
//! - **Evict by next use.** A loader in mode 3 hands the windows ahead to
//!   the end of the next cycle ([`Fill::plan`]); a line's next use is the
//!   first window of the plan that reads it, and the lines with the
//!   furthest next use (none in the plan: furthest of all) go first. Every
//!   line a mode-3 cycle reads is read once, so this is Belady's optimal
//!   policy over the plan's horizon: with a cap of a fraction `c` of the
//!   share, a cycle after the first fetches about `1 - c` of it.
//! - **One cache per host.** A line being read is pinned by a shared OFD
//!   lock on one byte of `.<name>.pins` (and a count within the process);
//!   an evictor takes that byte exclusively without waiting, and skips a
//!   line it cannot. Fetching and evicting hold `.<name>.fill.lock`, so two
//!   processes never fetch one line twice: the second finds it present.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use zring_engine::parts::{Extent, Fill, Pinned};

use crate::cache::{cache_name, is_chunk, read_state};
use crate::client::{Fetch, Remote};
use crate::error::{io_err, Error, Result};

/// The most bytes of one ranged GET: neighbouring lines missing together
/// go as one request of up to this (the range size the S3 performance
/// guide recommends).
const REQUEST_BYTES: u64 = 8 << 20;

/// A line: the chunk file's number in the cache and the line in it.
type LineId = (u32, u64);

struct Obj {
    key: String,
    etag: String,
    size: u64,
    path: PathBuf,
    file: Arc<File>,
}

/// What the cache has done, for `stats()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineStats {
    pub lines_fetched: u64,
    pub bytes_fetched: u64,
    pub lines_evicted: u64,
    pub bytes_evicted: u64,
    /// Fills that found every line present, and those that fetched.
    pub hits: u64,
    pub misses: u64,
    /// Nanoseconds spent fetching (what reads waited on).
    pub fetch_ns: u64,
    /// Bytes the cache's chunk files hold (allocated blocks) and the cap.
    pub used_bytes: u64,
    pub cap_bytes: u64,
    /// The requests behind the fetches: retries, throttles and the rest.
    pub requests: crate::Stats,
}

#[derive(Default)]
struct Counters {
    lines_fetched: AtomicU64,
    bytes_fetched: AtomicU64,
    lines_evicted: AtomicU64,
    bytes_evicted: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    fetch_ns: AtomicU64,
}

/// A dataset's chunk files in a cache, filled line by line (module docs).
pub struct LineCache {
    remote: Remote,
    objs: Vec<Obj>,
    by_path: HashMap<PathBuf, u32>,
    cap: u64,
    /// Bytes of the files fetched whole (heads, tables, schemas).
    fixed: u64,
    line: u64,
    parallel: usize,
    pins_file: File,
    fill_file: File,
    pins: Mutex<HashMap<LineId, u32>>,
    /// Each line's first window in the last plan.
    plan: Mutex<HashMap<LineId, u64>>,
    /// Evict the least recently used line instead (for comparison), and
    /// each line's last use by a tick of `clock`.
    lru: bool,
    uses: Mutex<HashMap<LineId, u64>>,
    clock: AtomicU64,
    filling: Mutex<()>,
    counters: Counters,
}

impl std::fmt::Debug for LineCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineCache").field("url", &self.remote.url()).field("cap", &self.cap).finish()
    }
}

fn lock_file(path: &Path) -> Result<File> {
    OpenOptions::new().create(true).truncate(false).read(true).write(true).open(path).map_err(io_err("open", path))
}

/// An OFD lock on byte `at` of `f`: shared, exclusive or released;
/// `wait` blocks until it is granted. `Ok(false)`: not granted.
fn ofd(f: &File, at: u64, kind: libc::c_short, wait: bool) -> Result<bool> {
    // SAFETY: an all-zero `flock` is a valid value of the plain C struct;
    // its fields are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = at as libc::off_t;
    fl.l_len = 1;
    let cmd = if wait { libc::F_OFD_SETLKW } else { libc::F_OFD_SETLK };
    loop {
        // SAFETY: `f` is an open descriptor and `fl` a valid `flock` that
        // outlives the call.
        let r = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
        if r == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) | Some(libc::EACCES) if !wait => return Ok(false),
            _ => return Err(Error::Io { op: "lock a line of", path: PathBuf::from(".pins"), source: e }),
        }
    }
}

/// The byte of the pins file that stands for line `id`.
fn pin_byte(id: LineId) -> u64 {
    ((id.0 as u64) << 32) | id.1
}

/// Whether bytes `r` of `f` are all allocated (no hole).
fn present(f: &File, r: &Range<u64>) -> bool {
    if r.is_empty() {
        return true;
    }
    // SAFETY: lseek on an open descriptor; only the returned offset is used.
    let hole = unsafe { libc::lseek(f.as_raw_fd(), r.start as libc::off_t, libc::SEEK_HOLE) };
    hole >= 0 && hole as u64 >= r.end
}

/// Punches bytes `r` of `f` out (they read as zeros, their blocks freed).
fn punch(f: &File, r: &Range<u64>, path: &Path) -> Result<()> {
    // SAFETY: fallocate on an open descriptor with a range inside the file;
    // KEEP_SIZE leaves its length as it is.
    let rc = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            r.start as libc::off_t,
            (r.end - r.start) as libc::off_t,
        )
    };
    if rc != 0 {
        return Err(Error::Io {
            op: "punch a line out of",
            path: path.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Blocks allocated to the files under `d` but the chunk files `chunks`
/// (paths relative to `root`).
fn allocated_except_chunks(root: &Path, chunks: &HashMap<PathBuf, u32>, d: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(d) else { return 0 };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => allocated_except_chunks(root, chunks, &e.path()),
            Ok(t) if t.is_file() => {
                let rel = e.path().strip_prefix(root).map(Path::to_path_buf).unwrap_or_default();
                if chunks.contains_key(&rel) {
                    0
                } else {
                    e.metadata().map(|m| m.blocks() * 512).unwrap_or(0)
                }
            }
            _ => 0,
        })
        .sum()
}

/// The lines pinned by one fill; unpinned when dropped.
struct Held {
    cache: Arc<LineCache>,
    lines: Vec<LineId>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.cache.unpin(&self.lines);
    }
}

impl LineCache {
    /// The line cache of the dataset staged lazily from `remote` in
    /// `cache` ([`crate::stage`] with `lazy`), within `cap` bytes.
    pub fn open(remote: Remote, cache: &Path, rank: Option<(u32, u32)>, cap: u64) -> Result<Arc<LineCache>> {
        let name = cache_name(remote.url(), rank);
        let dir = cache.join(&name);
        let st = read_state(&dir);
        if st.url != remote.url() {
            return Err(Error::InvalidArgument(format!("{} is not staged in {}", remote.url(), cache.display())));
        }
        let mut objs = Vec::new();
        let mut by_path = HashMap::new();
        let mut fixed = 0;
        for (key, e) in &st.objects {
            if !(e.lazy && is_chunk(key)) {
                continue;
            }
            let path = dir.join(key);
            let file = OpenOptions::new().read(true).write(true).open(&path).map_err(io_err("open", &path))?;
            by_path.insert(PathBuf::from(key), objs.len() as u32);
            objs.push(Obj { key: key.clone(), etag: e.etag.clone(), size: e.size, path, file: Arc::new(file) });
        }
        // What the other files take on disk: blocks, not lengths (a head of
        // 128 B takes a block of 4 KiB).
        fixed += allocated_except_chunks(&dir, &by_path, &dir);
        let lru = remote.lru();
        Ok(Arc::new(LineCache {
            line: remote.line(),
            remote,
            objs,
            by_path,
            cap,
            fixed,
            parallel: 16,
            pins_file: lock_file(&cache.join(format!(".{name}.pins")))?,
            fill_file: lock_file(&cache.join(format!(".{name}.fill.lock")))?,
            pins: Mutex::default(),
            plan: Mutex::default(),
            lru,
            uses: Mutex::default(),
            clock: AtomicU64::new(0),
            filling: Mutex::new(()),
            counters: Counters::default(),
        }))
    }

    /// What the cache has done, and the bytes it holds.
    pub fn stats(&self) -> LineStats {
        let c = &self.counters;
        LineStats {
            lines_fetched: c.lines_fetched.load(Relaxed),
            bytes_fetched: c.bytes_fetched.load(Relaxed),
            lines_evicted: c.lines_evicted.load(Relaxed),
            bytes_evicted: c.bytes_evicted.load(Relaxed),
            hits: c.hits.load(Relaxed),
            misses: c.misses.load(Relaxed),
            fetch_ns: c.fetch_ns.load(Relaxed),
            used_bytes: self.used(),
            cap_bytes: self.cap,
            requests: self.remote.stats(),
        }
    }

    fn range(&self, id: LineId) -> Range<u64> {
        let size = self.objs[id.0 as usize].size;
        id.1 * self.line..((id.1 + 1) * self.line).min(size)
    }

    /// The lines of `extents` (files this cache does not fill: none).
    fn lines(&self, extents: &[Extent]) -> Vec<LineId> {
        let mut out: Vec<LineId> = Vec::new();
        for (path, r) in extents {
            let Some(&id) = self.by_path.get(path) else { continue };
            if r.is_empty() {
                continue;
            }
            let end = r.end.min(self.objs[id as usize].size);
            for l in r.start / self.line..end.div_ceil(self.line) {
                out.push((id, l));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    fn pin(&self, lines: &[LineId]) -> Result<()> {
        let mut pins = self.pins.lock().unwrap_or_else(PoisonError::into_inner);
        for (n, &id) in lines.iter().enumerate() {
            let c = pins.entry(id).or_insert(0);
            if *c == 0 {
                if let Err(e) = ofd(&self.pins_file, pin_byte(id), libc::F_RDLCK as libc::c_short, true) {
                    pins.remove(&id);
                    drop(pins);
                    self.unpin(&lines[..n]);
                    return Err(e);
                }
            }
            *pins.get_mut(&id).expect("inserted") += 1;
        }
        Ok(())
    }

    fn unpin(&self, lines: &[LineId]) {
        let mut pins = self.pins.lock().unwrap_or_else(PoisonError::into_inner);
        for id in lines {
            if let Some(c) = pins.get_mut(id) {
                *c -= 1;
                if *c == 0 {
                    pins.remove(id);
                    let _ = ofd(&self.pins_file, pin_byte(*id), libc::F_UNLCK as libc::c_short, false);
                }
            }
        }
    }

    /// Blocks the chunk files hold, and the files fetched whole.
    fn used(&self) -> u64 {
        self.fixed + self.objs.iter().map(|o| o.file.metadata().map(|m| m.blocks() * 512).unwrap_or(0)).sum::<u64>()
    }

    /// The lines present in the chunk files (their data regions).
    fn present_lines(&self) -> Vec<LineId> {
        let mut out = Vec::new();
        for (k, o) in self.objs.iter().enumerate() {
            let fd = o.file.as_raw_fd();
            let mut at: i64 = 0;
            while (at as u64) < o.size {
                // SAFETY: lseek on an open descriptor; offsets only.
                let data = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
                if data < 0 {
                    break; // ENXIO: no data past `at`
                }
                // SAFETY: as above.
                let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
                let end = if hole < 0 { o.size as i64 } else { hole };
                for l in data as u64 / self.line..(end as u64).div_ceil(self.line) {
                    out.push((k as u32, l));
                }
                at = end.max(data + 1);
            }
        }
        out.dedup();
        out
    }

    /// Punches out present, unpinned lines, furthest next use first, until
    /// `need` more bytes fit under the cap. Called holding the fill locks.
    fn make_room(&self, need: u64, keep: &HashSet<LineId>) -> Result<()> {
        let mut used = self.used();
        if used + need <= self.cap {
            return Ok(());
        }
        let plan = if self.lru {
            // Oldest use first: sorted descending by u64::MAX - tick.
            let uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
            uses.iter().map(|(&id, &t)| (id, u64::MAX - t)).collect()
        } else {
            self.plan.lock().unwrap_or_else(PoisonError::into_inner).clone()
        };
        let pinned: HashSet<LineId> =
            self.pins.lock().unwrap_or_else(PoisonError::into_inner).keys().copied().collect();
        let mut victims: Vec<(u64, LineId)> = self
            .present_lines()
            .into_iter()
            .filter(|id| !keep.contains(id) && !pinned.contains(id))
            .map(|id| (plan.get(&id).copied().unwrap_or(u64::MAX), id))
            .collect();
        // Furthest next use first; among lines the plan does not read, the
        // later lines of a file (a cycle's order is random: any is as good).
        victims.sort_unstable_by(|a, b| b.cmp(a));
        for (_, id) in victims {
            if used + need <= self.cap {
                break;
            }
            // Another process reading it holds its byte: skip it.
            if !ofd(&self.pins_file, pin_byte(id), libc::F_WRLCK as libc::c_short, false)? {
                continue;
            }
            let o = &self.objs[id.0 as usize];
            let r = self.range(id);
            let before = o.file.metadata().map(|m| m.blocks() * 512).unwrap_or(0);
            let punched = punch(&o.file, &r, &o.path);
            let _ = ofd(&self.pins_file, pin_byte(id), libc::F_UNLCK as libc::c_short, false);
            punched?;
            let after = o.file.metadata().map(|m| m.blocks() * 512).unwrap_or(0);
            used = used.saturating_sub(before.saturating_sub(after));
            self.counters.lines_evicted.fetch_add(1, Relaxed);
            self.counters.bytes_evicted.fetch_add(before.saturating_sub(after), Relaxed);
        }
        if used + need > self.cap {
            return Err(Error::CacheTooSmall(format!(
                "{}: {need} B of lines to fetch do not fit under the cache's cap of {} B beside the {used} B held \
                 (lines being read by this or other processes cannot be evicted): raise the cap",
                self.remote.url(),
                self.cap
            )));
        }
        Ok(())
    }

    /// Fetches `missing` lines (holding the fill locks): runs of
    /// neighbouring lines of a file as one ranged GET of up to
    /// [`REQUEST_BYTES`], `parallel` in flight.
    fn fetch(&self, missing: &[LineId]) -> Result<()> {
        let t = Instant::now();
        let mut by_obj: HashMap<u32, Vec<u64>> = HashMap::new();
        for &(k, l) in missing {
            by_obj.entry(k).or_default().push(l);
        }
        let per = (REQUEST_BYTES / self.line).max(1);
        let mut jobs = Vec::new();
        for (k, mut ls) in by_obj {
            ls.sort_unstable();
            let o = &self.objs[k as usize];
            let mut runs: Vec<(u64, u64)> = Vec::new(); // first line, lines
            for l in ls {
                match runs.last_mut() {
                    Some((a, n)) if *a + *n == l && *n < per => *n += 1,
                    _ => runs.push((l, 1)),
                }
            }
            for (a, n) in runs {
                let range = self.range((k, a)).start..self.range((k, a + n - 1)).end;
                if !range.is_empty() {
                    jobs.push(Fetch {
                        key: o.key.clone(),
                        etag: o.etag.clone(),
                        range,
                        file: o.file.clone(),
                        path: o.path.clone(),
                    });
                }
            }
        }
        // Every file's runs in one stream of GETs, `parallel` in flight.
        self.remote.fetch_into(jobs, self.parallel, |_, f| {
            self.counters.lines_fetched.fetch_add((f.range.end - f.range.start).div_ceil(self.line), Relaxed);
            self.counters.bytes_fetched.fetch_add(f.range.end - f.range.start, Relaxed);
            Ok(())
        })?;
        self.counters.fetch_ns.fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
        Ok(())
    }

    fn fill_lines(self: &Arc<Self>, lines: Vec<LineId>) -> Result<Pinned> {
        if self.lru {
            let t = self.clock.fetch_add(1, Relaxed);
            let mut uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
            for &id in &lines {
                uses.insert(id, t);
            }
        }
        self.pin(&lines)?;
        let held = Held { cache: self.clone(), lines };
        let missing = |c: &Self| -> Vec<LineId> {
            held.lines.iter().copied().filter(|&id| !present(&c.objs[id.0 as usize].file, &c.range(id))).collect()
        };
        if missing(self).is_empty() {
            self.counters.hits.fetch_add(1, Relaxed);
            return Ok(Pinned(Box::new(held)));
        }
        self.counters.misses.fetch_add(1, Relaxed);
        let _one = self.filling.lock().unwrap_or_else(PoisonError::into_inner);
        self.fill_file.lock().map_err(io_err("lock", ".fill.lock"))?;
        let out = (|| {
            // Another thread or process may have fetched them meanwhile.
            let todo = missing(self);
            if todo.is_empty() {
                return Ok(());
            }
            let need: u64 = todo.iter().map(|&id| self.range(id)).map(|r| r.end - r.start).sum();
            let keep: HashSet<LineId> = held.lines.iter().copied().collect();
            self.make_room(need, &keep)?;
            self.fetch(&todo)
        })();
        let _ = self.fill_file.unlock();
        out.map(|()| Pinned(Box::new(held)))
    }
}

/// The [`Fill`] of a dataset of parts read through a [`LineCache`].
pub struct Filler(pub Arc<LineCache>);

fn engine_err(e: Error) -> zring_engine::Error {
    match e {
        Error::Engine(e) => e,
        Error::Io { op, path, source } => zring_engine::Error::Io { op, path, source },
        Error::Stale { url, detail } => zring_engine::Error::Stale {
            path: PathBuf::from(url),
            detail: format!("it was replaced in object storage while it was being read ({detail})"),
        },
        other => zring_engine::Error::Io {
            op: "fetch",
            path: PathBuf::from("object storage"),
            source: std::io::Error::other(other.to_string()),
        },
    }
}

impl Fill for Filler {
    fn fill(&self, extents: &[Extent]) -> zring_engine::Result<Pinned> {
        let lines = self.0.lines(extents);
        self.0.fill_lines(lines).map_err(engine_err)
    }

    fn plan(&self, windows: &[Vec<Extent>]) {
        let mut first: HashMap<LineId, u64> = HashMap::new();
        for (w, ext) in windows.iter().enumerate() {
            for id in self.0.lines(ext) {
                first.entry(id).or_insert(w as u64);
            }
        }
        *self.0.plan.lock().unwrap_or_else(PoisonError::into_inner) = first;
    }
}
