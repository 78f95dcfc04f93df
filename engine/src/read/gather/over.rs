//! Gathers over many snapshots at once (a dataset of parts): each part's
//! [`Source`], the records copied straight from the parts' mappings and
//! counted into their stores in batches, and the rest read in one batch of
//! transfers for all parts.

use super::items::{observed, read_group_over, read_items, share_groups, PARALLEL_MIN_BYTES};
use super::slots::{check_slots, check_width, hint, slot_starts};
use crate::error::{corrupted, Error, Result};
use crate::format::names::chunk_name;
use crate::format::record::Entry;
use crate::io::mapset::MapSet;
use crate::memory::reads::Seen;
use crate::read::hot::{HotQueue, HOT_GROUP};
use crate::read::item::{carve_at, finish_record, Item, Want};
use crate::read::request::Gather;
use crate::read::Ctx;
use crate::snapshot::Snapshot;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// One snapshot a [`gather_over`] reads from, with its store's context.
pub(crate) struct Source<'s> {
    /// The snapshot's store: read only through [`Source::ctx`], for what
    /// records not in memory need (a gather over hundreds of parts finds
    /// most parts' stores out of the CPU cache).
    pub store: &'s dyn crate::read::Contexts,
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

/// Reads the records of `req` into `dst` as [`gather`](super::snapshot::gather) does, record `k`
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
