//! A host's cache of datasets in object storage: each dataset's objects
//! (or one rank's share of a dataset of parts) copied into a folder laid
//! out as the dataset itself, which the engine then opens as any local
//! dataset, reading it with io_uring at the local disk's rate.
//!
//! ```text
//! CACHE/
//!   <name>/                    one dataset (<name> from its URL)
//!     manifest.json            as in the bucket (written last: a staged
//!     parts/p-.../...          dataset opens only once complete)
//!     .zring-cache.json        each object's size and ETag when fetched
//!   .<name>.stage.lock         held while a process stages it
//!   .<name>.use.lock           held (shared) while a process reads it
//! ```
//!
//! One cache per host: the processes of a host staging one dataset take
//! its stage lock in turn, so each object is fetched once and the others
//! find it in place. An object is fetched in lines (8 MiB ranged GETs,
//! 16 in flight) with `If-Match` on the ETag listed, so a replaced object
//! is an error, never a mix of versions; it is written beside its place
//! and renamed in when whole. A cached object whose ETag no longer
//! matches the bucket's is fetched again.
//!
//! `cache_bytes` caps every byte of the cache folder: staging refuses a
//! share larger than the cap (naming both), and removes other datasets no
//! process reads, least recently staged first, to make room.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use zring_engine::parts::{assign_ranks, placement_weights, Manifest, MANIFEST_FILE};

use crate::client::{Fetch, ObjectInfo, Remote};
use crate::error::{io_err, Error, Result};

const STATE_FILE: &str = ".zring-cache.json";

/// Objects staged at once (their files open together), so a share of
/// thousands of parts stays within the descriptor limit.
const GROUP_OBJECTS: usize = 256;

/// What to stage, and within which cap.
#[derive(Clone, Debug)]
pub struct StageOptions {
    /// `(rank, ranks)`: only the parts [`assign_ranks`] gives this rank.
    pub rank: Option<(u32, u32)>,
    /// The cap on the cache folder's bytes.
    pub cache_bytes: Option<u64>,
    /// The bytes of one ranged GET.
    pub line: u64,
    /// Ranged GETs in flight.
    pub parallel: usize,
    /// Fetch only the small files (heads, tables, schemas) and leave the
    /// chunk files as holes of their full size, to be filled line by line
    /// as they are read ([`crate::LineCache`]): a share larger than the
    /// cap, read in mode 3.
    pub lazy: bool,
}

impl Default for StageOptions {
    fn default() -> Self {
        StageOptions { rank: None, cache_bytes: None, line: 8 << 20, parallel: 16, lazy: false }
    }
}

/// What a [`stage`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Staged {
    /// The local copy: open it as a dataset.
    pub path: PathBuf,
    /// Bytes of the objects staged (the share).
    pub share_bytes: u64,
    /// Of those, bytes fetched now.
    pub fetched_bytes: u64,
    /// Objects fetched now and objects found in place.
    pub fetched: usize,
    pub reused: usize,
    /// Bytes removed: this dataset's objects no longer in the share, and
    /// other datasets evicted for room.
    pub removed_bytes: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct State {
    pub url: String,
    pub objects: BTreeMap<String, Entry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub size: u64,
    pub etag: String,
    /// A chunk file filled line by line (its lines present or holes).
    #[serde(default)]
    pub lazy: bool,
}

/// Whether `key` is a chunk file (what a lazy stage leaves as holes).
pub(crate) fn is_chunk(key: &str) -> bool {
    let name = key.rsplit('/').next().unwrap_or(key);
    name.starts_with("chunk-") && name.ends_with(".zr")
}

/// The folder name of `url`'s dataset (or of rank `rank` of `ranks`'s
/// share of it) in a cache: readable, and unique by a hash of the whole
/// URL. The ranks of one host have disjoint shares, each a folder of its
/// own (staging one rank's share never removes another's).
pub fn cache_name(url: &str, rank: Option<(u32, u32)>) -> String {
    let url = url.trim_end_matches('/');
    let tail: String = url
        .split("://")
        .nth(1)
        .unwrap_or(url)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' })
        .collect();
    let tail: String = tail.chars().rev().take(80).collect::<Vec<_>>().into_iter().rev().collect();
    // FNV-1a, 64 bits: a name, not a checksum.
    let h = url.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    match rank {
        None => format!("{tail}-{h:016x}"),
        Some((r, n)) => format!("{tail}-{h:016x}-rank{r}of{n}"),
    }
}

