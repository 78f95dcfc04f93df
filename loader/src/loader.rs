//! The step pipeline: worker threads gather steps ahead of the consumer and
//! hand them over in step order.
//!
//! # Why the limits are what they are
//!
//! Three limits meet here: `depth` (steps gathered ahead of the consumer),
//! `threads` (workers), and the buffers the caller still holds.
//!
//! * The window. A worker may claim step `s` only while
//!   `s < next_deliver + depth`, where `next_deliver` is the step the
//!   consumer's next `next()` returns. So at most `depth` steps are in flight
//!   or ready at once, whatever the thread count, and the ready steps fit a
//!   ring of exactly `depth` slots indexed by `s - next_deliver`: claiming
//!   hands out steps in increasing order and `next_deliver` only grows, so a
//!   finished step always has a slot. Delivery in step order falls out of the
//!   ring: the consumer only ever takes slot 0.
//!
//! * The window in bytes. `ahead_bytes` narrows the window further: it is
//!   `clamp(ahead_bytes / step_bytes, 1, depth)` steps, where `step_bytes` is
//!   the data one step of this shard gathers (exact for fixed layouts; a
//!   ragged stream counts as its largest step so far, and one step at a time
//!   is gathered until the first is known). At least one step keeps the
//!   pipeline moving, so a single step larger than the budget still loads.
//!   The window only narrows as ragged steps grow, except once: when the
//!   first ragged step is known it may widen, and the worker that learned it
//!   wakes the others. A narrower window still lies inside the ring of
//!   `depth` slots, so the slot argument above holds.
//!
//! * Hints, and what the window has to do with them. A store that reads
//!   around the page cache (O_DIRECT) keeps a record cache of its own, and
//!   that cache does best keeping the records needed soonest (Belady's
//!   rule). The sampler knows exactly when that is: for each record of step
//!   `s`, the first later step at which *this loader's shard* draws it
//!   (`Sampler::fill_shard_with_next_use`, one inverse permutation per
//!   record and cycle in cyclic mode, arithmetic in sequential mode; for iid
//!   draws, which have no inverse, a window of the shard's draws of the steps
//!   ahead, `lookahead.rs`; in mode 3 "none in sight", since a record
//!   comes again only in its next cycle and the window holding it is
//!   released before). So a worker asks each stream once per
//!   step whether it [wants hints](Source::wants_hints) and, if any does,
//!   computes them with the step's indices and passes them to the hinted
//!   gathers. The cache works on the hints; the read-ahead is still this
//!   window: records are read when their step is claimed, at most the
//!   window's steps before they are delivered, never fetched earlier because
//!   a hint says they come soon. A step at which another shard draws the
//!   record is no next use here: each host's cache keeps what that host
//!   reads next (with the global batch's draws, several ranks' caches kept
//!   records for each other and drifted towards a fixed subset).
//!
//! * Threads versus depth. A worker gathers one whole step (every stream), so
//!   at most `min(threads, depth)` gathers run at a time; threads beyond
//!   `depth` sleep. We do not split a step across workers: a store such as
//!   zring-engine already batches and parallelises the reads of one gather
//!   call, and splitting would only add a join per step. More threads help
//!   when single gathers are latency-bound (cold cache, slow disk) and the
//!   window is deep enough to keep several in flight. Once `min(threads,
//!   depth)` gathers can run at once on as many cores, each worker gathers
//!   alone (its gather request's fan-out is off): the store's pool would
//!   only put more threads than cores on the decoding
//!   (bench-results/engine-notes.md).
//!
//! * Buffers the caller holds. Batches own their buffers ([`crate::Pooled`]), and a
//!   worker that finds its pool empty allocates instead of waiting. Waiting
//!   for the caller to return a buffer could deadlock: a caller may hold any
//!   number of batches while it calls `next()`, and `next()` waits for a
//!   worker. So memory is bounded by `depth` buffer sets plus what the caller
//!   holds, and the pools keep at most [`retain_for`] free sets so a burst of
//!   held batches does not pin its memory forever. In the steady state (the
//!   caller drops or reuses a batch before it needs many more) every buffer
//!   comes from the pool and nothing is allocated for data.
//!
//! * Nothing blocks forever. Each kind of waiter has a condition variable of
//!   its own, so a wakeup cannot go to a thread that cannot use it: workers
//!   wait on one for a step to claim (the window opening, in mode 3 a window
//!   of blocks loaded) or for shutdown; the mode-3 prefetch thread waits on a
//!   second for a worker to claim the step it waits for, and every claim
//!   wakes it; the consumer waits on a third for slot 0 to fill, for
//!   shutdown, or for a worker to have died. (With one variable shared by
//!   workers and the prefetch thread, the consumer's wake-one went to the
//!   prefetch thread at depth 1 and no worker claimed the step it opened.)
//!   A wake-one is used only where every waiter could take the wakeup; a
//!   change that may let several proceed wakes all. Workers never wait
//!   on the caller's buffers or on a full queue (the ring cannot overflow, see
//!   above), so `close()` only has to set the flag, wake both sides and join.
//!   A gather already running inside a source is not interrupted; `close()`
//!   returns once it ends.

use std::any::Any;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use zring_sampler::{Blocks, Mixture, MixtureState, Mode, Sampler, SamplerState, SchedulePiece, SchedulePoint, Shard};

use crate::batch::{Batch, Column};
use crate::config::{Consumed, LoaderConfig, LoaderState, MAX_DEPTH, MAX_THREADS};
use crate::error::Error;
use crate::lookahead::Lookahead;
use crate::pack::{self, Pack, PackColumn, PackSource, Packer, TokenType};
use crate::plan::{self, Plan};
use crate::pool::{Pool, PAGE};
use crate::source::{Fingerprint, Layout, Request, Source};
use crate::stats::{self, GatherStats, LoaderStats, ThreadsCpu};

/// One named input of a loader. Every stream is gathered at the same indices,
/// so record `i` of each stream lines up: an image stream and a label stream
/// of the same length make (image, label) samples.
#[derive(Clone)]
pub struct Stream {
    /// The name of the stream's column in each [`Batch`].
    pub name: String,
    /// Where the stream's records come from.
    pub source: Arc<dyn Source>,
}

impl Stream {
    /// A stream called `name` over `source`.
    pub fn new(name: impl Into<String>, source: Arc<dyn Source>) -> Self {
        Stream { name: name.into(), source }
    }
}

/// One source of a mixture ([`Loader::new_mixture`]): its streams (the
/// same names and layouts in every source) and its weight, any positive
/// number (the weights are normalised to sum to 1).
#[derive(Clone, Debug)]
pub struct MixSource {
    /// The source's share of every batch, relative to the others.
    pub weight: f64,
    /// The source's streams, all of the same length.
    pub streams: Vec<Stream>,
}

impl MixSource {
    /// A source of `weight` over `streams`.
    pub fn new(weight: f64, streams: Vec<Stream>) -> Self {
        MixSource { weight, streams }
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("name", &self.name)
            .field("len", &self.source.len())
            .field("layout", &self.source.layout())
            .finish()
    }
}

/// How many free buffers each pool keeps for a pipeline of `depth`: the
/// `depth` steps in flight, the batch the caller works on, the one it may
/// still hold while asking for the next, and a little slack for callers that
/// keep a few batches alive (an asynchronous device copy, say).
fn retain_for(depth: usize) -> usize {
    depth + 4
}

/// A stream as the workers see it: its layout read once, its pools.
pub(crate) struct StreamCtx {
    name: Arc<str>,
    /// One per mixture source (one for a loader over one set of streams).
    pub(crate) sources: Vec<Arc<dyn Source>>,
    /// What errors call the stream of each source: its name, or
    /// `"<source>/<name>"` in a mixture.
    labels: Vec<Arc<str>>,
    layout: Layout,
    data: Arc<Pool<u8>>,
    /// Offsets for ragged streams; unused for fixed ones.
    offsets: Arc<Pool<u64>>,
}

/// What every worker reads and nothing changes after construction.
pub(crate) struct Ctx {
    plan: Plan,
    shard: Shard,
    shard_len: usize,
    depth: usize,
    /// At most this many data bytes in the steps ahead (see the module docs).
    ahead_bytes: u64,
    /// The data bytes of one step of the fixed-layout streams (saturating).
    fixed_step_bytes: u64,
    /// Whether some stream is ragged, so a step's size is only learned by
    /// gathering it.
    has_ragged: bool,
    /// How iid draws learn when records come again: a window of the steps
    /// ahead (`None` in sequential and cyclic modes, where the sampler
    /// computes it).
    lookahead: Option<Lookahead>,
    /// Whether a worker's gathers may hand work to the store's decode pool:
    /// only while fewer gathers run at once than there are cores.
    fan_out: bool,
    pub(crate) streams: Vec<StreamCtx>,
    indices: Arc<Pool<u64>>,
    /// The source of each row, for a mixture (`None` otherwise).
    sources: Option<Arc<Pool<u32>>>,
    /// Next-use hints, one per index, for steps some stream wants them for.
    hints: Arc<Pool<Option<u64>>>,
    /// A packed loader's packing (`None` for a loader of records).
    pack: Option<Packing>,
}

