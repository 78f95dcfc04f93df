//! Gathers: the plan of a batch of reads, its transfers, and the snapshot
//! they read from.

use crate::error::{corrupted, io_err, Error, Result};
use crate::format::codec::{self, Codec, Dict};
use crate::format::head::Head;
use crate::format::names::chunk_name;
use crate::format::names::HEAD_FILE;
use crate::format::record::{check_index, ChunkId, Entry};
use crate::format::table::{Format, Table};
use crate::io::fds::ChunkFile;
use crate::io::uring::{self, AlignedBuf, ReqErrorKind, ALIGN};
use crate::read::cache::{NextUse, StoreId};
use crate::read::hot::{Hot, HotQueue, HOT_GROUP};
use crate::read::reads::{Reads, Seen};
use crate::read::request::{Gather, Slots};
use crate::store::Store;
use once_cell::race::OnceBox;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

/// A gather below this many bytes runs on the calling thread alone.
const PARALLEL_MIN_BYTES: u64 = 128 << 10;

/// One chunk file as readers see it.
#[derive(Clone)]
pub(crate) struct Chunk {
    /// The file; its descriptors are opened on first use and cached by the
    /// process ([`crate::io::fds`]).
    pub file: Arc<ChunkFile>,
    /// Whether reads bypass the page cache (O_DIRECT) where the file system
    /// allows it.
    pub direct: bool,
    /// Bytes of this chunk that committed records may occupy.
    pub len: u64,
    /// A read-only mapping of the first `len` bytes, made on first use, for
    /// copying records that are already in the page cache without a system
    /// call. `None` inside when mapping failed or direct reads are on. Made
    /// without blocking (racing threads may both map; one mapping is kept),
    /// so no thread can wait on another's initialisation, even in a child
    /// forked while it ran.
    pub map: Arc<OnceBox<Option<crate::io::mmap::ChunkMap>>>,
}

impl Chunk {
    /// The stored bytes at `offset..offset + len` if every page of them is in
    /// memory (so reading them performs no I/O). Ask
    /// [`crate::io::mmap::Resident::faulted`] after using them.
    pub fn resident(&self, offset: u64, len: usize, epoch: Option<u64>) -> Option<crate::io::mmap::Resident<'_>> {
        if !self.copies_from_map() {
            return None;
        }
        self.mapping()?.resident_checked(offset as usize, len, epoch)
    }

    /// Whether records are copied from the mapping (no O_DIRECT in force).
    fn copies_from_map(&self) -> bool {
        !self.direct || self.file.direct_refused()
    }

    fn mapping(&self) -> Option<&crate::io::mmap::ChunkMap> {
        self.map
            .get_or_init(|| {
                let map = (self.len > 0)
                    .then(|| self.file.buffered().ok())
                    .flatten()
                    .and_then(|f| crate::io::mmap::ChunkMap::new(&f, self.len as usize).ok());
                Box::new(map)
            })
            .as_ref()
    }

    /// Starts loading what [`Chunk::resident`] will ask about `offset`.
    pub fn prefetch_residency(&self, offset: u64) {
        if self.copies_from_map() {
            if let Some(m) = self.map.get().and_then(Option::as_ref) {
                m.prefetch_residency(offset as usize);
            }
        }
    }

    /// The same file under another read mode.
    pub fn with_direct(&self, direct: bool) -> Chunk {
        Chunk { direct, ..self.clone() }
    }
}

/// An immutable view of the store; gathers hold one for their whole duration,
/// so a concurrent append, delete or compaction never changes what they see.
pub(crate) struct Snapshot {
    /// Keeps the chunk files this snapshot names from being removed by a
    /// compaction in any process ([`crate::read::pins`]); `None` when unpinned.
    pub pin: Option<Arc<crate::read::pins::Pin>>,
    pub table: Arc<Table>,
    pub chunk_base: u32,
    pub chunks: Vec<Chunk>,
    pub dict: Option<Arc<Dict>>,
    /// The fingerprint content as far as a head knows it: (records, content),
    /// content 0 when unknown ([`crate::format::fingerprint`]).
    pub known: (u64, u32),
    /// The content of all of `table`'s records, once computed.
    pub content: std::sync::OnceLock<u32>,
}

