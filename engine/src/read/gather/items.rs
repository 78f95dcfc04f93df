//! The transfers a gather ends in: records in memory copied or decoded from
//! the mappings and the rest read in batches (shared between the caller and
//! the decode pool), mode 3's reads through loaded windows, and the decode
//! pool's CPU time counted for the caller.

use crate::error::{corrupted, Error, Result};
use crate::format::codec::Codec;
use crate::format::names::chunk_name;
use crate::format::record::{ChunkId, Entry};
use crate::io::uring::{self, AlignedBuf, ReqErrorKind, ALIGN};
use crate::memory::reads::Seen;
use crate::memory::window::Loaded;
use crate::read::hot::{Hot, HotQueue, HOT_GROUP};
use crate::read::item::{carve, crc_check, finish_record, Item, Want};
use crate::read::Ctx;
use crate::snapshot::Snapshot;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, Ordering::Relaxed};
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
pub(super) const PARALLEL_MIN_BYTES: u64 = 128 << 10;

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
pub(super) fn find<'w>(windows: &'w Loaded, s: &Ctx<'_>, it: &Item<'_>) -> Option<Hot<'w>> {
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
pub(super) fn share_groups<T: Send>(items: &mut [T], finish: impl Fn(&mut [T]) + Sync) {
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
    // Kept between gathers within the budget, else freed ([`crate::io::scratch::keep_scratch`]).
    let mut scratch = crate::io::scratch::take_scratch();
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
    crate::io::scratch::keep_scratch(scratch);
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