/// `f` made `len` bytes long with its blocks allocated up front, so the
/// ranges fetched at once land in few extents and the file reads back as
/// fast as one written in order (sparse, 16 writers at once left it in
/// many, and cold reads of the copy 0.89x the local copy's). A file system
/// without `fallocate` gets a sparse file.
fn preallocate(f: &File, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    if len > 0 {
        // SAFETY: fallocate reads no memory of ours; `f` is an open,
        // writable descriptor for the call's length.
        let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) };
        if rc == 0 {
            return Ok(());
        }
    }
    f.set_len(len)
}

fn lock(path: &Path, shared: bool) -> Result<File> {
    let f = OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(io_err("open", path))?;
    if shared { f.lock_shared() } else { f.lock() }.map_err(io_err("lock", path))?;
    Ok(f)
}

/// A process's hold on a staged dataset: while held, no stage of another
/// dataset evicts it. Drop it when the dataset is closed.
#[derive(Debug)]
pub struct Hold(#[allow(dead_code)] File);

/// Holds `url`'s dataset (or a rank's share) in `cache` (see [`Hold`]).
pub fn hold(cache: &Path, url: &str, rank: Option<(u32, u32)>) -> Result<Hold> {
    lock(&cache.join(format!(".{}.use.lock", cache_name(url, rank))), true).map(Hold)
}

pub(crate) fn read_state(dir: &Path) -> State {
    fs::read(dir.join(STATE_FILE)).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
}

fn write_state(dir: &Path, st: &State) -> Result<()> {
    let tmp = dir.join(format!("{STATE_FILE}.tmp"));
    let body = serde_json::to_vec(st).map_err(|e| Error::InvalidArgument(e.to_string()))?;
    fs::write(&tmp, body).map_err(io_err("write", &tmp))?;
    fs::rename(&tmp, dir.join(STATE_FILE)).map_err(io_err("rename", &tmp))
}

/// A key that stays inside the dataset's folder.
fn local_path(dir: &Path, key: &str) -> Result<PathBuf> {
    let p = Path::new(key);
    if key.is_empty() || !p.components().all(|c| matches!(c, std::path::Component::Normal(_))) {
        return Err(Error::InvalidArgument(format!("object key {key:?} does not name a file inside the dataset")));
    }
    Ok(dir.join(p))
}

/// The objects of `remote`'s dataset in the share `opts.rank` asks for,
/// and the manifest's bytes (`None` for a single store).
/// A share's objects, and the manifest's bytes and listing (`None`: a single store).
type Share = (Vec<ObjectInfo>, Option<(bytes::Bytes, ObjectInfo)>);

fn share(remote: &Remote, opts: &StageOptions) -> Result<Share> {
    let Some((bytes, info)) = remote.get(MANIFEST_FILE)? else {
        if opts.rank.is_some() {
            return Err(Error::InvalidArgument(format!(
                "{} has no {MANIFEST_FILE}: not a dataset of parts, so it has no share per rank (give no rank to \
                 stage the whole store)",
                remote.url()
            )));
        }
        let all = remote.list("")?;
        if !all.iter().any(|o| o.key == "head.zr") {
            return Err(Error::NotFound { url: format!("{} (neither {MANIFEST_FILE} nor head.zr)", remote.url()) });
        }
        let objects = all.into_iter().filter(|o| !o.key.starts_with('.')).collect();
        return Ok((with_etags(remote, objects)?, None));
    };
    let m = Manifest::from_bytes(Path::new(&remote.url_of(MANIFEST_FILE)), &bytes)?;
    let mine: Vec<&str> = match opts.rank {
        None => m.parts.iter().map(|p| p.dir.as_str()).collect(),
        Some((rank, ranks)) => {
            if ranks == 0 || rank >= ranks {
                return Err(Error::InvalidArgument(format!("rank {rank} of {ranks}: need 0 <= rank < ranks")));
            }
            let owner = assign_ranks(&placement_weights(&m), ranks);
            m.parts.iter().zip(owner).filter(|(_, o)| *o == rank).map(|(p, _)| p.dir.as_str()).collect()
        }
    };
    let mut by_dir: BTreeMap<&str, Vec<ObjectInfo>> = mine.iter().map(|d| (*d, Vec::new())).collect();
    for o in remote.list("parts/")? {
        let dir = o.key.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        // A part's files sit at parts/<name>/<file> (the part's store).
        let part = dir.split('/').take(2).collect::<Vec<_>>().join("/");
        if let Some(v) = by_dir.get_mut(part.as_str()) {
            v.push(o);
        }
    }
    let mut out = Vec::new();
    for (dir, objs) in by_dir {
        if !objs.iter().any(|o| o.key.ends_with("/head.zr")) {
            return Err(Error::NotFound {
                url: format!("{} (part {dir}, listed in {MANIFEST_FILE})", remote.url_of(dir)),
            });
        }
        out.extend(objs);
    }
    Ok((with_etags(remote, out)?, Some((bytes, info))))
}

/// `objects` with the ETag of each the listing gave none (some servers
/// list none): every ranged GET then carries `If-Match`, so an object
/// replaced under the run is an error whatever its length.
fn with_etags(remote: &Remote, mut objects: Vec<ObjectInfo>) -> Result<Vec<ObjectInfo>> {
    for o in objects.iter_mut().filter(|o| o.etag.is_empty()) {
        o.etag = remote.head(&o.key)?.etag;
    }
    Ok(objects)
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(dir) else { return 0 };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// Makes room for `need` bytes in `cache` beside `keep`: removes other
/// datasets that no process holds, least recently staged first.
fn make_room(cache: &Path, keep: &str, need: u64, cap: u64) -> Result<u64> {
    let mut others = Vec::new();
    for e in fs::read_dir(cache).map_err(io_err("list", cache))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == keep || name.starts_with('.') || !e.path().join(STATE_FILE).is_file() {
            continue;
        }
        let staged = e.path().join(STATE_FILE).metadata().and_then(|m| m.modified()).ok();
        others.push((staged, name, dir_bytes(&e.path())));
    }
    let used: u64 = others.iter().map(|o| o.2).sum();
    let mut over = (used + need).saturating_sub(cap);
    others.sort();
    let mut removed = 0;
    for (_, name, bytes) in others {
        if over == 0 {
            break;
        }
        let use_lock = cache.join(format!(".{name}.use.lock"));
        let Ok(f) = OpenOptions::new().create(true).truncate(false).write(true).open(&use_lock) else { continue };
        if f.try_lock().is_err() {
            continue; // a process reads it
        }
        fs::remove_dir_all(cache.join(&name)).map_err(io_err("remove", cache.join(&name)))?;
        removed += bytes;
        over = over.saturating_sub(bytes);
    }
    if over > 0 {
        return Err(Error::CacheTooSmall(format!(
            "the cache {} holds {used} B of other datasets that processes are reading; {need} B more would pass the \
             cache's cap of {cap} B by {over} B: raise the cap, or close the datasets using it",
            cache.display()
        )));
    }
    Ok(removed)
}

/// Stages `remote`'s dataset (or one rank's share of it) into `cache`;
/// `progress(done, total)` reports the bytes fetched. Returns where the
/// local copy is, once it is whole.
pub fn stage(remote: &Remote, cache: &Path, opts: &StageOptions, progress: &mut dyn FnMut(u64, u64)) -> Result<Staged> {
    fs::create_dir_all(cache).map_err(io_err("create directory", cache))?;
    let name = cache_name(remote.url(), opts.rank);
    let _use = lock(&cache.join(format!(".{name}.use.lock")), true)?;
    let _stage = lock(&cache.join(format!(".{name}.stage.lock")), false)?;
    let dir = cache.join(&name);
    fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;

    let (objects, manifest) = share(remote, opts)?;
    let share_bytes: u64 = objects.iter().map(|o| o.size).sum::<u64>() + manifest.as_ref().map_or(0, |m| m.1.size);
    let mut out = Staged { path: dir.clone(), share_bytes, ..Default::default() };
    let eager: u64 = objects.iter().filter(|o| !(opts.lazy && is_chunk(&o.key))).map(|o| o.size).sum::<u64>()
        + manifest.as_ref().map_or(0, |m| m.1.size);
    if let (true, Some(cap)) = (opts.lazy, opts.cache_bytes) {
        // The small files whole, and room for a few lines.
        let least = eager + 16 * remote.line();
        if least > cap {
            return Err(Error::CacheTooSmall(format!(
                "{} needs {least} B of the cache at least ({eager} B of tables and heads, and room for 16 lines of \
                 {} B), more than the cache's cap of {cap} B: raise the cap to at \
                 least {least}",
                remote.url(),
                remote.line()
            )));
        }
        out.removed_bytes += make_room(cache, &name, cap, cap)?;
    } else if let Some(cap) = opts.cache_bytes {
        if share_bytes > cap {
            let what = match opts.rank {
                Some((r, n)) => format!("rank {r} of {n}'s share of {}", remote.url()),
                None => remote.url().to_string(),
            };
            return Err(Error::CacheTooSmall(format!(
                "{what} is {share_bytes} B, more than the cache's cap of {cap} B: raise the cap to at least \
                 {share_bytes} (or give the run more ranks, each holding a smaller share)"
            )));
        }
        out.removed_bytes += make_room(cache, &name, share_bytes, cap)?;
    }

    let mut st = read_state(&dir);
    if st.url != remote.url() {
        st = State { url: remote.url().to_string(), objects: BTreeMap::new() };
    }
    // What the share no longer holds (another rank's parts, parts dropped
    // by an overwrite) goes first, so the cap holds throughout.
    let wanted: BTreeMap<&str, &ObjectInfo> = objects.iter().map(|o| (o.key.as_str(), o)).collect();
    let stale: Vec<String> = st.objects.keys().filter(|k| !wanted.contains_key(k.as_str())).cloned().collect();
    for k in stale {
        let p = local_path(&dir, &k)?;
        if let Ok(m) = fs::symlink_metadata(&p) {
            out.removed_bytes += m.len();
            fs::remove_file(&p).map_err(io_err("remove", &p))?;
            let mut parent = p.parent();
            while let Some(d) = parent.filter(|d| *d != dir) {
                if fs::remove_dir(d).is_err() {
                    break;
                }
                parent = d.parent();
            }
        }
        st.objects.remove(&k);
    }
    if manifest.is_some() {
        // The manifest goes last; until then the folder is no dataset.
        let _ = fs::remove_file(dir.join(MANIFEST_FILE));
    }

    // Lazy: chunk files as holes of their full size (lines present kept,
    // unless the object changed).
    if opts.lazy {
        for o in objects.iter().filter(|o| is_chunk(&o.key)) {
            let path = local_path(&dir, &o.key)?;
            let same = st.objects.get(&o.key).is_some_and(|e| e.size == o.size && e.etag == o.etag && e.lazy);
            if let Some(p) = path.parent() {
                fs::create_dir_all(p).map_err(io_err("create directory", p))?;
            }
            let f = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(!same)
                .open(&path)
                .map_err(io_err("create", &path))?;
            f.set_len(o.size).map_err(io_err("size", &path))?;
            st.objects.insert(o.key.clone(), Entry { size: o.size, etag: o.etag.clone(), lazy: true });
        }
    }
    let todo: Vec<&ObjectInfo> = objects
        .iter()
        .filter(|o| !(opts.lazy && is_chunk(&o.key)))
        .filter(|o| {
            let have = st.objects.get(&o.key);
            let len = local_path(&dir, &o.key).ok().and_then(|p| fs::metadata(p).ok()).map(|m| m.len());
            !(have.is_some_and(|e| e.size == o.size && e.etag == o.etag && !e.lazy) && len == Some(o.size))
        })
        .collect();
    let mut todo = todo;
    if manifest.is_none() && !todo.is_empty() {
        // A single store is a store once its head is in: it goes last.
        let _ = fs::remove_file(dir.join("head.zr"));
        st.objects.remove("head.zr");
        if let Some(h) = objects.iter().find(|o| o.key == "head.zr") {
            todo.retain(|o| o.key != "head.zr");
            todo.push(h);
        }
    }
    out.reused = objects.len() - todo.len();
    let total: u64 = todo.iter().map(|o| o.size).sum();
    let mut done = 0u64;
    let mut saved = Instant::now();
    progress(0, total);
    // Objects in groups (each group's files open at once), each group's
    // ranges in one stream of GETs, `parallel` in flight across objects.
    // A single store's head goes last, renamed in once all else is.
    let line = opts.line.max(1 << 16);
    let single_head = manifest.is_none();
    for group in todo.chunks(GROUP_OBJECTS) {
        let mut files = Vec::with_capacity(group.len());
        let mut jobs = Vec::new();
        let mut left = Vec::with_capacity(group.len());
        for (g, o) in group.iter().enumerate() {
            let path = local_path(&dir, &o.key)?;
            if let Some(p) = path.parent() {
                fs::create_dir_all(p).map_err(io_err("create directory", p))?;
            }
            let part = path.with_extension(format!(
                "{}partial",
                path.extension().map(|e| format!("{}.", e.to_string_lossy())).unwrap_or_default()
            ));
            let f = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(&part)
                .map_err(io_err("create", &part))?;
            preallocate(&f, o.size).map_err(io_err("size", &part))?;
            let f = std::sync::Arc::new(f);
            let n = o.size.div_ceil(line);
            for i in 0..n {
                jobs.push((
                    g,
                    Fetch {
                        key: o.key.clone(),
                        etag: o.etag.clone(),
                        range: i * line..((i + 1) * line).min(o.size),
                        file: f.clone(),
                        path: part.clone(),
                    },
                ));
            }
            left.push(n);
            files.push((path, part, f));
        }
        let owner: Vec<usize> = jobs.iter().map(|(g, _)| *g).collect();
        let mut finished: Vec<usize> = Vec::new();
        let finish = |g: usize, st: &mut State, out: &mut Staged| -> Result<()> {
            let (path, part, f) = &files[g];
            f.sync_data().map_err(io_err("sync", part))?;
            fs::rename(part, path).map_err(io_err("rename", part))?;
            let o = group[g];
            st.objects.insert(o.key.clone(), Entry { size: o.size, etag: o.etag.clone(), lazy: false });
            out.fetched += 1;
            out.fetched_bytes += o.size;
            Ok(())
        };
        let is_last_head = |g: usize| single_head && group[g].key == "head.zr";
        // Objects of no bytes are whole already.
        for g in (0..group.len()).filter(|&g| left[g] == 0) {
            if is_last_head(g) {
                finished.push(g);
            } else {
                finish(g, &mut st, &mut out)?;
            }
        }
        let fetched = remote.fetch_into(jobs.into_iter().map(|(_, f)| f).collect(), opts.parallel, |i, f| {
            let g = owner[i];
            done += f.range.end - f.range.start;
            progress(done, total);
            left[g] -= 1;
            if left[g] == 0 {
                if is_last_head(g) {
                    finished.push(g);
                } else {
                    finish(g, &mut st, &mut out)?;
                }
            }
            Ok(())
        });
        if let Err(e) = fetched {
            for (_, part, _) in &files {
                let _ = fs::remove_file(part);
            }
            let _ = write_state(&dir, &st);
            return Err(e);
        }
        for g in finished {
            finish(g, &mut st, &mut out)?;
        }
        if saved.elapsed() > Duration::from_secs(2) {
            write_state(&dir, &st)?;
            saved = Instant::now();
        }
    }
    write_state(&dir, &st)?;
    if let Some((bytes, _)) = manifest {
        let tmp = dir.join(format!(".{MANIFEST_FILE}.stage.tmp"));
        let mut f = File::create(&tmp).map_err(io_err("create", &tmp))?;
        f.write_all(&bytes).and_then(|()| f.sync_data()).map_err(io_err("write", &tmp))?;
        fs::rename(&tmp, dir.join(MANIFEST_FILE)).map_err(io_err("rename", &tmp))?;
    }
    Ok(out)
}
