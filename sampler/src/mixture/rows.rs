//! A step's rows: where each source's rows lie in the grouped order, the
//! digit reversal that interleaves them (module docs of [`crate::mixture`]),
//! and the filling of a shard's rows with their sources and indices (and
//! each record's next use).

use super::apportion::Apportion;
use super::{Mixture, RowOrder};
use crate::{Error, Shard, MAX_BATCH};

/// How many later draws of a record [`Mixture::fill_shard_with_next_use`]
/// looks at for one that lands in the shard's rows.
const NEXT_USE_TRIES: u32 = 64;

/// Where each source's rows of one step are: its first stream position, its
/// first grouped position (before the rotation), its count; the sources in
/// grouped order with their first grouped positions; and the rotation of the
/// grouped positions (module docs).
struct Layout {
    start: Vec<u64>,
    row: Vec<u64>,
    count: Vec<u64>,
    seq_row: Vec<u64>,
    rotate: u64,
}

impl Mixture {
    /// Where each source's rows of `step` are.
    fn layout(&self, step: u64, order: &mut Vec<(f64, usize)>) -> Option<Layout> {
        let s = self.weights.len();
        let first = step.checked_mul(self.batch_size)?;
        let mut start = vec![0; s];
        let mut end = vec![0; s];
        self.allocate(first, &mut start, order);
        self.allocate(first.checked_add(self.batch_size)?, &mut end, order);
        let mut row = vec![0; s];
        let mut seq_row = Vec::with_capacity(s);
        // Monotone (module docs); saturating keeps a float surprise from
        // wrapping.
        let count: Vec<u64> = (0..s).map(|k| end[k].saturating_sub(start[k])).collect();
        let mut at = 0;
        for &k in &self.seq {
            row[k] = at;
            seq_row.push(at);
            at += count[k];
        }
        // Interleaved with sources of under a row per batch (last in the
        // grouped order), the grouped positions turn so that those sources'
        // rows of the run, one after another, take one grouped position
        // after another modulo B: they end where the run's rows of theirs
        // so far end.
        let rotate = match (&self.apportion, self.order) {
            (Apportion::Tree(tree), RowOrder::Interleaved) => {
                tree.tiny.iter().fold(0u64, |a, &k| a.wrapping_add(end[k])) % self.batch_size
            }
            _ => 0,
        };
        Some(Layout { start, row, count, seq_row, rotate })
    }

    /// Writes `shard`'s rows of the global batch of `step`: `sources[r]` the
    /// source of row `r`, `indices[r]` its record in that source. Both must
    /// hold exactly [`shard_len`](Mixture::shard_len) entries. Rows come in
    /// the mixture's [`RowOrder`].
    pub fn fill_shard(&self, step: u64, shard: Shard, sources: &mut [u32], indices: &mut [u64]) -> Result<(), Error> {
        self.fill(step, shard, sources, indices, None)
    }

    /// [`fill_shard`](Mixture::fill_shard) and, for each row, the first
    /// later step at which *this shard* draws the same record of the same
    /// source again (`None`: none found, or iid mode, whose draws have no
    /// inverse; a loader looks ahead instead). Up to 64 later draws of the
    /// record are tried for one that lands in the shard's rows.
    ///
    /// Each draw tried costs a few allocations of the rows (`O(sources)`
    /// each), several times the rows alone for one shard of many
    /// (bench-results/engine-notes.md). A loader asks only while a store
    /// reads around the page cache, where the step's reads take longer.
    pub fn fill_shard_with_next_use(
        &self,
        step: u64,
        shard: Shard,
        sources: &mut [u32],
        indices: &mut [u64],
        next: &mut [Option<u64>],
    ) -> Result<(), Error> {
        self.fill(step, shard, sources, indices, Some(next))
    }

    pub(super) fn fill(
        &self,
        step: u64,
        shard: Shard,
        sources: &mut [u32],
        indices: &mut [u64],
        next: Option<&mut [Option<u64>]>,
    ) -> Result<(), Error> {
        let (lo, hi) = shard.range(self.batch_len())?;
        for len in [sources.len(), indices.len()].into_iter().chain(next.as_ref().map(|n| n.len())) {
            if len != hi - lo {
                return Err(Error::BufferLength { expected: (hi - lo) as u64, got: len as u64 });
            }
        }
        let mut order = Vec::with_capacity(self.weights.len());
        // A step past 2^64 rows has no batch; steps that far are never asked.
        let Some(layout) = self.layout(step, &mut order) else {
            return Err(Error::BatchTooLarge { batch: u64::MAX, max: MAX_BATCH });
        };
        let (lo, hi) = (lo as u64, hi as u64);
        match self.order {
            RowOrder::Grouped => self.fill_grouped(step, &layout, shard, lo..hi, sources, indices, next, &mut order),
            RowOrder::Interleaved => {
                self.fill_interleaved(step, &layout, shard, lo..hi, sources, indices, next, &mut order)
            }
        }
        Ok(())
    }

