//! The write path: the single writer, append, sync and recovery.
//!
//! Appends only ever write past the committed end of the tail chunk and of the
//! record table; nothing a committed head refers to is modified. `sync` makes
//! the new bytes durable and then commits a new head. A crash before that
//! commit leaves the old head, and the bytes past it are cut off the next time
//! a writer opens the store ([`recover`]).

pub(crate) mod append;
pub(crate) mod builder;
pub(crate) mod compact;
pub(crate) mod new_table;
pub(crate) mod seal;

use crate::format::names::{
    DICT_FILE, HEAD_FILE, LEGACY_NAMES_FILE, LOCK_FILE, NAMES_DIR, SCHEMA_FILE, TABLE_HEADER_BYTES,
};
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use std::ops::Range;

use crate::error::{io_err, Error, Result};
use crate::fork::Gated;
use crate::format::codec::Codec;
use crate::format::head::Head;
use crate::format::names::chunk_name;
use crate::format::names::table_name;
use crate::format::record::{ChunkId, Entry, ENTRY_BYTES};
use crate::format::table::{table_header, Format, Table, VAR_PER_PAGE};
use crate::io::fs::{self, lock_mode, Dir};
use crate::io::uring::BackendKind;
use crate::io::uring::{self, ReqErrorKind};
use crate::snapshot::chunk::open_chunk;
use crate::snapshot::Snapshot;
use crate::write::append::{Block, Encoder, Input};
use std::sync::{Mutex, MutexGuard};

/// Largest record: lengths are stored as u32.
pub const MAX_RECORD_BYTES: u64 = u32::MAX as u64;

/// Takes the single-writer lock: an open file description write lock
/// (`F_OFD_SETLK`, `F_WRLCK`) on the whole of `lock`, opened for reading and
/// writing, released by the kernel when the last descriptor of that open
/// closes, however the process ends.
///
/// A write lock needs a descriptor opened for writing, so only those who may
/// write `lock` can take it ([`lock_mode`]: the owner, and the group or
/// others only where the directory lets them write the store anyway). A
/// reader can still take a *read* lock on any file it can read, and a `lock`
/// made readable to all (by `chmod -R a+rX`, or an older zring's umask mode)
/// lets it; no writer ever takes a read lock on `lock`, so a conflicting
/// read lock is never a writer's, and the writer replaces the file
/// ([`replace_lock`]): a new file of the right mode, locked and renamed over
/// the old, which the reader may keep holding to no effect. A too-open file
/// the writer did lock is replaced the same way, so descriptors opened on it
/// before lock nothing. A writer that locked a file which is no longer the
/// one at `lock` (replaced between its open and its lock) starts again.
///
/// The writer also takes `flock` on the file when it can, which keeps out
/// writers of zring 0.x releases that took only `flock`. A `flock` held on a
/// file only writers can open is such a writer's (`Locked`); on a too-open
/// file it may be anyone's, and the file is replaced: run those older
/// writers beside this one only on stores whose `lock` is not readable to
/// others.
pub(crate) fn lock(dir: &Dir) -> Result<File> {
    use crate::io::locks::{try_write_whole, Holder};
    let p = dir.join(LOCK_FILE);
    let dir_mode = dir.metadata()?.mode();
    let mode = lock_mode(dir_mode);
    // Each pass that does not return met a replacement by another writer.
    for _ in 0..8 {
        let f = dir.open_or_create_mode(LOCK_FILE, mode)?;
        let held = f.metadata().map_err(io_err("stat", &p))?;
        let too_open = held.mode() & 0o777 & !mode != 0;
        match try_write_whole(&f) {
            Ok(None) => {}
            Ok(Some(Holder::Writer)) => return Err(Error::Locked { path: dir.path().into() }),
            // Readers' locks: nobody's writer lock (above).
            Ok(Some(Holder::Readers)) => match replace_lock(dir, mode, &held)? {
                Some(f) => return Ok(f),
                None => continue,
            },
            Err(e) => return Err(io_err("lock", &p)(e)),
        }
        let older_writer = !flock_is_byte_range(&f)
            && match f.try_lock() {
                Ok(()) => false,
                Err(std::fs::TryLockError::WouldBlock) => true,
                Err(std::fs::TryLockError::Error(e)) => return Err(io_err("lock", &p)(e)),
            };
        if older_writer && !too_open {
            return Err(Error::Locked { path: dir.path().into() });
        }
        match dir.stat(LOCK_FILE) {
            Ok(m) if (m.st_dev, m.st_ino) == (held.dev(), held.ino()) => {}
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("stat", &p)(e)),
        }
        if !too_open {
            return Ok(f);
        }
        match replace_lock(dir, mode, &held)? {
            Some(f) => return Ok(f),
            None => continue,
        }
    }
    Err(Error::Locked { path: dir.path().into() })
}