/// A packed loader's packing: the documents' sampling mode (the plan walks
/// rows in order) and one packer per source, whose three columns are the
/// streams.
struct Packing {
    mode: Mode,
    pack: Pack,
    packers: Vec<Arc<Packer>>,
}

impl Ctx {
    /// How many steps may be claimed ahead of `next_deliver`: `depth`,
    /// narrowed by `ahead_bytes` (module docs, "The window in bytes").
    fn window(&self, ragged_step_max: Option<u64>) -> u64 {
        let depth = self.depth as u64;
        if self.ahead_bytes == u64::MAX {
            return depth;
        }
        let step_bytes = match (self.has_ragged, ragged_step_max) {
            (false, _) => self.fixed_step_bytes,
            (true, Some(ragged)) => self.fixed_step_bytes.saturating_add(ragged),
            (true, None) => return 1,
        };
        if step_bytes == 0 {
            return depth;
        }
        (self.ahead_bytes / step_bytes).clamp(1, depth)
    }
}

/// The part of the pipeline under the lock.
pub(crate) struct State {
    /// Set by close(), Drop and poisoning; workers exit when they see it.
    pub(crate) shutdown: bool,
    /// The next step a worker will claim.
    pub(crate) next_claim: u64,
    /// Mode 3 with a prefetch thread running: workers claim only steps
    /// below `loaded_until`, whose windows are loaded ([`crate::prefetch`]).
    pub(crate) prefetching: bool,
    pub(crate) loaded_until: u64,
    /// The least step a prefetch thread waits to see claimed
    /// ([`crate::prefetch::Windows::wait_for_claim`]; `u64::MAX`: none), so
    /// that a claim wakes the prefetch threads only when one of them can go
    /// on (a mixture has one per source, and a packed loader claims
    /// thousands of steps a second).
    awaited: u64,
    /// The step the consumer's next `next()` returns.
    next_deliver: u64,
    /// Finished steps: slot `k` holds step `next_deliver + k`. Always `depth`
    /// long.
    slots: VecDeque<Option<Result<Batch, Error>>>,
    /// Set when a worker thread died of a panic outside a step's gather.
    died: Option<String>,
    /// The largest data bytes of the ragged streams in one gathered step;
    /// `None` before the first.
    ragged_step_max: Option<u64>,
    gather: GatherStats,
    /// Workers waiting for the window to open.
    idle: u64,
}

/// The pipeline's shared state and the three kinds of waiter on it, each on
/// a condition variable of its own, so that a wakeup meant for one kind
/// never lands on another (see the module docs, "Nothing blocks forever").
pub(crate) struct Shared {
    pub(crate) ctx: Ctx,
    state: Mutex<State>,
    /// Workers wait here for a step to claim (the window opening, a window
    /// of blocks loaded) or for shutdown. Only workers wait here, and any of
    /// them can claim any step, so a change that lets one more step be
    /// claimed wakes one, and a change that may let several wakes all.
    pub(crate) work: Condvar,
    /// The mode-3 prefetch thread waits here for a worker to claim the step
    /// it waits for, or for shutdown; every claim wakes it.
    claimed: Condvar,
    /// The consumer waits here for slot 0, a dead worker or shutdown.
    ready: Condvar,
    /// CPU time of the loader's threads.
    cpu: ThreadsCpu,
}

impl Shared {
    /// The state, even if a thread panicked while holding the lock: every
    /// update leaves it consistent, and a dead worker is reported separately.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn shut_down(&self) {
        self.lock().shutdown = true;
        self.work.notify_all();
        self.claimed.notify_all();
        self.ready.notify_all();
    }
}

/// What the mode-3 prefetch thread walks: one sampler's windows, or each
/// source's of a mixture.
enum Prefetch {
    Single(Sampler),
    Mixture(Mixture),
    /// A packed loader's sources whose documents are read ahead (`None`
    /// for one that is not), and where their rows fall in the steps.
    Packed(Vec<Option<Arc<Packer>>>, PackedPlan),
}

/// Where a packed loader's rows of each source fall in its steps
/// ([`crate::prefetch::PackedSteps`]).
enum PackedPlan {
    /// One source: step `t` is rows `t·B .. (t+1)·B`.
    Single(u64),
    /// A mixture of sources, each row stream its source's.
    Mixture(Box<Mixture>),
}

impl crate::prefetch::PackedSteps for PackedPlan {
    fn first_row(&self, k: usize, step: u64) -> Option<u64> {
        match self {
            PackedPlan::Single(b) => step.checked_mul(*b),
            PackedPlan::Mixture(m) => {
                let mut out = vec![0; m.lengths().len()];
                m.allocation(step.checked_mul(m.batch_len() as u64)?, &mut out).ok()?;
                out.get(k).copied()
            }
        }
    }

    fn step_of_row(&self, k: usize, row: u64) -> Option<u64> {
        match self {
            PackedPlan::Single(b) => Some(row / b),
            PackedPlan::Mixture(m) => m.step_of_source_position(k, row),
        }
    }
}

impl crate::prefetch::Windows for Shared {
    fn wait_for_claim(&self, step: u64) -> bool {
        let mut state = self.lock();
        while !state.shutdown && state.next_claim < step {
            state.awaited = state.awaited.min(step);
            state = self.claimed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        !state.shutdown
    }

    fn load(&self, blocks: &[std::ops::Range<u64>], next: &[Option<u64>]) -> bool {
        self.ctx.streams.iter().flat_map(|s| &s.sources).all(|source| source.prefetch(blocks, next).is_ok())
    }

    fn load_source(&self, source: usize, blocks: &[std::ops::Range<u64>], next: &[Option<u64>]) -> bool {
        self.ctx.streams.iter().filter_map(|s| s.sources.get(source)).all(|s| s.prefetch(blocks, next).is_ok())
    }

    fn load_packed(&self, source: usize, blocks: &[std::ops::Range<u64>]) -> bool {
        let packer = self.ctx.pack.as_ref().and_then(|p| p.packers.get(source));
        packer.is_some_and(|p| p.prefetch(blocks).is_ok())
    }

    fn loaded_until(&self, step: u64) {
        let mut state = self.lock();
        state.loaded_until = state.loaded_until.max(step);
        drop(state);
        self.work.notify_all();
    }

    fn stopped(&self) {
        self.lock().prefetching = false;
        self.work.notify_all();
    }

    fn helper(&self, started: bool) {
        if started {
            self.cpu.helper_started();
        } else {
            self.cpu.helper_ended();
        }
    }
}

/// An endless, step-based loader over named streams.
///
/// Built with [`Loader::new`], it starts `threads` workers that gather up to
/// `depth` steps ahead; [`Loader::next`] returns the batches in step order,
/// blocking until the next one is ready. [`Loader::state`] saves the position
/// for an exact resume; [`Loader::stats`] reports where the time went.
/// [`Loader::close`] (or dropping the loader) stops and joins the workers.
pub struct Loader {
    shared: Arc<Shared>,
    /// What [`Loader::state`] records of the streams' records.
    fingerprints: Fingerprints,
    workers: Vec<JoinHandle<()>>,
    /// The step the next `next()` returns (mirrors `State::next_deliver`).
    next_step: u64,
    /// The step whose failure poisoned the loader.
    poisoned: Option<u64>,
    closed: bool,
    delivered: u64,
    wait: Histogram<u64>,
    /// When the consumer began waiting for the next step, across
    /// [`Loader::next_timeout`] calls that timed out.
    waiting_since: Option<Instant>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("next_step", &self.next_step)
            .field("streams", &self.shared.ctx.streams.len())
            .field("threads", &self.workers.len())
            .field("depth", &self.shared.ctx.depth)
            .field("poisoned", &self.poisoned)
            .field("closed", &self.closed)
            .finish()
    }
}

/// Steps are counted in `u64`; starting at most here leaves 2^63 steps before
/// the counters could overflow.
const MAX_START_STEP: u64 = 1 << 63;

fn check_range(field: &'static str, value: usize, max: usize, expected: &'static str) -> Result<(), Error> {
    if value == 0 || value > max {
        return Err(Error::InvalidConfig { field, value: value as u64, expected });
    }
    Ok(())
}

/// The common length of `streams`, checking they are a set: some streams,
/// no name twice, all of one length.
fn stream_length(streams: &[Stream]) -> Result<u64, Error> {
    if streams.is_empty() {
        return Err(Error::NoStreams);
    }
    let mut names = HashSet::new();
    for s in streams {
        if !names.insert(s.name.as_str()) {
            return Err(Error::DuplicateStream { name: s.name.clone() });
        }
    }
    let lengths: Vec<(String, u64)> = streams.iter().map(|s| (s.name.clone(), s.source.len())).collect();
    let length = lengths[0].1;
    if lengths.iter().any(|(_, l)| *l != length) {
        return Err(Error::LengthMismatch { lengths });
    }
    Ok(length)
}

