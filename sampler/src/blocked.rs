//! Mode 3, blocked: a cycle order without replacement that reads the index
//! space a window of blocks at a time.
//!
//! The index space `[0, n)` is cut into blocks of `b` consecutive records
//! (the last one short when `b` does not divide `n`). Each cycle puts the
//! blocks in a keyed random order and cuts that order into windows of `W`
//! blocks. The cycle's positions walk the windows one after another; within
//! a window they visit the records of its `W` blocks in a keyed random order
//! of their own. So every cycle visits every index exactly once (the
//! sampler then drops the cycle's last `n mod B` positions, as in cyclic
//! mode), a batch is a uniform draw from the records of one window (two at a
//! window's end), and a reader that loads a window's blocks whole serves the
//! window's batches from memory.
//!
//! Everything is arithmetic on two Feistel permutations: the block order of
//! the cycle and the order inside one window. The window holding the short
//! block is `b - r` records shorter (`r` the short block's records), which
//! shifts the start of every later window by that much; the short block's
//! place in the block order is one inverse permutation away, so a window's
//! start, the window of a position and the position of an index are all
//! O(1).

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::feistel::{Domain, Permutation};
use crate::random::{mix64, GOLDEN};

/// Domain separation for the two permutations of a cycle.
const BLOCK_ORDER_KEY: u64 = 0x5A17_B10C_0000_0003;
const WINDOW_KEY: u64 = 0x5A17_817D_0000_0004;

/// The block shape of mode 3: blocks of `block_records` consecutive indices,
/// drawn `window_blocks` blocks at a time. Part of the saved state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Blocks {
    /// Consecutive indices per block (a store reads a block as one read).
    pub block_records: u64,
    /// Blocks per window (what a reader holds in memory at once).
    pub window_blocks: u64,
}

impl Blocks {
    /// The shape [`Sampler::new`](crate::Sampler::new) gives mode 3 when
    /// nobody chose one: 64 records per block, 256 blocks per window. A
    /// loader chooses from the record size and its memory instead.
    pub const DEFAULT: Blocks = Blocks { block_records: 64, window_blocks: 256 };
}

/// The per-sampler constants of mode 3 for an index space of `n`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    n: u64,
    /// Records per block, at most `n`.
    b: u64,
    /// Blocks per window, at most the number of blocks.
    w: u64,
    /// Number of blocks, `ceil(n / b)`.
    blocks: u64,
    /// Records the last block lacks (`b - r`), 0 when it is full.
    short: u64,
    block_domain: Domain,
}

impl Layout {
    /// The layout for `n >= 1` records; `shape`'s fields are at least 1.
    pub(crate) fn new(n: u64, shape: Blocks) -> Layout {
        let b = shape.block_records.clamp(1, n);
        let blocks = n.div_ceil(b);
        let w = shape.window_blocks.clamp(1, blocks);
        Layout { n, b, w, blocks, short: blocks * b - n, block_domain: Domain::new(blocks) }
    }

    /// The order of the cycle keyed `cycle_key`.
    pub(crate) fn cycle(&self, cycle_key: u64) -> CycleOrder {
        let blocks = self.block_domain.permutation(mix64(cycle_key ^ BLOCK_ORDER_KEY));
        let short_at = if self.short > 0 { blocks.invert(self.blocks - 1) } else { u64::MAX };
        CycleOrder { l: *self, blocks, short_at, key: cycle_key }
    }
}

/// One cycle's block order, with the place of the short block.
pub(crate) struct CycleOrder {
    l: Layout,
    blocks: Permutation,
    /// Where the short last block sits in the block order (`u64::MAX` when
    /// the last block is full).
    short_at: u64,
    key: u64,
}

impl CycleOrder {
    fn windows(&self) -> u64 {
        self.l.blocks.div_ceil(self.l.w)
    }

    /// Whether window `w` holds the short block.
    fn holds_short(&self, w: u64) -> bool {
        self.short_at != u64::MAX && self.short_at / self.l.w == w
    }