impl Snapshot {
    pub fn records(&self) -> u64 {
        self.table.records
    }

    pub fn chunk(&self, id: ChunkId) -> Option<&Chunk> {
        id.0.checked_sub(self.chunk_base).and_then(|k| self.chunks.get(k as usize))
    }

    /// Entry `index`, checked against the chunk it points into, so a damaged
    /// table is an error before any I/O is issued.
    pub fn entry(&self, index: u64) -> Result<Entry> {
        check_index(index, self.records())?;
        let e = self.table.entry(index)?;
        let table = self.table.path().display();
        let chunk = self.chunk(e.chunk).ok_or_else(|| {
            corrupted(
                format!("{table}, table entry {index}"),
                format!(
                    "names chunk {} ({}) which the head does not name (it names chunks {}..{})",
                    e.chunk.0,
                    chunk_name(self.table.format, e.chunk),
                    self.chunk_base,
                    self.chunk_base as usize + self.chunks.len()
                ),
            )
        })?;
        if e.end() > chunk.len {
            return Err(corrupted(
                format!("{table}, table entry {index}"),
                format!(
                    "bytes {}..{} lie past the end of {} ({} bytes)",
                    e.offset,
                    e.end(),
                    chunk.file.path().display(),
                    chunk.len
                ),
            ));
        }
        Ok(e)
    }
}

pub(crate) fn open_chunk(
    dir: &Path,
    store: Option<StoreId>,
    format: Format,
    id: ChunkId,
    len: Option<u64>,
    direct: bool,
) -> Result<Chunk> {
    let path = dir.join(chunk_name(format, id));
    // Only its size is checked now; it is opened when first read.
    let size = std::fs::metadata(&path).map_err(io_err("stat", &path))?.len();
    let len = match len {
        Some(l) if l > size => {
            return Err(corrupted(
                path.display().to_string(),
                format!("{size} bytes, the head says {l}: bytes {size}..{l} are missing"),
            ))
        }
        Some(l) => l,
        None => size,
    };
    Ok(Chunk { file: ChunkFile::new(path, store), direct, len, map: Default::default() })
}