/// The fingerprints a loader's states carry: those of the records its
/// sampler draws from now and, while a resumed run over streams that grew
/// finishes its cycle over the saved records, the saved ones.
struct Fingerprints {
    before: BTreeMap<String, Fingerprint>,
    now: BTreeMap<String, Fingerprint>,
}

/// Each stream's fingerprint now (by label, for the sources that have one),
/// checked against `saved`: the labels of the streams that grew (the saved
/// records unchanged, more after them), or [`Error::StreamChanged`] for the
/// first stream whose saved records changed.
fn check_fingerprints(
    streams: &[(String, &dyn Source)],
    saved: &BTreeMap<String, Fingerprint>,
) -> Result<(BTreeMap<String, Fingerprint>, Vec<String>), Error> {
    let mut now = BTreeMap::new();
    let mut grown = Vec::new();
    for (label, source) in streams {
        let fail = |source| Error::Fingerprint { stream: label.clone(), source };
        let Some(fp) = source.fingerprint().map_err(fail)? else {
            continue;
        };
        now.insert(label.clone(), fp);
        match saved.get(label) {
            Some(&s) if s == fp => {}
            Some(&s) if s.records < fp.records && source.extends(s).map_err(fail)? => grown.push(label.clone()),
            Some(&s) => return Err(Error::StreamChanged { stream: label.clone(), saved: s, now: fp }),
            None => {}
        }
    }
    Ok((now, grown))
}

/// Depth, threads and start step in range.
fn check_config(config: &LoaderConfig) -> Result<(), Error> {
    check_range("depth", config.depth, MAX_DEPTH, "1 ..= 1024")?;
    check_range("threads", config.threads, MAX_THREADS, "1 ..= 256")?;
    if config.start_step > MAX_START_STEP {
        return Err(Error::InvalidConfig { field: "start_step", value: config.start_step, expected: "at most 2^63" });
    }
    Ok(())
}

/// A mixture as error messages name it.
fn describe(m: &MixtureState) -> String {
    let weights: Vec<String> = m.weights.iter().map(|w| format!("{w:.4}")).collect();
    match &m.schedule {
        None => format!("a mixture of sources of {:?} records, weights [{}]", m.lengths, weights.join(", ")),
        Some(pieces) => {
            format!("a mixture of sources of {:?} records, scheduled in {} piece(s)", m.lengths, pieces.len())
        }
    }
}

/// The mixture of a loader over sources of `lengths` records, with fixed
/// `weights` or `config.schedule`, resuming `config.expect_mixture` if
/// set. A saved run is refused only when its sources' lengths differ (the
/// data changed); under the same weights it goes on as saved, under others
/// it keeps its saved weights up to `config.start_step` and follows the
/// new ones from there (a new `SchedulePiece`; `zring_sampler::Mixture`,
/// "Schedules").
fn mixture_plan(mode: Mode, lengths: &[u64], weights: &[f64], config: &LoaderConfig) -> Result<Mixture, Error> {
    let (b, seed) = (config.batch_size, config.seed);
    // The loader's own weights as a piece, and its mixture when they are
    // fixed (built once: choosing a rounding tree can take a while).
    let (given, mine) = match &config.schedule {
        Some(points) => (SchedulePiece::new(0, lengths.len(), points)?, None),
        None => {
            let m = Mixture::new(mode, lengths, weights, b, seed)?;
            let point = SchedulePoint { step: 0, weights: m.weights().to_vec() };
            (SchedulePiece { from: 0, points: vec![point] }, Some(m))
        }
    };
    let fresh = |mine: Option<Mixture>| match mine {
        Some(m) => Ok(m),
        None => Mixture::scheduled(mode, lengths, vec![given.clone()], b, seed),
    };
    let Some(saved) = &config.expect_mixture else {
        let m = fresh(mine)?;
        if config.expect_length.is_some() {
            return Err(Error::MixtureMismatch {
                saved: "one set of streams".to_owned(),
                loader: describe(&m.state()),
            });
        }
        return Ok(m);
    };
    if saved.lengths != lengths {
        return Err(Error::MixtureMismatch { saved: describe(saved), loader: describe(&fresh(mine)?.state()) });
    }
    let pieces = saved.schedule.clone().unwrap_or_else(|| {
        vec![SchedulePiece { from: 0, points: vec![SchedulePoint { step: 0, weights: saved.weights.clone() }] }]
    });
    let m = if pieces.last().is_some_and(|last| last.same_points(&given)) {
        match saved.schedule {
            None => fresh(mine)?,
            Some(_) => Mixture::scheduled(mode, lengths, pieces, b, seed)?,
        }
    } else {
        let at = config.start_step;
        let mut kept: Vec<SchedulePiece> = pieces.into_iter().filter(|p| p.from < at).collect();
        kept.push(SchedulePiece { from: at, points: given.points.clone() });
        Mixture::scheduled(mode, lengths, kept, b, seed)?
    };
    Ok(m.with_order(saved.order))
}

impl Loader {
    /// Validates the streams and configuration and starts the workers, which
    /// begin gathering `config.start_step` at once.
    ///
    /// With [`LoaderConfig::expect_fingerprints`] (a resumed run), each
    /// stream's fingerprint must be the saved one, or the stream must only
    /// have grown: then the steps up to the end of the cycle under way
    /// ([`zring_sampler::Sampler::cycle_boundary`]) draw from the saved
    /// records as the saved run would have, and the later ones from all of
    /// them. Next-use hints of the cycle under way stop at its end.
    ///
    /// Errors: [`Error::NoStreams`], [`Error::DuplicateStream`],
    /// [`Error::LengthMismatch`] (listing every stream's length),
    /// [`Error::StateMismatch`] (another length, and not every stream shown
    /// to have only grown), [`Error::StreamChanged`], [`Error::CannotGrow`]
    /// (growth that would change the batch length),
    /// [`Error::Fingerprint`], [`Error::InvalidConfig`] for a depth or
    /// thread count out of range, [`Error::Sampler`] for an empty index
    /// space, a zero batch size or a shard that does not fit the batch, and
    /// [`Error::Spawn`] when a thread cannot be started.
    pub fn new(streams: Vec<Stream>, config: LoaderConfig) -> Result<Loader, Error> {
        let length = stream_length(&streams)?;
        let labelled: Vec<(String, &dyn Source)> = streams.iter().map(|s| (s.name.clone(), &*s.source)).collect();
        let (now, grown) = check_fingerprints(&labelled, &config.expect_fingerprints)?;
        if let Some(saved) = &config.expect_mixture {
            return Err(Error::MixtureMismatch { saved: describe(saved), loader: "one set of streams".to_owned() });
        }
        refuse_pack_state(&config)?;
        check_config(&config)?;
        // Mode 3's shape: the configuration's (a saved state's), else what
        // the first stream reads best, its cycles split for this loader's
        // shard count (each shard then reads only its own blocks).
        let blocks = match config.mode {
            Mode::Blocked => {
                let chosen = || {
                    let c = streams.first().and_then(|s| s.source.block_shape()).unwrap_or(Blocks::DEFAULT);
                    Blocks { shards: config.shard.count, ..c }
                };
                let b = match config.blocks {
                    Some(b) if b.block_records > 0 && b.window_blocks > 0 && b.shards > 0 => b,
                    // A field of 0 is chosen as for no shape.
                    Some(b) => {
                        let c = chosen();
                        Blocks {
                            block_records: if b.block_records > 0 { b.block_records } else { c.block_records },
                            window_blocks: if b.window_blocks > 0 { b.window_blocks } else { c.window_blocks },
                            shards: if b.shards > 0 { b.shards } else { c.shards },
                        }
                    }
                    None => chosen(),
                };
                // Unsplit cycles (a state saved before the split, or a shape
                // of 1 shard) serve any shard count, reading whole windows.
                if b.shards > 1 && b.shards != config.shard.count {
                    return Err(Error::ShardCount {
                        saved: b.shards,
                        index: config.shard.index,
                        count: config.shard.count,
                    });
                }
                Some(b)
            }
            _ => None,
        };
        let sampler = |length| {
            Sampler::from_state(&SamplerState {
                blocks,
                mode: config.mode,
                seed: config.seed,
                step: config.start_step,
                length,
                batch_size: config.batch_size,
                origin: config.origin,
            })
        };
        let plan = match config.expect_length {
            Some(expected) if expected != length => {
                // Streams that only grew (every one of them, each shown by
                // its fingerprint) finish the cycle under way over the
                // saved length; any other change of length is refused.
                if grown.len() != streams.len() {
                    return Err(Error::StateMismatch { state_length: expected, stream_length: length });
                }
                let before = sampler(expected)?;
                let boundary = before.cycle_boundary(config.start_step);
                let after = before.grown(length, boundary)?;
                if after.batch_len() != before.batch_len() {
                    return Err(Error::CannotGrow {
                        stream: grown[0].clone(),
                        saved: expected,
                        now: length,
                        why: format!(
                            "the saved run's batches hold all {expected} records (fewer than batch_size {}), and \
                             batches of another length cannot continue it",
                            config.batch_size
                        ),
                    });
                }
                if boundary <= config.start_step {
                    Plan::Single(after)
                } else {
                    Plan::Grown { before, after, boundary }
                }
            }
            _ => Plan::Single(sampler(length)?),
        };
        let fingerprints = Fingerprints { before: config.expect_fingerprints.clone(), now };
        Loader::start(plan, vec![streams], config, fingerprints, None)
    }

