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
/// Keys the windows of shard `k > 0` apart from shard 0's.
const SHARD_GAMMA: u64 = 0xD1B5_4A32_D192_ED03;

/// The block shape of mode 3: blocks of `block_records` consecutive indices,
/// drawn `window_blocks` blocks at a time, for `shards` consumers. Part of
/// the saved state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Blocks {
    /// Consecutive indices per block (a store reads a block as one read).
    pub block_records: u64,
    /// Blocks per window (what a reader holds in memory at once).
    pub window_blocks: u64,
    /// How many [`Shard`](crate::Shard)s the cycles are split for. With 1,
    /// every shard's slice of a batch comes from the one window of the whole
    /// batch. With `k > 1` each cycle's records are cut into `k` stretches
    /// of whole blocks (but the two at each cut), one per shard, and shard
    /// `i` of `k` draws its slice of every batch from windows of stretch `i`
    /// only: a reader of one shard loads only its own blocks (see the
    /// module docs). States saved before this field read as 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub shards: u32,
}

fn one() -> u32 {
    1
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's signature
fn is_one(v: &u32) -> bool {
    *v == 1
}

impl Blocks {
    /// The shape [`Sampler::new`](crate::Sampler::new) gives mode 3 when
    /// nobody chose one: 64 records per block, 256 blocks per window. A
    /// loader chooses from the record size and its memory instead.
    pub const DEFAULT: Blocks = Blocks { block_records: 64, window_blocks: 256, shards: 1 };
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
    /// Shards the cycle is split for ([`Blocks::shards`]); 1: not split.
    shards: u64,
    /// Each shard's slots of a batch: the batch length over `shards`.
    slice: u64,
}

impl Layout {
    /// The layout for `n >= 1` records and batches of `batch` positions;
    /// `shape`'s fields are at least 1 and its shards divide `batch`.
    pub(crate) fn new(n: u64, shape: Blocks, batch: u64) -> Layout {
        let b = shape.block_records.clamp(1, n);
        let blocks = n.div_ceil(b);
        let w = shape.window_blocks.clamp(1, blocks);
        let shards = u64::from(shape.shards.max(1));
        Layout {
            n,
            b,
            w,
            blocks,
            short: blocks * b - n,
            block_domain: Domain::new(blocks),
            shards,
            slice: (batch / shards).max(1),
        }
    }

    /// Whether the cycles are split between shards.
    pub(crate) fn split(&self) -> bool {
        self.shards > 1
    }

    /// The shard count the cycles are split for.
    pub(crate) fn shards(&self) -> u64 {
        self.shards
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
        self.inside_of(0, w, self.len(w))
    }

    /// The order of the `len` records inside window `w` of shard `k`'s
    /// stretch (shard 0's keys are those of the unsplit cycle's windows).
    fn inside_of(&self, k: u64, w: u64, len: u64) -> Permutation {
        let key = mix64(self.key.wrapping_add(w.wrapping_add(1).wrapping_mul(GOLDEN)) ^ WINDOW_KEY)
            ^ k.wrapping_mul(SHARD_GAMMA);
        Domain::new(len).permutation(key)
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
    /// all below `n` (split: below the cycle's drawn positions).
    pub(crate) fn fill(&self, first: u64, out: &mut [u64]) {
        if self.l.split() {
            return self.fill_split(first, out);
        }
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
    /// (Split: a position past the cycle's drawn ones, possibly past `n`,
    /// for an index its shard leaves out.)
    pub(crate) fn position(&self, index: u64) -> u64 {
        if self.l.split() {
            return self.position_split(index);
        }
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

    /// [`CycleOrder::window`], `None` past the last window.
    pub(crate) fn window_at(&self, w: u64) -> Option<(Range<u64>, Vec<Range<u64>>)> {
        (w < self.windows()).then(|| self.window(w))
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

/// A cycle split between shards ([`Blocks::shards`] `= k > 1`).
///
/// Line the cycle's blocks up in block order, the short block shortened:
/// the *sequence* of all `n` records. Shard `i` takes the stretch
/// `[i n / k, (i + 1) n / k)` of it (so the stretches differ by one record
/// at most, and only the two blocks at each cut are shared between two
/// shards). A stretch is cut into windows at the sequence's block bounds,
/// `W` blocks each (the first and last may hold part of a block), and the
/// shard's *local* order visits them one after another, each in a keyed
/// order of its own, like the unsplit cycle. Shard `i`'s slots
/// `i s .. (i + 1) s` of the batch of the cycle's step `t` (`s` = batch / k)
/// read local positions `t s .. (t + 1) s`; the local positions past the
/// cycle's `S s` drawn ones are left out, `n mod B` records in all, as in
/// the unsplit cycle.
impl CycleOrder {
    /// The sequence position of block slot `p`'s first record (`n` from
    /// the last slot on).
    fn seq_start(&self, p: u64) -> u64 {
        let full = p.saturating_mul(self.l.b);
        let full = if self.short_at != u64::MAX && self.short_at < p { full - self.l.short } else { full };
        full.min(self.l.n)
    }

    /// The block slot holding sequence position `t < n`.
    fn slot_of(&self, t: u64) -> u64 {
        // seq_start(p) is p b or p b - short (short < b): the quotient's
        // slot or the next.
        let p = t / self.l.b;
        if t >= self.seq_start(p + 1) {
            p + 1
        } else {
            p
        }
    }

    /// The index at sequence position `t < n`.
    fn seq(&self, t: u64) -> u64 {
        let p = self.slot_of(t);
        self.blocks.apply(p) * self.l.b + (t - self.seq_start(p))
    }

    /// The sequence position of shard `k`'s first record (`n` for
    /// `k = shards`).
    fn stretch_start(&self, k: u64) -> u64 {
        // Lossless: at most n.
        (u128::from(k) * u128::from(self.l.n) / u128::from(self.l.shards)) as u64
    }

    /// The shard whose stretch holds sequence position `t < n`.
    fn stretch_of(&self, t: u64) -> u64 {
        // Lossless: below shards. stretch_start(k + 1) > t - 1 + n / k.
        let k = (u128::from(t) * u128::from(self.l.shards) / u128::from(self.l.n)) as u64;
        if t >= self.stretch_start(k + 1) {
            k + 1
        } else {
            k
        }
    }

    /// Window `j` of shard `k`'s stretch: its sequence positions.
    fn split_bounds(&self, k: u64, j: u64) -> (u64, u64) {
        let (lo, hi) = (self.stretch_start(k), self.stretch_start(k + 1));
        let first = self.slot_of(lo.min(self.l.n - 1));
        let at = |j: u64| self.seq_start(first.saturating_add(j.saturating_mul(self.l.w))).clamp(lo, hi);
        (if j == 0 { lo } else { at(j) }, at(j + 1))
    }

    /// The window of shard `k`'s stretch holding sequence position `t`.
    fn split_window_of(&self, k: u64, t: u64) -> u64 {
        let first = self.slot_of(self.stretch_start(k));
        (self.slot_of(t) - first) / self.l.w
    }

    /// How many windows shard `k`'s stretch has.
    fn split_windows(&self, k: u64) -> u64 {
        let (lo, hi) = (self.stretch_start(k), self.stretch_start(k + 1));
        if hi == lo {
            0
        } else {
            self.split_window_of(k, hi - 1) + 1
        }
    }

    /// Writes the indices at shard `k`'s local positions `first ..`.
    fn fill_local(&self, k: u64, first: u64, out: &mut [u64]) {
        let lo = self.stretch_start(k);
        let mut t = lo + first;
        let mut rest = out;
        while !rest.is_empty() {
            let j = self.split_window_of(k, t);
            let (a, z) = self.split_bounds(k, j);
            // Lossless: at most the rest's length.
            let take = (z - t).min(rest.len() as u64) as usize;
            let (now, later) = rest.split_at_mut(take);
            self.inside_of(k, j, z - a).fill(t - a, now);
            for x in now.iter_mut() {
                *x = self.seq(a + *x);
            }
            t += take as u64;
            rest = later;
        }
    }

    fn fill_split(&self, first: u64, out: &mut [u64]) {
        let s = self.l.slice;
        let batch = s * self.l.shards;
        let mut g = first;
        let mut rest = out;
        while !rest.is_empty() {
            let (step, slot) = (g / batch, g % batch);
            let (k, off) = (slot / s, slot % s);
            // Lossless: at most the rest's length.
            let take = (s - off).min(rest.len() as u64) as usize;
            let (now, later) = rest.split_at_mut(take);
            self.fill_local(k, step * s + off, now);
            g += take as u64;
            rest = later;
        }
    }

    fn position_split(&self, index: u64) -> u64 {
        let b = self.l.b;
        let t = self.seq_start(self.blocks.invert(index / b)) + index % b;
        let k = self.stretch_of(t);
        let j = self.split_window_of(k, t);
        let (a, z) = self.split_bounds(k, j);
        let local = a - self.stretch_start(k) + self.inside_of(k, j, z - a).invert(t - a);
        let s = self.l.slice;
        (local / s) * s * self.l.shards + k * s + local % s
    }

    /// Window `j` of shard `k`'s stretch: its local positions and its
    /// records' index ranges (whole blocks but at the stretch's ends),
    /// sorted.
    fn split_window(&self, k: u64, j: u64) -> (Range<u64>, Vec<Range<u64>>) {
        let lo = self.stretch_start(k);
        let (a, z) = self.split_bounds(k, j);
        let mut records = Vec::new();
        if z > a {
            for p in self.slot_of(a)..=self.slot_of(z - 1) {
                let base = self.seq_start(p);
                let (x, y) = (base.max(a), self.seq_start(p + 1).min(z));
                let block = self.blocks.apply(p) * self.l.b;
                records.push(block + (x - base)..block + (y - base));
            }
        }
        records.sort_unstable_by_key(|r| r.start);
        (a - lo..z - lo, records)
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
    /// The cycle, counted from the origin, the window in it, and the shard
    /// whose stretch it is in (0 in an unsplit cycle), or for a mixture's
    /// source, its stream's cycle, the window and the source.
    pub(crate) at: (u64, u64, u64),
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
    Some(Window { steps, complete, records, at: (cycle, w, 0) })
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

/// Window `j` of shard `k`'s stretch of cycle `cycle` (a split cycle of
/// `steps_per_cycle` steps): as [`window`], for the steps at which shard
/// `k` draws from it.
pub(crate) fn split_window(
    order: &CycleOrder,
    origin: u64,
    cycle: u64,
    k: u64,
    j: u64,
    steps_per_cycle: u64,
) -> Option<Window> {
    let s = order.l.slice;
    let drawn = steps_per_cycle * s;
    if j >= order.split_windows(k) {
        return None;
    }
    let (positions, records) = order.split_window(k, j);
    if positions.start >= drawn {
        return None;
    }
    let cycle_start = origin.checked_add(cycle.checked_mul(steps_per_cycle)?)?;
    let end = positions.end.min(drawn);
    let steps = cycle_start + positions.start / s..cycle_start + (end - 1) / s + 1;
    let complete = if positions.end >= drawn { cycle_start + steps_per_cycle } else { cycle_start + end / s };
    Some(Window { steps, complete, records, at: (cycle, j, k) })
}

/// The window of shard `k`'s stretch after its window `j`, as [`next_at`].
pub(crate) fn split_next_at(order: &CycleOrder, cycle: u64, k: u64, j: u64, steps_per_cycle: u64) -> (u64, u64) {
    let next = j + 1;
    let start = |j| order.split_bounds(k, j).0 - order.stretch_start(k);
    if next < order.split_windows(k) && start(next) < steps_per_cycle * order.l.slice {
        (cycle, next)
    } else {
        (cycle + 1, 0)
    }
}

/// The window of shard `k`'s stretch holding its local position `q`.
pub(crate) fn split_window_of_local(order: &CycleOrder, k: u64, q: u64) -> u64 {
    order.split_window_of(k, order.stretch_start(k) + q)
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
                v.push((n, Blocks { block_records: b, window_blocks: w, shards: 1 }));
            }
        }
        v
    }

    #[test]
    fn a_cycle_is_a_permutation_and_position_inverts_it() {
        for (n, shape) in orders() {
            let l = Layout::new(n, shape, 1);
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

    /// The split order's machinery with one stretch is the unsplit order:
    /// the same draws, positions and windows.
    #[test]
    fn one_stretch_of_the_split_order_is_the_unsplit_order() {
        for (n, shape) in orders() {
            let order = Layout::new(n, shape, 1).cycle(0x5eed);
            let mut whole = vec![0; n as usize];
            order.fill(0, &mut whole);
            let mut local = vec![0; n as usize];
            order.fill_local(0, 0, &mut local);
            assert_eq!(local, whole, "n={n} {shape:?}");
            for i in 0..n {
                let t = order.seq_start(order.blocks.invert(i / order.l.b)) + i % order.l.b;
                assert_eq!(order.seq(t), i);
                let j = order.split_window_of(0, t);
                let (a, z) = order.split_bounds(0, j);
                assert_eq!(a + order.inside_of(0, j, z - a).invert(t - a), order.position(i), "n={n} {shape:?} {i}");
            }
            assert_eq!(order.split_windows(0), order.windows());
            for w in 0..order.windows() {
                assert_eq!(order.split_window(0, w), order.window(w), "n={n} {shape:?} window {w}");
            }
        }
    }

    #[test]
    fn each_window_draws_only_from_its_blocks() {
        let n = 1000;
        let shape = Blocks { block_records: 7, window_blocks: 4, shards: 1 };
        let order = Layout::new(n, shape, 1).cycle(9);
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
