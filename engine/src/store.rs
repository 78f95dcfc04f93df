//! The store: [`Store`] and [`StoreBuilder`], the crate's façade. Opening is
//! here; every operation delegates to the module that does it: reads to
//! [`crate::read::gather`], writes to [`crate::write`] and
//! [`crate::write::compact`], maintenance to [`crate::admin`].

use crate::admin::{Stats, VerifyReport};
use crate::snapshot::{load, Snapshot};
use crate::write::builder::Staging;
use crate::write::compact::CompactReport;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::{io_err, Error, Result};
use crate::format::codec::Codec;
use crate::format::fingerprint::Fingerprint;
use crate::format::names::HEAD_FILE;
use crate::format::names::LOADERX_META;
use crate::format::record::ChunkId;
use crate::format::table::Format;
use crate::io::fs::Dir;
use crate::io::uring::BackendKind;
use crate::memory::cache::NextUse;
use crate::memory::reads::{ReadStats, Reads};
use crate::read::request::Gather;
use crate::write::Writer;

/// zstd level of plain `zstd` records unless the builder says otherwise.
pub const DEFAULT_LEVEL: i32 = 3;
/// zstd level of `zstd_dict` records. Chosen by measurement (see DESIGN.md):
/// level 19 keeps a few percent more ratio at a small fraction of the speed.
pub const DEFAULT_DICT_LEVEL: i32 = 5;
/// Size at which a chunk file is sealed and the next one started.
pub const DEFAULT_CHUNK_BYTES: u64 = 1 << 30;

/// Whether hot records are copied from mappings unless the builder says:
/// `ZRING_MMAP=0` turns it off for the process.
fn mmap_default() -> bool {
    crate::env::mmap()
}

/// Configures and opens a [`Store`].
#[derive(Clone, Debug)]
pub struct StoreBuilder {
    path: PathBuf,
    codec: Codec,
    level: i32,
    dict_level: i32,
    chunk_bytes: u64,
    backend: BackendKind,
    direct: Option<bool>,
    mmap: Option<bool>,
    cache_bytes: Option<u64>,
    sealable: bool,
    /// The directory, already held by descriptor (a staging directory's).
    handle: Option<Arc<Dir>>,
}