/// Loads a snapshot (and for native stores the head it came from), with the
/// read policy `reads` chooses for the store's size.
pub(crate) fn load(
    dir: &Path,
    dict_level: i32,
    reads: &dyn Fn(u64) -> Result<Reads>,
) -> Result<(Snapshot, Option<Head>, Reads)> {
    // The store's identity before its head is read: a chunk file opened
    // later is checked against it, so a store replaced at this path is never
    // read under this snapshot's table ([`crate::io::fds::ChunkFile`]).
    let store = StoreId::of(dir).ok();
    if dir.join(HEAD_FILE).exists() {
        let head = Head::read(dir)?;
        // Pinned before the chunks are checked ([`crate::read::pins`]).
        let pin = crate::read::pins::pin(dir, head.chunk_base, head.chunk_count)?.map(Arc::new);
        let table = Table::open_native(dir, head.generation, head.layout, head.records)?;
        // Check every chunk before deciding on O_DIRECT (which needs the total
        // size); a missing chunk fails here, before any large allocation.
        let mut chunks = Vec::new();
        for k in 0..head.chunk_count {
            let len = (k + 1 == head.chunk_count).then_some(head.tail_len);
            chunks.push(open_chunk(dir, store, Format::Native, ChunkId(head.chunk_base + k), len, false)?);
        }
        if store.is_some() && StoreId::of(dir).ok() != store {
            return Err(Error::Io { op: "open", path: dir.to_path_buf(), source: std::io::ErrorKind::NotFound.into() });
        }
        let reads = reads(chunks.iter().map(|c| c.len).sum())?;
        if reads.direct() {
            chunks.iter_mut().for_each(|c| c.direct = true);
        }
        let dict = if head.dict_len > 0 {
            let p = dir.join(crate::format::names::DICT_FILE);
            let bytes = crate::io::fs::read(&p).map_err(io_err("read", &p))?;
            let crc = crate::format::crc::crc32c(&bytes);
            if bytes.len() != head.dict_len as usize || crc != head.dict_crc {
                return Err(corrupted(
                    p.display().to_string(),
                    format!(
                        "{} bytes with checksum {crc:#010x}; the head says {} bytes with checksum {:#010x}",
                        bytes.len(),
                        head.dict_len,
                        head.dict_crc
                    ),
                ));
            }
            let dict = Dict::new(bytes, Some(dict_level)).map_err(|e| match e {
                Error::Corrupted { detail, .. } => corrupted(p.display().to_string(), detail),
                e => e,
            })?;
            Some(Arc::new(dict))
        } else {
            None
        };
        let snap = Snapshot {
            pin,
            table: Arc::new(table),
            chunk_base: head.chunk_base,
            chunks,
            dict,
            known: (head.records, head.content),
            content: Default::default(),
        };
        Ok((snap, Some(head), reads))
    } else {
        let (table, tail_chunk, tail_offset) = Table::open_loaderx(dir)?;
        // loaderx chunk files are 4 GiB sparse files; only the data below the
        // frontier counts toward the direct-read threshold.
        let reads = reads(u64::from(tail_chunk) * (1 << 32) + tail_offset)?;
        let direct = reads.direct();
        let chunks = (0..=tail_chunk)
            .map(|k| {
                open_chunk(dir, store, Format::Loaderx, ChunkId(k), (k == tail_chunk).then_some(tail_offset), direct)
            })
            .collect::<Result<Vec<_>>>()?;
        let p = dir.join(crate::format::names::DICT_FILE);
        let dict = match crate::io::fs::read(&p) {
            Ok(bytes) => Some(Arc::new(Dict::new(bytes, None)?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("read", &p)(e)),
        };
        let snap = Snapshot {
            pin: None,
            table: Arc::new(table),
            chunk_base: 0,
            chunks,
            dict,
            known: (0, 0),
            content: Default::default(),
        };
        Ok((snap, None, reads))
    }
}

/// One record to read: where it is and where it goes.
pub(crate) struct Item<'a> {
    pub index: u64,
    pub entry: Entry,
    /// Exactly the record's logical length, or its stored length with `keep_stored`.
    pub dst: &'a mut [u8],
    /// Copy the stored bytes without decoding (compaction, import).
    pub keep_stored: bool,
    /// When the caller needs the record again (for the record cache).
    pub next: NextUse,
}

/// Hint `k`, or `Unknown` when the caller gave none.
fn hint(next: &[NextUse], k: usize) -> NextUse {
    next.get(k).copied().unwrap_or(NextUse::Unknown)
}

fn check_hints(indices: &[u64], next: &[NextUse]) -> Result<()> {
    if next.is_empty() || next.len() == indices.len() {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!("{} indices but {} next-use hints", indices.len(), next.len())))
}

fn crc_check(index: u64, e: &Entry, stored: &[u8]) -> Result<()> {
    match e.checksum {
        Some(_) => crc_matches(index, e, crate::format::crc::crc32c(stored)),
        None => Ok(()),
    }
}

/// `got`, the CRC-32C of record `index`'s stored bytes, against its entry's.
fn crc_matches(index: u64, e: &Entry, got: u32) -> Result<()> {
    if let Some(expected) = e.checksum {
        if got != expected {
            let file = chunk_name(Format::Native, e.chunk);
            let file = if e.is_part() {
                format!("{file} (the block of bytes {}..{} holding it)", e.offset, e.end())
            } else {
                format!("{file} (bytes {}..{})", e.offset, e.end())
            };
            return Err(Error::ChecksumMismatch { record: index, file, expected, got });
        }
    }
    Ok(())
}

