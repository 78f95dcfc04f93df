//! Block reads: a window of consecutive records loaded in large reads before
//! the gathers that draw from it.
//!
//! A loader in the sampler's blocked mode knows which blocks of consecutive
//! records its next steps draw from (a window of them). Read record by
//! record, a window costs one small random read per record; read here, it
//! costs one read per run of records that lie back to back in one chunk
//! file (a run is cut at [`MAX_SPAN`] bytes), about
//! [`crate::io::slab::in_flight_bytes`] of them in flight at once (32 MiB, less
//! for a small budget, which counts them). With a record cache (O_DIRECT
//! reads) each run is read into a slab ([`crate::io::slab`]) that is kept
//! whole: the window's slabs and an index of its records in them are
//! published to the store's loaded windows ([`crate::memory::window`]) once
//! the window has loaded, and the gathers copy each record from there into
//! its batch, checking its checksum as they do every record's. That is the
//! one copy a record takes on its way from disk to batch: no record is copied
//! into a buffer of its own in the cache, and no cache entry is made, ranked
//! or evicted per record. Each slab is charged to the record cache for as
//! long as any record of it lives (evicting cached records for room); a store
//! keeps its two newest windows while it loads the next
//! ([`crate::memory::window::KEEP`]: the one gathered and the one before it,
//! whose last steps may still be running), and a released window's slabs are kept, still charged, for the next
//! window's reads, so the window thread's memory is faulted in and cleared
//! once, not per page each window. A window's records are not kept past its
//! release: a later cycle reads their blocks again, one large read each,
//! where keeping a share of them cost a copy of every record and a cache
//! entry ranked and evicted per record. Buffered stores are asked to read
//! the runs ahead into the page cache (`POSIX_FADV_WILLNEED`), where
//! the gathers copy them from the chunk mappings. A store read with a
//! forced mode and no cache reads nothing ahead: the gathers then measure
//! exactly the mode they name.

use std::ops::Range;
use std::os::fd::AsFd;

use crate::error::{corrupted, Error, Result};
use crate::format::names::chunk_name;
use crate::format::record::{ChunkId, Entry};
use crate::io::slab::Slab;
use crate::io::uring::{self, ReqErrorKind, ALIGN};
use crate::memory::cache::NextUse;
use crate::memory::window::Window;
use crate::read::Ctx;
use crate::snapshot::Snapshot;

/// The longest single read: one run of back-to-back records is cut here.
/// Large enough that a disk streams at its sequential rate, small enough that
/// a window is many reads in flight at once (bench-results/engine-notes.md).
pub(crate) const MAX_SPAN: u64 = 4 << 20;

// About `io::slab::in_flight_bytes()` are in flight at once while a window
// loads: as one run's read completes and its records are indexed in the
// window, the next run's read is submitted, so the device always has this much
// to do (32 MiB is about the queue depth at which large random reads peak,
// bench-results/engine-notes.md), and the memory a load holds beside the cache
// stays bounded (the budget counts it, `memory::budget`).

/// A run of records to read as one: entries `first..first + count` of the
/// list, bytes `offset..end` of `chunk`.
struct Run {
    chunk: ChunkId,
    offset: u64,
    end: u64,
    records: Range<usize>,
}

/// Loads the records of `ranges` (index ranges) ahead of the gathers that
/// will draw them; `next` holds one hint per record, counting through the
/// ranges in order (empty: none), checked against them. Every record is read
/// with its block, even one the record cache or an older window holds: left
/// out, it would cut its block's run in two, and the copy it counted on could
/// be evicted for a window's slab or released with its window before its
/// step.
pub(crate) fn prefetch(s: &Ctx<'_>, snap: &Snapshot, ranges: &[Range<u64>], next: &[NextUse]) -> Result<()> {
    let _gate = crate::fork::enter();
    let count: u64 = ranges.iter().map(|r| r.end.saturating_sub(r.start)).sum();
    if !next.is_empty() && next.len() as u64 != count {
        return Err(Error::InvalidArgument(format!("prefetch: {count} records but {} next-use hints", next.len())));
    }
    let caching = s.reads.caching();
    if !caching && s.reads.forced() {
        return Ok(());
    }
    // The window two before this one is done with (memory::window).
    s.reads.trim_windows();
    let mut wanted: Vec<(u64, Entry, NextUse)> = Vec::with_capacity(count as usize);
    let mut k = 0;
    for r in ranges {
        for index in r.clone() {
            let e = snap.entry(index)?;
            let hint = next.get(k).copied().unwrap_or(NextUse::Unknown);
            k += 1;
            // Records inside a checksummed block (small fixed records of a
            // sealed table) are read with their block by the gathers.
            if e.is_part() || e.stored_len == 0 {
                continue;
            }
            wanted.push((index, e, hint));
        }
    }
    let runs = runs(&wanted);
    if !caching {
        return advise(snap, &runs);
    }
    read_runs(s, snap, &runs, &wanted)?;
    s.reads.count_prefetched(runs.iter().map(|r| r.end - r.offset).sum());
    Ok(())
}