impl StoreBuilder {
    /// Default codec of [`Store::append`] when the call names none.
    pub fn codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }
    /// zstd level of plain `zstd` records (default 3).
    pub fn level(mut self, level: i32) -> Self {
        self.level = level;
        self
    }
    /// zstd level of `zstd_dict` records.
    pub fn dict_level(mut self, level: i32) -> Self {
        self.dict_level = level;
        self
    }
    /// Size at which a new chunk file is started (a new store only; an existing
    /// store keeps the size it was created with).
    pub fn chunk_bytes(mut self, bytes: u64) -> Self {
        self.chunk_bytes = bytes.max(1);
        self
    }
    /// Which I/O backend carries reads and writes.
    pub fn backend(mut self, backend: BackendKind) -> Self {
        self.backend = backend;
        self
    }
    /// Force O_DIRECT reads on (`true`) or off (`false`), with no record cache
    /// and no switching. By default the read policy follows the memory budget
    /// (see [`StoreBuilder::cache_bytes`]): buffered while the store's data
    /// fits, else O_DIRECT with a record cache; `ZRING_DIRECT=0|1` forces it
    /// for the process.
    pub fn direct(mut self, direct: bool) -> Self {
        self.direct = Some(direct);
        self
    }

    /// The memory this process may fill with store data (page cache or
    /// record caches), stated for the process, not for this handle: the
    /// process has one budget, the latest statement still live (of
    /// [`crate::set_cache_bytes`], of the handles opened with `cache_bytes`
    /// and of [`crate::state_cache_bytes`]; a handle's is withdrawn when it
    /// closes).
    /// By default: `ZRING_CACHE_BYTES`, else the cgroup memory limit less
    /// what the process uses, else `MemAvailable` (`memory/budget/`).
    pub fn cache_bytes(mut self, bytes: u64) -> Self {
        self.cache_bytes = Some(bytes);
        self
    }

    /// Whether records already in the page cache are copied straight from a
    /// read-only mapping of their chunk (no system call per record) instead of
    /// being read through the I/O backend. On by default (`ZRING_MMAP=0` turns
    /// the default off); never used with O_DIRECT.
    pub fn mmap(mut self, on: bool) -> Self {
        self.mmap = Some(on);
        self
    }

    /// Lay appended records out so that [`Store::seal`] can give the store a
    /// format-2 table without copying them: a chunk is started only at a
    /// record whose index is a multiple of 340 (the records of a page of a
    /// variable section), so a chunk may run past
    /// [`StoreBuilder::chunk_bytes`] by up to 339 records, as compaction's
    /// do (never past 4 GiB). Off by default; meant for a store written once
    /// and then sealed. Records of one length, raw, can be sealed either way.
    ///
    /// A sealable writer that opens an empty store also seals as it goes:
    /// once the table's 32-byte entries past its sealed section outgrow a
    /// sixteenth of the data (and 1 MiB), an append seals the table again,
    /// so the store's table turns format 2 during the write and the write
    /// never needs much more disk than the store it leaves.
    pub fn sealable(mut self, on: bool) -> Self {
        self.sealable = on;
        self
    }

    /// The store's directory, already held by descriptor (its path is then
    /// only for messages): a part of a dataset of parts, reached from the
    /// dataset's folder with no link followed.
    pub(crate) fn in_dir(mut self, dir: Arc<Dir>) -> Self {
        self.handle = Some(dir);
        self
    }

    /// Opens an existing store (zring's or loaderx 0.7.3's) for reading.
    pub fn open(self) -> Result<Store> {
        self.open_inner(false)
    }

    /// Opens a store for reading and writing, creating it if the directory
    /// holds none. Takes the single-writer lock.
    pub fn open_writable(self) -> Result<Store> {
        let Some(dir) = self.existing_dir()? else { return self.create() };
        if !dir.exists(HEAD_FILE) && !dir.exists(LOADERX_META) {
            return self.create_in(dir);
        }
        self.open_inner_in(dir, true)
    }

    /// Creates a new, empty store; fails if one is already there.
    pub fn create(self) -> Result<Store> {
        let dir = match self.held(true)? {
            Some(d) => d,
            None => {
                std::fs::create_dir_all(&self.path).map_err(io_err("create directory", &self.path))?;
                Arc::new(Dir::open(&self.path)?)
            }
        };
        self.create_in(dir)
    }

    fn create_in(self, dir: Arc<Dir>) -> Result<Store> {
        if dir.exists(HEAD_FILE) || dir.exists(LOADERX_META) {
            return Err(Error::AlreadyExists { path: self.path.clone() });
        }
        let lock = crate::write::lock(&dir)?;
        // Checked under the lock, so no other writer is making files here.
        let orphans = crate::write::orphaned_files(&dir)?;
        if !orphans.is_empty() {
            return Err(crate::write::headless(dir.path(), &orphans));
        }
        crate::write::init(&dir, self.chunk_bytes)?;
        self.finish_open(dir, Some(lock))
    }

    /// Creates a new, empty store in a hidden directory beside the builder's
    /// path, which [`StagedStore::publish`] renames into place once it is
    /// complete (swapping it for a store already there when `replace`; see
    /// [`Staging`]); dropped unpublished, it is removed. An existing path is
    /// [`Error::AlreadyExists`] unless `replace`.
    pub fn create_staged(self, replace: bool) -> Result<StagedStore> {
        let staging = Staging::new(&self.path, replace)?;
        let store =
            StoreBuilder { path: staging.path().to_path_buf(), handle: Some(staging.handle()), ..self }.create()?;
        Ok(StagedStore::new(store, staging))
    }

    /// The directory when it is already held by descriptor: given to the
    /// builder, or a staging directory of this process or one under it
    /// ([`crate::write::builder::resolve`]; `create` makes missing ones).
    fn held(&self, create: bool) -> Result<Option<Arc<Dir>>> {
        match &self.handle {
            Some(d) => Ok(Some(Arc::clone(d))),
            None => crate::write::builder::resolve(&self.path, create),
        }
    }

    fn open_inner(self, writable: bool) -> Result<Store> {
        let Some(dir) = self.existing_dir()? else {
            return Err(Error::NotAStore { path: self.path.clone(), reason: "no such directory".into() });
        };
        self.open_inner_in(dir, writable)
    }

    /// The store's directory (held by a staging directory of this process,
    /// or opened by path), or `None` when there is no directory there.
    fn existing_dir(&self) -> Result<Option<Arc<Dir>>> {
        let missing = |e: &Error| matches!(e, Error::Io { source, .. } if matches!(source.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)));
        match self.held(false) {
            Ok(Some(d)) => Ok(Some(d)),
            Ok(None) => match Dir::open(&self.path) {
                Ok(d) => Ok(Some(Arc::new(d))),
                Err(e) if missing(&e) => Ok(None),
                Err(e) => Err(e),
            },
            Err(e) if missing(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn open_inner_in(self, dir: Arc<Dir>, writable: bool) -> Result<Store> {
        if !dir.exists(HEAD_FILE) {
            if dir.exists(LOADERX_META) {
                if writable {
                    return Err(Error::ReadOnly(format!(
                        "{} is a loaderx store; convert it with import_loaderx to write to it",
                        self.path.display()
                    )));
                }
                return self.finish_open(dir, None);
            }
            let orphans = crate::write::orphaned_files(&dir)?;
            if !orphans.is_empty() {
                return Err(crate::write::headless(dir.path(), &orphans));
            }
            return Err(Error::NotAStore {
                path: self.path.clone(),
                reason: "no head.zr (nor loaderx meta.zr)".into(),
            });
        }
        let lock = if writable {
            let lock = crate::write::lock(&dir)?;
            crate::write::recover(&dir).map_err(|e| missing_is_damage(dir.path(), e))?;
            Some(lock)
        } else {
            None
        };
        self.finish_open(dir, lock)
    }

    fn finish_open(self, dir: Arc<Dir>, lock: Option<File>) -> Result<Store> {
        let _gate = crate::fork::enter();
        let backend = self.backend.resolve().map_err(io_err("set up io_uring for", &self.path))?;
        // A reader can race a writer's compaction, which replaces files and
        // then the head: read the head again when a file it names is gone.
        let mut attempt = 0;
        let (snap, head, reads) = loop {
            match load(&dir, self.dict_level, &|data| Reads::open(&self.path, self.cache_bytes, self.direct, data)) {
                Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound && attempt < 5 => {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                r => break r.map_err(|e| missing_is_damage(&self.path, e))?,
            }
        };
        let writer = match (lock, head) {
            (Some(lock), Some(head)) => Some(Mutex::new(
                Writer::new(&dir, lock, head, self.sealable).map_err(|e| missing_is_damage(&self.path, e))?,
            )),
            _ => None,
        };
        Ok(Store {
            dir,
            backend,
            reads,
            mmap: self.mmap.unwrap_or_else(mmap_default) && crate::io::mmap::guard_available(),
            codec: self.codec,
            level: self.level,
            dict_level: self.dict_level,
            snap: crate::snapshot::cell::Cell::new(snap),
            writer,
            pid: std::process::id(),
            closing: Default::default(),
        })
    }
}

/// A store file (`*.zr`: head, table, chunk, dictionary, loaderx meta) that
/// an open did not find is damage, not an I/O failure: [`Error::Corrupted`]
/// naming it. The open's retries for a compaction racing it have run out
/// by then, so the head that names the file is the current one.
fn missing_is_damage(dir: &Path, e: Error) -> Error {
    match e {
        Error::Io { path, source, .. }
            if source.kind() == std::io::ErrorKind::NotFound
                && path.parent() == Some(dir)
                && path.extension().is_some_and(|x| x == "zr") =>
        {
            crate::error::corrupted(
                path.display().to_string(),
                "missing, though the store's head names it; restore the store from a copy",
            )
        }
        e => e,
    }
}

/// A record store: a directory of chunk files, a record table and a head.
///
/// `Store` is `Send + Sync`; share it as `Arc<Store>`. Gathers run
/// concurrently with each other and with a writer's appends, deletes and
/// compactions: each gather works on the snapshot it started with.
pub struct Store {
    pub(crate) dir: Arc<Dir>,
    pub(crate) backend: BackendKind,
    pub(crate) reads: Reads,
    pub(crate) mmap: bool,
    pub(crate) codec: Codec,
    pub(crate) level: i32,
    pub(crate) dict_level: i32,
    pub(crate) snap: crate::snapshot::cell::Cell,
    pub(crate) writer: Option<Mutex<Writer>>,
    /// The process that opened the store (writes are refused in a forked child).
    pub(crate) pid: u32,
    /// Removes superseded chunks as the handle closes; the last field, so
    /// it runs after the snapshot above has released its pin.
    pub(crate) closing: crate::snapshot::pins::Closing,
}

impl Store {
    /// A builder for the store at `path`.
    pub fn builder(path: impl AsRef<Path>) -> StoreBuilder {
        StoreBuilder {
            path: path.as_ref().to_path_buf(),
            codec: Codec::Zstd,
            level: DEFAULT_LEVEL,
            dict_level: DEFAULT_DICT_LEVEL,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            backend: BackendKind::Auto,
            direct: None,
            sealable: false,
            mmap: None,
            cache_bytes: None,
            handle: None,
        }
    }

    /// Opens an existing store for reading.
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        Store::builder(path).open()
    }

    /// The store's directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Number of records.
    pub fn len(&self) -> u64 {
        self.snapshot().records()
    }

    /// Whether the store holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The on-disk layout.
    pub fn format(&self) -> Format {
        self.snapshot().table.format
    }

    /// The I/O backend in use.
    pub fn backend(&self) -> BackendKind {
        self.backend
    }

    /// Whether reads bypass the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.reads.direct()
    }

    /// What a checkpoint records of the store: its record count and a
    /// content checksum that appends, deletes, rewrites and re-encoding
    /// change and compaction keeps. O(1) when the head knows it (every store
    /// written by this version, once synced); otherwise computed once per
    /// snapshot from the table (see [`Fingerprint`]).
    pub fn fingerprint(&self) -> Result<Fingerprint> {
        fingerprint_of(&self.snapshot())
    }

    /// Whether the store's first `earlier.records` records are those
    /// `earlier` was taken of ([`Store::fingerprint`], at any time before):
    /// they are unchanged, and the store may hold more after them (it only
    /// grew by appends). A delete, a rewrite or a re-encoding of any of
    /// them makes it `false` (but for a 2^-32 chance of a collision, as
    /// for any fingerprint). Reads the table entries added since, and
    /// costs what [`Store::fingerprint`] costs besides.
    pub fn extends(&self, earlier: Fingerprint) -> Result<bool> {
        let snap = self.snapshot();
        let now = fingerprint_of(&snap)?;
        if earlier.records > now.records {
            return Ok(false);
        }
        let content =
            crate::format::fingerprint::over_table(earlier.content, &snap.table, earlier.records, now.records)?;
        Ok(content == now.content)
    }

    /// One snapshot of the store to make several reads from: every call on
    /// the [`View`] sees the same records, whatever appends, deletes and
    /// compactions happen meanwhile (the files it reads stay until it is
    /// dropped). A data loader takes one per step, so the lengths it sizes
    /// a ragged batch by are those of the records it then gathers.
    pub fn view(self: &Arc<Self>) -> View {
        View { store: Arc::clone(self), snap: self.snapshot() }
    }

    /// Whether next-use hints ([`Gather::next`]) reach a record cache
    /// now: the store reads with O_DIRECT behind a record cache of some size.
    /// Cheap (two relaxed loads); a loader asks once per step.
    pub fn wants_hints(&self) -> bool {
        self.reads.caching()
    }

    /// The read policy in force and what reads have done since the store
    /// opened: record-cache and page-cache hits, bytes from each source.
    pub fn read_stats(&self) -> ReadStats {
        let _gate = crate::fork::enter();
        self.reads.stats()
    }

    /// Whether this handle may write.
    pub fn is_writable(&self) -> bool {
        self.writer.is_some()
    }

    /// The default codec of appends.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.snap.get()
    }

    /// What this store's reads need of it ([`crate::read::Ctx`]).
    pub(crate) fn read_ctx(&self) -> crate::read::Ctx<'_> {
        crate::read::Ctx {
            dir: self.dir.path(),
            backend: self.backend,
            mmap: self.mmap,
            reads: &self.reads,
            adopt: self,
        }
    }

    pub(crate) fn publish(&self, snap: Snapshot) {
        self.snap.publish(snap)
    }

    /// What this store's writes need of it ([`crate::write::Ctx`]).
    pub(crate) fn write_ctx(&self) -> crate::write::Ctx<'_> {
        crate::write::Ctx {
            dir: &self.dir,
            backend: self.backend,
            reads: &self.reads,
            codec: self.codec,
            level: self.level,
            dict_level: self.dict_level,
            cell: &self.snap,
            writer: self.writer.as_ref(),
            pid: self.pid,
            read: self.read_ctx(),
        }
    }

    /// The bytes of the chunk files that records `indices` are stored in:
    /// `(file name, byte range)`, one per record, in order. What a cache of
    /// the store's files must hold before the records are read.
    pub fn extents(&self, indices: &[u64]) -> Result<Vec<(String, std::ops::Range<u64>)>> {
        let snap = self.snapshot();
        let format = snap.table.format;
        indices
            .iter()
            .map(|&i| {
                let e = snap.entry(i)?;
                Ok((crate::format::names::chunk_name(format, e.chunk), e.offset..e.offset + e.stored_len as u64))
            })
            .collect()
    }

    /// [`Store::extents`] of the records `range`, as few extents as the
    /// chunk files hold them in: from the first record's bytes to the last
    /// record's in each chunk file between, assuming records laid out in
    /// index order (as a writer appends them). Exact for a store written
    /// once; a hint otherwise.
    pub fn range_extents(&self, range: std::ops::Range<u64>) -> Result<Vec<(String, std::ops::Range<u64>)>> {
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let snap = self.snapshot();
        let format = snap.table.format;
        let (a, b) = (snap.entry(range.start)?, snap.entry(range.end - 1)?);
        let name = |c: ChunkId| crate::format::names::chunk_name(format, c);
        if a.chunk == b.chunk && a.offset <= b.offset {
            return Ok(vec![(name(a.chunk), a.offset..b.offset + b.stored_len as u64)]);
        }
        if a.chunk > b.chunk {
            return self.extents(&range.collect::<Vec<_>>());
        }
        let mut out = Vec::new();
        for c in a.chunk.0..=b.chunk.0 {
            let id = ChunkId(c);
            let Some(chunk) = snap.chunk(id) else { continue };
            let start = if id == a.chunk { a.offset } else { 0 };
            let end = if id == b.chunk { b.offset + b.stored_len as u64 } else { chunk.len };
            out.push((name(id), start..end.max(start)));
        }
        Ok(out)
    }

    /// Logical (decoded) length of each record in `indices`, into `out`.
    pub fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<()> {
        crate::read::gather::lengths(&self.snapshot(), indices, out)
    }

    /// Logical length of one record.
    pub fn record_len(&self, index: u64) -> Result<u64> {
        crate::read::gather::record_len(&self.snapshot(), index)
    }

    /// Reads the records `req` names into `dst`, each into its slot
    /// ([`Gather`]).
    ///
    /// Every index, entry and slot is checked before anything is written to
    /// `dst`.
    pub fn gather(&self, req: &Gather<'_>, dst: &mut [u8]) -> Result<()> {
        crate::read::gather::gather(&self.read_ctx(), &self.snapshot(), req, dst)
    }

    /// Appends records, compressing them with `codec` (the store's default
    /// when `None`) on every core while earlier ones are written (see
    /// `append.rs`). Returns the index of the first. The records are visible
    /// to this handle's readers at once and durable after [`Store::sync`].
    ///
    /// On an error, the records before the failing group of about 1 MiB may
    /// have been appended (and are visible); none after it.
    pub fn append(&self, records: &[&[u8]], codec: Option<Codec>) -> Result<u64> {
        crate::write::append_records(&self.write_ctx(), records, codec)
    }

    /// Appends `src.len() / item_len` records of `item_len` bytes each. Raw
    /// records are written straight from `src`.
    pub fn append_fixed(&self, src: &[u8], item_len: usize, codec: Option<Codec>) -> Result<u64> {
        crate::write::append_fixed(&self.write_ctx(), src, item_len, codec)
    }

    /// Makes every appended record durable: fsyncs the data and table, then
    /// atomically replaces the head. After a crash the store reopens with
    /// every record appended before the last successful `sync`.
    pub fn sync(&self) -> Result<()> {
        crate::write::sync(&self.write_ctx())
    }

    /// Syncs (if writable). Dropping a store does the same, ignoring errors.
    /// After a failed write (a poisoned writer) it returns `Ok`: that call
    /// reported the error, and the handle already holds only what is saved.
    pub fn close(&self) -> Result<()> {
        crate::write::close(&self.write_ctx())
    }

    /// Removes records, keeping the index space dense: each hole is filled by
    /// the record at the end of the table, in descending index order (the
    /// semantics of loaderx 0.7.3, so the same deletes give the same order).
    /// Indices of survivors may change. Duplicates and any order are fine;
    /// every index is checked before anything changes. Only the table is
    /// rewritten; [`Store::compact`] reclaims the bytes.
    pub fn delete(&self, indices: &[u64]) -> Result<()> {
        crate::write::compact::delete(&self.write_ctx(), indices)
    }

    /// Reclaims the bytes of deleted records: copies every live record, in
    /// index order, into new chunk files, then commits a table naming them and
    /// removes the old files. Needs free space for the live data. Concurrent
    /// gathers keep reading the old files through their snapshot.
    pub fn compact(&self) -> Result<CompactReport> {
        crate::write::compact::compact(&self.write_ctx(), None)
    }

    /// [`Store::compact`], writing the table in format `version`: 1 (a
    /// 32-byte entry per record) or 2 (no entry at all for raw records of
    /// one length, 12 bytes for any other; `engine/DESIGN.md`). Compacts
    /// even when nothing was deleted, to upgrade a store in place; crash-safe
    /// as every compaction. Appends after it add format-1 entries after the
    /// sealed section; [`Store::delete`] rewrites the table in format 1.
    pub fn compact_to(&self, version: u32) -> Result<CompactReport> {
        crate::write::compact::compact(&self.write_ctx(), Some(version))
    }

    /// Gives a store written once its table in format 2 without copying a
    /// record: syncs, then writes a new table generation in format 2 and
    /// commits it, crash-safe as a delete (the old table or the new one,
    /// never a mix). It applies when the records already lie as a sealed
    /// section has them: raw records of one length (no entry per record),
    /// or any records when every 340 consecutive ones from index 0 lie back
    /// to back in one chunk, which a writer opened with
    /// [`StoreBuilder::sealable`] guarantees (12 bytes a record). Any other
    /// store is left as it is, as is a store whose table is already format
    /// 2; the report's `format_after` tells which. Appends after it add
    /// format-1 entries after the sealed section; [`Store::delete`] rewrites
    /// the table in format 1, as after [`Store::compact_to`]. A writer that
    /// appended every record itself from an empty store knows their layout
    /// already; any other reads the table once.
    pub fn seal(&self) -> Result<CompactReport> {
        crate::write::seal::seal(&self.write_ctx())
    }

    /// The table's format version (1 or 2; loaderx stores: 0) and its bytes.
    pub fn table_format(&self) -> (u32, u64) {
        self.snapshot().table_format()
    }

    /// Counts records, bytes and codecs (a scan of the table, no data reads).
    pub fn stats(&self) -> Result<Stats> {
        crate::admin::stats(&self.write_ctx())
    }

    /// Reads every record, checks its checksum and decodes it: the explicit
    /// full scan that `open` does not do. The first damaged record is the error.
    pub fn verify(&self) -> Result<VerifyReport> {
        crate::admin::verify(&self.write_ctx())
    }

    /// Whether the store has a zstd dictionary.
    pub fn has_dict(&self) -> bool {
        crate::admin::has_dict(&self.write_ctx())
    }

    /// Trains a zstd dictionary of at most `max_size` bytes on `samples`,
    /// stores it durably and installs it for `zstd_dict` appends. A store has
    /// at most one dictionary, fixed once trained. Returns its size.
    pub fn train_dict(&self, samples: &[&[u8]], max_size: usize) -> Result<usize> {
        crate::admin::train_dict(&self.write_ctx(), samples, max_size)
    }

    /// The contents of `schema.json`, the Python layer's metadata, if any.
    /// A file whose checksum does not match is [`Error::Corrupted`] naming
    /// it; files written before schemas had a checksum are returned as
    /// they are.
    pub fn schema(&self) -> Result<Option<String>> {
        crate::admin::schema(&self.write_ctx())
    }

    /// Replaces `schema.json` atomically. `json` must be a JSON object; the
    /// file stores it with a checksum ([`Store::schema`] returns `json`).
    pub fn set_schema(&self, json: &str) -> Result<()> {
        crate::admin::set_schema(&self.write_ctx(), json)
    }

    /// The bytes of `names.intent`, the Python layer's record of a delete
    /// whose records are committed and whose record names (`names/`) may
    /// not be yet; `None` when there is none. Read through the store
    /// directory's descriptor, never through a link.
    pub fn names_intent(&self) -> Result<Option<Vec<u8>>> {
        crate::admin::names_intent(&self.write_ctx())
    }

    /// Writes `names.intent` atomically (a temporary file made anew, fsync,
    /// rename, fsync of the directory), or with `None` removes it durably.
    /// Needs the writer.
    pub fn set_names_intent(&self, bytes: Option<&[u8]>) -> Result<()> {
        crate::admin::set_names_intent(&self.write_ctx(), bytes)
    }
}

