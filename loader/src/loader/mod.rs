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
//!   step whether it [wants hints](crate::Source::wants_hints) and, if any does,
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
//!   holds, and the pools keep at most [`retain_for`](shared::retain_for) free sets so a burst of
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

mod build;
mod shared;
mod stream;
mod worker;

pub use self::stream::{MixSource, Stream};
use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use zring_sampler::Shard;

use self::shared::Shared;
use self::worker::panic_message;
use crate::batch::Batch;
use crate::config::{Consumed, LoaderState};
use crate::error::Error;
use crate::plan::Plan;
use crate::source::Fingerprint;
use crate::stats::{self, LoaderStats};

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

/// The fingerprints a loader's states carry: those of the records its
/// sampler draws from now and, while a resumed run over streams that grew
/// finishes its cycle over the saved records, the saved ones.
struct Fingerprints {
    before: BTreeMap<String, Fingerprint>,
    now: BTreeMap<String, Fingerprint>,
}

impl Loader {
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
            pack_growth: ctx
                .pack
                .as_ref()
                .map(|p| p.packers.iter().map(|k| k.growth()).collect::<Vec<_>>())
                .filter(|g| g.iter().any(|s| s.len() > 1))
                .unwrap_or_default(),
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

    /// For an elastic resume (another rank count): per source, the records
    /// the run delivered in the cycle under way before `step`, in the order
    /// drawn (for packed rows, the documents begun), and the records that
    /// cycle draws from. A loader of one set of streams in mode 2 or 3, or of
    /// packed rows; [`Error::InvalidConfig`] otherwise (iid and sequential
    /// runs have no cycle to finish, and a mixture of record sources or a
    /// grown run is not taken).
    pub fn delivered_in_cycle(&self, step: u64) -> Result<Vec<(Vec<u64>, u64)>, Error> {
        let ctx = &self.shared.ctx;
        if let Some(p) = &ctx.pack {
            let rows: Vec<u64> = match &ctx.plan {
                Plan::Mixture(m) => {
                    let mut out = vec![0; m.lengths().len()];
                    m.allocation(step.saturating_mul(m.batch_len() as u64), &mut out)?;
                    out
                }
                plan => vec![step.saturating_mul(plan.shard_len(Shard::ALL)? as u64)],
            };
            return p
                .packers
                .iter()
                .zip(rows)
                .enumerate()
                .map(|(k, (packer, r))| {
                    packer.begun_in_cycle(r).map_err(|source| Error::Pack { stream: format!("{k}/tokens"), source })
                })
                .collect();
        }
        let unsupported = || Error::InvalidConfig {
            field: "elastic resume",
            value: step,
            expected: "a loader of one set of streams in mode 2 or 3 (not grown), or of packed rows",
        };
        match &ctx.plan {
            Plan::Single(s) => {
                let st = s.state();
                if !matches!(st.mode, zring_sampler::Mode::Cyclic | zring_sampler::Mode::Blocked) || st.origin != 0 {
                    return Err(unsupported());
                }
                let b = s.batch_len() as u64;
                let per = (st.length / b).max(1);
                let start = step - step % per;
                let mut out = Vec::with_capacity(((step - start) * b) as usize);
                let mut buf = vec![0u64; b as usize];
                for t in start..step {
                    s.fill(t, &mut buf)?;
                    out.extend_from_slice(&buf);
                }
                Ok(vec![(out, st.length)])
            }
            _ => Err(unsupported()),
        }
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

#[cfg(test)]
mod tests;
