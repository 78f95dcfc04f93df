//! Next-use hints for iid sampling, from a window of the steps ahead.
//!
//! In cyclic and sequential modes the sampler answers "when is record `r`
//! needed after step `s`" by arithmetic. Draws with replacement (iid) have no
//! inverse, but they are still a pure function of (seed, step): the loader
//! can simply look. [`Lookahead`] keeps, for the next [`Lookahead::span`]
//! steps, every index *this loader's shard* draws and at which steps; a worker
//! gathering step `s` asks it for each of its indices. A record not drawn in
//! the window gets no hint (the store then ranks it with the records it knows
//! nothing about).
//!
//! Only the shard's own draws count: a host's record cache keeps what that
//! host reads next, and a record another host draws at a step is no reason
//! to keep it here (with the global batch's draws, each of 4 ranks kept
//! records for the others, and held a third fewer of its own hits). It is
//! also `count` times less work: each host computes only its slice.
//!
//! Why it pays: a record cache holding a fraction `c` of the data serves `c`
//! of iid draws when it keeps a fixed subset. Knowing which records come back
//! soonest, it keeps those instead; simulated for `c = 1/4`, batch 256, with
//! the window reaching 20 steps ahead it serves 40 % of the draws, and 61 %
//! once the window spans the steps in which every record is drawn once on
//! average (`len / batch`); a longer window adds nothing.
//!
//! # Numbers
//!
//! * The span is `ceil(len / shard_len)` steps (the shard's draws of one
//!   pass over the data on average), capped so the window holds at most
//!   [`MAX_ENTRIES`] = 2^19 draws: about 25 MB of maps and vectors at the
//!   cap, counted against nothing (a store this large has a budget of
//!   gigabytes). With 256 draws a step the cap is 2,048 steps.
//! * Each step entering the window costs one batch of draws (the sampler
//!   recomputes them; no state), each step leaving it one more: two batches
//!   of hashing and map updates per step gathered, under one lock held for
//!   microseconds.
//! * Steps are dropped from the back only once they are more than the
//!   loader's depth (at least [`SLACK`]) behind the latest query, so workers
//!   gathering steps apart (at most the depth) all find the window covering
//!   their step instead of rebuilding it.

use std::collections::HashMap;
use std::sync::Mutex;

use zring_sampler::{Error as SamplerError, Shard};

use crate::plan::Plan;

/// Most draws the window holds (module docs).
pub(crate) const MAX_ENTRIES: u64 = 1 << 19;
/// Least steps kept behind the latest step asked about (module docs).
const SLACK: u64 = 64;

/// The window of draws ahead (module docs).
pub(crate) struct Lookahead {
    shard: Shard,
    span: u64,
    slack: u64,
    window: Mutex<Window>,
}

#[derive(Default)]
struct Window {
    /// Steps `lo..hi` are in the window; `lo == hi` when empty.
    lo: u64,
    hi: u64,
    /// (Source, index) -> the steps of the window that draw it, ascending.
    /// The source is always 0 for one set of streams.
    at: HashMap<(u32, u64), Vec<u64>>,
    /// Scratch for one step's draws of the shard, and their sources.
    batch: Vec<u64>,
    sources: Vec<u32>,
}

impl Lookahead {
    /// A window over `shard`'s draws of `sampler`, for a loader running up
    /// to `depth` steps apart.
    pub fn new(plan: &Plan, shard: Shard, depth: u64) -> Result<Lookahead, SamplerError> {
        let per_step = plan.shard_len(shard)?.max(1) as u64;
        let span = plan.length().div_ceil(per_step).clamp(1, (MAX_ENTRIES / per_step).max(1));
        Ok(Lookahead { shard, span, slack: depth.max(SLACK), window: Mutex::new(Window::default()) })
    }

    /// Steps ahead of the asked one that the window covers.
    #[cfg(test)]
    pub fn span(&self) -> u64 {
        self.span
    }