/// Converts the loaderx 0.7.3 store at `src` into a new native store at `dst`,
/// copying every record's stored bytes unchanged (no recompression) with a
/// checksum added, the dictionary, and `schema.json`. The new store's table
/// is sealed in format 2 where its records allow ([`Store::seal`]).
///
/// loaderx keeps no checksums, so before a record gets one it is checked as
/// far as its bytes allow: a raw record must be as long as its logical
/// length, a compressed one must decode (on the decode pool) to exactly that
/// length. A record that does not is [`Error::Corrupted`] naming it, instead
/// of damaged bytes blessed with a fresh checksum.
pub fn import_loaderx(src: impl AsRef<Path>, dst: impl AsRef<Path>) -> Result<Store> {
    let from = Store::open(src.as_ref())?;
    if from.format() != Format::Loaderx {
        return Err(Error::InvalidArgument(format!("{} is not a loaderx store", src.as_ref().display())));
    }
    let to = Store::builder(dst.as_ref()).sealable(true).create()?;
    crate::admin::import(&from.write_ctx(), &to.write_ctx())?;
    to.sync()?;
    // Written once, so laid out for a format-2 table (sealing syncs first).
    to.seal()?;
    Ok(to)
}

/// A new store being built in a [`Staging`] directory
/// ([`StoreBuilder::create_staged`]); it derefs to the
/// [`Store`].
pub struct StagedStore {
    // Declared first: dropped (closing its files) before the staging
    // directory is removed.
    store: Store,
    staging: Staging,
}

