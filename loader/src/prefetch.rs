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
    /// Whether a source evicts by the windows ahead ([`Windows::plan`]).
    fn wants_plan(&self) -> bool;
    /// Tells every source the windows read next: the one being read, then
    /// the one about to load, and on.
    fn plan(&self, windows: &[Vec<Range<u64>>]);
    /// Steps below `step` draw only from loaded windows.
    fn loaded_until(&self, step: u64);
    /// The thread has stopped: workers no longer wait for windows.
    fn stopped(&self);
    /// A helper of the thread (one source's loads) starts (`true`) or ends,
    /// on that helper: its CPU time is the window thread's.
    fn helper(&self, started: bool);
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
    // The window whose steps are gathered while the next one loads.
    let mut previous: Option<Vec<Range<u64>>> = None;
    while let Some(w) = window {
        if let Some(p) = previous_start {
            if !shared.wait_for_claim(p) {
                return;
            }
        }
        if shared.wants_plan() {
            shared.plan(&plan(sampler, previous.as_deref(), &w));
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
        previous = Some(w.records);
    }
}

/// Most windows a plan holds ([`plan`]).
const PLAN_WINDOWS: usize = 4096;

/// The window being read (`previous`), then the windows from `w` on to
/// the end of the cycle after `w`'s (at most [`PLAN_WINDOWS`]): what a
/// cache of object storage evicts by, as every line a cycle reads is read
/// again in the next.
fn plan(sampler: &Sampler, previous: Option<&[Range<u64>]>, w: &Window) -> Vec<Vec<Range<u64>>> {
    let end = sampler.cycle_boundary(sampler.cycle_boundary(w.steps.start).saturating_add(1));
    let mut out: Vec<Vec<Range<u64>>> = previous.map(|p| p.to_vec()).into_iter().collect();
    out.push(w.records.clone());
    let mut next = sampler.next_window(w);
    while let Some(n) = next {
        if n.steps.start >= end || out.len() >= PLAN_WINDOWS {
            break;
        }
        out.push(n.records.clone());
        next = sampler.next_window(&n);
    }
    out
}

/// The prefetch thread's body for a mixture in mode 3: each source's
/// windows ([`Mixture::source_window`]) from the ones holding `start`'s rows
/// on, one window ahead per source as [`run`] does ([`run_sources`]: each
/// source loads on its own thread, so one source's slow window does not
/// hold the others' back). Steps are claimed once every source's windows
/// they draw from are loaded.
pub(crate) fn run_mixture(shared: &(dyn Windows + Sync), mixture: &Mixture, start: u64) {
    let _done = Done(shared);
    let first = (0..mixture.lengths().len()).map(|k| mixture.source_window(k, start)).collect();
    // No next-use hints, as in [`run`].
    let load = |k: usize, w: &Window| shared.load_source(k, &w.records, &[]);
    let advance = |_: usize, w: &Window| {
        let next = mixture.next_source_window(w).map(|n| (w.complete, n));
        (Some(w.steps.start), next)
    };
    run_sources(shared, start, first, &load, &advance);
}

/// What [`run_sources`] calls a source's windows loader: `(k, window)` → loaded.
type Load<'a, W> = &'a (dyn Fn(usize, &W) -> bool + Sync);
/// What [`run_sources`] calls after source `k` loaded `window`: the first step
/// that draws from it, and the window after it with the first step that
/// may draw from that one (the steps before read only what is loaded).
type Advance<'a, W> = &'a (dyn Fn(usize, &W) -> (Option<u64>, Option<(u64, W)>) + Sync);

/// Walks several sources' windows, each on a thread of its own (the
/// calling thread for the last), each one window ahead of its steps as
/// [`run`] does: window `w + 1` of a source loads once a step of its window
/// `w` is claimed. The steps below the smallest of the sources' loaded
/// horizons are claimable ([`Windows::loaded_until`]); a source with no
/// window (`None` in `first`) or past its last holds the others back no
/// more. A source whose load fails stops the read-ahead for every source
/// ([`Windows::stopped`]): the gathers then read what they need and report
/// any error with its step.
fn run_sources<W: Send>(
    shared: &(dyn Windows + Sync),
    start: u64,
    first: Vec<Option<W>>,
    load: Load<'_, W>,
    advance: Advance<'_, W>,
) {
    // The steps below `complete[k]` draw from source `k`'s loaded windows only.
    let complete: std::sync::Mutex<Vec<u64>> =
        std::sync::Mutex::new(first.iter().map(|w| if w.is_some() { start } else { u64::MAX }).collect());
    let walk = |k: usize, mut window: W| {
        let mut previous_start: Option<u64> = None;
        loop {
            if let Some(p) = previous_start {
                if !shared.wait_for_claim(p) {
                    return;
                }
            }
            if !load(k, &window) {
                shared.stopped();
                return;
            }
            let (first_step, next) = advance(k, &window);
            let until = {
                let mut c = complete.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                c[k] = next.as_ref().map_or(u64::MAX, |(until, _)| *until);
                c.iter().copied().min().unwrap_or(u64::MAX)
            };
            shared.loaded_until(until);
            previous_start = first_step;
            match next {
                Some((_, n)) => window = n,
                None => return,
            }
        }
    };
    let mut walks: Vec<(usize, W)> = first.into_iter().enumerate().filter_map(|(k, w)| Some((k, w?))).collect();
    let Some((last, last_window)) = walks.pop() else {
        return;
    };
    std::thread::scope(|scope| {
        for (k, w) in walks {
            let walk = &walk;
            let spawned =
                std::thread::Builder::new().name(format!("zring-prefetch-{k}")).spawn_scoped(scope, move || {
                    shared.helper(true);
                    walk(k, w);
                    shared.helper(false);
                });
            if spawned.is_err() {
                // No thread for this source: nothing waits for its windows.
                shared.stopped();
            }
        }
        walk(last, last_window);
    });
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
/// each source on its own thread ([`run_sources`]). A window's steps are
/// those whose rows hold its documents' tokens
/// ([`Packer::rows_of_positions`]); steps are claimed once every window
/// they read is loaded. A source whose windows would not fit its memory
/// ([`Packer::window_fits`]), or whose rows cannot be found (its lengths
/// unreadable), is not read ahead: its gathers read what they need and
/// report any error with its step.
pub(crate) fn run_packed(
    shared: &(dyn Windows + Sync),
    packers: &[Option<&Packer>],
    steps: &(dyn PackedSteps + Sync),
    start: u64,
) {
    let _done = Done(shared);
    let first = (0..packers.len())
        .map(|k| {
            let packer = packers[k]?;
            let w = PackedWindow::of_row(packer, steps.first_row(k, start)?)?;
            // Windows that would not fit a quarter of the source's memory
            // are not read ahead: a load holds what it can and drops the
            // rest, read for nothing.
            packer.window_fits(&w.blocks).then_some(w)
        })
        .collect();
    let load = |k: usize, w: &PackedWindow| shared.load_packed(k, &w.blocks);
    let advance = |k: usize, w: &PackedWindow| {
        let next = packers[k].and_then(|p| w.next(p));
        // Steps before the first that may read the next window read only
        // this one and those before it.
        let next = next.and_then(|n| Some((steps.step_of_row(k, n.rows.start)?, n)));
        (steps.step_of_row(k, w.rows.start), next)
    };
    run_sources(shared, start, first, &load, &advance);
}