    /// A loader over a weighted mixture of sources: every global batch of
    /// `config.batch_size` rows holds each source's share of the rows, rounded
    /// so that the running totals are exact (see `zring_sampler::Mixture`),
    /// each source's rows gathered in one call per stream (then moved to their
    /// interleaved rows) into the same batch buffers, with the same
    /// pipeline, hints, state and errors as [`Loader::new`]. Each row's source is in [`Batch::sources`]; its
    /// index (into that source) in [`Batch::indices`].
    ///
    /// Errors: those of [`Loader::new`] for each source's streams
    /// ([`Error::CannotGrow`] for any source that grew since the state was
    /// saved), [`Error::SourceStreams`] when a source's streams differ from source
    /// 0's in names or layouts, [`Error::MixtureMismatch`] for a state saved
    /// from another mixture, and [`Error::Sampler`] for weights that are not
    /// positive and finite. Any positive weight is taken: a source of under
    /// one row per batch gets its rows over the steps (the rounding tree of
    /// `zring_sampler::Mixture`).
    pub fn new_mixture(sources: Vec<MixSource>, config: LoaderConfig) -> Result<Loader, Error> {
        if sources.is_empty() {
            return Err(zring_sampler::Error::NoSources.into());
        }
        let mut lengths = Vec::with_capacity(sources.len());
        for source in &sources {
            lengths.push(stream_length(&source.streams)?);
        }
        let shape = |streams: &[Stream]| {
            let mut v: Vec<(String, Layout)> = streams.iter().map(|s| (s.name.clone(), s.source.layout())).collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        let want = shape(&sources[0].streams);
        for (k, source) in sources.iter().enumerate().skip(1) {
            let got = shape(&source.streams);
            if got != want {
                let show = |v: &[(String, Layout)]| format!("{v:?}");
                return Err(Error::SourceStreams { source_index: k, got: show(&got), want: show(&want) });
            }
        }
        let labelled: Vec<(String, &dyn Source)> = sources
            .iter()
            .enumerate()
            .flat_map(|(k, source)| source.streams.iter().map(move |s| (format!("{k}/{}", s.name), &*s.source)))
            .collect();
        let (now, grown) = check_fingerprints(&labelled, &config.expect_fingerprints)?;
        if let Some(stream) = grown.into_iter().next() {
            let (saved, now) = (config.expect_fingerprints[&stream].records, now[&stream].records);
            let why = "a mixture resumes only over sources of the lengths it was saved with".to_owned();
            return Err(Error::CannotGrow { stream, saved, now, why });
        }
        refuse_pack_state(&config)?;
        let weights: Vec<f64> = sources.iter().map(|s| s.weight).collect();
        // A saved run goes on in its own row order: one saved before rows
        // were interleaved keeps its grouped batches.
        let mut mixture = mixture_plan(config.mode, &lengths, &weights, &config)?;
        // Mode 3: each source's windows sized by its weight (a saved run
        // takes its own shapes; one saved before they were chosen, the
        // default), so that they last about as many steps and together take
        // the memory of one source's.
        if config.mode == Mode::Blocked {
            let shapes = match &config.expect_mixture {
                Some(saved) => saved.blocks.clone(),
                None => Some(mixture_shapes(&sources, mixture.weights())),
            };
            if let Some(shapes) = shapes {
                mixture = mixture.with_blocks(&shapes)?;
            }
        }
        check_config(&config)?;
        // Every source's streams in source 0's order.
        let order: Vec<String> = sources[0].streams.iter().map(|s| s.name.clone()).collect();
        let by_source = sources
            .into_iter()
            .map(|source| {
                let mut streams = source.streams;
                streams.sort_by_key(|s| order.iter().position(|n| *n == s.name));
                streams
            })
            .collect();
        let fingerprints = Fingerprints { before: BTreeMap::new(), now };
        Loader::start(Plan::Mixture(mixture), by_source, config, fingerprints, None)
    }

    /// A loader of packed token rows over `source`, a ragged source whose
    /// records are documents of little-endian tokens of `pack.token_bytes`:
    /// each batch has the columns `tokens` (`seq_len` tokens a row),
    /// `segment_ids` and `positions` (little-endian `i32`, `seq_len` a row),
    /// then with `pack.labels` `labels` (tokens) and `loss_mask` (`u8`);
    /// see [`PackMode`](crate::PackMode) and the `pack` module docs for what
    /// a row holds. The documents
    /// come in the order of `config.mode` and `config.seed` (a sampler of
    /// batch 1 over the documents); the rows of a step are the next
    /// `batch_size` rows of the packed stream, a shard's a contiguous slice
    /// of them, and [`Batch::indices`] their numbers in the stream.
    ///
    /// Building reads the lengths of every document once (the first cycle's
    /// index). Errors: those of [`Loader::new`], [`Error::InvalidConfig`] for
    /// a `pack` out of range, [`Error::Pack`] for a source that is not
    /// ragged, holds records that are not whole tokens, or no tokens,
    /// [`Error::PackMismatch`] for a state saved with other packing, and
    /// [`Error::CannotGrow`] for a source that grew since the state was
    /// saved.
    pub fn new_packed(source: Arc<dyn Source>, pack: Pack, config: LoaderConfig) -> Result<Loader, Error> {
        let tokens = TokenType { bytes: pack.token_bytes, signed: pack.signed };
        Loader::packed(vec![PackSource { weight: 1.0, source, tokens, name: None }], false, pack, config)
    }

    /// A packed loader over sources whose tokens may be of other integer
    /// types than the delivered ones (`pack.token_bytes`, `pack.signed`):
    /// `sources` give each source's token type (and name), a mixture when
    /// `mixture` (else one source, weight ignored). Tokens are widened
    /// without loss; a token the delivered type cannot hold fails the step
    /// with an error naming the source, the document and the value.
    pub fn new_packed_typed(
        sources: Vec<PackSource>,
        mixture: bool,
        pack: Pack,
        config: LoaderConfig,
    ) -> Result<Loader, Error> {
        if sources.is_empty() {
            return Err(zring_sampler::Error::NoSources.into());
        }
        if !mixture && sources.len() != 1 {
            return Err(Error::InvalidConfig { field: "sources", value: sources.len() as u64, expected: "one source" });
        }
        for s in &sources {
            if ![1, 2, 4, 8].contains(&s.tokens.bytes) {
                let value = s.tokens.bytes;
                return Err(Error::InvalidConfig { field: "token bytes", value, expected: "1, 2, 4 or 8" });
            }
        }
        Loader::packed(sources, mixture, pack, config)
    }

    /// A loader of packed token rows over a weighted mixture of sources, as
    /// [`Loader::new_packed`] for each: every row is `seq_len` tokens of one
    /// source, so the weights count tokens; each source's rows per batch are
    /// those of [`Loader::new_mixture`] over the sources' row streams, and
    /// [`Batch::sources`] names each row's source. Source `k` orders its
    /// documents with seed `config.seed + k`.
    pub fn new_packed_mixture(
        sources: Vec<(f64, Arc<dyn Source>)>,
        pack: Pack,
        config: LoaderConfig,
    ) -> Result<Loader, Error> {
        if sources.is_empty() {
            return Err(zring_sampler::Error::NoSources.into());
        }
        let tokens = TokenType { bytes: pack.token_bytes, signed: pack.signed };
        let sources = sources.into_iter().map(|(weight, source)| PackSource { weight, source, tokens, name: None });
        Loader::packed(sources.collect(), true, pack, config)
    }

    fn packed(sources: Vec<PackSource>, mixture: bool, pack: Pack, config: LoaderConfig) -> Result<Loader, Error> {
        if let Some((field, value, expected)) = pack.check() {
            return Err(Error::InvalidConfig { field, value, expected });
        }
        check_config(&config)?;
        let show = |p: &Pack| {
            let mut s =
                format!("rows of {} tokens ({:?}, pad {}, {}-byte tokens", p.seq_len, p.mode, p.pad_id, p.token_bytes);
            if p.labels {
                s += if p.mask_boundaries { ", labels, boundaries masked" } else { ", labels" };
            }
            if let Some(b) = p.bos_id {
                s += &format!(", bos {b}");
            }
            if let Some(e) = p.eod_id {
                s += &format!(", eod {e}");
            }
            s + ")"
        };
        match (&config.expect_pack, config.expect_length) {
            (Some(saved), _) if !pack.resumes(saved) => {
                return Err(Error::PackMismatch { saved: show(saved), loader: show(&pack) });
            }
            (None, Some(_)) => {
                return Err(Error::PackMismatch { saved: "records, not packed rows".to_owned(), loader: show(&pack) });
            }
            _ => {}
        }
        let label = |k: usize| if mixture { format!("{k}/tokens") } else { "tokens".to_owned() };
        let mut packers = Vec::with_capacity(sources.len());
        let mut by_source = Vec::with_capacity(sources.len());
        let mut weights = Vec::with_capacity(sources.len());
        // Each source's name (its path) where one was given, for errors.
        let named: Vec<Option<String>> = sources.iter().map(|s| s.name.clone()).collect();
        for (k, PackSource { weight, source, tokens, name }) in sources.into_iter().enumerate() {
            let seed = config.seed.wrapping_add(k as u64);
            let mut what = if mixture { format!("source {k}") } else { "the source".to_owned() };
            if let Some(name) = name {
                what = format!("{what} ({name})");
            }
            let name = what;
            let packer = Packer::new(source, pack, config.mode, seed, tokens, name)
                .map_err(|source| Error::Pack { stream: label(k), source })?;
            let packer = Arc::new(packer);
            let streams: Vec<Stream> = PackColumn::all(&packer)
                .into_iter()
                .zip(pack.columns())
                .map(|(column, name)| Stream::new(*name, Arc::new(column) as Arc<dyn Source>))
                .collect();
            packers.push(packer);
            by_source.push(streams);
            weights.push(weight);
        }
        let labelled: Vec<(String, &dyn Source)> =
            by_source.iter().enumerate().map(|(k, streams)| (label(k), &*streams[0].source)).collect();
        let (now, grown) = check_fingerprints(&labelled, &config.expect_fingerprints)?;
        if let Some(stream) = grown.into_iter().next() {
            let (saved, now) = (config.expect_fingerprints[&stream].records, now[&stream].records);
            let why = "a packed run resumes only over the documents it was saved with".to_owned();
            // Named by its path where known, not only by its position.
            let k = (0..named.len()).find(|&k| label(k) == stream);
            let stream = match k.and_then(|k| named[k].as_ref().map(|n| (k, n))) {
                Some((k, name)) if mixture => format!("{name} (source {k}, {stream})"),
                Some((_, name)) => format!("{name} ({stream})"),
                None => stream,
            };
            return Err(Error::CannotGrow { stream, saved, now, why });
        }
        let plan = if mixture {
            let lengths = vec![pack::PACKED_ROWS; weights.len()];
            Plan::Mixture(mixture_plan(Mode::Sequential, &lengths, &weights, &config)?)
        } else {
            if let Some(saved) = &config.expect_mixture {
                let loader = "one packed source".to_owned();
                return Err(Error::MixtureMismatch { saved: describe(saved), loader });
            }
            Plan::Single(Sampler::from_state(&SamplerState {
                mode: Mode::Sequential,
                seed: config.seed,
                step: config.start_step,
                length: pack::PACKED_ROWS,
                batch_size: config.batch_size,
                origin: 0,
                blocks: None,
            })?)
        };
        let fingerprints = Fingerprints { before: BTreeMap::new(), now };
        let packing = Packing { mode: config.mode, pack, packers };
        Loader::start(plan, by_source, config, fingerprints, Some(packing))
    }

    /// Starts the workers over `plan`; `sources[k]` are source `k`'s streams,
    /// in the same order for every source (one source unless a mixture).
    fn start(
        plan: Plan,
        sources: Vec<Vec<Stream>>,
        config: LoaderConfig,
        fingerprints: Fingerprints,
        pack: Option<Packing>,
    ) -> Result<Loader, Error> {
        let shard_len = plan.shard_len(config.shard)?;
        let mixture = matches!(plan, Plan::Mixture(_));
        let mut per_stream: Vec<Vec<Stream>> = Vec::new();
        for streams in sources {
            for (i, stream) in streams.into_iter().enumerate() {
                if per_stream.len() <= i {
                    per_stream.push(Vec::new());
                }
                per_stream[i].push(stream);
            }
        }

        let retain = retain_for(config.depth);
        // Pre-allocate what the steady state uses: `depth` steps in flight
        // plus the batch the caller holds. Ragged buffers start empty and
        // grow to fit.
        let prefill = config.depth + 1;
        let streams: Vec<StreamCtx> = per_stream
            .into_iter()
            .map(|set| {
                let layout = set[0].source.layout();
                let (data, offsets) = match layout {
                    Layout::Fixed { record_bytes } => {
                        let bytes = shard_len.saturating_mul(record_bytes);
                        (Pool::aligned(retain, prefill, bytes, PAGE), Pool::new(0, 0, 0))
                    }
                    Layout::Ragged => (Pool::aligned(retain, 0, 0, PAGE), Pool::new(retain, prefill, shard_len + 1)),
                };
                let name: Arc<str> = Arc::from(set[0].name.as_str());
                let labels = (0..set.len())
                    .map(|k| if mixture { Arc::from(format!("{k}/{name}")) } else { Arc::clone(&name) })
                    .collect();
                let sources = set.into_iter().map(|s| s.source).collect();
                StreamCtx { name, sources, labels, layout, data, offsets }
            })
            .collect();

        let fixed_step_bytes = streams
            .iter()
            .filter_map(|s| match s.layout {
                Layout::Fixed { record_bytes } => Some((shard_len as u64).saturating_mul(record_bytes as u64)),
                Layout::Ragged => None,
            })
            .fold(0u64, u64::saturating_add);
        let has_ragged = streams.iter().any(|s| s.layout == Layout::Ragged);

        let mut slots = VecDeque::with_capacity(config.depth);
        slots.resize_with(config.depth, || None);
        // Mode 3 over one set of streams: a thread loads each window ahead.
        let blocked = match &plan {
            Plan::Single(s) if s.state().mode == Mode::Blocked => Some(Prefetch::Single(s.clone())),
            // A mixture's sources read their windows ahead too, each its own.
            Plan::Mixture(m) if m.mode() == Mode::Blocked && pack.is_none() => Some(Prefetch::Mixture(m.clone())),
            // So do packed sources' documents in mode 3.
            Plan::Single(_) | Plan::Mixture(_) => {
                pack.as_ref().and_then(|p| packed_read_ahead(p, config.shard)).map(|packers| {
                    let steps = match &plan {
                        Plan::Mixture(m) => PackedPlan::Mixture(Box::new(m.clone())),
                        _ => PackedPlan::Single(config.batch_size),
                    };
                    Prefetch::Packed(packers, steps)
                })
            }
            Plan::Grown { .. } => None,
        };
        let lookahead = match plan.mode() {
            // Workers run at most `depth + threads` steps apart.
            Mode::Iid => Some(Lookahead::new(&plan, config.shard, (config.depth + config.threads) as u64)?),
            _ => None,
        };
        let shared = Arc::new(Shared {
            ctx: Ctx {
                plan,
                shard: config.shard,
                shard_len,
                depth: config.depth,
                ahead_bytes: config.ahead_bytes,
                fixed_step_bytes,
                has_ragged,
                lookahead,
                fan_out: gathers_leave_cores_idle(config.threads, config.depth),
                streams,
                indices: Pool::new(retain, prefill, shard_len),
                sources: mixture.then(|| Pool::new(retain, prefill, shard_len)),
                // Filled on first use: most stores never want hints.
                hints: Pool::new(retain, 0, 0),
                pack,
            },
            state: Mutex::new(State {
                shutdown: false,
                next_claim: config.start_step,
                prefetching: blocked.is_some(),
                awaited: u64::MAX,
                loaded_until: config.start_step,
                next_deliver: config.start_step,
                slots,
                died: None,
                ragged_step_max: None,
                gather: GatherStats::new(),
                idle: 0,
            }),
            work: Condvar::new(),
            claimed: Condvar::new(),
            ready: Condvar::new(),
            cpu: ThreadsCpu::new(config.threads),
        });

        let mut workers = Vec::with_capacity(config.threads);
        for i in 0..config.threads {
            let worker_shared = Arc::clone(&shared);
            let spawned =
                thread::Builder::new().name(format!("zring-loader-{i}")).spawn(move || worker(&worker_shared, i));
            match spawned {
                Ok(handle) => workers.push(handle),
                Err(e) => {
                    shared.shut_down();
                    for handle in workers {
                        // A worker's panic is already recorded in the state;
                        // there is nothing more to report while failing.
                        let _ = handle.join();
                    }
                    return Err(Error::Spawn(e));
                }
            }
        }

        if let Some(prefetch) = blocked {
            let prefetch_shared = Arc::clone(&shared);
            let (shard, start) = (config.shard, config.start_step);
            let spawned = thread::Builder::new().name("zring-prefetch".to_owned()).spawn(move || {
                prefetch_shared.cpu.window_started();
                match prefetch {
                    Prefetch::Single(sampler) => crate::prefetch::run(&*prefetch_shared, &sampler, shard, start),
                    Prefetch::Mixture(mixture) => crate::prefetch::run_mixture(&*prefetch_shared, &mixture, start),
                    Prefetch::Packed(packers, plan) => {
                        let packers: Vec<Option<&Packer>> = packers.iter().map(Option::as_deref).collect();
                        crate::prefetch::run_packed(&*prefetch_shared, &packers, &plan, start);
                    }
                }
                prefetch_shared.cpu.window_ended();
            });
            match spawned {
                Ok(handle) => workers.push(handle),
                // Without the thread the gathers read record by record.
                Err(_) => {
                    shared.lock().prefetching = false;
                    shared.work.notify_all();
                }
            }
        }

        Ok(Loader {
            shared,
            fingerprints,
            workers,
            next_step: config.start_step,
            poisoned: None,
            closed: false,
            delivered: 0,
            wait: stats::histogram(),
            waiting_since: None,
        })
    }

    /// The batch of the next step, blocking until it is gathered.
    ///
    /// Steps come strictly in order. If gathering this step failed, the
    /// failure is returned ([`Error::Gather`], [`Error::Panicked`], ...) and
    /// the loader is poisoned: later calls return [`Error::Poisoned`]. After
    /// [`Loader::close`] this returns [`Error::Closed`].
    #[expect(
        clippy::should_implement_trait,
        reason = "the loader never ends and every call can fail, so Iterator's Option would only add an always-Some layer"
    )]
    pub fn next(&mut self) -> Result<Batch, Error> {
        Ok(self.next_until(None)?.expect("waits without a deadline"))
    }

    /// [`Loader::next`], giving up after `timeout` with `Ok(None)` if the
    /// step is not ready by then; a later call waits for the same step. A
    /// caller that must stay responsive (to signals, say) waits in slices:
    /// the wait statistics count the slices up to a delivery as one wait.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Batch>, Error> {
        self.next_until(Some(Instant::now() + timeout))
    }

    fn next_until(&mut self, deadline: Option<Instant>) -> Result<Option<Batch>, Error> {
        if let Some(step) = self.poisoned {
            return Err(Error::Poisoned { step });
        }
        if self.closed {
            return Err(Error::Closed);
        }
        let started = *self.waiting_since.get_or_insert_with(Instant::now);
        let shared = &*self.shared;
        let mut state = shared.lock();
        let outcome = loop {
            if let Some(outcome) = state.slots[0].take() {
                state.slots.pop_front();
                state.slots.push_back(None);
                state.next_deliver += 1;
                break outcome;
            }
            if let Some(message) = &state.died {
                break Err(Error::Panicked { step: None, stream: None, message: message.clone() });
            }
            if state.shutdown {
                // Only close() and poisoning set it, and both are seen above;
                // kept so a future path cannot leave the consumer waiting.
                break Err(Error::Closed);
            }
            state = match deadline {
                None => shared.ready.wait(state).unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    shared.ready.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0
                }
            };
        };
        drop(state);
        self.waiting_since = None;
        stats::record(&mut self.wait, started.elapsed());
        match outcome {
            Ok(batch) => {
                // One more step may be claimed: one worker (only workers
                // wait on `work`, and any of them can claim it).
                shared.work.notify_one();
                self.next_step += 1;
                self.delivered += 1;
                Ok(Some(batch))
            }
            Err(e) => {
                self.poisoned = Some(self.next_step);
                shared.shut_down();
                Err(e)
            }
        }
    }

    /// The state that resumes this run exactly: its step is the step of the
    /// batch the next [`Loader::next`] returns. After a failure it is the
    /// failed step, so a loader rebuilt from it retries that step.
    pub fn state(&self) -> LoaderState {
        self.state_at(self.next_step)
    }

    /// The state that resumes this run at `step` (delivered or not): what
    /// [`Loader::state`] returns once `step` is the next to deliver. A
    /// consumer that hands steps on to workers of its own (the Python
    /// loader's transform threads) saves the step its caller reached.
    pub fn state_at(&self, step: u64) -> LoaderState {
        let ctx = &self.shared.ctx;
        let (mut sampler, mixture) = ctx.plan.state(step);
        if let Some(p) = &ctx.pack {
            sampler.mode = p.mode;
        }
        let f = &self.fingerprints;
        let fingerprints = if ctx.plan.before_growth(step) { f.before.clone() } else { f.now.clone() };
        let consumed = self.consumed(step);
        LoaderState {
            sampler,
            shard: ctx.shard,
            mixture,
            fingerprints,
            pack: ctx.pack.as_ref().map(|p| p.pack),
            consumed,
        }
    }

    /// What the run consumed of each source before `step` (all ranks'
    /// rows; [`Consumed`]), a function of the step: a mixture's rows of each
    /// source are its allocation of the `step * B` rows so far. A packed
    /// source's documents are counted from the lengths near the row (read
    /// already by a run that got there); should that read fail, they are
    /// left out.
    pub fn consumed(&self, step: u64) -> Vec<Consumed> {
        let ctx = &self.shared.ctx;
        let (rows, lengths): (Vec<u64>, Vec<u64>) = match &ctx.plan {
            Plan::Mixture(m) => {
                let mut out = vec![0; m.lengths().len()];
                let _ = m.allocation(step.saturating_mul(m.batch_len() as u64), &mut out);
                (out, m.lengths().to_vec())
            }
            plan => {
                let b = plan.shard_len(Shard::ALL).unwrap_or(0) as u64;
                (vec![step.saturating_mul(b)], vec![plan.length()])
            }
        };
        rows.iter()
            .enumerate()
            .map(|(k, &r)| match &ctx.pack {
                Some(p) => {
                    let docs = p.packers.get(k).and_then(|packer| packer.documents_before(r).ok());
                    Consumed {
                        rows: r,
                        records: None,
                        documents: docs.map(|d| d.0),
                        tokens: Some(r.saturating_mul(p.pack.seq_len)),
                        epochs: docs.map_or(0.0, |(d, n)| d as f64 / n.max(1) as f64),
                    }
                }
                None => Consumed {
                    rows: r,
                    records: Some(r),
                    documents: None,
                    tokens: None,
                    epochs: r as f64 / lengths[k].max(1) as f64,
                },
            })
            .collect()
    }

    /// The step of the batch the next [`Loader::next`] returns.
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// The number of records per batch of this loader's shard.
    pub fn batch_len(&self) -> usize {
        self.shared.ctx.shard_len
    }

    /// A snapshot of the pipeline's counters and latency percentiles.
    pub fn stats(&self) -> LoaderStats {
        let ctx = &self.shared.ctx;
        let allocated = ctx.indices.allocations()
            + ctx.sources.as_ref().map_or(0, |p| p.allocations())
            + ctx.hints.allocations()
            + ctx.streams.iter().map(|s| s.data.allocations() + s.offsets.allocations()).sum::<u64>();
        let state = self.shared.lock();
        // Waiting workers count as idle only while there is nothing to claim
        // (a worker woken for a step it has not claimed yet is not idle).
        let window_end = state.next_deliver.saturating_add(ctx.window(state.ragged_step_max));
        let idle = if state.next_claim >= window_end { state.idle } else { 0 };
        let mut stats = stats::snapshot(self.delivered, allocated, &self.wait, &state.gather, idle, &self.shared.cpu);
        drop(state);
        stats.consumed = self.consumed(self.next_step);
        stats
    }

    /// Stops the workers and waits for them to exit. Batches already returned
    /// stay valid. Returns [`Error::Panicked`] if a worker thread died of a
    /// panic that was not already reported; calling it again does nothing.
    pub fn close(&mut self) -> Result<(), Error> {
        self.closed = true;
        self.shared.shut_down();
        let mut result = Ok(());
        for handle in self.workers.drain(..) {
            if let Err(payload) = handle.join() {
                if result.is_ok() && self.poisoned.is_none() {
                    result =
                        Err(Error::Panicked { step: None, stream: None, message: panic_message(payload.as_ref()) });
                }
            }
        }
        result
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        // A worker's death has nowhere to go from a destructor; close() is
        // the way to observe it.
        let _ = self.close();
    }
}