impl StagedStore {
    pub(crate) fn new(store: Store, staging: Staging) -> StagedStore {
        StagedStore { store, staging }
    }

    /// Closes the store (a sync) and puts it at the builder's path
    /// ([`Staging::publish`]). Dropping it unpublished removes it.
    pub fn publish(self) -> Result<()> {
        self.store.close()?;
        drop(self.store);
        self.staging.publish()
    }
}

impl std::ops::Deref for StagedStore {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

/// The fingerprint of `snap`'s records ([`Store::fingerprint`]).
fn fingerprint_of(snap: &Snapshot) -> Result<Fingerprint> {
    let records = snap.records();
    let (known_records, known) = snap.known;
    if known != 0 && known_records == records {
        return Ok(Fingerprint { records, content: known });
    }
    if let Some(&content) = snap.content.get() {
        return Ok(Fingerprint { records, content });
    }
    let (from, h) = if known != 0 && known_records <= records {
        (known_records, known)
    } else {
        (0, crate::format::fingerprint::SEED)
    };
    let content = crate::format::fingerprint::over_table(h, &snap.table, from, records)?;
    let _ = snap.content.set(content);
    Ok(Fingerprint { records, content })
}

/// One snapshot of a store ([`Store::view`]): its reads all see the same
/// records.
pub struct View {
    store: Arc<Store>,
    snap: Arc<Snapshot>,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View").field("path", &self.store.dir.path()).field("len", &self.len()).finish()
    }
}