/// Verifies and decodes one record's stored bytes into its slot.
///
/// A raw record stored whole is copied and checked in one pass
/// ([`crate::format::crc::copy_crc32c`]). Otherwise the decode runs first
/// and the checksum after it: the first pass over the stored bytes pays for
/// bringing them from memory, the second finds them in the CPU cache.
/// Decoding unverified bytes is safe (zstd checks its input); a mismatch
/// still fails the call, with the slot's contents undefined.
pub(crate) fn finish_record(it: &mut Item<'_>, stored: &[u8], dict: Option<&Dict>) -> Result<()> {
    let codec = if it.keep_stored { Codec::Raw } else { it.entry.codec };
    let whole = it.keep_stored || !it.entry.is_part();
    if codec == Codec::Raw && whole && it.entry.checksum.is_some() && stored.len() == it.dst.len() {
        let got = crate::format::crc::copy_crc32c(stored, it.dst);
        return crc_matches(it.index, &it.entry, got);
    }
    let src = if it.entry.is_part() && !it.keep_stored {
        // A record inside a checksummed block: the whole block is verified.
        let at = it.entry.within as usize;
        stored.get(at..at + it.dst.len()).unwrap_or_default()
    } else {
        stored
    };
    let decoded = codec::decode(codec, src, it.dst, dict);
    crc_check(it.index, &it.entry, stored)?;
    decoded.map_err(|d| {
        // Native entries always carry a checksum, loaderx entries never.
        let format = if it.entry.checksum.is_some() { Format::Native } else { Format::Loaderx };
        let e = &it.entry;
        corrupted(
            format!("record {} in {} (bytes {}..{})", it.index, chunk_name(format, e.chunk), e.offset, e.end()),
            d,
        )
    })
}

/// Logical (decoded) length of each record in `indices` in `snap`, into `out`.
pub(crate) fn lengths(snap: &Snapshot, indices: &[u64], out: &mut [u64]) -> Result<()> {
    if indices.len() != out.len() {
        return Err(Error::InvalidArgument(format!(
            "lengths: {} indices but an output of {} entries",
            indices.len(),
            out.len()
        )));
    }
    snap.table.prefetch(indices);
    for (i, o) in indices.iter().zip(out.iter_mut()) {
        *o = u64::from(snap.entry(*i)?.logical_len);
    }
    Ok(())
}

/// Logical length of one record.
pub(crate) fn record_len(s: &Store, index: u64) -> Result<u64> {
    Ok(u64::from(s.snapshot().entry(index)?.logical_len))
}

/// Reads the records of `req` from `snap` into `dst` ([`crate::Gather`]).
///
/// Every index, entry and slot is checked before anything is written to
/// `dst`; a fixed slot is zero-padded after its record.
pub(crate) fn gather(s: &Store, snap: &Snapshot, req: &Gather<'_>, dst: &mut [u8]) -> Result<()> {
    let indices = req.indices;
    check_hints(indices, req.next)?;
    // Each record's slot: where it starts, and its width when fixed.
    let (starts, width): (std::borrow::Cow<'_, [u64]>, Option<usize>) = match req.slots {
        Slots::Fixed(stride) => {
            let need = indices
                .len()
                .checked_mul(stride)
                .ok_or_else(|| Error::InvalidArgument("indices × stride overflows".into()))?;
            if dst.len() != need {
                return Err(Error::InvalidArgument(format!(
                    "gather: destination is {} bytes, expected {} indices × stride {stride} = {need}",
                    dst.len(),
                    indices.len()
                )));
            }
            ((0..indices.len() as u64).map(|k| k * stride as u64).collect(), Some(stride))
        }
        Slots::Ragged(starts) => (starts.into(), None),
        Slots::FixedAt { width, starts } => (starts.into(), Some(width)),
    };
    if starts.len() != indices.len() {
        return Err(Error::InvalidArgument(format!(
            "gather: {} indices but {} slot starts",
            indices.len(),
            starts.len()
        )));
    }
    snap.table.prefetch(indices);
    let mut order: Vec<(u64, Want)> = Vec::with_capacity(indices.len());
    for (k, (&index, &start)) in indices.iter().zip(starts.iter()).enumerate() {
        let entry = snap.entry(index)?;
        let len = u64::from(entry.logical_len);
        if let Some(w) = width {
            if len > w as u64 {
                return Err(Error::RecordSize { record: index, len, slot: w as u64 });
            }
        }
        order.push((
            start,
            Want { index, entry, len: entry.logical_len as usize, keep_stored: false, next: hint(req.next, k) },
        ));
    }
    if width == Some(0) {
        return Ok(());
    }
    // Empty records share their offset with the next slot: order by (offset, length).
    order.sort_unstable_by_key(|(start, w)| (*start, w.len));
    let mut end = 0u64;
    for (start, w) in &order {
        let slot = width.map_or(w.len as u64, |w| w as u64);
        if *start < end {
            return Err(Error::InvalidArgument(format!(
                "gather: the slot of record {} at offset {start} overlaps the previous slot",
                w.index
            )));
        }
        end = start.checked_add(slot).unwrap_or(u64::MAX);
        if end > dst.len() as u64 {
            return Err(match width {
                None => Error::RecordSize {
                    record: w.index,
                    len: w.len as u64,
                    slot: (dst.len() as u64).saturating_sub(*start),
                },
                Some(width) => Error::InvalidArgument(format!(
                    "gather: a slot at {start} of {width} bytes is outside the destination of {} bytes",
                    dst.len()
                )),
            });
        }
    }
    if let Some(width) = width {
        for (start, w) in &order {
            // Lossless: checked inside `dst` above.
            dst[*start as usize + w.len..*start as usize + width].fill(0);
        }
    }
    read_items(s, snap, carve_at(dst, order), req.fan_out)
}

