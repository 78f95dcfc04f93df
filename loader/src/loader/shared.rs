//! What the workers share: the context fixed at construction, the state
//! under the pipeline's lock and the condition variables its waiters wait
//! on (module docs of [`crate::loader`]), and what the mode-3 prefetch
//! thread walks.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use zring_sampler::{Mixture, Mode, Sampler, Shard};

use crate::batch::Batch;
use crate::error::Error;
use crate::lookahead::Lookahead;
use crate::pack::{Pack, Packer};
use crate::plan::Plan;
use crate::pool::Pool;
use crate::source::{Layout, Source};
use crate::stats::{GatherStats, ThreadsCpu};

/// How many free buffers each pool keeps for a pipeline of `depth`: the
/// `depth` steps in flight, the batch the caller works on, the one it may
/// still hold while asking for the next, and a little slack for callers that
/// keep a few batches alive (an asynchronous device copy, say).
pub(super) fn retain_for(depth: usize) -> usize {
    depth + 4
}

/// A stream as the workers see it: its layout read once, its pools.
pub(crate) struct StreamCtx {
    pub(super) name: Arc<str>,
    /// One per mixture source (one for a loader over one set of streams).
    pub(crate) sources: Vec<Arc<dyn Source>>,
    /// What errors call the stream of each source: its name, or
    /// `"<source>/<name>"` in a mixture.
    pub(super) labels: Vec<Arc<str>>,
    pub(super) layout: Layout,
    pub(super) data: Arc<Pool<u8>>,
    /// Offsets for ragged streams; unused for fixed ones.
    pub(super) offsets: Arc<Pool<u64>>,
}

/// What every worker reads and nothing changes after construction.
pub(crate) struct Ctx {
    pub(super) plan: Plan,
    pub(super) shard: Shard,
    pub(super) shard_len: usize,
    pub(super) depth: usize,
    /// At most this many data bytes in the steps ahead (see the module docs).
    pub(super) ahead_bytes: u64,
    /// The data bytes of one step of the fixed-layout streams (saturating).
    pub(super) fixed_step_bytes: u64,
    /// Whether some stream is ragged, so a step's size is only learned by
    /// gathering it.
    pub(super) has_ragged: bool,
    /// How iid draws learn when records come again: a window of the steps
    /// ahead (`None` in sequential and cyclic modes, where the sampler
    /// computes it).
    pub(super) lookahead: Option<Lookahead>,
    /// Whether a worker's gathers may hand work to the store's decode pool:
    /// only while fewer gathers run at once than there are cores.
    pub(super) fan_out: bool,
    pub(crate) streams: Vec<StreamCtx>,
    pub(super) indices: Arc<Pool<u64>>,
    /// The source of each row, for a mixture (`None` otherwise).
    pub(super) sources: Option<Arc<Pool<u32>>>,
    /// Next-use hints, one per index, for steps some stream wants them for.
    pub(super) hints: Arc<Pool<Option<u64>>>,
    /// A packed loader's packing (`None` for a loader of records).
    pub(super) pack: Option<Packing>,
}

/// A packed loader's packing: the documents' sampling mode (the plan walks
/// rows in order) and one packer per source, whose three columns are the
/// streams.
pub(super) struct Packing {
    pub(super) mode: Mode,
    pub(super) pack: Pack,
    pub(super) packers: Vec<Arc<Packer>>,
}

impl Ctx {
    /// How many steps may be claimed ahead of `next_deliver`: `depth`,
    /// narrowed by `ahead_bytes` (module docs, "The window in bytes").
    pub(super) fn window(&self, ragged_step_max: Option<u64>) -> u64 {
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
    pub(super) awaited: u64,
    /// The step the consumer's next `next()` returns.
    pub(super) next_deliver: u64,
    /// Finished steps: slot `k` holds step `next_deliver + k`. Always `depth`
    /// long.
    pub(super) slots: VecDeque<Option<Result<Batch, Error>>>,
    /// Set when a worker thread died of a panic outside a step's gather.
    pub(super) died: Option<String>,
    /// The largest data bytes of the ragged streams in one gathered step;
    /// `None` before the first.
    pub(super) ragged_step_max: Option<u64>,
    pub(super) gather: GatherStats,
    /// Workers waiting for the window to open.
    pub(super) idle: u64,
}

/// The pipeline's shared state and the three kinds of waiter on it, each on
/// a condition variable of its own, so that a wakeup meant for one kind
/// never lands on another (see the module docs, "Nothing blocks forever").
pub(crate) struct Shared {
    pub(crate) ctx: Ctx,
    pub(super) state: Mutex<State>,
    /// Workers wait here for a step to claim (the window opening, a window
    /// of blocks loaded) or for shutdown. Only workers wait here, and any of
    /// them can claim any step, so a change that lets one more step be
    /// claimed wakes one, and a change that may let several wakes all.
    pub(crate) work: Condvar,
    /// The mode-3 prefetch thread waits here for a worker to claim the step
    /// it waits for, or for shutdown; every claim wakes it.
    pub(super) claimed: Condvar,
    /// The consumer waits here for slot 0, a dead worker or shutdown.
    pub(super) ready: Condvar,
    /// CPU time of the loader's threads.
    pub(super) cpu: ThreadsCpu,
}

impl Shared {
    /// The state, even if a thread panicked while holding the lock: every
    /// update leaves it consistent, and a dead worker is reported separately.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn shut_down(&self) {
        self.lock().shutdown = true;
        self.work.notify_all();
        self.claimed.notify_all();
        self.ready.notify_all();
    }
}

/// What the mode-3 prefetch thread walks: one sampler's windows, or each
/// source's of a mixture.
pub(super) enum Prefetch {
    Single(Sampler),
    Mixture(Mixture),
    /// A packed loader's sources whose documents are read ahead (`None`
    /// for one that is not), and where their rows fall in the steps.
    Packed(Vec<Option<Arc<Packer>>>, PackedPlan),
}

/// Where a packed loader's rows of each source fall in its steps
/// ([`crate::prefetch::PackedSteps`]).
pub(super) enum PackedPlan {
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

    fn wants_plan(&self) -> bool {
        self.ctx.streams.iter().flat_map(|s| &s.sources).any(|source| source.wants_plan())
    }

    fn plan(&self, windows: &[Vec<std::ops::Range<u64>>]) {
        for source in self.ctx.streams.iter().flat_map(|s| &s.sources) {
            // A plan is a hint: a source failing it reads as it would without.
            let _ = source.plan(windows);
        }
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