impl View {
    /// Number of records.
    pub fn len(&self) -> u64 {
        self.snap.records()
    }

    /// Whether the view holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// [`Store::fingerprint`] of these records.
    pub fn fingerprint(&self) -> Result<Fingerprint> {
        fingerprint_of(&self.snap)
    }

    /// [`Store::lengths`] of these records.
    pub fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<()> {
        crate::read::gather::lengths(&self.snap, indices, out)
    }

    /// Loads the records of `ranges` (index ranges, best in index order)
    /// ahead of the gathers that will draw them, each run of records lying
    /// back to back in a chunk file as one large read: into the record cache
    /// (ranked by `next`, one hint per record counting through the ranges,
    /// or none) when the store reads with O_DIRECT behind one, into the page
    /// cache (`POSIX_FADV_WILLNEED`) when it reads buffered; nothing when the
    /// read mode was forced. A loader in the sampler's blocked mode calls it
    /// a window ahead (engine/DESIGN.md, "Block reads").
    pub fn prefetch(&self, ranges: &[std::ops::Range<u64>], next: &[NextUse]) -> Result<()> {
        crate::read::blocks::prefetch(&self.store.read_ctx(), &self.snap, ranges, next)
    }

    /// [`Store::gather`] from these records.
    pub fn gather(&self, req: &Gather<'_>, dst: &mut [u8]) -> Result<()> {
        crate::read::gather::gather(&self.store.read_ctx(), &self.snap, req, dst)
    }