/// Marks the pipeline dead if its worker unwinds, so the consumer gets an
/// error instead of waiting for a step that will never come.
struct DeathWatch<'a>(&'a Shared);

impl Drop for DeathWatch<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            let mut state = self.0.lock();
            state.died.get_or_insert_with(|| "a gather thread died".to_owned());
            drop(state);
            self.0.ready.notify_all();
        }
    }
}

fn worker(shared: &Shared, i: usize) {
    let _watch = DeathWatch(shared);
    loop {
        let step = {
            let mut state = shared.lock();
            loop {
                if state.shutdown {
                    shared.cpu.publish(i);
                    return;
                }
                let window_end = state.next_deliver.saturating_add(shared.ctx.window(state.ragged_step_max));
                let loaded = !state.prefetching || state.next_claim < state.loaded_until;
                if state.next_claim < window_end && loaded {
                    let step = state.next_claim;
                    state.next_claim += 1;
                    if state.next_claim >= state.awaited {
                        // A prefetch thread waits for this claim to load
                        // the next window, which the workers may wait for
                        // in turn. The others waiting wait on again.
                        state.awaited = u64::MAX;
                        shared.claimed.notify_all();
                    }
                    break step;
                }
                state.idle += 1;
                state = shared.work.wait(state).unwrap_or_else(PoisonError::into_inner);
                state.idle -= 1;
            }
        };

        let started = Instant::now();
        let mut current_stream: Option<Arc<str>> = None;
        let gathered = panic::catch_unwind(AssertUnwindSafe(|| gather_step(&shared.ctx, step, &mut current_stream)));
        let elapsed = started.elapsed();
        shared.cpu.publish(i);
        let outcome = match gathered {
            Ok(outcome) => outcome,
            Err(payload) => Err(Error::Panicked {
                step: Some(step),
                stream: current_stream.map(|s| s.to_string()),
                message: panic_message(payload.as_ref()),
            }),
        };

        let mut state = shared.lock();
        let mut widened = false;
        if let Ok(batch) = &outcome {
            let g = &mut state.gather;
            g.steps += 1;
            g.records += (batch.indices.len() * batch.columns.len()) as u64;
            g.bytes += batch.columns.iter().map(|c| c.data.len() as u64).sum::<u64>();
            stats::record(&mut g.time, elapsed);
            if shared.ctx.has_ragged {
                let ragged: u64 =
                    batch.columns.iter().filter(|c| c.offsets.is_some()).map(|c| c.data.len() as u64).sum();
                let before = shared.ctx.window(state.ragged_step_max);
                let max = state.ragged_step_max.map_or(ragged, |m| m.max(ragged));
                state.ragged_step_max = Some(max);
                widened = shared.ctx.window(state.ragged_step_max) > before;
            }
        }
        // The window guarantees next_deliver <= step < next_deliver + depth.
        let slot = (step - state.next_deliver) as usize;
        let is_next = slot == 0;
        state.slots[slot] = Some(outcome);
        drop(state);
        if is_next {
            shared.ready.notify_one();
        }
        if widened {
            shared.work.notify_all();
        }
    }
}