/// Whether `flock` on `file` is a whole-file byte-range lock (NFS and SMB
/// clients emulate it so): it would then conflict with the writer's own OFD
/// lock, and an older writer's `flock` there already conflicts with it, so
/// the writer takes no `flock` ([`lock`]).
fn flock_is_byte_range(file: &File) -> bool {
    const NFS: u64 = 0x6969;
    const CIFS: u64 = 0xff53_4d42;
    const SMB2: u64 = 0xfe53_4d42;
    rustix::fs::fstatfs(file).is_ok_and(|s| matches!(s.f_type as u64, NFS | CIFS | SMB2))
}

/// Replaces `lock`, the lock file `old` (too open, or read-locked by someone
/// who is no writer), with a new locked one of `mode` ([`lock`]); `None`
/// when another writer replaced or took it first (the caller starts again).
///
/// Writers replacing at once meet at one temporary name, `lock.tmp`: it is
/// created exclusively, and only the holder of its write lock renames it, and
/// only while `lock` is still `old`. A `lock.tmp` left by a crash is taken
/// over by whoever locks it. The new file keeps the old one's owner and
/// group where this process may give them (root may): root tightening a
/// user's lock file must not leave the user a file only root can open.
fn replace_lock(dir: &Dir, mode: u32, old: &std::fs::Metadata) -> Result<Option<File>> {
    use crate::io::locks::{try_write_whole, Holder};
    let tmp_name = format!("{LOCK_FILE}.tmp");
    let tmp = dir.join(&tmp_name);
    let not_found = |e: &Error| matches!(e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound);
    let exists =
        |e: &Error| matches!(e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::AlreadyExists);
    let f = match dir.create_new_mode(&tmp_name, Some(mode)) {
        Ok(f) => f,
        Err(e) if exists(&e) => match dir.open_rw(&tmp_name) {
            Ok(f) => f,
            Err(e) if not_found(&e) => return Ok(None),
            Err(e) => return Err(e),
        },
        Err(e) => return Err(e),
    };
    let mine = f.metadata().map_err(io_err("stat", &tmp))?;
    match try_write_whole(&f).map_err(io_err("lock", &tmp))? {
        None => {}
        Some(Holder::Writer) => return Err(Error::Locked { path: dir.path().into() }),
        // A crash's leftover, made readable and read-locked since: no
        // writer's. Removed (if it is still that file) for the next pass.
        Some(Holder::Readers) => {
            if dir.stat(&tmp_name).is_ok_and(|m| (m.st_dev, m.st_ino) == (mine.dev(), mine.ino())) {
                let _ = dir.remove(&tmp_name);
            }
            return Ok(None);
        }
    }
    let same =
        |name: &str, m: &std::fs::Metadata| dir.stat(name).is_ok_and(|n| (n.st_dev, n.st_ino) == (m.dev(), m.ino()));
    // Locked, but renamed into place by its creator meanwhile; or `lock` is
    // no longer the file this writer found wanting.
    if !same(&tmp_name, &mine) || !same(LOCK_FILE, old) {
        return Ok(None);
    }
    // A leftover keeps the mode it was made with.
    f.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(io_err("chmod", &tmp))?;
    // Best effort: only root may give a file away, and a writer that is not
    // root made the new file its own, as it would have made a new store's.
    let _ = std::os::unix::fs::fchown(&f, Some(old.uid()), Some(old.gid()));
    // Older zring writers take only `flock`; nobody else can hold it yet.
    if !flock_is_byte_range(&f) {
        let _ = f.try_lock();
    }
    dir.rename(&tmp_name, LOCK_FILE)?;
    // The one at `lock` now is this file unless another writer renamed its
    // own over it since; that writer locked it and this one starts again.
    Ok(same(LOCK_FILE, &mine).then_some(f))
}

/// The files in `dir` that hold (or describe) a store's records although
/// no head names them: what a new store must not be laid out over. `init`
/// truncates table generation 1 and chunk 0, so a directory whose `head.zr`
/// was removed would lose every record to a writer that took it for empty.
/// Left alone: the lock and pins files (no data), `*.tmp` files (never
/// committed), other files and directories (not the store's), and the
/// empty table and chunk a create interrupted before its head leaves.
pub(crate) fn orphaned_files(dir: &Dir) -> Result<Vec<String>> {
    let empty_table = table_name(1);
    let empty_chunk = chunk_name(Format::Native, ChunkId(0));
    let mut found = Vec::new();
    for (name, ty) in dir.entries()? {
        let len = match dir.stat(&name) {
            Ok(m) => m.st_size as u64,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("stat", dir.join(&name))(e)),
        };
        let store_file = if ty == rustix::fs::FileType::Directory {
            name == NAMES_DIR
        } else {
            name.ends_with(".zr") || name == SCHEMA_FILE || name == LEGACY_NAMES_FILE
        };
        let unborn = (name == empty_table && len <= TABLE_HEADER_BYTES as u64) || (name == empty_chunk && len == 0);
        if store_file && !unborn {
            found.push(name);
        }
    }
    found.sort();
    Ok(found)
}

