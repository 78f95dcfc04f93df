//! Mode 3's windows: the stretch of a source's stream whose blocks a reader
//! loads before the steps that draw from it, and the step at which each
//! stream position is drawn.

use super::stream::SourceStream;
use super::Mixture;
use crate::{Error, Mode, Window};

impl Mixture {
    /// Mode 3 only (`None` otherwise, or past the last step): the window of
    /// source `k`'s stream that its first row at or after `step` is drawn
    /// from, with the steps whose rows of source `k` draw from it and its
    /// blocks' index ranges in source `k`. A reader loads a window's blocks
    /// before those steps gather; [`Mixture::next_source_window`] names the
    /// one after it. (Every shard's rows of the source come from it: a
    /// mixture's cycles are not split between shards.)
    pub fn source_window(&self, k: usize, step: u64) -> Option<Window> {
        let stream = self.blocked_stream(k)?;
        let p = self.allocation_of(k, step.checked_mul(self.batch_size)?);
        let (cycle, q) = stream.cycle_of(p);
        let w = stream.cycle_window_of(cycle, q)?;
        self.stream_window(k, cycle, w)
    }

    /// The window of source `k`'s stream after `window` (one of its
    /// [`Mixture::source_window`]s).
    pub fn next_source_window(&self, window: &Window) -> Option<Window> {
        let (cycle, w, k) = window.at;
        let k = usize::try_from(k).ok()?;
        let stream = self.blocked_stream(k)?;
        match stream.cycle_window(cycle, w + 1) {
            Some(_) => self.stream_window(k, cycle, w + 1),
            None => self.stream_window(k, cycle.checked_add(1)?, 0),
        }
    }

    /// For each of `indices`, records of `window` (of source `k`, from
    /// [`Mixture::source_window`]), the step that draws it from that window
    /// (`None` for an index it does not hold).
    pub fn fill_window_steps(&self, window: &Window, indices: &[u64], out: &mut [Option<u64>]) -> Result<(), Error> {
        if out.len() != indices.len() {
            return Err(Error::BufferLength { expected: indices.len() as u64, got: out.len() as u64 });
        }
        out.fill(None);
        let (cycle, w, k) = window.at;
        let Some(stream) = usize::try_from(k).ok().and_then(|k| self.blocked_stream(k)) else {
            return Ok(());
        };
        let k = k as usize;
        let Some((positions, _)) = stream.cycle_window(cycle, w) else {
            return Ok(());
        };
        let Some(base) = stream.cycle_base(cycle) else {
            return Ok(());
        };
        // The steps of the window's stream positions, walked once: the
        // first row of step t is at A_k(t B).
        let (lo, hi) = (base + positions.start, base + positions.end);
        let mut by_position = Vec::with_capacity((hi - lo) as usize);
        let mut t = window.steps.start;
        let mut next_start = self.step_start(k, t + 1);
        for p in lo..hi {
            while next_start.is_some_and(|a| a <= p) {
                t += 1;
                next_start = self.step_start(k, t + 1);
            }
            by_position.push(t);
        }
        for (o, &i) in out.iter_mut().zip(indices) {
            let Some(q) = stream.cycle_position(cycle, i) else {
                continue;
            };
            *o = (base + q).checked_sub(lo).and_then(|d| by_position.get(d as usize)).copied();
        }
        Ok(())
    }

    /// Source `k`'s stream when the mixture is in mode 3.
    fn blocked_stream(&self, k: usize) -> Option<&SourceStream> {
        (self.mode == Mode::Blocked).then(|| self.streams.get(k)).flatten()
    }

    /// The stream position of source `k`'s first row of `step`, `A_k(step
    /// B)`; `None` past 2^64 rows.
    fn step_start(&self, k: usize, step: u64) -> Option<u64> {
        Some(self.allocation_of(k, step.checked_mul(self.batch_size)?))
    }

    /// The step whose rows of source `k` hold position `p` of the source's
    /// stream (the last step whose rows of source `k` start at or before
    /// it); `None` for a source out of range or past 2^64 rows. For a
    /// reader that loads a stretch of a source's stream ahead of the steps
    /// that draw from it.
    pub fn step_of_source_position(&self, k: usize, p: u64) -> Option<u64> {
        if k >= self.weights.len() {
            return None;
        }
        self.step_of_position(k, p)
    }

    /// The step whose rows of source `k` hold stream position `p`: the last
    /// step starting at or before it.
    fn step_of_position(&self, k: usize, p: u64) -> Option<u64> {
        // A_k(t B) is about w_k t B: search upwards from 0 by doubling,
        // then halve.
        let mut hi = 1u64;
        while self.step_start(k, hi)? <= p {
            hi = hi.checked_mul(2)?;
        }
        let mut lo = 0u64;
        // Invariant: A(lo) <= p < A(hi).
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.step_start(k, mid)? <= p {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    }

    /// Window `w` of cycle `cycle` of source `k`'s stream, in steps.
    fn stream_window(&self, k: usize, cycle: u64, w: u64) -> Option<Window> {
        let stream = self.blocked_stream(k)?;
        let (positions, records) = stream.cycle_window(cycle, w)?;
        let base = stream.cycle_base(cycle)?;
        let (lo, hi) = (base.checked_add(positions.start)?, base.checked_add(positions.end)?);
        let first = self.step_of_position(k, lo)?;
        let last = self.step_of_position(k, hi - 1)?;
        // The steps before `complete` draw only positions below `hi`.
        let complete = self.step_of_position(k, hi)?;
        Some(Window { steps: first..last + 1, complete, records, at: (cycle, w, k as u64) })
    }
}