    /// What a gather over several views reads this one with
    /// (`crate::parts::Parts::gather`), its records copied from the
    /// mappings counted into `pending` first; `mapped` is [`View::maps`],
    /// kept by the caller beside `pending` (the store itself is not read
    /// until a gather needs more of it than its records in memory).
    pub(crate) fn source<'a>(
        &'a self,
        pending: &'a std::sync::atomic::AtomicU64,
        ahead: &'a std::sync::atomic::AtomicBool,
        mapped: &'a std::sync::atomic::AtomicBool,
    ) -> crate::read::gather::Source<'a> {
        crate::read::gather::Source {
            store: &*self.store,
            mmap: mapped.load(std::sync::atomic::Ordering::Relaxed),
            snap: &self.snap,
            dict: self.snap.dict.as_deref(),
            pending,
            ahead,
        }
    }

    /// Whether this view's store copies records from its mappings
    /// ([`crate::read::Ctx::mmap`]).
    pub(crate) fn maps(&self) -> bool {
        self.store.mmap
    }

    /// Reads parts of these records into `dst` ([`Spans`](crate::Spans):
    /// what each costs and what is checked).
    pub fn read_spans(&self, req: &crate::Spans<'_>, dst: &mut [u8]) -> Result<()> {
        crate::read::gather::read_spans(&self.store.read_ctx(), &self.snap, req, dst)
    }

    /// The codec each record of `indices` is stored with, into `out`: a
    /// [`Spans`](crate::Spans) read of a raw record reads about the span, of
    /// a compressed one the whole record.
    pub fn codecs(&self, indices: &[u64], out: &mut [Codec]) -> Result<()> {
        crate::read::gather::codecs(&self.snap, indices, out)
    }
}