/// The error for a directory that holds store files but no head:
/// [`Error::Corrupted`] naming the directory, the missing head and the
/// files, and what the user can do.
pub(crate) fn headless(dir: &Path, files: &[String]) -> Error {
    const SHOWN: usize = 6;
    let mut list = files.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if files.len() > SHOWN {
        list.push_str(&format!(", ... ({} more)", files.len() - SHOWN));
    }
    crate::error::corrupted(
        dir.display().to_string(),
        format!(
            "no {HEAD_FILE} but {} store files ({list}): the head that names the committed records is missing, \
             so nothing was opened and no file was changed; restore {HEAD_FILE} from a copy of the store, or move \
             those files away to start a new store in this directory",
            files.len()
        ),
    )
}

/// Lays out a new, empty store: table generation 1, an empty chunk 0, a head.
pub(crate) fn init(dir: &Dir, chunk_target: u64) -> Result<()> {
    let tp = dir.join(table_name(1));
    let mut t = dir.create(&table_name(1))?;
    fs::write_all(&mut t, &tp, 0, &table_header(1))?;
    fs::fsync(&t, &tp)?;
    let cname = chunk_name(Format::Native, ChunkId(0));
    let cp = dir.join(&cname);
    let c = dir.create(&cname)?;
    fs::fsync(&c, &cp)?;
    dir.fsync()?;
    Head {
        generation: 1,
        records: 0,
        chunk_base: 0,
        chunk_count: 1,
        tail_len: 0,
        dict_len: 0,
        dict_crc: 0,
        chunk_target,
        content: crate::format::fingerprint::SEED,
        layout: crate::format::head::Layout::V1,
    }
    .commit(dir)
}

/// Brings the files back to exactly what the head describes: cuts the table
/// and the tail chunk to their committed lengths and removes files that no
/// committed state refers to (left by a crash mid-append, -delete or -compact).
/// A table or tail chunk shorter than the head says is reported, never
/// extended: a crash cannot shorten them (both are synced before the head
/// names them), so something else lost committed bytes. Nothing is changed
/// then.
pub(crate) fn recover(dir: &Dir) -> Result<()> {
    let head = Head::read(dir)?;
    let live_table = table_name(head.generation);
    let tp = dir.join(&live_table);
    let t = dir.open_rw(&live_table)?;
    let table_size = t.metadata().map_err(io_err("stat", &tp))?.len();
    if table_size < head.table_bytes() {
        return Err(crate::error::corrupted(
            tp.display().to_string(),
            format!(
                "{table_size} bytes, the head says {} ({} records): committed entries (bytes {table_size}..{}) are \
                 missing",
                head.table_bytes(),
                head.records,
                head.table_bytes()
            ),
        ));
    }
    let cname = chunk_name(Format::Native, ChunkId(head.last_chunk()));
    let cp = dir.join(&cname);
    let c = dir.open_rw(&cname)?;
    let size = c.metadata().map_err(io_err("stat", &cp))?.len();
    if size < head.tail_len {
        return Err(crate::error::corrupted(
            cp.display().to_string(),
            format!("{size} bytes, the head says {}: bytes {size}..{} are missing", head.tail_len, head.tail_len),
        ));
    }
    let live_chunks = head.chunk_base..head.chunk_base + head.chunk_count;
    let pins = crate::snapshot::pins::create(dir)?;
    for (name, _) in dir.entries()? {
        let stale = if let Some(id) = name.strip_prefix("chunk-").and_then(|s| s.strip_suffix(".zr")) {
            match id.parse::<u32>() {
                // Chunks of an older head stay while a reader pins them.
                Ok(id) if id < head.chunk_base => {
                    crate::snapshot::pins::remove_unpinned(&pins, dir, &name, id)?;
                    false
                }
                Ok(id) => !live_chunks.contains(&id),
                Err(_) => false,
            }
        } else if name.starts_with("table-") && name.ends_with(".zr") {
            name != live_table
        } else {
            name.ends_with(".tmp") || (name == DICT_FILE && head.dict_len == 0)
        };
        if stale {
            dir.remove(&name)?;
        }
    }
    fs::set_len(&t, &tp, head.table_bytes())?;
    fs::set_len(&c, &cp, head.tail_len)?;
    dir.fsync()
}

