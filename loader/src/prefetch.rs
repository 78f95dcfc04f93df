//! Mode 3: the thread that loads each window of blocks before its steps are
//! gathered.
//!
//! The sampler's blocked mode draws every batch from a window of blocks of
//! consecutive records ([`Sampler::window`]). One thread per loader walks
//! the windows in order and asks every stream's source to load the next
//! window ([`Source::prefetch`](crate::Source::prefetch): a store reads each
//! block as one large read into its record cache), at most one window ahead
//! of the steps claimed: window `w + 1` loads once a step of window `w` is
//! claimed, so the memory held is about two windows. Workers claim a step
//! only once every window it draws from is loaded
//! ([`Windows::loaded_until`]), so no record is read
//! twice, once small by a gather and once whole by its block. The thread
//! stops (and the workers stop waiting for it) on shutdown, past the last
//! step, or when a source's prefetch fails: the gathers then read what they
//! need themselves and report any real error with its step.
//!
//! A mixture's sources read their windows ahead the same way, each its own
//! ([`run_mixture`]), and so do packed sources whose documents are drawn in
//! mode 3 ([`run_packed`]): their windows are the document orders', and the
//! steps that read a window are those whose rows hold its documents' tokens.
//!
//! A loader of one shard walks that shard's windows
//! ([`Sampler::shard_window`]): when the cycles are split for its shard
//! count, windows of its own blocks only, so it reads about its share of
//! the data; unsplit, the windows of the whole batch.

use std::ops::Range;

use zring_sampler::{Mixture, Sampler, Shard, Window};

use crate::pack::Packer;

/// What the prefetch thread asks of the loader it works for (the loader's
/// shared state implements it), so that this module needs nothing of the
/// loader's insides.
pub(crate) trait Windows {
    /// Waits until a step at or past `step` has been claimed; `false` once the
    /// loader shuts down.
    fn wait_for_claim(&self, step: u64) -> bool;
    /// Loads the records of `blocks` in every source, `next` holding when
    /// each is drawn next (empty: no hints, as the thread passes now);
    /// `false` when a source failed.
    fn load(&self, blocks: &[Range<u64>], next: &[Option<u64>]) -> bool;
    /// [`Windows::load`] in mixture source `source`'s streams only.
    fn load_source(&self, source: usize, blocks: &[Range<u64>], next: &[Option<u64>]) -> bool;
    /// Loads the documents of `blocks` in a packed loader's source `source`.
    fn load_packed(&self, source: usize, blocks: &[Range<u64>]) -> bool;
    /// Steps below `step` draw only from loaded windows.
    fn loaded_until(&self, step: u64);
    /// The thread has stopped: workers no longer wait for windows.
    fn stopped(&self);
}

/// Tells the loader the thread stopped, however it ends, so no worker waits
/// for a window that will never load.
struct Done<'a>(&'a dyn Windows);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.stopped();
    }
}

/// The prefetch thread's body: loads the windows from the one holding
/// `start`'s first draw on.
pub(crate) fn run(shared: &dyn Windows, sampler: &Sampler, shard: Shard, start: u64) {
    let _done = Done(shared);
    // The windows of this loader's shard: its own blocks when the cycles
    // are split for its shard count, else the windows of the whole batch.
    let mut window = sampler.shard_window(start, shard);
    let mut previous_start: Option<u64> = None;
    while let Some(w) = window {
        if let Some(p) = previous_start {
            if !shared.wait_for_claim(p) {
                return;
            }
        }
        // No next-use hints: a store keeps a window's blocks for the
        // window's steps and releases them after (memory::window), whatever
        // the hints, so the thread spares inverting the permutation for
        // each record (`Sampler::fill_next_use`).
        if !shared.load(&w.records, &[]) {
            return;
        }
        shared.loaded_until(w.complete);
        previous_start = Some(w.steps.start);
        window = sampler.next_window(&w);
    }
}

/// The prefetch thread's body for a mixture in mode 3: each source's
/// windows ([`Mixture::source_window`]) from the ones holding `start`'s rows
/// on, one window ahead per source as [`run`] does, always the source whose
/// loaded windows end soonest next. Steps are claimed once every source's
/// windows they draw from are loaded.
pub(crate) fn run_mixture(shared: &dyn Windows, mixture: &Mixture, start: u64) {
    let _done = Done(shared);
    let sources = mixture.lengths().len();
    let mut pending: Vec<Option<Window>> = (0..sources).map(|k| mixture.source_window(k, start)).collect();
    let mut previous_start: Vec<Option<u64>> = vec![None; sources];
    // The steps below `complete[k]` draw from source `k`'s loaded windows
    // only; a source past its last window holds the others back no more.
    let mut complete: Vec<u64> = pending.iter().map(|w| if w.is_some() { start } else { u64::MAX }).collect();
    while let Some(k) = (0..sources).filter(|&k| pending[k].is_some()).min_by_key(|&k| complete[k]) {
        let Some(w) = pending[k].take() else {
            return;
        };
        if let Some(p) = previous_start[k] {
            if !shared.wait_for_claim(p) {
                return;
            }
        }
        // No next-use hints, as in [`run`].
        if !shared.load_source(k, &w.records, &[]) {
            return;
        }
        complete[k] = w.complete;
        previous_start[k] = Some(w.steps.start);
        pending[k] = mixture.next_source_window(&w);
        if pending[k].is_none() {
            complete[k] = u64::MAX;
        }
        if let Some(&until) = complete.iter().min() {
            shared.loaded_until(until);
        }
    }
}