    /// For each of `indices` (drawn at `step`, from `sources`, or all from
    /// source 0 when `sources` is empty), the first later step within the
    /// span that draws it again, or `None`.
    pub fn fill(
        &self,
        plan: &Plan,
        step: u64,
        sources: &[u32],
        indices: &[u64],
        out: &mut [Option<u64>],
    ) -> Result<(), SamplerError> {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let w = &mut *w;
        let first = step.saturating_add(1);
        let last = step.saturating_add(self.span);
        if first < w.lo || first > w.hi {
            // A jump (the first call, a resume): start afresh.
            w.at.clear();
            w.lo = first;
            w.hi = first;
        }
        let per_step = plan.shard_len(self.shard)?;
        w.batch.resize(per_step, 0);
        w.sources.resize(per_step, 0);
        while w.hi <= last {
            plan.fill(w.hi, self.shard, &mut w.sources, &mut w.batch, None)?;
            for (&k, &i) in w.sources.iter().zip(&w.batch) {
                let steps = w.at.entry((k, i)).or_default();
                if steps.last() != Some(&w.hi) {
                    steps.push(w.hi);
                }
            }
            w.hi += 1;
        }
        while w.lo + self.slack < step && w.lo < w.hi {
            plan.fill(w.lo, self.shard, &mut w.sources, &mut w.batch, None)?;
            for (&k, &i) in w.sources.iter().zip(&w.batch) {
                if let Some(steps) = w.at.get_mut(&(k, i)) {
                    if steps.first() == Some(&w.lo) {
                        steps.remove(0);
                    }
                    if steps.is_empty() {
                        w.at.remove(&(k, i));
                    }
                }
            }
            w.lo += 1;
        }
        for (r, (o, &i)) in out.iter_mut().zip(indices).enumerate() {
            let k = sources.get(r).copied().unwrap_or(0);
            *o = w.at.get(&(k, i)).and_then(|steps| steps.iter().find(|&&t| t > step && t <= last)).copied();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zring_sampler::{Mode, Sampler};

    /// The hints are exactly the shard's next draws within the span,
    /// whatever order and spacing the steps are asked in (workers race,
    /// resumes jump); a draw by another shard is not a next use.
    #[test]
    fn hints_are_the_shards_next_draws_within_the_span() {
        let s = Sampler::new(Mode::Iid, 500, 32, 7).unwrap();
        for shard in [Shard::ALL, Shard::new(1, 4).unwrap()] {
            let plan = Plan::Single(s.clone());
            let look = Lookahead::new(&plan, shard, 8).unwrap();
            let per = s.shard_len(shard).unwrap();
            assert_eq!(look.span(), 500u64.div_ceil(per as u64));
            let draws = |t: u64| {
                let mut v = vec![0; per];
                s.fill_shard(t, shard, &mut v).unwrap();
                v
            };
            let mut others = 0;
            for step in (0..200).chain([190, 195, 1000, 1001, 5, 6]) {
                let idx = draws(step);
                let mut out = vec![None; idx.len()];
                look.fill(&plan, step, &[], &idx, &mut out).unwrap();
                for (k, &i) in idx.iter().enumerate() {
                    let want = (step + 1..=step + look.span()).find(|&t| draws(t).contains(&i));
                    assert_eq!(out[k], want, "step {step}, index {i}");
                    // Other shards draw it sooner, often: that is not counted.
                    let global = (step + 1..=step + look.span()).find(|&t| s.batch(t).contains(&i));
                    others += usize::from(global.is_some() && global != want);
                }
            }
            assert_eq!(others > 0, shard != Shard::ALL);
            assert!(look.window.lock().unwrap().at.len() <= (look.span() + SLACK + 1) as usize * per);
        }
    }

    #[test]
    fn the_span_is_capped_by_the_entries_and_the_slack_follows_the_depth() {
        let s = Plan::Single(Sampler::new(Mode::Iid, 1 << 40, 1024, 1).unwrap());
        assert_eq!(Lookahead::new(&s, Shard::ALL, 4).unwrap().span(), MAX_ENTRIES / 1024);
        assert_eq!(Lookahead::new(&s, Shard::new(0, 4).unwrap(), 4).unwrap().span(), MAX_ENTRIES / 256);
        assert_eq!(Lookahead::new(&s, Shard::ALL, 4).unwrap().slack, SLACK);
        assert_eq!(Lookahead::new(&s, Shard::ALL, 500).unwrap().slack, 500);
    }
}