/// The writer's state; lives behind the store's mutex.
pub(crate) struct Writer {
    _lock: File,
    /// The last committed head.
    pub head: Head,
    /// Live state, ahead of `head` by the appends not yet synced.
    pub records: u64,
    pub chunk_count: u32,
    pub tail_len: u64,
    pub table: File,
    pub tail: File,
    /// Chunk files written since the last sync (ids).
    dirty: Vec<u32>,
    new_files: bool,
    /// Set by a failed write or fsync: what reached the disk is unknown.
    pub poisoned: Option<String>,
    /// The store's pins file ([`crate::snapshot::pins`]), to remove old chunks by.
    pub pins: File,
    /// Chunks no head names that a reader still pinned when they were to be
    /// removed: tried again at every sync and compaction.
    pub deferred: Vec<u32>,
    /// Set when [`Writer::roll_back`] dropped records readers were shown:
    /// the store publishes the committed state ([`settle`]).
    rolled_back: bool,
    /// Appends start a chunk only at a variable page's first record
    /// ([`crate::StoreBuilder::sealable`]).
    sealable: bool,
    /// What [`seal::seal`] needs to know of every record from index 0,
    /// extended as records are appended: begun by a sealable writer that
    /// opened an empty store (or by a seal's pass over the table), dropped
    /// by anything that moves records.
    pub survey: Option<seal::Survey>,
}

impl Writer {
    pub fn new(dir: &Dir, lock: File, head: Head, sealable: bool) -> Result<Writer> {
        Ok(Writer {
            _lock: lock,
            head,
            records: head.records,
            chunk_count: head.chunk_count,
            tail_len: head.tail_len,
            table: dir.open_rw(&table_name(head.generation))?,
            tail: dir.open_rw(&chunk_name(Format::Native, ChunkId(head.last_chunk())))?,
            dirty: Vec::new(),
            new_files: false,
            poisoned: None,
            pins: crate::snapshot::pins::create(dir)?,
            deferred: Vec::new(),
            rolled_back: false,
            sealable,
            survey: (sealable && head.records == 0 && head.layout.version == 1).then(seal::Survey::default),
        })
    }

    fn tail_id(&self) -> u32 {
        self.head.chunk_base + self.chunk_count - 1
    }

    pub(crate) fn poison<T>(&mut self, e: Error) -> Result<T> {
        self.poisoned = Some(e.to_string());
        Err(e)
    }

    /// After a failure before a commit (a write, or an fsync of data):
    /// gives back everything written since the last commit. The tail chunk
    /// and the table are cut to their committed lengths and the chunks
    /// begun since are removed, so a full disk has that space back at once,
    /// not at the next writer's recovery; the live state becomes the
    /// committed head's, the records the store holds. Best effort: what
    /// cannot be cut now, recovery cuts.
    fn roll_back(&mut self, dir: &Dir) {
        let head = self.head;
        // Chunks begun since the commit: no head names them, and only this
        // handle's snapshots (which it republishes) ever did.
        for id in head.chunk_base + head.chunk_count..head.chunk_base + self.chunk_count {
            let _ = dir.remove(&chunk_name(Format::Native, ChunkId(id)));
        }
        if let Ok(f) = dir.open_rw(&chunk_name(Format::Native, ChunkId(head.last_chunk()))) {
            let _ = f.set_len(head.tail_len);
            self.tail = f;
        }
        let _ = self.table.set_len(head.table_bytes());
        self.rolled_back |= self.records != head.records || self.chunk_count != head.chunk_count;
        self.records = head.records;
        self.chunk_count = head.chunk_count;
        self.tail_len = head.tail_len;
        self.dirty.clear();
        self.new_files = false;
        self.survey = None;
    }

    /// Poisons the writer after a failure before anything was committed,
    /// rolling back to the committed state ([`Writer::roll_back`]).
    fn fail<T>(&mut self, dir: &Dir, e: Error) -> Result<T> {
        self.roll_back(dir);
        self.poison(e)
    }

    /// Removes the chunk files of older heads that no reader pins any more;
    /// the rest stay in [`Writer::deferred`].
    pub fn remove_old_chunks(&mut self, dir: &Dir, ids: impl IntoIterator<Item = u32>) {
        let mut keep = Vec::new();
        for id in ids {
            let name = chunk_name(Format::Native, ChunkId(id));
            // A failed removal leaves a file recovery removes later.
            if !crate::snapshot::pins::remove_unpinned(&self.pins, dir, &name, id).unwrap_or(true) {
                keep.push(id);
            }
        }
        self.deferred = keep;
    }