/// A record to read, before it has its slot ([`carve`], [`carve_at`]).
pub(crate) struct Want {
    pub index: u64,
    pub entry: Entry,
    /// The slot's length: the record's logical length, or its stored length
    /// with `keep_stored`.
    pub len: usize,
    pub keep_stored: bool,
    pub next: NextUse,
}

impl Want {
    /// Record `index` at `entry`, decoded, with no hint.
    pub fn logical(index: u64, entry: Entry) -> Want {
        Want { index, entry, len: entry.logical_len as usize, keep_stored: false, next: NextUse::Unknown }
    }

    /// Record `index` at `entry` as stored (compaction, import, blocks).
    pub fn stored(index: u64, entry: Entry) -> Want {
        Want { index, entry, len: entry.stored_len as usize, keep_stored: true, next: NextUse::Unknown }
    }
}

/// The items of `wants` read into `buf` back to back, in the order given.
/// `buf` must hold them all.
pub(crate) fn carve(buf: &mut [u8], wants: impl IntoIterator<Item = Want>) -> Vec<Item<'_>> {
    let mut at = 0u64;
    carve_at(
        buf,
        wants.into_iter().map(|w| {
            let start = at;
            at += w.len as u64;
            (start, w)
        }),
    )
}

/// The items of `wants`, each read into `buf` at its start: starts in
/// ascending order, slots not overlapping and inside `buf`.
pub(crate) fn carve_at(buf: &mut [u8], wants: impl IntoIterator<Item = (u64, Want)>) -> Vec<Item<'_>> {
    let wants = wants.into_iter();
    let mut items = Vec::with_capacity(wants.size_hint().0);
    let mut rest: &mut [u8] = buf;
    let mut pos = 0u64;
    for (start, w) in wants {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut((start - pos) as usize);
        let (slot, tail) = tail.split_at_mut(w.len);
        rest = tail;
        pos = start + w.len as u64;
        items.push(Item { index: w.index, entry: w.entry, dst: slot, keep_stored: w.keep_stored, next: w.next });
    }
    items
}