    /// The cycle position of window `w`'s first record (`w` may be the
    /// number of windows: then `n`).
    fn start(&self, w: u64) -> u64 {
        let full = w * self.l.w * self.l.b;
        let before = self.short_at != u64::MAX && self.short_at / self.l.w < w;
        (if before { full - self.l.short } else { full }).min(self.l.n)
    }

    fn len(&self, w: u64) -> u64 {
        self.start(w + 1) - self.start(w)
    }

    /// The window holding cycle position `q < n`.
    fn window_of(&self, q: u64) -> u64 {
        // start(w) <= w * W * b, and start(w + 1) > (w + 1) * W * b - b, so
        // the window is the quotient's or the next.
        let w = q / (self.l.w * self.l.b);
        if q >= self.start(w + 1) {
            w + 1
        } else {
            w
        }
    }

    /// The order of the records inside window `w`.
    fn inside(&self, w: u64) -> Permutation {
        let key = mix64(self.key.wrapping_add(w.wrapping_add(1).wrapping_mul(GOLDEN)) ^ WINDOW_KEY);
        Domain::new(self.len(w)).permutation(key)
    }

    /// The index at slot `t` of window `w`'s records (its blocks in block
    /// order, back to back; the short block has `b - short` slots).
    fn record(&self, w: u64, t: u64) -> u64 {
        let b = self.l.b;
        let (slot, offset) = if self.holds_short(w) {
            let ts = self.short_at - w * self.l.w;
            let before = ts * b;
            let r = b - self.l.short;
            if t < before {
                (t / b, t % b)
            } else if t < before + r {
                (ts, t - before)
            } else {
                let u = t - before - r;
                (ts + 1 + u / b, u % b)
            }
        } else {
            (t / b, t % b)
        };
        self.blocks.apply(w * self.l.w + slot) * b + offset
    }

    /// Writes the indices at cycle positions `first .. first + out.len()`,
    /// all below `n`.
    pub(crate) fn fill(&self, first: u64, out: &mut [u64]) {
        let mut q = first;
        let mut rest = out;
        while !rest.is_empty() {
            let w = self.window_of(q);
            let start = self.start(w);
            // Lossless: at most the rest's length.
            let take = (self.start(w + 1) - q).min(rest.len() as u64) as usize;
            let (now, later) = rest.split_at_mut(take);
            self.inside(w).fill(q - start, now);
            for t in now.iter_mut() {
                *t = self.record(w, *t);
            }
            q += take as u64;
            rest = later;
        }
    }

    /// The cycle position of `index < n`: `fill` writes `index` there.
    pub(crate) fn position(&self, index: u64) -> u64 {
        let b = self.l.b;
        let p = self.blocks.invert(index / b);
        let w = p / self.l.w;
        let slot = p - w * self.l.w;
        let mut t = slot * b + index % b;
        if self.holds_short(w) && p > self.short_at {
            t -= self.l.short;
        }
        self.start(w) + self.inside(w).invert(t)
    }

    /// Window `w`'s cycle positions and its blocks' index ranges, sorted.
    fn window(&self, w: u64) -> (Range<u64>, Vec<Range<u64>>) {
        let first = w * self.l.w;
        let last = (first + self.l.w).min(self.l.blocks);
        let mut records: Vec<Range<u64>> = (first..last)
            .map(|p| {
                let block = self.blocks.apply(p);
                block * self.l.b..((block + 1) * self.l.b).min(self.l.n)
            })
            .collect();
        records.sort_unstable_by_key(|r| r.start);
        (self.start(w)..self.start(w + 1), records)
    }
}

/// One window of a mode-3 sampler: which steps draw from it and which
/// records it holds ([`Sampler::window`](crate::Sampler::window)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// The steps whose global batch draws from this window (the first and
    /// last may also draw from the windows before and after).
    pub steps: Range<u64>,
    /// The first step that draws from a later window: the steps before it
    /// draw only from this window and earlier ones.
    pub complete: u64,
    /// The index ranges of the window's blocks, in index order.
    pub records: Vec<Range<u64>>,
    /// The cycle, counted from the origin, and the window in it.
    pub(crate) at: (u64, u64),
}