    /// Makes every appended byte durable and commits a head naming it.
    pub fn sync(&mut self, dir: &Dir) -> Result<()> {
        if !self.deferred.is_empty() {
            let ids = std::mem::take(&mut self.deferred);
            self.remove_old_chunks(dir, ids);
        }
        let mut head =
            Head { records: self.records, chunk_count: self.chunk_count, tail_len: self.tail_len, ..self.head };
        if head == self.head {
            return Ok(());
        }
        if let Err(e) = self.flush(dir) {
            return self.fail(dir, e);
        }
        // The fingerprint over the entries this sync commits (all of them
        // when the old head did not know it): read back from the table.
        let tp = dir.join(table_name(self.head.generation));
        let (from, h) = match self.head.content_known() {
            false => (0, crate::format::fingerprint::SEED),
            true => (self.head.records, self.head.content),
        };
        head.content =
            match crate::format::fingerprint::over_file(h, &self.table, &tp, self.head.layout, from, self.records) {
                Ok(h) => h,
                Err(e) => return self.fail(dir, e),
            };
        crate::io::fault::crash_point("sync.flushed");
        // A failed commit may still have replaced the head (a rename that
        // reached the disk before the directory's fsync failed): the files
        // it names stay as they are.
        if let Err(e) = head.commit(dir) {
            return self.poison(e);
        }
        self.head = head;
        Ok(())
    }

    /// fsyncs the chunk files written since the last sync, the table and, if
    /// files were created, the directory.
    fn flush(&mut self, dir: &Dir) -> Result<()> {
        for id in std::mem::take(&mut self.dirty) {
            let name = chunk_name(Format::Native, ChunkId(id));
            fs::fsync(&dir.open_read(&name)?, &dir.join(&name))?;
        }
        fs::fsync(&self.table, &dir.join(table_name(self.head.generation)))?;
        if std::mem::take(&mut self.new_files) {
            dir.fsync()?;
        }
        Ok(())
    }

    /// Places encoded blocks at the end of the tail chunk (starting a new
    /// chunk when the tail is full) and writes them and their table entries
    /// in one batch of transfers: one per block and chunk, one for the entries.
    pub(crate) fn write_blocks(&mut self, dir: &Dir, backend: uring::BackendKind, blocks: &[Block<'_>]) -> Result<()> {
        // Chunks sealed by this call stay open until its writes are done.
        let mut sealed: Vec<(u32, File)> = Vec::new();
        // Byte runs that go to one place: (chunk, offset, block, range in block).
        let mut runs: Vec<(u32, u64, usize, Range<usize>)> = Vec::new();
        let count: usize = blocks.iter().map(|b| b.records.len()).sum();
        let mut table_bytes = Vec::with_capacity(count * ENTRY_BYTES);
        let mut index = self.records;
        for (bi, b) in blocks.iter().enumerate() {
            let mut pos = 0usize;
            for m in &b.records {
                let len = u64::from(m.stored_len);
                // A sealable writer keeps a variable page's records in one
                // chunk, overrunning the target by up to 339 records (as
                // compaction to format 2 does), but never past the 4 GiB a
                // sealed page can address.
                let at_page =
                    !self.sealable || index.is_multiple_of(VAR_PER_PAGE) || self.tail_len + len > u64::from(u32::MAX);
                if self.tail_len > 0 && self.tail_len + len > self.head.chunk_target && at_page {
                    let id = self.head.chunk_base + self.chunk_count;
                    let f = dir.create_new(&chunk_name(Format::Native, ChunkId(id)))?;
                    let old = std::mem::replace(&mut self.tail, f);
                    sealed.push((id - 1, old));
                    self.chunk_count += 1;
                    self.tail_len = 0;
                    self.new_files = true;
                }
                let id = self.tail_id();
                if self.dirty.last() != Some(&id) {
                    self.dirty.push(id);
                }
                let end = pos + m.stored_len as usize;
                match runs.last_mut() {
                    Some((c, at, rb, r)) if *c == id && *rb == bi && *at + r.len() as u64 == self.tail_len => {
                        r.end = end
                    }
                    _ => runs.push((id, self.tail_len, bi, pos..end)),
                }
                let entry = Entry {
                    chunk: ChunkId(id),
                    offset: self.tail_len,
                    stored_len: m.stored_len,
                    logical_len: m.logical_len,
                    checksum: Some(m.crc),
                    codec: m.codec,
                    within: 0,
                };
                table_bytes.extend_from_slice(&entry.encode());
                if let Some(survey) = &mut self.survey {
                    survey.see(&entry);
                }
                self.tail_len += len;
                index += 1;
                pos = end;
            }
        }
        let tail_id = self.tail_id();
        let mut writes = Vec::with_capacity(runs.len() + 1);
        // The chunk each write goes to (`None`: the table), to name the
        // file a failed write was for.
        let mut targets = Vec::with_capacity(runs.len() + 1);
        for (id, offset, bi, range) in runs {
            if range.is_empty() {
                continue;
            }
            targets.push(Some(id));
            let fd = if id == tail_id {
                self.tail.as_fd()
            } else {
                sealed.iter().find(|(s, _)| *s == id).map(|(_, f)| f.as_fd()).expect("sealed chunk kept open")
            };
            writes.push((fd, offset, &blocks[bi].bytes[range]));
        }
        let table_at = self.head.layout.entry_at(self.records);
        writes.push((self.table.as_fd(), table_at, &table_bytes[..]));
        targets.push(None);
        let r = uring::write_batch(backend, &writes);
        if r.is_ok() {
            // Writeback starts now, while later blocks encode.
            for (fd, offset, bytes) in &writes {
                uring::start_writeback(*fd, *offset, bytes.len());
            }
        }
        drop(writes);
        drop(sealed);
        if let Err(e) = r {
            let source = match e.kind {
                ReqErrorKind::Os(s) => s,
                ReqErrorKind::Eof { .. } => std::io::Error::new(std::io::ErrorKind::WriteZero, "write returned 0"),
            };
            let path = match targets.get(e.req).copied().flatten() {
                Some(id) => dir.join(chunk_name(Format::Native, ChunkId(id))),
                None => dir.join(table_name(self.head.generation)),
            };
            return Err(Error::Io { op: "write", path, source });
        }
        crate::io::fault::crash_point("append.written");
        self.records += count as u64;
        Ok(())
    }
}

/// What a write needs of its store, and no more: the directory, the I/O
/// backend, the read counters (whose mode new chunks open in), the default
/// codec and levels, the cell the next snapshot is published in, the writer
/// (none when read-only) and the process that opened it, and the store's
/// read context for the records a compaction reads.
#[derive(Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub dir: &'a std::sync::Arc<Dir>,
    pub backend: BackendKind,
    pub reads: &'a crate::memory::reads::Reads,
    pub codec: Codec,
    pub level: i32,
    pub dict_level: i32,
    pub cell: &'a crate::snapshot::cell::Cell,
    pub writer: Option<&'a Mutex<Writer>>,
    /// The process that opened the store (writes are refused in a forked child).
    pub pid: u32,
    pub read: crate::read::Ctx<'a>,
}