/// Reads `items`: the records whose pages are all in memory ("hot") are
/// copied or decoded straight from the chunk mappings, the rest read in
/// batches of transfers.
///
/// The cold records are split evenly between the threads (the caller and,
/// for a gather worth it, the decode pool), each submitting its share as
/// one batch. Hot records are shared out dynamically: every thread takes
/// the next group of [`HOT_GROUP`] from a common counter while its reads
/// are in flight, so a thread that starts late (a pool thread waking up)
/// or is descheduled simply takes fewer groups instead of holding up the
/// gather, and the copying or decoding overlaps the I/O.
pub(crate) fn read_items(s: &Store, snap: &Snapshot, items: Vec<Item<'_>>, fan_out: bool) -> Result<()> {
    let _gate = crate::fork::enter();
    let total: u64 = items.iter().map(|it| u64::from(it.entry.stored_len)).sum();
    // The eviction count, read at most every few milliseconds per process, lets
    // the residency bitmaps answer without a system call per record.
    let epoch = if s.mmap { crate::io::mmap::evictions() } else { None };
    let mut hot: Vec<(Item<'_>, Hot<'_>)> = Vec::with_capacity(if s.mmap { items.len() } else { 0 });
    let mut cold: Vec<Item<'_>> = Vec::with_capacity(if s.mmap { 0 } else { items.len() });
    let caching = s.reads.caching();
    // Compaction and import copy stored bytes: not reads to count.
    let internal = items.first().is_some_and(|it| it.keep_stored);
    let mut seen = Seen {
        records: if internal { 0 } else { items.len() as u64 },
        stored_bytes: total,
        residency: s.mmap,
        ..Seen::default()
    };
    if s.mmap {
        for it in &items {
            if let Some(chunk) = snap.chunk(it.entry.chunk) {
                chunk.prefetch_residency(it.entry.offset);
            }
        }
    }
    for it in items {
        let stored = it.entry.stored_len as usize;
        let chunk = snap.chunk(it.entry.chunk).expect("entry checked against chunks");
        if let Some(b) = if s.mmap { chunk.resident(it.entry.offset, stored, epoch) } else { None } {
            seen.mapped += 1;
            seen.mapped_bytes += stored as u64;
            hot.push((it, Hot::Mapped(b)));
        } else if let Some(b) = if caching && !it.keep_stored { s.reads.lookup(&it.entry, it.next) } else { None } {
            seen.cache_hits += 1;
            seen.cache_hit_bytes += stored as u64;
            hot.push((it, Hot::Cached(b)));
        } else {
            seen.cache_misses += u64::from(caching && !it.keep_stored);
            seen.read_bytes += stored as u64;
            cold.push(it);
        }
    }
    let hot_groups: Vec<Mutex<&mut [(Item<'_>, Hot<'_>)]>> = hot.chunks_mut(HOT_GROUP).map(Mutex::new).collect();
    let queue = HotQueue {
        groups: &hot_groups,
        next: AtomicUsize::new(0),
        dict: snap.dict.as_deref(),
        dir: &s.dir,
        format: snap.table.format,
        error: Mutex::new(None),
    };
    let parallel = total >= PARALLEL_MIN_BYTES && hot_groups.len() + cold.len() >= 2 && fan_out;
    if !parallel {
        let r = read_group(s, snap, &mut cold, &queue);
        return observed(s, snap, seen, queue.finish(r));
    }
    let pool = crate::pool::get();
    let helpers = pool.current_num_threads().min((hot_groups.len() + cold.len()).saturating_sub(1)).max(1);
    // The caller takes the first share of the cold records; each helper
    // one of the others. Hot groups go to whoever asks first.
    let per = cold.len().div_ceil(helpers + 1).max(1);
    let mut shares = cold.chunks_mut(per);
    let own = shares.next().unwrap_or_default();
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    let mine = pool.in_place_scope(|scope| {
        for _ in 0..helpers {
            let share = shares.next().unwrap_or_default();
            let (failed, queue) = (&failed, &queue);
            #[cfg(test)]
            crate::pool::HANDED_OFF.with(|n| n.set(n.get() + 1));
            scope.spawn(move |_| {
                if let Err(e) = read_group(s, snap, share, queue) {
                    failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                }
            });
        }
        read_group(s, snap, own, &queue)
    });
    let r = mine.and(match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    });
    observed(s, snap, seen, queue.finish(r))
}

/// Reads `items` as [`read_items`] does, except that a checksummed block
/// holding several of them (a format-2 fixed section) is read and verified
/// once and each record copied out of it. Compaction and delete read every
/// record of every block: record by record, each 4-byte label would read
/// and check its whole 4 KiB block again.
pub(crate) fn read_items_by_block(s: &Store, snap: &Snapshot, items: Vec<Item<'_>>) -> Result<()> {
    let (mut parts, whole): (Vec<Item<'_>>, Vec<Item<'_>>) =
        items.into_iter().partition(|it| it.entry.is_part() && !it.keep_stored);
    if !whole.is_empty() {
        read_items(s, snap, whole, true)?;
    }
    if parts.is_empty() {
        return Ok(());
    }
    // Each distinct block once, in the order first asked for: (index of the
    // first record asking, its entry, where the block lands in `buf`).
    let mut at: HashMap<(ChunkId, u64), usize> = HashMap::new();
    let mut blocks: Vec<(u64, Entry, usize)> = Vec::new();
    let mut size = 0usize;
    for it in &parts {
        at.entry((it.entry.chunk, it.entry.offset)).or_insert_with(|| {
            blocks.push((it.index, it.entry, size));
            size += it.entry.stored_len as usize;
            size - it.entry.stored_len as usize
        });
    }
    let mut buf = vec![0u8; size];
    let reads = carve(&mut buf, blocks.iter().map(|&(index, entry, _)| Want::stored(index, entry)));
    read_items(s, snap, reads, true)?;
    for it in &mut parts {
        let from = at[&(it.entry.chunk, it.entry.offset)] + it.entry.within as usize;
        let n = it.dst.len();
        let src = buf.get(from..from + n).filter(|_| it.entry.within as usize + n <= it.entry.stored_len as usize);
        let src = src.ok_or_else(|| {
            corrupted(
                format!("table entry {}", it.index),
                format!("bytes {}.. of its {}-byte block lie past the block", it.entry.within, it.entry.stored_len),
            )
        })?;
        it.dst.copy_from_slice(src);
    }
    Ok(())
}