/// Whether `min(threads, depth)` concurrent gathers leave cores for a
/// store's decode pool to use. (`ZRING_LOADER_FAN_OUT=0|1` decides instead.)
fn gathers_leave_cores_idle(threads: usize, depth: usize) -> bool {
    if let Some(v) = std::env::var_os("ZRING_LOADER_FAN_OUT") {
        return v != "0";
    }
    fan_out_for(threads, depth, thread::available_parallelism().map_or(1, std::num::NonZero::get))
}

fn fan_out_for(threads: usize, depth: usize, cores: usize) -> bool {
    threads.min(depth) < cores
}

/// Gathers every stream of `step`. `current` names the stream being gathered,
/// so a panic in a source can be attributed to it.
///
/// A mixture's rows are gathered with one call per source and stream
/// (below).
fn gather_step(ctx: &Ctx, step: u64, current: &mut Option<Arc<str>>) -> Result<Batch, Error> {
    // Asked once per step: a store's read policy may change while it runs.
    let mut wants = Vec::with_capacity(ctx.streams.len());
    for stream in &ctx.streams {
        let mut per_source = Vec::with_capacity(stream.sources.len());
        for (source, label) in stream.sources.iter().zip(&stream.labels) {
            *current = Some(Arc::clone(label));
            per_source.push(source.wants_hints());
        }
        wants.push(per_source);
    }
    let mut indices = ctx.indices.take(ctx.shard_len);
    let mut sources = ctx.sources.as_ref().map(|p| p.take(ctx.shard_len));
    let rows_sources: &mut [u32] = sources.as_deref_mut().unwrap_or(&mut []);
    let hints = if wants.iter().flatten().any(|&w| w) {
        let blocked = ctx.plan.mode() == Mode::Blocked;
        let mut next = ctx.hints.take(ctx.shard_len);
        match &ctx.lookahead {
            Some(look) => {
                ctx.plan.fill(step, ctx.shard, rows_sources, &mut indices, None)?;
                look.fill(&ctx.plan, step, rows_sources, &indices, &mut next)?;
            }
            // Mode 3 draws a record again only in its (source's) next cycle,
            // far past the windows read ahead: "none in sight" ranks it as
            // the prefetch's window ranks what it loaded, and spares
            // inverting the permutation for every row (a mixture: searching
            // its rows, several times the cost of the rows,
            // bench-results/engine-notes.md).
            None if blocked => {
                ctx.plan.fill(step, ctx.shard, rows_sources, &mut indices, None)?;
                next.fill(None);
            }
            None => ctx.plan.fill(step, ctx.shard, rows_sources, &mut indices, Some(&mut next))?,
        }
        Some(next)
    } else {
        ctx.plan.fill(step, ctx.shard, rows_sources, &mut indices, None)?;
        None
    };
    // Each source's rows are gathered in one call per stream. A mixture's
    // rows are interleaved (`zring_sampler::RowOrder`): each source's call
    // then puts its records straight into their rows' slots
    // ([`Slots::At`](crate::Slots::At)).
    let grouping = match &sources {
        Some(rows) => plan::Grouping::new(rows),
        None => plan::Grouping::single(indices.len()),
    };
    let grouped_indices: Option<Vec<u64>> = grouping.order.as_ref().map(|o| o.iter().map(|&r| indices[r]).collect());
    let gidx: &[u64] = grouped_indices.as_deref().unwrap_or(&indices);
    if let Some(packing) = &ctx.pack {
        let columns = match &grouping.order {
            None => pack_step(ctx, packing, step, &indices, &grouping.runs, current)?,
            Some(order) => {
                // Packed grouped by source (each source's rows of the shard
                // are one stretch of its row stream), then each row moved to
                // its interleaved place.
                let grouped = pack_step(ctx, packing, step, gidx, &grouping.runs, current)?;
                grouped
                    .into_iter()
                    .zip(&ctx.streams)
                    .map(|(column, stream)| {
                        let width = column.data.len() / indices.len().max(1);
                        let mut data = stream.data.take(column.data.len());
                        for (slot, &row) in order.iter().enumerate() {
                            data[row * width..][..width].copy_from_slice(&column.data[slot * width..][..width]);
                        }
                        Column { name: column.name, data, offsets: None }
                    })
                    .collect()
            }
        };
        return Ok(Batch { step, indices, sources, columns });
    }
    // A cyclic plan's hints all lie in the next cycle (each record comes
    // once a cycle): the sources learn where it starts.
    let cycle_end = match &ctx.plan {
        Plan::Single(s) if hints.is_some() && s.state().mode == Mode::Cyclic => Some(s.cycle_boundary(step + 1)),
        _ => None,
    };
    let grouped_hints: Option<Vec<Option<u64>>> =
        grouping.order.as_ref().zip(hints.as_deref()).map(|(o, h)| o.iter().map(|&r| h[r]).collect());
    let ghints: Option<&[Option<u64>]> = grouped_hints.as_deref().or(hints.as_deref());
    let runs = &grouping.runs;
    let mut starts = Vec::new();
    let mut columns = Vec::with_capacity(ctx.streams.len());
    for (stream, wants) in ctx.streams.iter().zip(&wants) {
        let gather_err = |k: usize| {
            let label = stream.labels[k].to_string();
            move |source| Error::Gather { step, stream: label, source }
        };
        // One view of each source for the whole step: a ragged column's
        // lengths and its records come from the same records.
        let mut views = Vec::with_capacity(stream.sources.len());
        for (k, source) in stream.sources.iter().enumerate() {
            *current = Some(Arc::clone(&stream.labels[k]));
            views.push(source.view().map_err(gather_err(k))?);
        }
        let views: Vec<&dyn Source> =
            views.iter().zip(&stream.sources).map(|(v, s)| v.as_deref().unwrap_or(&**s)).collect();
        let too_large = |bytes: u128| Error::BatchTooLarge { step, stream: stream.name.to_string(), bytes };
        let column = match stream.layout {
            Layout::Fixed { record_bytes } => {
                let bytes = indices
                    .len()
                    .checked_mul(record_bytes)
                    .ok_or_else(|| too_large(indices.len() as u128 * record_bytes as u128))?;
                let mut data = stream.data.take(bytes);
                for (k, rows) in runs {
                    let (k, rows) = (*k, rows.clone());
                    *current = Some(Arc::clone(&stream.labels[k]));
                    let source = views[k];
                    let idx = &gidx[rows.clone()];
                    let next = ghints.filter(|_| wants[k]).map(|h| &h[rows.clone()]);
                    let next = next.unwrap_or(&[]);
                    match &grouping.order {
                        None => {
                            let dst = &mut data[rows.start * record_bytes..rows.end * record_bytes];
                            source.gather(
                                &Request::packed(idx).hints(next).cycle_end(cycle_end).fan_out(ctx.fan_out),
                                dst,
                            )
                        }
                        Some(order) => {
                            starts.clear();
                            starts.extend(order[rows].iter().map(|&r| (r * record_bytes) as u64));
                            source.gather(
                                &Request::at(idx, &starts).hints(next).cycle_end(cycle_end).fan_out(ctx.fan_out),
                                &mut data,
                            )
                        }
                    }
                    .map_err(gather_err(k))?;
                }
                Column { name: Arc::clone(&stream.name), data, offsets: None }
            }
            Layout::Ragged => {
                // Lengths in grouped order (one call per source), then put in
                // row order: the batch's offsets.
                let mut glens = vec![0u64; indices.len()];
                for (k, rows) in runs {
                    *current = Some(Arc::clone(&stream.labels[*k]));
                    views[*k].lengths(&gidx[rows.clone()], &mut glens[rows.clone()]).map_err(gather_err(*k))?;
                }
                let mut offsets = stream.offsets.take(indices.len() + 1);
                offsets[0] = 0;
                match &grouping.order {
                    None => offsets[1..].copy_from_slice(&glens),
                    Some(order) => {
                        for (slot, &row) in order.iter().enumerate() {
                            offsets[row + 1] = glens[slot];
                        }
                    }
                }
                let total = prefix_sum(&mut offsets[1..])
                    .ok_or_else(|| too_large(glens.iter().map(|&l| u128::from(l)).sum::<u128>()))?;
                let bytes = usize::try_from(total).map_err(|_| too_large(u128::from(total)))?;
                let mut data = stream.data.take(bytes);
                let mut rebased = Vec::new();
                for (k, rows) in runs {
                    let (k, rows) = (*k, rows.clone());
                    *current = Some(Arc::clone(&stream.labels[k]));
                    let source = views[k];
                    let idx = &gidx[rows.clone()];
                    let next = ghints.filter(|_| wants[k]).map_or(&[][..], |h| &h[rows.clone()]);
                    match &grouping.order {
                        None => {
                            // Lossless: the offsets are at most `bytes`, a usize.
                            let (a, z) = (offsets[rows.start] as usize, offsets[rows.end] as usize);
                            let dst = &mut data[a..z];
                            // A source sees offsets from the start of its run.
                            let offs = if a == 0 {
                                &offsets[rows.start..=rows.end]
                            } else {
                                rebased.clear();
                                rebased.extend(offsets[rows.start..=rows.end].iter().map(|&o| o - a as u64));
                                &rebased[..]
                            };
                            source.gather(
                                &Request::ragged(idx, offs).hints(next).cycle_end(cycle_end).fan_out(ctx.fan_out),
                                dst,
                            )
                        }
                        Some(order) => {
                            starts.clear();
                            starts.extend(order[rows].iter().map(|&r| offsets[r]));
                            source.gather(
                                &Request::at(idx, &starts).hints(next).cycle_end(cycle_end).fan_out(ctx.fan_out),
                                &mut data,
                            )
                        }
                    }
                    .map_err(gather_err(k))?;
                }
                Column { name: Arc::clone(&stream.name), data, offsets: Some(offsets) }
            }
        };
        columns.push(column);
    }
    *current = None;
    Ok(Batch { step, indices, sources, columns })
}