impl<'a> Ctx<'a> {
    /// The snapshot published now.
    pub fn snapshot(&self) -> std::sync::Arc<Snapshot> {
        self.cell.get()
    }

    /// Publishes `snap` ([`crate::snapshot::cell::Cell::publish`]).
    pub fn publish(&self, snap: Snapshot) {
        self.cell.publish(snap)
    }

    /// What the reads of a write (a compaction's, a verify's) need.
    pub fn read_ctx(&self) -> crate::read::Ctx<'a> {
        self.read
    }

    /// The writer, for the whole of a write operation (inside the fork gate,
    /// [`crate::fork`]).
    pub fn writer(&self) -> Result<Gated<MutexGuard<'a, Writer>>> {
        let w = self.writer.ok_or_else(|| {
            Error::ReadOnly(format!(
                "{} was opened read-only; open it writable to change it",
                self.dir.path().display()
            ))
        })?;
        if std::process::id() != self.pid {
            // Parent and child would write the same tail under one lock, and
            // a fork inside a long write leaves the writer locked here.
            return Err(Error::ReadOnly(format!(
                "{} was opened writable by process {}; a forked child cannot write through that handle: open the \
                 store again in this process",
                self.dir.path().display(),
                self.pid
            )));
        }
        let gate = crate::fork::enter();
        let g = Gated::new(gate, w.lock().unwrap_or_else(|p| p.into_inner()));
        if let Some(why) = &g.poisoned {
            return Err(Error::Poisoned(why.clone()));
        }
        Ok(g)
    }
}

/// Appends records, compressing them with `codec` (the store's default
/// when `None`) on every core while earlier ones are written (see
/// `append.rs`). Returns the index of the first. The records are visible
/// to this handle's readers at once and durable after [`Store::sync`].
///
/// On an error, the records before the failing group of about 1 MiB may
/// have been appended (and are visible); none after it.
pub(crate) fn append_records(s: &Ctx<'_>, records: &[&[u8]], codec: Option<Codec>) -> Result<u64> {
    for r in records {
        if r.len() as u64 > MAX_RECORD_BYTES {
            return Err(Error::InvalidArgument(format!(
                "a record of {} bytes exceeds the limit of {MAX_RECORD_BYTES} bytes",
                r.len()
            )));
        }
    }
    append_input(s, Input::List(records), codec)
}