/// Counts a finished gather and, when the counts show the read policy
/// chose wrong, switches to the better one: the chunks are reopened with
/// or without O_DIRECT in a new snapshot (gathers under way keep theirs).
pub(crate) fn observed(s: &Store, snap: &Snapshot, seen: Seen, r: Result<()>) -> Result<()> {
    if seen.records == 0 {
        return r;
    }
    let data = snap.chunks.iter().map(|c| c.len).sum();
    if let Some(policy) = s.reads.observe(seen, data) {
        let direct = policy.mode == crate::read::policy::ReadMode::Direct;
        // Holding the writer (if any) keeps an append from publishing
        // chunks between reading the snapshot and replacing it. A busy
        // writer (this thread may be compacting) defers the switch to a
        // later window rather than wait.
        let _w = match s.writer.as_ref().map(Mutex::try_lock) {
            Some(Err(std::sync::TryLockError::WouldBlock)) => return r,
            w => w,
        };
        let now = s.snapshot();
        s.publish(Snapshot {
            pin: now.pin.clone(),
            table: now.table.clone(),
            chunk_base: now.chunk_base,
            chunks: now.chunks.iter().map(|c| c.with_direct(direct)).collect(),
            dict: now.dict.clone(),
            known: now.known,
            content: now.content.clone(),
        });
        s.reads.adopt(policy, data);
    }
    r
}

pub(crate) fn read_group(s: &Store, snap: &Snapshot, items: &mut [Item<'_>], hot: &HotQueue<'_, '_, '_>) -> Result<()> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<AlignedBuf> = std::cell::RefCell::new(AlignedBuf::new());
    }
    let mut scratch = SCRATCH.with(|s| std::mem::replace(&mut *s.borrow_mut(), AlignedBuf::new()));
    // A batch holds a descriptor per chunk file it names until it
    // completes: name at most `batch_files` files per batch (fds.rs).
    let limit = crate::io::fds::batch_files();
    let mut rest = items;
    let r = loop {
        let cut = if snap.chunks.len() <= limit {
            rest.len()
        } else {
            let mut files = std::collections::HashSet::new();
            rest.iter().position(|it| files.insert(it.entry.chunk) && files.len() > limit).unwrap_or(rest.len())
        };
        let (batch, tail) = std::mem::take(&mut rest).split_at_mut(cut);
        let r = read_group_with(s, snap, batch, &mut scratch, hot);
        rest = tail;
        if rest.is_empty() || r.is_err() {
            break r;
        }
    };
    SCRATCH.with(|s| *s.borrow_mut() = scratch);
    r
}

