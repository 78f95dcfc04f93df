//! Next-use hints for iid sampling, from a window of the steps ahead.
//!
//! In cyclic and sequential modes the sampler answers "when is record `r`
//! needed after step `s`" by arithmetic. Draws with replacement (iid) have no
//! inverse, but they are still a pure function of (seed, step): the loader
//! can simply look. [`Lookahead`] keeps, for the next [`Lookahead::span`]
//! global steps, every index they draw and at which steps; a worker
//! gathering step `s` asks it for each of its indices. A record not drawn in
//! the window gets no hint (the store then ranks it with the records it knows
//! nothing about).
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
//! * The span is `ceil(len / batch)` steps, capped so the window holds at
//!   most [`MAX_ENTRIES`] = 2^19 draws: about 25 MB of maps and vectors at
//!   the cap, counted against nothing (a store this large has a budget of
//!   gigabytes). With batch 256 the cap is 2,048 steps.
//! * Each step entering the window costs one batch of draws (the sampler
//!   recomputes them; no state), each step leaving it one more: two batches
//!   of hashing and map updates per step gathered, under one lock held for
//!   microseconds.
//! * Steps are dropped from the back only once they are [`SLACK`] steps
//!   behind the latest query, so workers gathering a few steps apart (at most
//!   the loader's depth) all find the window covering their step.

use std::collections::HashMap;
use std::sync::Mutex;

use zring_sampler::{Error as SamplerError, Sampler};

/// Most draws the window holds (module docs).
pub(crate) const MAX_ENTRIES: u64 = 1 << 19;
/// Steps kept behind the latest step asked about (module docs).
const SLACK: u64 = 64;

/// The window of draws ahead (module docs).
pub(crate) struct Lookahead {
    span: u64,
    window: Mutex<Window>,
}

#[derive(Default)]
struct Window {
    /// Steps `lo..hi` are in the window; `lo == hi` when empty.
    lo: u64,
    hi: u64,
    /// Index -> the steps of the window that draw it, ascending.
    at: HashMap<u64, Vec<u64>>,
    /// Scratch for one global batch.
    batch: Vec<u64>,
}

impl Lookahead {
    /// A window for `sampler`'s global batches.
    pub fn new(sampler: &Sampler) -> Lookahead {
        let batch = sampler.batch_len().max(1) as u64;
        let span = sampler.state().length.div_ceil(batch).clamp(1, (MAX_ENTRIES / batch).max(1));
        Lookahead { span, window: Mutex::new(Window::default()) }
    }

    /// Steps ahead of the asked one that the window covers.
    #[cfg(test)]
    pub fn span(&self) -> u64 {
        self.span
    }

    /// For each of `indices` (drawn at `step`), the first later step within
    /// the span that draws it again, or `None`.
    pub fn fill(
        &self,
        sampler: &Sampler,
        step: u64,
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
        w.batch.resize(sampler.batch_len(), 0);
        while w.hi <= last {
            sampler.fill(w.hi, &mut w.batch)?;
            for &i in &w.batch {
                let steps = w.at.entry(i).or_default();
                if steps.last() != Some(&w.hi) {
                    steps.push(w.hi);
                }
            }
            w.hi += 1;
        }
        while w.lo + SLACK < step && w.lo < w.hi {
            sampler.fill(w.lo, &mut w.batch)?;
            for &i in &w.batch {
                if let Some(steps) = w.at.get_mut(&i) {
                    if steps.first() == Some(&w.lo) {
                        steps.remove(0);
                    }
                    if steps.is_empty() {
                        w.at.remove(&i);
                    }
                }
            }
            w.lo += 1;
        }
        for (o, i) in out.iter_mut().zip(indices) {
            *o = w.at.get(i).and_then(|steps| steps.iter().find(|&&t| t > step && t <= last)).copied();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zring_sampler::Mode;

    /// The hints are exactly the next draws within the span, whatever order
    /// and spacing the steps are asked in (workers race, resumes jump).
    #[test]
    fn hints_are_the_next_draws_within_the_span() {
        let s = Sampler::new(Mode::Iid, 500, 32, 7).unwrap();
        let look = Lookahead::new(&s);
        assert_eq!(look.span(), 16);
        let mut asked = Vec::new();
        for step in (0..200).chain([190, 195, 1000, 1001, 5, 6]) {
            let idx = s.batch(step);
            let mut out = vec![None; idx.len()];
            look.fill(&s, step, &idx, &mut out).unwrap();
            for (k, &i) in idx.iter().enumerate() {
                let want = (step + 1..=step + look.span()).find(|&t| s.batch(t).contains(&i));
                assert_eq!(out[k], want, "step {step}, index {i}");
            }
            asked.push(step);
        }
        assert!(look.window.lock().unwrap().at.len() <= (look.span() + SLACK + 1) as usize * 32);
    }

    #[test]
    fn the_span_is_capped_by_the_entries() {
        let s = Sampler::new(Mode::Iid, 1 << 40, 1024, 1).unwrap();
        assert_eq!(Lookahead::new(&s).span(), MAX_ENTRIES / 1024);
    }
}