/// Cuts `wanted` (in index order) into runs of records back to back in one
/// chunk, each at most [`MAX_SPAN`] bytes (a larger record is a run alone).
fn runs(wanted: &[(u64, Entry, NextUse)]) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for (k, (_, e, _)) in wanted.iter().enumerate() {
        if let Some(last) = out.last_mut() {
            if last.chunk == e.chunk && last.end == e.offset && e.end() - last.offset <= MAX_SPAN {
                last.end = e.end();
                last.records.end = k + 1;
                continue;
            }
        }
        out.push(Run { chunk: e.chunk, offset: e.offset, end: e.end(), records: k..k + 1 });
    }
    out
}

/// The ALIGN-aligned file span around a run: its start and length.
fn span(run: &Run) -> (u64, u64) {
    let start = run.offset / ALIGN as u64 * ALIGN as u64;
    let end = run.end.div_ceil(ALIGN as u64) * ALIGN as u64;
    (start, end - start)
}

/// Buffered stores: asks the kernel to read the runs into the page cache.
fn advise(snap: &Snapshot, runs: &[Run]) -> Result<()> {
    for run in runs {
        let chunk = snap.chunk(run.chunk).expect("entry checked against chunks");
        let file = chunk.file.buffered()?;
        // Advice only: a file system that ignores it costs the gathers
        // their own reads, never wrong bytes.
        let len = std::num::NonZeroU64::new(run.end - run.offset);
        let _ = rustix::fs::fadvise(file.as_fd(), run.offset, len, rustix::fs::Advice::WillNeed);
    }
    Ok(())
}

/// Reads `runs` (O_DIRECT where the chunk allows), each into a slab of its
/// own (a released window's spare when there is one), about
/// [`crate::io::slab::in_flight_bytes`] in flight, holds each slab against
/// the record cache as its run arrives, and publishes the window.
fn read_runs(s: &Ctx<'_>, snap: &Snapshot, runs: &[Run], wanted: &[(u64, Entry, NextUse)]) -> Result<()> {
    let mut files = std::collections::HashMap::new();
    for run in runs {
        if let std::collections::hash_map::Entry::Vacant(v) = files.entry(run.chunk) {
            let chunk = snap.chunk(run.chunk).expect("entry checked against chunks");
            let direct = if chunk.direct { chunk.file.direct()? } else { None };
            v.insert(match direct {
                Some(f) => f,
                None => chunk.file.buffered()?,
            });
        }
    }
    let reads: Vec<uring::SlabRead<'_>> = runs
        .iter()
        .map(|run| {
            let (start, len) = span(run);
            uring::SlabRead {
                fd: files[&run.chunk].as_fd(),
                offset: start,
                len: len as usize,
                need: (run.end - start) as usize,
            }
        })
        .collect();
    let total: u64 = runs.iter().map(|r| span(r).1).sum();
    let limit = (crate::io::slab::in_flight_bytes() * runs.len() as u64 / total.max(1)).max(1) as usize;
    let mut window = Window::default();
    // Which runs read into a released window's slab, charged already.
    let spare: Vec<std::cell::Cell<bool>> = runs.iter().map(|_| std::cell::Cell::new(false)).collect();
    let done: Vec<std::cell::Cell<bool>> = runs.iter().map(|_| std::cell::Cell::new(false)).collect();
    let mut take = |i: usize, len: usize| match s.reads.spare(len) {
        Some(slab) => {
            spare[i].set(true);
            slab
        }
        None => Slab::take_aligned(len),
    };
    let r = uring::read_slabs(s.backend, &reads, limit, &mut take, &mut |i, slab| {
        // The run's slab is kept whole, charged to the record cache, and
        // its records indexed in it: no copy until the gathers'.
        done[i].set(true);
        let held = if spare[i].get() { Some(s.reads.held(slab)) } else { s.reads.hold(slab) };
        let Some(held) = held else { return };
        let run = &runs[i];
        let start = span(run).0;
        let k = window.slab(held);
        for (_, e, _) in &wanted[run.records.clone()] {
            window.add(e, k, (e.offset - start) as usize);
        }
    });
    if r.is_ok() {
        s.reads.publish(window);
    }
    // A spare slab whose read failed was dropped by `read_slabs`: its charge
    // goes with it.
    for (k, read) in reads.iter().enumerate() {
        if spare[k].get() && !done[k].get() {
            s.reads.unhold(crate::io::slab::aligned_capacity(read.len) as u64);
        }
    }
    r.map_err(|e| {
        let run = &runs[e.req.min(runs.len().saturating_sub(1))];
        let path = s.dir.join(chunk_name(snap.table.format, run.chunk));
        match e.kind {
            ReqErrorKind::Eof { got } => corrupted(
                format!("chunk {}", run.chunk.0),
                format!(
                    "{} ends {got} bytes into the read at {}, before record bytes end at {}",
                    path.display(),
                    span(run).0,
                    run.end
                ),
            ),
            ReqErrorKind::Os(source) => Error::Io { op: "read", path, source },
        }
    })
}