/// Reads the cold `items` in one batch, taking hot groups from `hot`
/// while the reads are in flight.
pub(crate) fn read_group_with(
    s: &Store,
    snap: &Snapshot,
    items: &mut [Item<'_>],
    scratch: &mut AlignedBuf,
    hot: &HotQueue<'_, '_, '_>,
) -> Result<()> {
    // Plan: where each record's stored bytes are read to. Raw records read
    // through the page cache go straight into their slot; everything else
    // goes to scratch. O_DIRECT spans come first in scratch, so each starts
    // at an ALIGN boundary (their lengths are multiples of ALIGN).
    struct Plan<'f> {
        fd: std::os::fd::BorrowedFd<'f>,
        offset: u64,
        len: usize,
        need: usize,
        skip: usize,
        scratch: bool,
        direct: bool,
    }
    let dict = snap.dict.as_deref();
    let mut first_err: Option<Error> = None;
    // The descriptors of the batch's files (opened or taken from the
    // process's cache), held until its reads complete; `true` with an
    // O_DIRECT one.
    let mut files: HashMap<ChunkId, (Arc<File>, bool)> = HashMap::new();
    for it in items.iter() {
        if let std::collections::hash_map::Entry::Vacant(v) = files.entry(it.entry.chunk) {
            let chunk = snap.chunk(it.entry.chunk).expect("entry checked against chunks");
            let direct = if chunk.direct { chunk.file.direct()? } else { None };
            v.insert(match direct {
                Some(f) => (f, true),
                None => (chunk.file.buffered()?, false),
            });
        }
    }
    let mut plans = Vec::with_capacity(items.len());
    for it in items.iter() {
        let (file, direct) = &files[&it.entry.chunk];
        let stored = it.entry.stored_len as usize;
        let p = match direct.then_some(file) {
            Some(d) => {
                let start = it.entry.offset / ALIGN as u64 * ALIGN as u64;
                let end = it.entry.end().div_ceil(ALIGN as u64) * ALIGN as u64;
                let skip = (it.entry.offset - start) as usize;
                Plan {
                    fd: d.as_fd(),
                    offset: start,
                    len: (end - start) as usize,
                    need: skip + stored,
                    skip,
                    scratch: true,
                    direct: true,
                }
            }
            None => {
                let in_place = (it.entry.codec == Codec::Raw && !it.entry.is_part()) || it.keep_stored;
                Plan {
                    fd: file.as_fd(),
                    offset: it.entry.offset,
                    len: stored,
                    need: stored,
                    skip: 0,
                    scratch: !in_place,
                    direct: false,
                }
            }
        };
        plans.push(p);
    }
    let direct_bytes: usize = plans.iter().filter(|p| p.direct).map(|p| p.len).sum();
    let buffered_bytes: usize = plans.iter().filter(|p| p.scratch && !p.direct).map(|p| p.len).sum();
    let buf = scratch.get(direct_bytes + buffered_bytes);
    let (mut direct_area, mut buffered_area) = buf.split_at_mut(direct_bytes);
    let mut reads = Vec::with_capacity(items.len());
    let mut io_items: Vec<&mut Item<'_>> = items.iter_mut().collect();
    for (it, p) in io_items.iter_mut().zip(&plans) {
        let buf: &mut [u8] = if p.scratch {
            let area = if p.direct { &mut direct_area } else { &mut buffered_area };
            let (piece, rest) = std::mem::take(area).split_at_mut(p.len);
            *area = rest;
            piece
        } else {
            // Read in place: the slot travels with the read and comes back
            // in the completion.
            std::mem::take(&mut it.dst)
        };
        reads.push(uring::ReadBuf { fd: p.fd, offset: p.offset, buf, need: p.need });
    }
    let r = uring::read_batch(
        s.backend,
        reads,
        &mut |i, buf| {
            let it = &mut *io_items[i];
            let stored_len = it.entry.stored_len as usize;
            let r = if plans[i].scratch {
                let skip = plans[i].skip;
                let stored = &buf[skip..skip + stored_len];
                let r = finish_record(it, stored, dict);
                if r.is_ok() && plans[i].direct && !it.keep_stored {
                    s.reads.offer(&it.entry, stored, it.next);
                }
                r
            } else {
                crc_check(it.index, &it.entry, &buf[..stored_len])
            };
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        },
        &mut || hot.drain(),
    );
    if let Err(e) = r {
        let it = &io_items[e.req.min(io_items.len().saturating_sub(1))];
        let path = s.dir.join(chunk_name(snap.table.format, it.entry.chunk));
        return Err(match e.kind {
            ReqErrorKind::Eof { got } => corrupted(
                format!("chunk {}", it.entry.chunk.0),
                format!("{} ends after {got} bytes of record {}", path.display(), it.index),
            ),
            ReqErrorKind::Os(source) => Error::Io { op: "read", path, source },
        });
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
