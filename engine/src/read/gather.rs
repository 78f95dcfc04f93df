//! Gathers: the plan of a batch of reads, its transfers, and the snapshot
//! they read from.

use crate::error::{corrupted, Error, Result};
use crate::format::codec::Codec;
use crate::format::names::chunk_name;
use crate::format::record::{ChunkId, Entry};
use crate::io::mapset::MapSet;
use crate::io::uring::{self, AlignedBuf, ReqErrorKind, ALIGN};
use crate::memory::cache::NextUse;
use crate::memory::reads::Seen;
use crate::memory::window::Loaded;
use crate::read::hot::{Hot, HotQueue, HOT_GROUP};
use crate::read::item::{carve, carve_at, crc_check, finish_record, Item, Want};
use crate::read::request::{Gather, Slots, Spans};
use crate::read::Ctx;
use crate::snapshot::Snapshot;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

thread_local! {
    /// CPU nanoseconds the decode pool's threads spent on this thread's gathers.
    static HELPED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// CPU time, in nanoseconds, the decode pool's threads have spent so far on
/// the gathers the calling thread made (its share of a gather that fans out);
/// with [`crate::cpu::thread_cpu_ns`], the whole CPU cost of its gathers.
pub fn helped_ns() -> u64 {
    HELPED.with(std::cell::Cell::get)
}

/// A gather below this many bytes runs on the calling thread alone.
const PARALLEL_MIN_BYTES: u64 = 128 << 10;

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
pub(crate) fn record_len(snap: &Snapshot, index: u64) -> Result<u64> {
    Ok(u64::from(snap.entry(index)?.logical_len))
}

/// Reads the records of `req` from `snap` into `dst` ([`crate::Gather`]).
///
/// Every index, entry and slot is checked before anything is written to
/// `dst`; a fixed slot is zero-padded after its record.
pub(crate) fn gather(s: &Ctx<'_>, snap: &Snapshot, req: &Gather<'_>, dst: &mut [u8]) -> Result<()> {
    let indices = req.indices;
    let (starts, width) = slot_starts(req, dst.len())?;
    snap.table.prefetch(indices);
    let mut order: Vec<(u64, Want)> = Vec::with_capacity(indices.len());
    for (k, (&index, &start)) in indices.iter().zip(starts.iter()).enumerate() {
        let entry = snap.entry(index)?;
        check_width(index, &entry, width)?;
        order.push((start, Want { next: hint(req.next, k), ..Want::logical(index, entry) }));
    }
    if width == Some(0) {
        return Ok(());
    }
    // Empty records share their offset with the next slot: order by (offset, length).
    order.sort_unstable_by_key(|(start, w)| (*start, w.len));
    check_slots(&order, width, dst)?;
    read_items(s, snap, carve_at(dst, order), req.fan_out)
}

/// A record of `len` bytes fits a fixed slot of `width`.
fn check_width(index: u64, entry: &Entry, width: Option<usize>) -> Result<()> {
    let len = u64::from(entry.logical_len);
    match width {
        Some(w) if len > w as u64 => Err(Error::RecordSize { record: index, len, slot: w as u64 }),
        _ => Ok(()),
    }
}

/// Each record's slot in a destination of `dst_len` bytes: where it starts,
/// and its width when fixed; the hints and starts counted against the
/// indices.
fn slot_starts<'r>(req: &Gather<'r>, dst_len: usize) -> Result<(std::borrow::Cow<'r, [u64]>, Option<usize>)> {
    let indices = req.indices;
    check_hints(indices, req.next)?;
    let dst = dst_len;
    let (starts, width): (std::borrow::Cow<'_, [u64]>, Option<usize>) = match req.slots {
        Slots::Fixed(stride) => {
            let need = indices
                .len()
                .checked_mul(stride)
                .ok_or_else(|| Error::InvalidArgument("indices × stride overflows".into()))?;
            if dst != need {
                return Err(Error::InvalidArgument(format!(
                    "gather: destination is {dst} bytes, expected {} indices × stride {stride} = {need}",
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
    Ok((starts, width))
}

/// Checks that the slots of `order` (sorted by start) lie inside `dst` and
/// do not overlap; zero-pads each fixed slot after its record.
fn check_slots(order: &[(u64, Want)], width: Option<usize>, dst: &mut [u8]) -> Result<()> {
    let mut end = 0u64;
    for (start, w) in order {
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
        for (start, w) in order {
            // Lossless: checked inside `dst` above.
            dst[*start as usize + w.len..*start as usize + width].fill(0);
        }
    }
    Ok(())
}

/// One snapshot a [`gather_over`] reads from, with its store's context.
pub(crate) struct Source<'s> {
    /// The snapshot's store: read only through [`Source::ctx`], for what
    /// records not in memory need (a gather over hundreds of parts finds
    /// most parts' stores out of the CPU cache).
    pub store: &'s crate::store::Store,
    /// Whether the store copies records from its mappings ([`Ctx::mmap`]).
    pub mmap: bool,
    pub snap: &'s Snapshot,
    /// The snapshot's dictionary (read once, not per record).
    pub dict: Option<&'s crate::format::codec::Dict>,
    /// The snapshot's records copied from its mappings and not yet counted
    /// into its store's reads ([`count_mapped`]).
    pub pending: &'s AtomicU64,
    /// Whether the snapshot was read ahead whole ([`read_ahead_small`]).
    pub ahead: &'s AtomicBool,
}

impl<'s> Source<'s> {
    /// The store's read context.
    pub fn ctx(&self) -> Ctx<'s> {
        self.store.read_ctx()
    }
}

/// What [`gather_over`] takes from the dataset instead of each part's
/// table: each record's entry (`entries[k]` of `at[k]`).
#[derive(Clone, Copy)]
pub(crate) struct Dense<'d> {
    pub entries: &'d [Entry],
}

/// Asks the kernel to read `source`'s snapshot whole into the page cache, once
/// (its [`Source::ahead`] flag), when its chunks hold at most
/// [`AHEAD_WHOLE_MAX`] bytes in all and it reads buffered by its own policy
/// (a mode forced by the caller measures exactly the mode it names).
///
/// Why: the kernel reads ahead of random reads in one large file once cached
/// pages lie just before them (windows up to the device's readahead size), so
/// a store of one large file read at random fills the page cache in long reads
/// after a fraction of a pass. The same records in a thousand files of a
/// megabyte are read a page at a time: each file's history is short and its
/// readahead ends at its end. A small part read whole on its first cold record
/// gets what one large file gets. Once per part while its dataset is open, so
/// a dataset larger than memory reads at most one pass more than it needs.
fn read_ahead_small(source: &Source<'_>) {
    let Source { snap, ahead, .. } = source;
    if ahead.load(Relaxed) || source.ctx().reads.forced() {
        return;
    }
    if snap.chunks.iter().map(|c| c.len).sum::<u64>() > AHEAD_WHOLE_MAX || ahead.swap(true, Relaxed) {
        return;
    }
    for chunk in snap.chunks.iter().filter(|c| !c.direct || c.file.direct_refused()) {
        chunk.read_ahead();
    }
}

/// The largest part [`read_ahead_small`] reads whole: the longest single read
/// of a block load ([`crate::read::blocks::MAX_SPAN`]).
const AHEAD_WHOLE_MAX: u64 = crate::read::blocks::MAX_SPAN;

/// Where [`Source::pending`] keeps its records; its stored bytes are below.
const PENDING_RECORDS: u32 = 40;
/// A part's pending mapped reads are counted into its store
/// ([`Reads::observe`](crate::memory::reads::Reads::observe)) once they
/// reach this many records, or [`FLUSH_BYTES`].
pub(crate) const FLUSH_RECORDS: u64 = 256;
const FLUSH_BYTES: u64 = 1 << 34;

/// Counts a record of `stored` bytes that `source` served from its
/// mappings: added to its pending count (an atomic in an array the dataset
/// keeps, next to the others), and counted into its store's reads once
/// [`FLUSH_RECORDS`] are pending. A random batch over many parts touches
/// a record or two of each: counting each part's reads at once, its
/// counters (a few cache lines per store, out of the CPU cache) cost about
/// as much as copying its record did.
fn count_mapped(source: &Source<'_>, stored: u64) {
    if add_pending(source.pending, stored) {
        flush_mapped(source);
    }
}

/// Adds a record of `stored` bytes to `pending`; whether they are now to be
/// counted into their store ([`flush_mapped`]).
#[inline]
fn add_pending(pending: &AtomicU64, stored: u64) -> bool {
    let add = (1u64 << PENDING_RECORDS) | stored;
    let now = pending.fetch_add(add, Relaxed).wrapping_add(add);
    now >> PENDING_RECORDS >= FLUSH_RECORDS || now & ((1 << PENDING_RECORDS) - 1) >= FLUSH_BYTES
}

/// Counts `source`'s pending mapped records into its store's reads now.
pub(crate) fn flush_mapped(source: &Source<'_>) {
    let v = source.pending.swap(0, Relaxed);
    let (records, bytes) = (v >> PENDING_RECORDS, v & ((1 << PENDING_RECORDS) - 1));
    if records == 0 {
        return;
    }
    let seen =
        Seen { records, stored_bytes: bytes, mapped: records, mapped_bytes: bytes, residency: true, ..Seen::default() };
    // Lossless: counting returns the gather's result, Ok here.
    let _ = observed(&source.ctx(), source.snap, seen, Ok(()));
}

/// A record of a [`gather_over`] whose stored bytes are in its part's
/// mapping, with the part it is of.
type MappedItem<'i, 'm> = (Item<'i>, crate::io::mmap::Resident<'m>, usize);

/// Copies (or decodes) and checks each of `hot`, counting it into its
/// part's pending reads; the first error.
fn finish_mapped(sources: &[Source<'_>], hot: &mut [MappedItem<'_, '_>]) -> Result<()> {
    let mut first_err: Option<Error> = None;
    for (it, b, src) in hot.iter_mut() {
        let source = &sources[*src];
        let r = finish_record(it, b.bytes(), source.dict);
        let r = if b.faulted() {
            // The copy may have read zeros for pages the file lost.
            let path = source.ctx().dir.join(chunk_name(source.snap.table.format, it.entry.chunk));
            Err(corrupted(
                format!("chunk {}", it.entry.chunk.0),
                format!("{} shrank or could not be read while mapped (record {})", path.display(), it.index),
            ))
        } else {
            r.map_err(|e| match e {
                // The chunk's name alone does not tell which part it is of.
                Error::ChecksumMismatch { record, file, expected, got } => Error::ChecksumMismatch {
                    record,
                    file: format!("{}/{file}", source.ctx().dir.display()),
                    expected,
                    got,
                },
                e => e,
            })
        };
        match r {
            Ok(()) => count_mapped(source, u64::from(it.entry.stored_len)),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Reads the records of `req` into `dst` as [`gather`] does, record `k`
/// being record `at[k].1` of snapshot `at[k].0` of `sources` (a dataset of
/// parts, `crate::parts`): one validation pass over all of them (every
/// index, entry and slot checked before anything is written to `dst`, the
/// slots against each other whatever snapshot they read from, the entries'
/// cache lines loaded first), then
///
/// * the records whose stored bytes are all in their part's mappings copied
///   or decoded and checked straight from them, on the calling thread and,
///   for a gather worth it ([`PARALLEL_MIN_BYTES`] in all), the decode
///   pool's, each counted into its part's pending reads ([`count_mapped`]);
/// * the other records of parts read buffered, in one batch of reads for
///   all parts ([`read_group_over`]), counted into each part's reads;
/// * the records of a part that reads through its record cache, and a
///   part's share large enough to be worth the decode pool on its own, read
///   by [`read_items`] per part, as a gather of that store alone reads them.
///
/// `dense`, when given, holds each record's entry as the dataset copied it
/// from its part's table when the part opened (checked then, as
/// [`Snapshot::entry`] checks it, [`Dense`]): the tables are then not read.
pub(crate) fn gather_over(
    sources: &[Source<'_>],
    at: &[(usize, u64)],
    dense: Option<Dense<'_>>,
    req: &Gather<'_>,
    dst: &mut [u8],
) -> Result<()> {
    let (starts, width) = slot_starts(req, dst.len())?;
    let bad_dense = dense.is_some_and(|d| d.entries.len() != at.len());
    if at.len() != req.indices.len() || bad_dense {
        return Err(Error::InvalidArgument(format!(
            "gather: {} indices but {} located records",
            req.indices.len(),
            at.len()
        )));
    }
    if let Some(&(src, _)) = at.iter().find(|(src, _)| *src >= sources.len()) {
        return Err(Error::InvalidArgument(format!("gather: snapshot {src} of {}", sources.len())));
    }
    // Each snapshot's entries prefetched (their table pages read ahead when
    // not in memory, their cache lines loaded), as a store's gather does:
    // the local indices grouped by snapshot, a counting sort.
    if dense.is_none() {
        prefetch_entries(sources, at);
    }
    // Each record's slot, what to read, and the snapshot it reads from.
    let mut tagged: Vec<(u64, Want, usize)> = Vec::with_capacity(at.len());
    for (k, (&(src, index), &start)) in at.iter().zip(starts.iter()).enumerate() {
        let entry = match dense {
            Some(d) => dense_entry(sources[src].snap, index, d.entries[k])?,
            None => sources[src].snap.entry(index)?,
        };
        check_width(index, &entry, width)?;
        tagged.push((start, Want { next: hint(req.next, k), ..Want::logical(index, entry) }, src));
    }
    gather_tagged(sources, tagged, width, req, dst)
}

/// A record of [`gather_mapped`]: where it goes, its bytes in its part's
/// mapping, its part.
type SetItem<'i, 'm> = (Item<'i>, crate::io::mmap::Resident<'m>, usize);

/// The hot path of a gather over a dataset of parts whose table entries the
/// dataset copied into one array when it opened (`crate::parts`) and whose
/// chunk mappings it keeps in a [`MapSet`], a slot per part: record `k` of
/// `req` is `recs[k]`, its part and its entry.
///
/// When every record's entry names its part's mapped chunk and lies inside
/// it, fits its slot, and its bytes are in memory, the records are copied
/// (or decoded, with their part's dictionary of `dicts`) and checked
/// straight from the mappings, on the calling thread and, for a gather worth
/// it, the decode pool's, as [`gather_over`] copies its hot records; then
/// each is counted into its part's `pending` reads, `flush(part)` asked of a
/// part with enough pending ([`FLUSH_RECORDS`]). Otherwise, or when a record
/// fails its checksum or its mapping faulted, `None`, with nothing counted:
/// the caller then reads the whole request through [`gather_over`], which
/// checks everything again and reports what failed, naming the part.
///
/// It reads no part's store, snapshot or table: a record costs a line of
/// each of the dataset's arrays (entries, the set's slots, residency bits),
/// its bytes and its checksum, as in one store, where [`gather_over`] stalls
/// on each part's scattered open state in turn.
#[allow(clippy::too_many_arguments, reason = "the dataset's arrays, each borrowed for the call")]
pub(crate) fn gather_mapped(
    maps: &MapSet,
    dicts: &[Option<Arc<crate::format::codec::Dict>>],
    recs: &[(usize, Entry)],
    pending: &[AtomicU64],
    flush: &dyn Fn(usize),
    req: &Gather<'_>,
    dst: &mut [u8],
) -> Option<()> {
    let (starts, width) = slot_starts(req, dst.len()).ok()?;
    if recs.len() != req.indices.len() {
        return None;
    }
    let mut tagged: Vec<(u64, Want, usize)> = Vec::with_capacity(recs.len());
    for (k, (&(part, e), &start)) in recs.iter().zip(starts.iter()).enumerate() {
        let (chunk, len) = maps.shape(part)?;
        if e.chunk.0 != chunk || e.end() > len || check_width(req.indices[k], &e, width).is_err() {
            return None;
        }
        tagged.push((start, Want { next: hint(req.next, k), ..Want::logical(req.indices[k], e) }, part));
    }
    if width == Some(0) {
        return Some(());
    }
    // Slots in order (the usual case) need no sort.
    if tagged.windows(2).any(|w| (w[0].0, w[0].1.len) > (w[1].0, w[1].1.len)) {
        tagged.sort_unstable_by_key(|(start, w, _)| (*start, w.len));
    }
    let from: Vec<usize> = tagged.iter().map(|t| t.2).collect();
    let order: Vec<(u64, Want)> = tagged.into_iter().map(|(start, w, _)| (start, w)).collect();
    check_slots(&order, width, dst).ok()?;
    let _gate = crate::fork::enter();
    let items = carve_at(dst, order);
    let epoch = crate::io::mmap::evictions();
    // Every record's residency word and first bytes asked for at once: their
    // misses (the bytes' a page-table walk too, as each part is a mapping of
    // its own) overlap instead of coming one after another in the copies.
    for (it, &part) in items.iter().zip(&from) {
        maps.prefetch(part, it.entry.offset, it.entry.stored_len as usize);
    }
    let mut hot: Vec<SetItem<'_, '_>> = Vec::with_capacity(items.len());
    let mut total = 0u64;
    for (it, &part) in items.into_iter().zip(&from) {
        let stored = it.entry.stored_len;
        let b = maps.resident(part, it.entry.offset, stored as usize, epoch)?;
        total += u64::from(stored);
        hot.push((it, b, part));
    }
    let failed = AtomicBool::new(false);
    let finish = |group: &mut [SetItem<'_, '_>]| {
        for (it, b, part) in group.iter_mut() {
            let dict = dicts.get(*part).and_then(Option::as_deref);
            if finish_record(it, b.bytes(), dict).is_err() || b.faulted() {
                failed.store(true, Relaxed);
            }
        }
    };
    let groups = hot.len().div_ceil(HOT_GROUP);
    if req.fan_out && total >= PARALLEL_MIN_BYTES && groups >= 2 {
        share_groups(&mut hot, finish);
    } else {
        finish(&mut hot);
    }
    if failed.into_inner() {
        return None;
    }
    for (it, _, part) in &hot {
        if add_pending(&pending[*part], u64::from(it.entry.stored_len)) {
            flush(*part);
        }
    }
    #[cfg(test)]
    MAPPED_GATHERS.with(|n| n.set(n.get() + 1));
    Some(())
}

#[cfg(test)]
thread_local! {
    /// Gathers [`gather_mapped`] served on this thread (tests).
    pub(crate) static MAPPED_GATHERS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// `e`, record `index`'s entry as copied into a dataset's [`Dense`] array,
/// checked against the chunk it names in `snap` (the part's snapshot now: a
/// part opened again reads the same chunks).
fn dense_entry(snap: &Snapshot, index: u64, e: Entry) -> Result<Entry> {
    match snap.chunk(e.chunk) {
        Some(c) if e.end() <= c.len => Ok(e),
        _ => Err(corrupted(
            format!("{}, table entry {index}", snap.table.path().display()),
            format!(
                "chunk {} bytes {}..{}, copied when the part opened, are not in the part now: it changed after its \
                 commit; open the dataset again",
                e.chunk.0,
                e.offset,
                e.end()
            ),
        )),
    }
}

/// Loads the cache lines of the table entries of `at` (their pages read
/// ahead when not in memory).
fn prefetch_entries(sources: &[Source<'_>], at: &[(usize, u64)]) {
    let mut ends = vec![0usize; sources.len() + 1];
    for &(src, _) in at {
        ends[src + 1] += 1;
    }
    for k in 1..ends.len() {
        ends[k] += ends[k - 1];
    }
    let mut fill = ends.clone();
    let mut locals = vec![0u64; at.len()];
    for &(src, index) in at {
        locals[fill[src]] = index;
        fill[src] += 1;
    }
    for (src, source) in sources.iter().enumerate() {
        if ends[src] < ends[src + 1] {
            source.snap.table.prefetch_lines(&locals[ends[src]..ends[src + 1]]);
        }
    }
}

/// [`gather_over`] once every record's entry is checked: `tagged` holds each
/// record's slot start, what to read, and its snapshot.
fn gather_tagged(
    sources: &[Source<'_>],
    mut tagged: Vec<(u64, Want, usize)>,
    width: Option<usize>,
    req: &Gather<'_>,
    dst: &mut [u8],
) -> Result<()> {
    if width == Some(0) {
        return Ok(());
    }
    // Empty records share their offset with the next slot: order by (offset, length).
    tagged.sort_unstable_by_key(|(start, w, _)| (*start, w.len));
    let from: Vec<usize> = tagged.iter().map(|t| t.2).collect();
    let order: Vec<(u64, Want)> = tagged.into_iter().map(|(start, w, _)| (start, w)).collect();
    check_slots(&order, width, dst)?;
    let _gate = crate::fork::enter();
    let items = carve_at(dst, order);
    // A snapshot's share worth fanning out goes to `read_items` whole.
    let mut share = vec![0u64; sources.len()];
    for (it, &src) in items.iter().zip(&from) {
        share[src] += u64::from(it.entry.stored_len);
    }
    let total: u64 = share.iter().sum();
    let mmap = sources.iter().any(|s| s.mmap);
    let epoch = if mmap { crate::io::mmap::evictions() } else { None };
    if mmap {
        for (it, &src) in items.iter().zip(&from) {
            let Source { mmap, snap, .. } = &sources[src];
            if !*mmap {
                continue;
            }
            if let Some(chunk) = snap.chunk(it.entry.chunk) {
                chunk.prefetch_residency(it.entry.offset);
            }
        }
    }
    let mut hot: Vec<MappedItem<'_, '_>> = Vec::with_capacity(items.len());
    // Records read through the backend in one batch, with their snapshot,
    // and what each snapshot's share of them counts.
    let (mut cold, mut cold_from): (Vec<Item<'_>>, Vec<usize>) = (Vec::new(), Vec::new());
    let mut seen: Vec<Seen> = Vec::new();
    // Per snapshot: the records left to `read_items`.
    let mut rest: Vec<Vec<Item<'_>>> = Vec::new();
    for (it, &src) in items.into_iter().zip(&from) {
        let Source { mmap, snap, .. } = &sources[src];
        let stored = it.entry.stored_len as usize;
        let whole = req.fan_out && share[src] >= PARALLEL_MIN_BYTES;
        if *mmap && !whole {
            let chunk = snap.chunk(it.entry.chunk).expect("entry checked against chunks");
            if let Some(b) = chunk.resident(it.entry.offset, stored, epoch) {
                hot.push((it, b, src));
                continue;
            }
        }
        if whole || it.keep_stored || sources[src].ctx().reads.caching() {
            if rest.is_empty() {
                rest = sources.iter().map(|_| Vec::new()).collect();
            }
            rest[src].push(it);
            continue;
        }
        if seen.is_empty() {
            seen = sources.iter().map(|s| Seen { residency: s.mmap, ..Seen::default() }).collect();
        }
        let s = &mut seen[src];
        s.records += 1;
        s.stored_bytes += stored as u64;
        s.read_bytes += stored as u64;
        cold.push(it);
        cold_from.push(src);
    }
    let mut first_err: Option<Error> = None;
    let mut keep = |r: Result<()>| {
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    };
    // The hot records: on this thread alone, or shared out in groups with
    // the decode pool as a store's gather shares its hot records.
    let groups = hot.len().div_ceil(HOT_GROUP);
    if req.fan_out && total >= PARALLEL_MIN_BYTES && groups >= 2 {
        let failed: Mutex<Option<Error>> = Mutex::new(None);
        share_groups(&mut hot, |group| {
            if let Err(e) = finish_mapped(sources, group) {
                failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            keep(Err(e));
        }
    } else {
        keep(finish_mapped(sources, &mut hot));
    }
    if !cold.is_empty() {
        // A small part read buffered is asked into the page cache whole on
        // its first cold record, before the batch (whose read of that record
        // then waits for the readahead in flight).
        for &src in &cold_from {
            read_ahead_small(&sources[src]);
        }
        let owned: Vec<Ctx<'_>> = sources.iter().map(Source::ctx).collect();
        let ctxs: Vec<(&Ctx<'_>, &Snapshot)> = owned.iter().zip(sources).map(|(c, s)| (c, s.snap)).collect();
        let queue = HotQueue {
            groups: &[],
            next: AtomicUsize::new(0),
            dict: None,
            dir: owned[0].dir,
            format: sources[0].snap.table.format,
            error: Mutex::new(None),
        };
        let r = read_group_over(&ctxs, &mut cold, &cold_from, &queue);
        drop(cold);
        for (src, s) in seen.into_iter().enumerate() {
            let source = &sources[src];
            keep(observed(&owned[src], source.snap, s, Ok(())));
        }
        keep(r);
    }
    for (src, items) in rest.into_iter().enumerate() {
        if !items.is_empty() {
            let source = &sources[src];
            keep(read_items(&source.ctx(), source.snap, items, req.fan_out));
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Reads the parts of records `req` names into `dst` ([`crate::Spans`]):
/// a short span of a raw record reads only its bytes, straight into its
/// place in `dst`; a long one (at least half of the record's stored bytes)
/// and any span of a compressed record read the whole record, checked,
/// once per call, into scratch, and the spans are copied from it. A short
/// span of a record a loaded window holds whole ([`crate::memory::window`])
/// is copied from the window after the whole record is checked, with no
/// read.
///
/// Every index and span is checked before anything is written to `dst`.
pub(crate) fn read_spans(s: &Ctx<'_>, snap: &Snapshot, req: &Spans<'_>, dst: &mut [u8]) -> Result<()> {
    let spans = req.spans;
    snap.table.prefetch(&spans.iter().map(|p| p.index).collect::<Vec<_>>());
    // Checked first: every record, every span inside its record and `dst`,
    // no two spans overlapping.
    let mut entries = Vec::with_capacity(spans.len());
    for p in spans {
        let entry = snap.entry(p.index)?;
        let logical = u64::from(entry.logical_len);
        if p.from.checked_add(p.len).is_none_or(|end| end > logical) {
            return Err(Error::InvalidArgument(format!(
                "read_spans: bytes {}..{} of record {}, which holds {logical} bytes",
                p.from,
                p.from.saturating_add(p.len),
                p.index
            )));
        }
        if p.at.checked_add(p.len).is_none_or(|end| end > dst.len() as u64) {
            return Err(Error::InvalidArgument(format!(
                "read_spans: a span of {} bytes at {} lies outside the destination of {} bytes",
                p.len,
                p.at,
                dst.len()
            )));
        }
        entries.push(entry);
    }
    let mut by_at: Vec<usize> = (0..spans.len()).filter(|&k| spans[k].len > 0).collect();
    by_at.sort_unstable_by_key(|&k| spans[k].at);
    for w in by_at.windows(2) {
        let (a, b) = (&spans[w[0]], &spans[w[1]]);
        if a.at + a.len > b.at {
            return Err(Error::InvalidArgument(format!(
                "read_spans: the span of record {} at {} overlaps the span of record {} at {}",
                b.index, b.at, a.index, a.at
            )));
        }
    }
    // A span reads its own bytes, or its whole record (below).
    let whole = |k: usize| {
        let e = &entries[k];
        e.codec != Codec::Raw || spans[k].len.saturating_mul(2) >= u64::from(e.stored_len)
    };
    // The records read whole, each once, back to back in `scratch`: index
    // -> (where it starts, its entry).
    let mut wholes: HashMap<u64, (u64, Entry)> = HashMap::new();
    let mut order: Vec<u64> = Vec::new();
    let mut size = 0u64;
    for &k in &by_at {
        if whole(k) {
            let index = spans[k].index;
            wholes.entry(index).or_insert_with(|| {
                order.push(index);
                let at = size;
                size += u64::from(entries[k].logical_len);
                (at, entries[k])
            });
        }
    }
    // Short spans of records a loaded window holds: copied from it, the
    // record checked whole (cheap beside the read it spares).
    let mut held = vec![false; spans.len()];
    let windows = if s.reads.caching() { s.reads.windows() } else { Loaded::default() };
    for &k in &by_at {
        if whole(k) {
            continue;
        }
        if let Some(stored) = windows.get(&entries[k]).filter(|_| !entries[k].is_part()) {
            let p = &spans[k];
            crc_check(p.index, &entries[k], stored)?;
            // Lossless: the span lies inside its record (checked above).
            dst[p.at as usize..][..p.len as usize].copy_from_slice(&stored[p.from as usize..][..p.len as usize]);
            held[k] = true;
        }
    }
    let mut scratch =
        vec![0u8; usize::try_from(size).map_err(|_| Error::InvalidArgument("read_spans: too large".into()))?];
    let mut items = carve(&mut scratch, order.iter().map(|i| Want::logical(*i, wholes[i].1)));
    // Lossless: spans lie inside `dst`, a slice, and inside records of
    // u32 lengths.
    items.extend(carve_at(
        dst,
        by_at
            .iter()
            .filter(|&&k| !whole(k) && !held[k])
            .map(|&k| (spans[k].at, Want::span(spans[k].index, entries[k], spans[k].from, spans[k].len as u32))),
    ));
    read_items(s, snap, items, req.fan_out)?;
    for &k in &by_at {
        if whole(k) {
            let p = &spans[k];
            let from = (wholes[&p.index].0 + p.from) as usize;
            dst[p.at as usize..][..p.len as usize].copy_from_slice(&scratch[from..][..p.len as usize]);
        }
    }
    Ok(())
}

/// The codec each record of `indices` is stored with, into `out`.
pub(crate) fn codecs(snap: &Snapshot, indices: &[u64], out: &mut [Codec]) -> Result<()> {
    if indices.len() != out.len() {
        return Err(Error::InvalidArgument(format!(
            "codecs: {} indices but an output of {} entries",
            indices.len(),
            out.len()
        )));
    }
    snap.table.prefetch(indices);
    for (i, o) in indices.iter().zip(out.iter_mut()) {
        *o = snap.entry(*i)?.codec;
    }
    Ok(())
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
pub(crate) fn read_items(s: &Ctx<'_>, snap: &Snapshot, items: Vec<Item<'_>>, fan_out: bool) -> Result<()> {
    let _gate = crate::fork::enter();
    let total: u64 = items.iter().map(|it| u64::from(it.entry.stored_len)).sum();
    // The eviction count, read at most every few milliseconds per process, lets
    // the residency bitmaps answer without a system call per record.
    let epoch = if s.mmap { crate::io::mmap::evictions() } else { None };
    let mut hot: Vec<(Item<'_>, Hot<'_>)> = Vec::with_capacity(if s.mmap { items.len() } else { 0 });
    let mut cold: Vec<Item<'_>> = Vec::with_capacity(if s.mmap { 0 } else { items.len() });
    let caching = s.reads.caching();
    // Taken once: the gather searches these windows without a lock.
    let windows = if caching { s.reads.windows() } else { Default::default() };
    // Compaction and import copy stored bytes: not reads to count (spans
    // also read stored bytes, and are reads).
    let internal = items.first().is_some_and(|it| it.keep_stored && !it.span);
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
        } else if let Some(b) = if caching && !it.keep_stored { find(&windows, s, &it) } else { None } {
            seen.cache_hits += 1;
            seen.cache_hit_bytes += stored as u64;
            hot.push((it, b));
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
        dir: s.dir,
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
    let helped = AtomicU64::new(0);
    let mine = pool.in_place_scope(|scope| {
        for _ in 0..helpers {
            let share = shares.next().unwrap_or_default();
            let (failed, queue) = (&failed, &queue);
            #[cfg(test)]
            crate::pool::HANDED_OFF.with(|n| n.set(n.get() + 1));
            let helped = &helped;
            scope.spawn(move |_| {
                let cpu0 = crate::io::process::thread_cpu_ns();
                if let Err(e) = read_group(s, snap, share, queue) {
                    failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                }
                helped.fetch_add(crate::io::process::thread_cpu_ns().saturating_sub(cpu0), Ordering::Relaxed);
            });
        }
        read_group(s, snap, own, &queue)
    });
    HELPED.with(|h| h.set(h.get() + helped.into_inner()));
    let r = mine.and(match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    });
    observed(s, snap, seen, queue.finish(r))
}

/// A record's stored bytes in a loaded window (no copy, no bookkeeping),
/// else in the record cache.
fn find<'w>(windows: &'w Loaded, s: &Ctx<'_>, it: &Item<'_>) -> Option<Hot<'w>> {
    if let Some(b) = windows.get(&it.entry) {
        return Some(Hot::Held(b));
    }
    s.reads.lookup(&it.entry, it.next).map(Hot::Cached)
}

/// Reads `items` as [`read_items`] does, except that a checksummed block
/// holding several of them (a format-2 fixed section) is read and verified
/// once and each record copied out of it. Compaction and delete read every
/// record of every block: record by record, each 4-byte label would read
/// and check its whole 4 KiB block again.
pub(crate) fn read_items_by_block(s: &Ctx<'_>, snap: &Snapshot, items: Vec<Item<'_>>) -> Result<()> {
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
/// chose wrong, has the store switch to the better one ([`crate::read::Adopt`]).
pub(crate) fn observed(s: &Ctx<'_>, snap: &Snapshot, seen: Seen, r: Result<()>) -> Result<()> {
    if seen.records == 0 {
        return r;
    }
    let data = snap.chunks.iter().map(|c| c.len).sum();
    if let Some(policy) = s.reads.observe(seen, data) {
        s.adopt.adopt(policy, data);
    }
    r
}

pub(crate) fn read_group(
    s: &Ctx<'_>,
    snap: &Snapshot,
    items: &mut [Item<'_>],
    hot: &HotQueue<'_, '_, '_>,
) -> Result<()> {
    read_group_over(&[(s, snap)], items, &[], hot)
}

/// Runs `finish` over `items` in groups of [`HOT_GROUP`], shared out with
/// the decode pool: its threads and this one each take the next group until
/// none is left.
fn share_groups<T: Send>(items: &mut [T], finish: impl Fn(&mut [T]) + Sync) {
    let groups: Vec<Mutex<&mut [T]>> = items.chunks_mut(HOT_GROUP).map(Mutex::new).collect();
    let next = AtomicUsize::new(0);
    let drain = || loop {
        let k = next.fetch_add(1, Relaxed);
        let Some(group) = groups.get(k) else { return };
        finish(&mut group.lock().unwrap_or_else(|p| p.into_inner()));
    };
    let pool = crate::pool::get();
    let helpers = pool.current_num_threads().min(groups.len().saturating_sub(1)).max(1);
    pool.in_place_scope(|scope| {
        for _ in 0..helpers {
            #[cfg(test)]
            crate::pool::HANDED_OFF.with(|n| n.set(n.get() + 1));
            scope.spawn(|_| drain());
        }
        drain();
    });
}

/// [`read_group`] of items from several snapshots (a dataset of parts):
/// item `k` is of `sources[from[k]]` (of `sources[0]` when `from` is
/// empty). Their reads go out in as few batches as the descriptor limit
/// allows, one batch for every part they touch.
pub(crate) fn read_group_over(
    sources: &[(&Ctx<'_>, &Snapshot)],
    items: &mut [Item<'_>],
    from: &[usize],
    hot: &HotQueue<'_, '_, '_>,
) -> Result<()> {
    // Kept between gathers within the budget, else freed ([`crate::io::slab::keep_scratch`]).
    let mut scratch = crate::io::slab::take_scratch();
    // A batch holds a descriptor per chunk file it names until it
    // completes: name at most `batch_files` files per batch (fds.rs).
    let limit = crate::io::fds::batch_files();
    let files: usize = sources.iter().map(|(_, snap)| snap.chunks.len()).sum();
    let src = |k: usize| from.get(k).copied().unwrap_or(0);
    let mut rest = items;
    let mut at = 0usize;
    let r = loop {
        let cut = if files <= limit {
            rest.len()
        } else {
            let mut files = std::collections::HashSet::new();
            rest.iter()
                .enumerate()
                .position(|(k, it)| files.insert((src(at + k), it.entry.chunk)) && files.len() > limit)
                .unwrap_or(rest.len())
        };
        let (batch, tail) = std::mem::take(&mut rest).split_at_mut(cut);
        let r = read_group_with(sources, batch, from.get(at..at + cut).unwrap_or(&[]), &mut scratch, hot);
        at += cut;
        rest = tail;
        if rest.is_empty() || r.is_err() {
            break r;
        }
    };
    crate::io::slab::keep_scratch(scratch);
    r
}

/// Reads the cold `items` in one batch, taking hot groups from `hot`
/// while the reads are in flight.
pub(crate) fn read_group_with(
    sources: &[(&Ctx<'_>, &Snapshot)],
    items: &mut [Item<'_>],
    from: &[usize],
    scratch: &mut AlignedBuf,
    hot: &HotQueue<'_, '_, '_>,
) -> Result<()> {
    let src = |k: usize| from.get(k).copied().unwrap_or(0);
    // Plan: where each record's stored bytes are read to. Raw records read
    // through the page cache go straight into their slot, and so do O_DIRECT
    // ones of whole pages bound for page-aligned slots; everything else
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
    let mut first_err: Option<Error> = None;
    // The descriptors of the batch's files (opened or taken from the
    // process's cache), held until its reads complete; `true` with an
    // O_DIRECT one.
    let mut files: HashMap<(usize, ChunkId), (Arc<File>, bool)> = HashMap::new();
    for (k, it) in items.iter().enumerate() {
        if let std::collections::hash_map::Entry::Vacant(v) = files.entry((src(k), it.entry.chunk)) {
            let chunk = sources[src(k)].1.chunk(it.entry.chunk).expect("entry checked against chunks");
            let direct = if chunk.direct { chunk.file.direct()? } else { None };
            v.insert(match direct {
                Some(f) => (f, true),
                None => (chunk.file.buffered()?, false),
            });
        }
    }
    let mut plans = Vec::with_capacity(items.len());
    for (k, it) in items.iter().enumerate() {
        let (file, direct) = &files[&(src(k), it.entry.chunk)];
        let stored = it.entry.stored_len as usize;
        let p = match direct.then_some(file) {
            Some(d) => {
                let start = it.entry.offset / ALIGN as u64 * ALIGN as u64;
                let end = it.entry.end().div_ceil(ALIGN as u64) * ALIGN as u64;
                let skip = (it.entry.offset - start) as usize;
                // A record that fills whole pages of the file, bound for a
                // page-aligned slot of its own length (the loader's batches
                // of such rows), is read straight into the slot.
                let whole = it.keep_stored || (it.entry.codec == Codec::Raw && !it.entry.is_part());
                let into_slot = whole
                    && skip == 0
                    && stored.is_multiple_of(ALIGN)
                    && it.dst.len() == stored
                    && (it.dst.as_ptr() as usize).is_multiple_of(ALIGN);
                Plan {
                    fd: d.as_fd(),
                    offset: start,
                    len: (end - start) as usize,
                    need: skip + stored,
                    skip,
                    scratch: !into_slot,
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
    let direct_bytes: usize = plans.iter().filter(|p| p.scratch && p.direct).map(|p| p.len).sum();
    let buffered_bytes: usize = plans.iter().filter(|p| p.scratch && !p.direct).map(|p| p.len).sum();
    let (buf, region) = scratch.get_in(direct_bytes + buffered_bytes);
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
        sources[0].0.backend,
        reads,
        Some(region),
        &mut |i, buf| {
            let it = &mut *io_items[i];
            let (s, snap) = sources[src(i)];
            let stored_len = it.entry.stored_len as usize;
            let r = if plans[i].scratch {
                let skip = plans[i].skip;
                let stored = &buf[skip..skip + stored_len];
                let r = finish_record(it, stored, snap.dict.as_deref());
                if r.is_ok() && plans[i].direct && !it.keep_stored {
                    s.reads.offer(&it.entry, stored, it.next);
                }
                r
            } else {
                let stored = &buf[..stored_len];
                let r = crc_check(it.index, &it.entry, stored);
                if plans[i].direct {
                    s.reads.count_into_place(stored_len as u64);
                    if r.is_ok() && !it.keep_stored {
                        s.reads.offer(&it.entry, stored, it.next);
                    }
                }
                r
            };
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        },
        &mut || hot.drain(),
    );
    if let Err(e) = r {
        let k = e.req.min(io_items.len().saturating_sub(1));
        let it = &io_items[k];
        let (s, snap) = sources[src(k)];
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