/// The window `w` of cycle `cycle` (counted from `origin`), whose cycle has
/// `steps_per_cycle` steps of `b` positions; `None` when no step draws from
/// it (it lies in the dropped tail of the cycle) or past the last step.
pub(crate) fn window(
    order: &CycleOrder,
    origin: u64,
    cycle: u64,
    w: u64,
    steps_per_cycle: u64,
    b: u64,
) -> Option<Window> {
    let drawn = steps_per_cycle * b;
    let (positions, records) = order.window(w);
    if positions.start >= drawn || w >= order.windows() {
        return None;
    }
    let cycle_start = origin.checked_add(cycle.checked_mul(steps_per_cycle)?)?;
    let end = positions.end.min(drawn);
    let steps = cycle_start + positions.start / b..cycle_start + (end - 1) / b + 1;
    let complete = if positions.end >= drawn { cycle_start + steps_per_cycle } else { cycle_start + end / b };
    Some(Window { steps, complete, records, at: (cycle, w) })
}

/// The window after `(cycle, w)`: the next of the cycle if any step draws
/// from it, else the first of the next cycle.
pub(crate) fn next_at(order: &CycleOrder, cycle: u64, w: u64, steps_per_cycle: u64, b: u64) -> (u64, u64) {
    let next = w + 1;
    if next < order.windows() && order.start(next) < steps_per_cycle * b {
        (cycle, next)
    } else {
        (cycle + 1, 0)
    }
}

/// Window `w` of the order (for the sampler's step arithmetic).
pub(crate) fn window_of_position(order: &CycleOrder, q: u64) -> u64 {
    order.window_of(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn orders() -> Vec<(u64, Blocks)> {
        let mut v = Vec::new();
        for n in [1u64, 2, 7, 64, 100, 101, 1000, 1023] {
            for (b, w) in [(1, 1), (1, 5), (3, 1), (3, 4), (7, 3), (10, 10), (64, 2), (5000, 3)] {
                v.push((n, Blocks { block_records: b, window_blocks: w }));
            }
        }
        v
    }

    #[test]
    fn a_cycle_is_a_permutation_and_position_inverts_it() {
        for (n, shape) in orders() {
            let l = Layout::new(n, shape);
            for key in [0u64, 1, 0xdead_beef] {
                let order = l.cycle(key);
                let mut out = vec![0; n as usize];
                order.fill(0, &mut out);
                let mut seen = vec![false; n as usize];
                for (q, &i) in out.iter().enumerate() {
                    assert!(i < n, "n={n} {shape:?}: index {i}");
                    assert!(!seen[i as usize], "n={n} {shape:?}: {i} twice");
                    seen[i as usize] = true;
                    assert_eq!(order.position(i), q as u64, "n={n} {shape:?} index {i}");
                }
                // Any sub-range fills the same as the whole.
                let mid = n / 3;
                let mut part = vec![0; (n - mid) as usize];
                order.fill(mid, &mut part);
                assert_eq!(part, out[mid as usize..]);
            }
        }
    }

    #[test]
    fn each_window_draws_only_from_its_blocks() {
        let n = 1000;
        let shape = Blocks { block_records: 7, window_blocks: 4 };
        let order = Layout::new(n, shape).cycle(9);
        let mut out = vec![0; n as usize];
        order.fill(0, &mut out);
        for w in 0..order.windows() {
            let (positions, records) = order.window(w);
            let mut drawn: Vec<u64> = out[positions.start as usize..positions.end as usize].to_vec();
            drawn.sort_unstable();
            let held: Vec<u64> = records.iter().flat_map(|r| r.clone()).collect();
            assert_eq!(drawn, held, "window {w}");
        }
    }
}