    /// Rows `rows` of a grouped step: a few runs, one per source.
    #[allow(clippy::too_many_arguments)]
    fn fill_grouped(
        &self,
        step: u64,
        layout: &Layout,
        shard: Shard,
        rows: std::ops::Range<u64>,
        sources: &mut [u32],
        indices: &mut [u64],
        mut next: Option<&mut [Option<u64>]>,
        order: &mut Vec<(f64, usize)>,
    ) {
        let (lo, hi) = (rows.start, rows.end);
        for k in 0..self.weights.len() {
            let (row, count) = (layout.row[k], layout.count[k]);
            let (a, z) = (row.max(lo), (row + count).min(hi));
            if a >= z {
                continue;
            }
            let first = layout.start[k] + (a - row);
            let span = (a - lo) as usize..(z - lo) as usize;
            self.streams[k].fill(first, &mut indices[span.clone()]);
            // Lossless: at most 2^32 sources fit in memory as weights.
            sources[span.clone()].fill(k as u32);
            if let Some(next) = next.as_deref_mut() {
                for (j, o) in span.clone().enumerate() {
                    let at = first + j as u64;
                    next[o] = self.next_use(k, step, at, indices[o], shard, order);
                }
            }
        }
    }

    /// Rows `rows` of an interleaved step: each row's grouped position
    /// (module docs) names its source; a source's rows take its stream
    /// positions in row order, so the rows' ranks among the source's rows
    /// of the step, counted from the first row of the range, name them. A
    /// contiguous range of rows holds a contiguous range of each source's
    /// stream, read in one call per source.
    #[allow(clippy::too_many_arguments)]
    fn fill_interleaved(
        &self,
        step: u64,
        layout: &Layout,
        shard: Shard,
        rows: std::ops::Range<u64>,
        sources: &mut [u32],
        indices: &mut [u64],
        mut next: Option<&mut [Option<u64>]>,
        order: &mut Vec<(f64, usize)>,
    ) {
        let s = self.weights.len();
        let before: Vec<u64> = (0..s).map(|k| self.rows_of_source_before(layout, k, rows.start)).collect();
        let mut taken = vec![0u64; s];
        for (o, r) in rows.clone().enumerate() {
            let g = (self.grouped_position(r) + self.batch_size - layout.rotate) % self.batch_size;
            // The last source starting at or before g holds it: sources with
            // no rows this step start where the next one does.
            let k = self.seq[layout.seq_row.partition_point(|&at| at <= g) - 1];
            // Lossless: at most 2^32 sources fit in memory as weights.
            sources[o] = k as u32;
            indices[o] = taken[k];
            taken[k] += 1;
        }
        // Each source's stretch of its stream, one after another in `read`.
        let mut at = Vec::with_capacity(s);
        let mut total = 0;
        for &n in &taken {
            at.push(total);
            // Lossless: at most the rows of the range, a usize.
            total += n as usize;
        }
        let mut read = vec![0; total];
        for k in 0..s {
            if taken[k] > 0 {
                self.streams[k].fill(layout.start[k] + before[k], &mut read[at[k]..at[k] + taken[k] as usize]);
            }
        }
        for (o, (&k, x)) in sources.iter().zip(indices.iter_mut()).enumerate() {
            let k = k as usize;
            let rank = *x;
            *x = read[at[k] + rank as usize];
            if let Some(next) = next.as_deref_mut() {
                next[o] = self.next_use(k, step, layout.start[k] + before[k] + rank, *x, shard, order);
            }
        }
    }

    /// How many of source `k`'s rows of the step laid out by `layout` lie
    /// in rows `0 .. r`.
    fn rows_of_source_before(&self, layout: &Layout, k: usize, r: u64) -> u64 {
        let (b, below) = (self.batch_size, |g| self.grouped_below_in_rows_below(g, r));
        let g = layout.row[k] + layout.rotate;
        let end = g + layout.count[k];
        if g >= b {
            below(end - b) - below(g - b)
        } else if end > b {
            // Turned past the end: the source's positions wrap around.
            below(b) - below(g) + below(end - b)
        } else {
            below(end) - below(g)
        }
    }