/// Mode 3 shapes for a mixture's sources: each source's own blocks (what its
/// first stream reads best, about 1 MiB each), and a share of the windows'
/// blocks by its weight. A store's shape has a window of a quarter of its
/// record cache, and the stores share the cache: their windows together are
/// what one store's would be alone.
fn mixture_shapes(sources: &[MixSource], weights: &[f64]) -> Vec<Blocks> {
    let shapes: Vec<Blocks> = sources
        .iter()
        .map(|source| source.streams.first().and_then(|s| s.source.block_shape()).unwrap_or(Blocks::DEFAULT))
        .collect();
    let total: u64 = shapes.iter().map(|b| b.window_blocks).fold(0, u64::saturating_add);
    shapes
        .iter()
        .zip(weights)
        .map(|(c, &w)| {
            // Lossless enough: a window of at most 2^53 blocks.
            let window_blocks = ((total as f64 * w).round() as u64).max(1);
            Blocks { window_blocks, shards: 1, ..*c }
        })
        .collect()
}

/// The packers whose document windows a packed loader reads ahead
/// ([`crate::prefetch::run_packed`], which also checks that a window fits
/// its source's memory), one per source (`None` for a source that is not):
/// those of a loader in mode 3 over a source that reads blocks
/// ([`Source::block_shape`]), when the loader reads every row of
/// each batch (one shard: a shard's rows of a window are spread over all of
/// its blocks, so it would read the whole window for its share). `None`
/// when no source is: the gathers read each document themselves.
fn packed_read_ahead(packing: &Packing, shard: Shard) -> Option<Vec<Option<Arc<Packer>>>> {
    if packing.mode != Mode::Blocked || shard.count != 1 {
        return None;
    }
    let packers: Vec<Option<Arc<Packer>>> =
        packing.packers.iter().map(|p| p.source_shape().is_some().then(|| Arc::clone(p))).collect();
    packers.iter().any(Option::is_some).then_some(packers)
}