/// One window of a packed source's document order: its blocks, and the
/// rows of the packed stream that may read its documents.
struct PackedWindow {
    at: (u64, u64),
    blocks: Vec<Range<u64>>,
    rows: Range<u64>,
}

impl PackedWindow {
    fn at(packer: &Packer, at: (u64, u64)) -> Option<PackedWindow> {
        let (positions, blocks) = packer.order_window(at.0, at.1)?;
        let rows = packer.rows_of_positions(positions).ok()?;
        Some(PackedWindow { at, blocks, rows })
    }

    /// The window holding row `row`'s first document.
    fn of_row(packer: &Packer, row: u64) -> Option<PackedWindow> {
        let p = packer.first_position_of_row(row).ok()?;
        PackedWindow::at(packer, packer.order_window_of(p)?)
    }

    /// The window after this one: the next of its cycle, else the first of
    /// the next cycle.
    fn next(&self, packer: &Packer) -> Option<PackedWindow> {
        let (c, w) = self.at;
        PackedWindow::at(packer, (c, w + 1)).or_else(|| PackedWindow::at(packer, (c.checked_add(1)?, 0)))
    }
}

/// What [`run_packed`] needs of the loader's steps: where each packed
/// source's rows fall.
pub(crate) trait PackedSteps {
    /// The first row of source `k` that step `step` draws.
    fn first_row(&self, k: usize, step: u64) -> Option<u64>;
    /// The step that draws row `row` of source `k`.
    fn step_of_row(&self, k: usize, row: u64) -> Option<u64>;
}

/// The prefetch thread's body for a packed loader whose documents are drawn
/// in mode 3: each source's windows of its document order, from the ones
/// holding `start`'s rows on, one window ahead per source as [`run`] does,
/// always the source whose loaded windows end soonest next (as
/// [`run_mixture`]). A window's steps are those whose rows hold its
/// documents' tokens ([`Packer::rows_of_positions`]); steps are claimed
/// once every window they read is loaded. A source whose windows would not
/// fit its memory ([`Packer::window_fits`]), or whose rows cannot be found
/// (its lengths unreadable), is not read ahead: its gathers read what they
/// need and report any error with its step.
pub(crate) fn run_packed(shared: &dyn Windows, packers: &[Option<&Packer>], steps: &dyn PackedSteps, start: u64) {
    let _done = Done(shared);
    let window_of = |k: usize| -> Option<PackedWindow> {
        let packer = packers[k]?;
        let w = PackedWindow::of_row(packer, steps.first_row(k, start)?)?;
        // Windows that would not fit a quarter of the source's memory are
        // not read ahead: a load holds what it can and drops the rest,
        // read for nothing.
        packer.window_fits(&w.blocks).then_some(w)
    };
    let mut pending: Vec<Option<PackedWindow>> = (0..packers.len()).map(window_of).collect();
    let mut previous_start: Vec<Option<u64>> = vec![None; packers.len()];
    // The steps below `complete[k]` read only source `k`'s loaded windows; a
    // source not read ahead holds the others back no more.
    let mut complete: Vec<u64> = pending.iter().map(|w| if w.is_some() { start } else { u64::MAX }).collect();
    while let Some(k) = (0..packers.len()).filter(|&k| pending[k].is_some()).min_by_key(|&k| complete[k]) {
        let (Some(window), Some(packer)) = (pending[k].take(), packers[k]) else {
            return;
        };
        if let Some(p) = previous_start[k] {
            if !shared.wait_for_claim(p) {
                return;
            }
        }
        if !shared.load_packed(k, &window.blocks) {
            return;
        }
        // Steps before the first that may read the next window read only
        // this one and those before it.
        let next = window.next(packer);
        match next.as_ref().and_then(|n| steps.step_of_row(k, n.rows.start)) {
            Some(until) => complete[k] = until,
            None => {
                complete[k] = u64::MAX;
                pending[k] = None;
            }
        }
        previous_start[k] = steps.step_of_row(k, window.rows.start);
        if complete[k] != u64::MAX {
            pending[k] = next;
        }
        if let Some(&until) = complete.iter().min() {
            shared.loaded_until(until);
        }
    }
}