    /// How many grouped positions `g < b` sit in rows below `r`. Interleaved,
    /// row `row_of(g)` compares with `r` digit by digit, `g`'s least
    /// significant digit against `r`'s most significant: `g` is below when,
    /// for some `i`, its first `i - 1` digits are `r`'s and its `i`-th is
    /// smaller, which fixes `g mod (b_1 ... b_i)` to one of `r_i` residues,
    /// each counted in closed form. `O(sum of the radices)`.
    pub(super) fn grouped_below_in_rows_below(&self, b: u64, r: u64) -> u64 {
        match self.order {
            RowOrder::Grouped => b.min(r),
            RowOrder::Interleaved => {
                if r >= self.batch_size {
                    return b;
                }
                // Positions below b congruent to w modulo m.
                let congruent = |w: u64, m: u64| if w >= b { 0 } else { (b - w - 1) / m + 1 };
                let (mut count, mut fixed, mut modulus, mut scale, mut rest) = (0, 0, 1, self.batch_size, r);
                for &radix in &self.radices {
                    scale /= radix;
                    let digit = rest / scale;
                    rest %= scale;
                    let next = modulus * radix;
                    for t in 0..digit {
                        count += congruent(fixed + modulus * t, next);
                    }
                    fixed += modulus * digit;
                    modulus = next;
                }
                count
            }
        }
    }

    /// The row of grouped position `g` (module docs): `g` itself when
    /// grouped, else `g`'s digits reversed. The fill counts rows instead
    /// ([`Mixture::grouped_below_in_rows_below`]); tests check the two agree.
    #[cfg(test)]
    pub(super) fn row_of(&self, g: u64) -> u64 {
        match self.order {
            RowOrder::Grouped => g,
            RowOrder::Interleaved => {
                let (mut x, mut r) = (g, 0);
                for &b in &self.radices {
                    r = r * b + x % b;
                    x /= b;
                }
                r
            }
        }
    }

    /// The grouped position of row `r`, the inverse of `Mixture::row_of`.
    pub(super) fn grouped_position(&self, r: u64) -> u64 {
        match self.order {
            RowOrder::Grouped => r,
            RowOrder::Interleaved => {
                // B = 2^a q, q odd: the twos are the radices of the first a
                // digits, so row r = bitreverse_a(g mod 2^a) q + (the odd
                // digits of g / 2^a, reversed); undone here with one bit
                // reversal and a loop over the odd radices only.
                let twos = self.radices.iter().take_while(|&&b| b == 2).count() as u32;
                let odd = self.batch_size >> twos;
                let (high, low) = (r / odd, r % odd);
                let bits = if twos == 0 { 0 } else { high.reverse_bits() >> (64 - twos) };
                let (mut x, mut rest) = (low, 0);
                for &b in self.radices[twos as usize..].iter().rev() {
                    rest = rest * b + x % b;
                    x /= b;
                }
                bits | (rest << twos)
            }
        }
    }

    /// The first step after `step` (which draws position `p` of source `k`'s
    /// stream, holding `index`) whose rows of `shard` draw `index` again. A
    /// short source may draw it again within `step` itself: not a next use.
    fn next_use(
        &self,
        k: usize,
        step: u64,
        p: u64,
        index: u64,
        shard: Shard,
        order: &mut Vec<(f64, usize)>,
    ) -> Option<u64> {
        let stream = &self.streams[k];
        let (lo, hi) = shard.range(self.batch_len()).ok()?;
        for q in stream.later_positions(self.mode, p, index, NEXT_USE_TRIES) {
            let t = self.step_of(k, q)?;
            if t <= step {
                continue;
            }
            if shard == Shard::ALL {
                return Some(t);
            }
            let layout = self.layout(t, order)?;
            // The source's rows of `shard` hold its positions from this many
            // of its rows of the step on (rows in stream order).
            let (from, to) =
                (self.rows_of_source_before(&layout, k, lo as u64), self.rows_of_source_before(&layout, k, hi as u64));
            if (from..to).contains(&(q - layout.start[k])) {
                return Some(t);
            }
        }
        None
    }

    /// The step whose rows hold position `q` of source `k`'s stream: the `t`
    /// with `A_k(t B) <= q < A_k((t + 1) B)`.
    pub(super) fn step_of(&self, k: usize, q: u64) -> Option<u64> {
        let b = self.batch_size;
        let below = |t: u64| -> Option<bool> { Some(self.allocation_of(k, t.checked_mul(b)?) <= q) };
        // A_k(t B) is within a row or so of w_k t B: the guess is near, but
        // a source of under a row per batch is a row off over many steps.
        // Widen a bracket around the guess, then halve it.
        let per_step = self.weights[k] * b as f64;
        let guess = ((q as f64) / per_step).floor().min(u64::MAX as f64 / b as f64) as u64;
        let (mut lo, mut hi) = (guess, guess.checked_add(1)?);
        let mut reach = 1u64;
        while lo > 0 && !below(lo)? {
            lo = lo.saturating_sub(reach);
            reach = reach.saturating_mul(2);
        }
        reach = 1;
        while below(hi)? {
            lo = hi;
            hi = hi.checked_add(reach)?;
            reach = reach.saturating_mul(2);
        }
        // A_k(lo B) <= q < A_k(hi B) (A_k(0) = 0).
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if below(mid)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    }
}