/// A loader of records refuses a state saved by a packed loader.
fn refuse_pack_state(config: &LoaderConfig) -> Result<(), Error> {
    match &config.expect_pack {
        Some(p) => Err(Error::PackMismatch {
            saved: format!("rows of {} packed tokens", p.seq_len),
            loader: "a loader of records".to_owned(),
        }),
        None => Ok(()),
    }
}

/// A packed step: the three columns of the rows in `indices`, each run of
/// one source's rows filled by its packer in one call.
fn pack_step(
    ctx: &Ctx,
    packing: &Packing,
    step: u64,
    indices: &[u64],
    runs: &[(usize, std::ops::Range<usize>)],
    current: &mut Option<Arc<str>>,
) -> Result<Vec<Column>, Error> {
    let widths = packing.pack.row_bytes();
    let mut data: Vec<_> = ctx.streams.iter().zip(&widths).map(|(s, w)| s.data.take(indices.len() * w)).collect();
    for (k, rows) in runs {
        let label = &ctx.streams[0].labels[*k];
        *current = Some(Arc::clone(label));
        let mut bufs: Vec<&mut [u8]> =
            data.iter_mut().zip(&widths).map(|(d, w)| &mut d[rows.start * w..rows.end * w]).collect();
        packing.packers[*k].fill(&indices[rows.clone()], &mut bufs, ctx.fan_out).map_err(|source| Error::Gather {
            step,
            stream: label.to_string(),
            source,
        })?;
    }
    *current = None;
    Ok(ctx
        .streams
        .iter()
        .zip(data)
        .map(|(s, data)| Column { name: Arc::clone(&s.name), data, offsets: None })
        .collect())
}

/// Turns lengths into end offsets in place; `None` if the total overflows.
fn prefix_sum(lengths: &mut [u64]) -> Option<u64> {
    let mut total = 0u64;
    for l in lengths {
        total = total.checked_add(*l)?;
        *l = total;
    }
    Some(total)
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Python binding moves loaders and batches across threads (the GIL
    /// is released around `next()`) and wraps buffers in pyclasses, which
    /// must be `Send + Sync`.
    #[test]
    fn handles_are_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Loader>();
        send_sync::<Batch>();
        send_sync::<Column>();
        send_sync::<crate::PooledBuf>();
        send_sync::<crate::Pooled<u64>>();
        send_sync::<Error>();
        send_sync::<LoaderState>();
    }

    #[test]
    fn workers_lend_the_pool_only_while_cores_would_idle() {
        assert!(fan_out_for(1, 4, 2), "one gather at a time leaves a core free");
        assert!(fan_out_for(4, 1, 2), "depth 1 runs one gather at a time");
        assert!(!fan_out_for(2, 4, 2), "two gathers on two cores");
        assert!(!fan_out_for(8, 8, 4));
        assert!(fan_out_for(2, 2, 4));
    }

    #[test]
    fn prefix_sum_turns_lengths_into_ends() {
        let mut v = [3, 0, 4, 1];
        assert_eq!(prefix_sum(&mut v), Some(8));
        assert_eq!(v, [3, 3, 7, 8]);
        assert_eq!(prefix_sum(&mut [u64::MAX, 1]), None);
    }
}