/// Appends `src.len() / item_len` records of `item_len` bytes each. Raw
/// records are written straight from `src`.
pub(crate) fn append_fixed(s: &Ctx<'_>, src: &[u8], item_len: usize, codec: Option<Codec>) -> Result<u64> {
    if item_len == 0 || !src.len().is_multiple_of(item_len) {
        return Err(Error::InvalidArgument(format!(
            "append_fixed: {} bytes do not split into records of {item_len} bytes",
            src.len()
        )));
    }
    if item_len as u64 > MAX_RECORD_BYTES {
        return Err(Error::InvalidArgument(format!(
            "a record of {item_len} bytes exceeds the limit of {MAX_RECORD_BYTES} bytes"
        )));
    }
    append_input(s, Input::Fixed { src, len: item_len }, codec)
}

pub(crate) fn append_input(s: &Ctx<'_>, input: Input<'_, '_>, codec: Option<Codec>) -> Result<u64> {
    let codec = codec.unwrap_or(s.codec);
    let mut w = s.writer()?;
    let dict = s.snapshot().dict.clone();
    if codec == Codec::ZstdDict && dict.is_none() {
        return Err(Error::NoDictionary);
    }
    let first = w.records;
    let enc = Encoder { codec, level: s.level, dict: dict.as_deref() };
    let r = append::encode_and_write(input, &enc, &mut |blocks| {
        // A writer sealing as it goes looks at its entries after every
        // block (1 MiB of input) rather than every batch of them.
        let step = if w.survey.is_some() { 1 } else { blocks.len().max(1) };
        let r = blocks
            .chunks(step)
            .try_for_each(|part| write_blocks(s, &mut w, part).and_then(|()| seal::as_you_go(s, &mut w)));
        w.yield_to_fork();
        r
    });
    if r.is_ok() && w.records != first {
        republish(s, &w)?;
    }
    settle(s, &mut w, r.map(|()| first))
}

/// Writes encoded blocks; a failure poisons the writer and gives back what
/// was written since the last commit ([`Writer::roll_back`]).
pub(crate) fn write_blocks(s: &Ctx<'_>, w: &mut Writer, blocks: &[Block<'_>]) -> Result<()> {
    match w.write_blocks(s.dir, s.backend, blocks) {
        Ok(()) => Ok(()),
        Err(e) => w.fail(s.dir, e),
    }
}

/// Ends a write operation: when the writer rolled back on a failure, the
/// store's readers are shown the committed state (its length is what the
/// store holds).
pub(crate) fn settle<T>(s: &Ctx<'_>, w: &mut Writer, r: Result<T>) -> Result<T> {
    if std::mem::take(&mut w.rolled_back) {
        let _ = republish(s, w);
    }
    r
}

/// Publishes a snapshot of the writer's live state to readers.
pub(crate) fn republish(s: &Ctx<'_>, w: &Writer) -> Result<()> {
    let old = s.snapshot();
    let table = Table::open_native(s.dir, w.head.generation, w.head.layout, w.records)?;
    let mut chunks = old.chunks.clone();
    let base = w.head.chunk_base;
    if old.chunk_base != base {
        chunks.clear();
    }
    for k in 0..w.chunk_count {
        let id = base + k;
        let len = if k + 1 == w.chunk_count {
            w.tail_len
        } else {
            s.dir.stat(&chunk_name(Format::Native, ChunkId(id))).map_or(0, |m| m.st_size as u64)
        };
        match chunks.get_mut(k as usize) {
            Some(c) if c.len != len => {
                c.len = len;
                c.map = Default::default();
            }
            Some(_) => {}
            None => {
                let store = old.chunks.first().and_then(|c| c.file.store());
                chunks.push(open_chunk(s.dir, store, Format::Native, ChunkId(id), Some(len), s.reads.direct())?)
            }
        }
    }
    chunks.truncate(w.chunk_count as usize);
    // The snapshot's own chunks, those an append added included: a pin of
    // fewer would let a compaction in this handle remove them under a
    // gather still reading this snapshot.
    let pin = match &old.pin {
        Some(p) if p.covers(base, w.chunk_count) => Some(p.clone()),
        _ => crate::snapshot::pins::pin(s.dir, base, w.chunk_count)?.map(Into::into),
    };
    s.publish(Snapshot {
        pin,
        table: std::sync::Arc::new(table),
        chunk_base: base,
        chunks,
        dict: old.dict.clone(),
        known: (w.head.records, w.head.content),
        content: Default::default(),
    });
    Ok(())
}

/// Makes every appended record durable: fsyncs the data and table, then
/// atomically replaces the head. After a crash the store reopens with
/// every record appended before the last successful `sync`.
pub(crate) fn sync(s: &Ctx<'_>) -> Result<()> {
    let mut w = s.writer()?;
    let r = w.sync(s.dir);
    settle(s, &mut w, r)
}