impl crate::read::Contexts for Store {
    fn read_ctx(&self) -> crate::read::Ctx<'_> {
        Store::read_ctx(self)
    }
}

/// A read policy the counts chose, put in force: the chunks are reopened
/// with or without O_DIRECT in a new snapshot (gathers under way keep
/// theirs).
impl crate::read::Adopt for Store {
    fn adopt(&self, policy: crate::memory::policy::Policy, data: u64) {
        let direct = policy.mode == crate::memory::policy::ReadMode::Direct;
        // Holding the writer (if any) keeps an append from publishing
        // chunks between reading the snapshot and replacing it. A busy
        // writer (this thread may be compacting) defers the switch to a
        // later window rather than wait.
        let _w = match self.writer.as_ref().map(Mutex::try_lock) {
            Some(Err(std::sync::TryLockError::WouldBlock)) => return,
            w => w,
        };
        let now = self.snapshot();
        self.publish(Snapshot {
            pin: now.pin.clone(),
            table: now.table.clone(),
            chunk_base: now.chunk_base,
            chunks: now.chunks.iter().map(|c| c.with_direct(direct)).collect(),
            dict: now.dict.clone(),
            known: now.known,
            content: now.content.clone(),
        });
        self.reads.adopt(policy, data);
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // A forked child's copy: the parent owns the writer.
            return;
        }
        if let Some(w) = &self.writer {
            let mut w = w.lock().unwrap_or_else(|p| p.into_inner());
            if w.poisoned.is_none() {
                let _ = w.sync(&self.dir);
            }
            self.closing.writer = true;
            self.closing.deferred = (!w.deferred.is_empty()).then_some(w.head.chunk_base);
        }
        let snap = self.snapshot();
        if snap.pin.is_some() {
            self.closing.at = Some((Arc::clone(&self.dir), snap.chunk_base));
        }
    }
}