/// Syncs (if writable). Dropping a store does the same, ignoring errors.
///
/// A writer poisoned by a failure closes without an error: the failure
/// was reported by the call that met it (a `with` block's error must stay
/// the one the user sees), and the handle already rolled back to what the
/// store holds, so closing loses nothing more.
pub(crate) fn close(s: &Ctx<'_>) -> Result<()> {
    if s.writer.is_none() {
        return Ok(());
    }
    match sync(s) {
        Err(Error::Poisoned(_)) => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// Anyone who could open `lock` could keep the writer out with `flock`
    /// through a read-only descriptor: the file is open only to those who may
    /// write the directory.
    #[test]
    fn the_lock_file_is_open_only_to_those_who_may_write_the_store() {
        for (dir_mode, most) in [(0o755, 0o600), (0o700, 0o600), (0o775, 0o660), (0o777, 0o666)] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(dir_mode)).unwrap();
            let held = lock(&Dir::open(dir.path()).unwrap()).unwrap();
            let m = mode(&dir.path().join(LOCK_FILE));
            assert_eq!(m & !most, 0, "dir {dir_mode:o}: lock {m:o}");
            assert_eq!(m & 0o600, 0o600);
            assert!(matches!(lock(&Dir::open(dir.path()).unwrap()), Err(Error::Locked { .. })));
            drop(held);
        }
    }

    /// A lock file an older zring made readable to all is replaced by the
    /// next writer, so a descriptor opened on it before (and its `flock`)
    /// keeps no writer out afterwards.
    #[test]
    fn a_too_open_lock_file_is_replaced_and_its_old_descriptors_lock_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let p = dir.path().join(LOCK_FILE);
        std::fs::write(&p, b"").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        if rustix::process::geteuid().is_root() {
            // Root tightening a user's lock file leaves it the user's.
            std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
        }
        let owner = std::fs::metadata(&p).unwrap().uid();
        let reader = File::open(&p).unwrap();
        let writer = lock(&Dir::open(dir.path()).unwrap()).unwrap();
        assert_eq!(mode(&p), 0o600);
        assert!(!dir.path().join(format!("{LOCK_FILE}.tmp")).exists());
        drop(writer);
        reader.try_lock().expect("the old file is nobody's lock now");
        let again =
            lock(&Dir::open(dir.path()).unwrap()).expect("a lock held on the replaced file keeps no writer out");
        assert_eq!(std::fs::metadata(&p).unwrap().uid(), owner, "the owner stays");
        assert!(matches!(lock(&Dir::open(dir.path()).unwrap()), Err(Error::Locked { .. })));
        drop(again);
    }

    /// Issue 36: after `chmod -R a+rX`, a user who may only read the store
    /// held `flock` on `lock` and every append, delete and compact failed.
    /// Whatever a reader holds on a readable `lock` (`flock`, OFD read locks
    /// on any range), the writer proceeds, and a second writer is still
    /// kept out.
    #[test]
    fn locks_a_reader_can_take_keep_no_writer_out() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        drop(lock(&Dir::open(dir.path()).unwrap()).unwrap());
        let p = dir.path().join(LOCK_FILE);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let squatter = File::open(&p).unwrap();
        squatter.try_lock_shared().unwrap();
        assert!(crate::io::locks::lock(&squatter, libc::F_RDLCK, 0, 0, false).unwrap());
        // A leftover temporary name, made readable and read-locked too.
        let tmp = dir.path().join(format!("{LOCK_FILE}.tmp"));
        std::fs::write(&tmp, b"").unwrap();
        let squat_tmp = File::open(&tmp).unwrap();
        assert!(crate::io::locks::lock(&squat_tmp, libc::F_RDLCK, 0, 0, false).unwrap());
        let writer = lock(&Dir::open(dir.path()).unwrap()).expect("a reader's locks keep no writer out");
        assert_eq!(mode(&p), 0o600);
        assert!(matches!(lock(&Dir::open(dir.path()).unwrap()), Err(Error::Locked { .. })), "one writer at a time");
        drop(writer);
        drop(lock(&Dir::open(dir.path()).unwrap()).unwrap());
    }

    /// A writer holding the lock through a descriptor opened for writing
    /// keeps the next out, whatever the file's mode.
    #[test]
    fn a_writers_lock_keeps_the_next_writer_out() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let held = lock(&Dir::open(dir.path()).unwrap()).unwrap();
        let p = dir.path().join(LOCK_FILE);
        assert!(matches!(lock(&Dir::open(dir.path()).unwrap()), Err(Error::Locked { .. })));
        drop(held);
        // An older zring's writer: `flock` on a file only writers can open.
        let older = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        older.try_lock().unwrap();
        assert!(matches!(lock(&Dir::open(dir.path()).unwrap()), Err(Error::Locked { .. })));
    }
}
