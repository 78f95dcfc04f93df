//! The sampler: modes, state, and the per-step index computation.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::blocked::{self, Blocks, CycleOrder, Layout, Window};
use crate::feistel::{Domain, Permutation};
use crate::random::{mix64, Lemire, GOLDEN, SLOT_GAMMA};
use crate::{Error, Shard};

/// The longest global batch a sampler hands out in one step: `2^32` indices
/// (32 GiB of `u64`), or less where `usize` is narrower.
pub const MAX_BATCH: u64 = {
    let widest_vec = isize::MAX as u64 / 8;
    if widest_vec < 1 << 32 {
        widest_vec
    } else {
        1 << 32
    }
};

/// How many cycles [`Sampler::next_use`] searches in cyclic mode, counting
/// the first one it searches. A cycle leaves out `length mod B`
/// of its `length` indices, which is under half of them (`length mod B < B
/// <= length - length mod B`), and each cycle's permutation is keyed afresh;
/// so an index is left out of 63 cycles in a row with probability below
/// `2^-63`, and the search practically never ends empty-handed while a
/// step still exists.
const NEXT_USE_CYCLES: u64 = 64;

/// Domain-separation constants: the iid and cyclic streams of one seed are
/// derived from different keys, so they share no structure.
const IID_KEY: u64 = 0x5A17_1D00_0000_0001;
const CYCLIC_KEY: u64 = 0x5A17_C7C1_0000_0002;
const BLOCKED_KEY: u64 = 0x5A17_B10C_0000_0005;

/// How indices are drawn. The numbering matches loaderx's `Sampler.Mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum Mode {
    /// In order: batch `k` holds `(k * B + j) mod length` for `j < B`, wrapping
    /// around the end of the index space so no batch is cut short.
    Sequential = 0,
    /// Independent and uniform, with replacement: every index of every batch
    /// is a fresh unbiased draw from `[0, length)`.
    Iid = 1,
    /// Without replacement: each cycle is a fresh random permutation of
    /// `[0, length)`, cut into full batches.
    Cyclic = 2,
    /// Without replacement, a window of blocks at a time: each cycle visits
    /// every index once, drawing each batch from the records of a window of
    /// [`Blocks::window_blocks`] blocks of [`Blocks::block_records`]
    /// consecutive indices, the windows walking a fresh random order of the
    /// blocks (see the crate docs).
    Blocked = 3,
}

impl Mode {
    /// The mode with number `v` (0 sequential, 1 iid, 2 cyclic, 3 blocked), or
    /// [`Error::BadMode`].
    pub fn from_u8(v: u8) -> Result<Mode, Error> {
        match v {
            0 => Ok(Mode::Sequential),
            1 => Ok(Mode::Iid),
            2 => Ok(Mode::Cyclic),
            3 => Ok(Mode::Blocked),
            _ => Err(Error::BadMode(v)),
        }
    }
}

/// Everything needed to rebuild a sampler at the same point:
/// [`Sampler::from_state`] of [`Sampler::state`] continues identically.
///
/// It holds no shard, so a run may resume with a different shard count.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SamplerState {
    /// The sampling mode.
    pub mode: Mode,
    /// The seed every random choice derives from.
    pub seed: u64,
    /// The step whose batch [`Sampler::next_batch`] returns next.
    pub step: u64,
    /// The size of the index space `[0, length)`.
    pub length: u64,
    /// The requested batch size (the batch is shorter if `length` is smaller).
    pub batch_size: u64,
    /// The step from which the index space is `[0, length)`: 0 for a run
    /// that always had `length` records. A run resumed over a store that
    /// grew draws its earlier steps from the earlier length and starts
    /// afresh over the new one here ([`Sampler::grown`]); absent from the
    /// serialised form when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub origin: u64,
    /// Mode 3's block shape (absent in the other modes; absent in mode 3
    /// means [`Blocks::DEFAULT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<Blocks>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The per-mode constants, computed once in [`Sampler::new`].
#[derive(Clone, Copy, Debug)]
enum Kernel {
    Sequential,
    Iid {
        /// The key of this seed's iid stream.
        key: u64,
        /// Reduction of 64-bit words into `[0, length)`.
        lemire: Lemire,
    },
    Cyclic {
        /// The key of this seed's sequence of per-cycle permutations.
        key: u64,
        /// The Feistel domain for `length`.
        domain: Domain,
        /// `length / batch_len`: full batches in one cycle.
        steps_per_cycle: u64,
    },
    Blocked {
        /// The key of this seed's sequence of per-cycle orders.
        key: u64,
        /// Blocks and windows over `length`.
        layout: Layout,
        /// `length / batch_len`: full batches in one cycle.
        steps_per_cycle: u64,
    },
}

/// One cycle's order in a mode without replacement.
enum Order {
    Cyclic(Permutation),
    Blocked(CycleOrder),
}

impl Order {
    fn invert(&self, index: u64) -> u64 {
        match self {
            Order::Cyclic(p) => p.invert(index),
            Order::Blocked(o) => o.position(index),
        }
    }

    fn fill(&self, first: u64, out: &mut [u64]) {
        match self {
            Order::Cyclic(p) => p.fill(first, out),
            Order::Blocked(o) => o.fill(first, out),
        }
    }
}

/// A seekable, shardable stream of index batches over `[0, length)`.
///
/// The batch of a step is a pure function of `(mode, seed, length,
/// batch_size, step)`: [`Sampler::batch`] computes any step directly, and the
/// only mutable part is the current step used by [`Sampler::next_batch`].
/// See the [crate docs](crate) for what each mode draws.
#[derive(Clone, Debug)]
pub struct Sampler {
    mode: Mode,
    seed: u64,
    step: u64,
    length: u64,
    batch_size: u64,
    batch_len: usize,
    /// [`SamplerState::origin`].
    origin: u64,
    /// [`SamplerState::blocks`].
    blocks: Option<Blocks>,
    kernel: Kernel,
}

impl Sampler {
    /// A sampler at step 0 over `[0, length)` with batches of `batch_size`
    /// (or of `length` when that is smaller).
    ///
    /// Errors: [`Error::EmptyIndexSpace`] for `length == 0`,
    /// [`Error::ZeroBatch`] for `batch_size == 0`, [`Error::BatchTooLarge`]
    /// when `min(batch_size, length)` exceeds [`MAX_BATCH`].
    pub fn new(mode: Mode, length: u64, batch_size: u64, seed: u64) -> Result<Sampler, Error> {
        Sampler::with_blocks(mode, length, batch_size, seed, None)
    }

    /// [`Sampler::new`] with mode 3's block shape (`None`: [`Blocks::DEFAULT`];
    /// ignored in the other modes). A shape larger than the index space is
    /// cut to it (blocks of at most `length` records, windows of at most
    /// every block); the state keeps the shape as given.
    ///
    /// Errors: those of [`Sampler::new`], and [`Error::ZeroBlocks`] for a
    /// shape with a 0.
    pub fn with_blocks(
        mode: Mode,
        length: u64,
        batch_size: u64,
        seed: u64,
        blocks: Option<Blocks>,
    ) -> Result<Sampler, Error> {
        if length == 0 {
            return Err(Error::EmptyIndexSpace);
        }
        if batch_size == 0 {
            return Err(Error::ZeroBatch);
        }
        let batch = batch_size.min(length);
        if batch > MAX_BATCH {
            return Err(Error::BatchTooLarge { batch, max: MAX_BATCH });
        }
        let blocks = (mode == Mode::Blocked).then(|| blocks.unwrap_or(Blocks::DEFAULT));
        if let Some(shape) = blocks {
            if shape.block_records == 0 {
                return Err(Error::ZeroBlocks { what: "block_records" });
            }
            if shape.window_blocks == 0 {
                return Err(Error::ZeroBlocks { what: "window_blocks" });
            }
            if shape.shards == 0 {
                return Err(Error::ZeroBlocks { what: "shards" });
            }
            // Not `is_multiple_of`: the workspace supports Rust 1.80.
            let shards = u64::from(shape.shards);
            if batch / shards * shards != batch {
                return Err(Error::ShardDoesNotDivide { batch, count: shape.shards });
            }
        }
        let kernel = match mode {
            Mode::Sequential => Kernel::Sequential,
            Mode::Blocked => Kernel::Blocked {
                key: mix64(seed ^ BLOCKED_KEY),
                layout: Layout::new(length, blocks.unwrap_or(Blocks::DEFAULT), batch),
                steps_per_cycle: length / batch,
            },
            Mode::Iid => Kernel::Iid { key: mix64(seed ^ IID_KEY), lemire: Lemire::new(length, 64) },
            Mode::Cyclic => Kernel::Cyclic {
                key: mix64(seed ^ CYCLIC_KEY),
                domain: Domain::new(length),
                steps_per_cycle: length / batch,
            },
        };
        Ok(Sampler {
            mode,
            seed,
            step: 0,
            length,
            batch_size,
            // Lossless: batch <= MAX_BATCH <= isize::MAX.
            batch_len: batch as usize,
            origin: 0,
            blocks,
            kernel,
        })
    }

    /// The sampler that continues this one over `[0, length)` from step
    /// `origin` on: the same mode, seed and batch size, with its first cycle
    /// starting at `origin`. A run over a store that grew to `length`
    /// records resumes with this sampler from the step
    /// [`cycle_boundary`](Sampler::cycle_boundary) names, so the cycle under
    /// way finishes over the records it began with.
    ///
    /// Its draws at steps from `origin` on: sequential, the walk over
    /// `[0, length)` from index 0; cyclic, a fresh permutation per cycle of
    /// `length / B` steps, keyed apart from every cycle before `origin`; iid,
    /// uniform over `[0, length)`, keyed by the step as always. Steps before
    /// `origin` are not meant to be asked (they wrap around as with
    /// [`next_batch`](Sampler::next_batch)).
    ///
    /// Errors: those of [`Sampler::new`].
    pub fn grown(&self, length: u64, origin: u64) -> Result<Sampler, Error> {
        let mut next = Sampler::with_blocks(self.mode, length, self.batch_size, self.seed, self.blocks)?;
        next.origin = origin;
        next.step = self.step.max(origin);
        Ok(next)
    }

    /// The first step at or after `step` that starts a cycle: the step from
    /// which a store that grew can add its new records without changing the
    /// cycle under way. Cycles count from the [origin](SamplerState::origin):
    /// cyclic, `length / B` steps each; iid, which has no cycles, the same
    /// number of steps (an epoch's worth of draws); sequential, the first
    /// step whose first draw is at or past the end of the current pass over
    /// `[0, length)` (so the step that crosses the end still wraps to the
    /// first records). `step` itself when it starts one, `u64::MAX` when no
    /// later step does.
    pub fn cycle_boundary(&self, step: u64) -> u64 {
        let rel = step.saturating_sub(self.origin);
        let b = self.batch_len as u64;
        let boundary = match self.kernel {
            Kernel::Sequential => {
                let n = u128::from(self.length);
                let pos = u128::from(rel) * u128::from(b);
                let pass_end = pos.div_ceil(n) * n;
                pass_end.div_ceil(u128::from(b))
            }
            Kernel::Iid { .. } | Kernel::Cyclic { .. } | Kernel::Blocked { .. } => {
                let per_cycle = u128::from(self.length / b);
                u128::from(rel).div_ceil(per_cycle) * per_cycle
            }
        };
        u64::try_from(u128::from(self.origin) + boundary).unwrap_or(u64::MAX)
    }

    /// The global batch length, `min(batch_size, length)`: a store smaller
    /// than one batch gives a shorter batch.
    pub fn batch_len(&self) -> usize {
        self.batch_len
    }

    /// The length of `shard`'s slice of each global batch, or
    /// [`Error::BadShard`] / [`Error::ShardDoesNotDivide`].
    pub fn shard_len(&self, shard: Shard) -> Result<usize, Error> {
        let (start, end) = shard.range(self.batch_len)?;
        Ok(end - start)
    }

    /// Writes the global batch of `step` into `out`, which must hold exactly
    /// [`batch_len`](Sampler::batch_len) indices ([`Error::BufferLength`]
    /// otherwise).
    pub fn fill(&self, step: u64, out: &mut [u64]) -> Result<(), Error> {
        self.fill_shard(step, Shard::ALL, out)
    }

    /// Writes `shard`'s contiguous slice of the global batch of `step` into
    /// `out`, which must hold exactly [`shard_len`](Sampler::shard_len)
    /// indices. Computes only this shard's indices and allocates nothing.
    pub fn fill_shard(&self, step: u64, shard: Shard, out: &mut [u64]) -> Result<(), Error> {
        let (start, end) = shard.range(self.batch_len)?;
        if out.len() != end - start {
            return Err(Error::BufferLength { expected: (end - start) as u64, got: out.len() as u64 });
        }
        self.fill_positions(step, start, out);
        Ok(())
    }

    /// Writes slots `start .. start + out.len()` of the global batch of
    /// `step`: that part of what [`fill`](Sampler::fill) writes, computing
    /// only those indices ([`Error::BufferLength`] when the slots pass the
    /// end of the batch). A reader of a few positions at a time (a packer
    /// walking documents) pays for each cycle's keys once per call, not
    /// once per index.
    pub fn fill_slots(&self, step: u64, start: usize, out: &mut [u64]) -> Result<(), Error> {
        if start.checked_add(out.len()).is_none_or(|end| end > self.batch_len) {
            return Err(Error::BufferLength {
                expected: self.batch_len.saturating_sub(start) as u64,
                got: out.len() as u64,
            });
        }
        self.fill_positions(step, start, out);
        Ok(())
    }

    /// The global batch of `step`, newly allocated.
    pub fn batch(&self, step: u64) -> Vec<u64> {
        let mut out = vec![0; self.batch_len];
        self.fill_positions(step, 0, &mut out);
        out
    }

    /// The batch of the current step; then advances to the next step.
    pub fn next_batch(&mut self) -> Vec<u64> {
        let out = self.batch(self.step);
        // The stream is defined for every u64 step; past the last it wraps.
        self.step = self.step.wrapping_add(1);
        out
    }

    /// Moves to `step`, in constant time: the next
    /// [`next_batch`](Sampler::next_batch) returns that step's batch.
    pub fn seek(&mut self, step: u64) {
        self.step = step;
    }

    /// The step whose batch [`next_batch`](Sampler::next_batch) returns next.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The first step after `after` whose global batch contains `index`:
    /// when the record is needed next. Computed directly, in about the time
    /// of computing one or two indices, never by scanning batches.
    ///
    /// - Sequential: arithmetic on the circular walk.
    /// - Cyclic: the inverse permutation gives the index's position in the
    ///   cycle of step `after + 1`; if that position's step is past `after`
    ///   it is the answer, else (or when that cycle leaves the index out, see
    ///   the [crate docs](crate)) the next cycles are asked the same way.
    /// - Iid: always `None`: every step draws independently, so no step is
    ///   known in advance.
    ///
    /// In sequential and cyclic mode `None` means no such step exists:
    /// `index >= length`, or the step would be past `u64::MAX` (steps are not
    /// wrapped here, unlike [`next_batch`](Sampler::next_batch)), or, in
    /// cyclic mode, none of the 64 cycles searched (that of `after + 1` and
    /// the 63 after it) places the index after `after`, which needs it left
    /// out of 63 cycles in a row: probability below `2^-63`.
    ///
    /// The step is that of the *global* batch: a consumer of one
    /// [`Shard`] may find the index in another shard's slice at that step.
    /// [`fill_next_use`](Sampler::fill_next_use) answers for many indices at
    /// once, computing each cycle's permutation only once.
    pub fn next_use(&self, index: u64, after: u64) -> Option<u64> {
        let mut out = [None];
        self.next_use_into(after, &[index], &mut out, false, None);
        out[0]
    }

    /// [`next_use`](Sampler::next_use) of every `indices[k]` into `out[k]`;
    /// `out` must be as long as `indices` ([`Error::BufferLength`]
    /// otherwise). Allocates nothing. For a loader's step `s`, passing the
    /// step's indices and `after = s` gives each record's next use.
    pub fn fill_next_use(&self, after: u64, indices: &[u64], out: &mut [Option<u64>]) -> Result<(), Error> {
        if out.len() != indices.len() {
            return Err(Error::BufferLength { expected: indices.len() as u64, got: out.len() as u64 });
        }
        self.next_use_into(after, indices, out, false, None);
        Ok(())
    }

    /// [`fill_shard`](Sampler::fill_shard) and, for each index it wrote, the
    /// first step after `step` at which *this shard* draws it again: `next[k]`
    /// is when `indices[k]` is needed next by the consumer of `shard`. Both
    /// buffers must hold exactly [`shard_len`](Sampler::shard_len) entries.
    /// For [`Shard::ALL`] this is [`next_use`](Sampler::next_use); for a
    /// shard, a step at which another shard takes the index does not count
    /// (a host's record cache keeps what *it* reads next). In cyclic mode
    /// each cycle places an index in a given shard with probability
    /// `1 / count`, so `None` after the 64 cycles searched needs `(1 - 1 /
    /// count)^63` bad luck; in sequential mode the search stops after 64
    /// passes over the data.
    ///
    /// This is what a loader gathering `step` asks. It costs less than
    /// [`fill_next_use`](Sampler::fill_next_use) on the same indices: in
    /// cyclic mode the indices are known to sit at `step` in their cycle, so
    /// the search starts at the next cycle, one inverse permutation per index
    /// instead of two. (The step is that of the global batch, see
    /// [`next_use`](Sampler::next_use).)
    pub fn fill_shard_with_next_use(
        &self,
        step: u64,
        shard: Shard,
        indices: &mut [u64],
        next: &mut [Option<u64>],
    ) -> Result<(), Error> {
        self.fill_shard(step, shard, indices)?;
        if next.len() != indices.len() {
            return Err(Error::BufferLength { expected: indices.len() as u64, got: next.len() as u64 });
        }
        let slots = shard.range(self.batch_len)?;
        self.next_use_into(step, indices, next, true, Some(slots));
        Ok(())
    }

    /// The body of the next-use methods; the lengths are equal. With
    /// `from_batch`, every index is one of the batch of `after`. With `slots`
    /// (a shard's positions `lo..hi` in a batch) only draws at those positions
    /// count.
    fn next_use_into(
        &self,
        after: u64,
        indices: &[u64],
        out: &mut [Option<u64>],
        from_batch: bool,
        slots: Option<(usize, usize)>,
    ) {
        let b = self.batch_len as u64;
        let counts = |q: u64| slots.is_none_or(|(lo, hi)| (lo as u64..hi as u64).contains(&(q % b)));
        out.fill(None);
        let Some(first_step) = after.checked_add(1) else {
            return;
        };
        let n = self.length;
        // Sequential walks and cyclic cycles count from the origin.
        let origin = self.origin;
        match self.kernel {
            Kernel::Iid { .. } => {}
            Kernel::Sequential => {
                // Step `s` holds the positions `s * B .. (s + 1) * B` of the
                // walk, and position `p` reads index `p mod n`. The positions
                // of steps `>= first_step` are exactly those `>= first_step *
                // B`, so the answer is the step of the first position at or
                // past that with `p mod n == index`: `first_step * B + r`,
                // `r = (index - first_step * B) mod n`, whose step is
                // `first_step + r / B` (the start is a multiple of B).
                // Lossless: the remainder is below n.
                let rel = first_step.wrapping_sub(origin);
                let start = ((u128::from(rel) * u128::from(b)) % u128::from(n)) as u64;
                for (o, &index) in out.iter_mut().zip(indices) {
                    if index >= n {
                        continue;
                    }
                    let r = if index >= start { index - start } else { index + (n - start) };
                    // Later passes over the data put the index at `r + k n`
                    // positions on; a shard takes the first at its slots.
                    *o = (0..NEXT_USE_CYCLES)
                        .map_while(|k| r.checked_add(k.checked_mul(n)?))
                        .find(|&p| counts(p))
                        .and_then(|p| first_step.checked_add(p / b));
                }
            }
            Kernel::Cyclic { steps_per_cycle, .. } | Kernel::Blocked { steps_per_cycle, .. } => {
                // Cycle `c` runs steps `c * S .. (c + 1) * S` and reads
                // position `q < S * B` of its permutation at step
                // `c * S + q / B`; positions `>= S * B` are left out. Each
                // cycle contains an index at most once, so the first cycle
                // (from the one of `first_step` on) that places it at a step
                // `>= first_step` holds its next use. An index of the batch
                // of `after` has its one place in `after`'s cycle at `after`,
                // so its search starts a cycle later.
                let per_cycle = steps_per_cycle * b;
                let mut open = indices.iter().filter(|&&i| i < n).count();
                // Cycles counted from the origin: cycle `c` starts at step
                // `origin + c * S` and is keyed as cycle `origin + c`.
                let first_cycle = if from_batch {
                    // Lossless: after < u64::MAX here. Past the last cycle
                    // the range below is empty.
                    after.wrapping_sub(origin) / steps_per_cycle + 1
                } else {
                    first_step.wrapping_sub(origin) / steps_per_cycle
                };
                let last_cycle = first_cycle.saturating_add(NEXT_USE_CYCLES - 1).min(u64::MAX / steps_per_cycle);
                for cycle in first_cycle..=last_cycle {
                    if open == 0 {
                        break;
                    }
                    let perm = self.order(cycle);
                    // Lossless: cycle <= u64::MAX / S. Past u64::MAX the
                    // cycle starts at no step.
                    let Some(cycle_start) = origin.checked_add(cycle * steps_per_cycle) else {
                        break;
                    };
                    for (o, &index) in out.iter_mut().zip(indices) {
                        if o.is_some() || index >= n {
                            continue;
                        }
                        let q = perm.invert(index);
                        if q >= per_cycle || !counts(q) {
                            continue;
                        }
                        match cycle_start.checked_add(q / b) {
                            Some(step) if step >= first_step => {
                                *o = Some(step);
                                open -= 1;
                            }
                            // Before `first_step` (only in the first cycle),
                            // or past the last step there is.
                            _ => {}
                        }
                    }
                }
            }
        }
    }

    /// The state to save for an exact resume.
    pub fn state(&self) -> SamplerState {
        SamplerState {
            mode: self.mode,
            seed: self.seed,
            step: self.step,
            length: self.length,
            batch_size: self.batch_size,
            origin: self.origin,
            blocks: self.blocks,
        }
    }

    /// Rebuilds a sampler from a saved state; fails like [`Sampler::new`] on
    /// a state that no sampler could have produced.
    pub fn from_state(state: &SamplerState) -> Result<Sampler, Error> {
        let mut sampler = Sampler::with_blocks(state.mode, state.length, state.batch_size, state.seed, state.blocks)?;
        sampler.step = state.step;
        sampler.origin = state.origin;
        Ok(sampler)
    }

    /// Writes positions `start .. start + out.len()` of the global batch of
    /// `step`. The caller has checked that this range lies in the batch.
    pub(crate) fn fill_positions(&self, step: u64, start: usize, out: &mut [u64]) {
        let b = self.batch_len as u64;
        let start = start as u64;
        match self.kernel {
            Kernel::Sequential => {
                let n = u128::from(self.length);
                let rel = step.wrapping_sub(self.origin);
                let pos = u128::from(rel) * u128::from(b) + u128::from(start);
                // Lossless: the remainder is below length.
                let first = (pos % n) as u64;
                // Up to the end of the index space, then wrap to 0. The batch
                // is at most `length` long, so it wraps at most once.
                let head = (self.length - first).min(out.len() as u64) as usize;
                let (before_wrap, after_wrap) = out.split_at_mut(head);
                for (o, i) in before_wrap.iter_mut().zip(first..) {
                    *o = i;
                }
                for (o, i) in after_wrap.iter_mut().zip(0..) {
                    *o = i;
                }
            }
            Kernel::Iid { key, lemire } => {
                // The step's own key: SplitMix64 output `step` of the seed's
                // key. Slot `j` then reads counter `j` of that step's stream.
                let step_key = mix64(key.wrapping_add(step.wrapping_mul(GOLDEN)));
                for (o, slot) in out.iter_mut().zip(start..) {
                    let word = mix64(step_key.wrapping_add(slot.wrapping_mul(SLOT_GAMMA)));
                    *o = match lemire.reduce(word) {
                        Some(index) => index,
                        None => redraw(step_key, slot, b, &lemire),
                    };
                }
            }
            Kernel::Cyclic { steps_per_cycle, .. } => {
                // A cycle holds `steps_per_cycle` whole batches, so a batch
                // never straddles two cycles: the cycle and its round keys are
                // computed once per call.
                let rel = step.wrapping_sub(self.origin);
                let cycle = rel / steps_per_cycle;
                let first = (rel % steps_per_cycle) * b + start;
                self.order(cycle).fill(first, out);
            }
            Kernel::Blocked { steps_per_cycle, .. } => {
                // As cyclic: a batch never straddles two cycles.
                let rel = step.wrapping_sub(self.origin);
                let cycle = rel / steps_per_cycle;
                let first = (rel % steps_per_cycle) * b + start;
                self.order(cycle).fill(first, out);
            }
        }
    }

    /// Cycle `cycle`'s order (counted from the origin); cyclic and blocked
    /// modes only.
    fn order(&self, cycle: u64) -> Order {
        match self.kernel {
            Kernel::Cyclic { key, domain, .. } => Order::Cyclic(domain.permutation(cycle_key(key, self.origin, cycle))),
            Kernel::Blocked { key, layout, .. } => Order::Blocked(layout.cycle(cycle_key(key, self.origin, cycle))),
            Kernel::Sequential | Kernel::Iid { .. } => unreachable!("only modes without replacement have cycle orders"),
        }
    }

    /// Mode 3's block shape as given (`None` in the other modes).
    pub fn blocks(&self) -> Option<Blocks> {
        self.blocks
    }

    /// Mode 3 only (`None` otherwise, or past the last step): the window
    /// that the first index of `step`'s global batch is drawn from, with the
    /// steps that draw from it and its blocks' index ranges. A reader loads
    /// a window's blocks (each one read of consecutive records) before the
    /// steps of [`Window::steps`] gather, and [`Sampler::next_window`] names
    /// the one to load after it.
    ///
    /// A sampler whose [`Blocks::shards`] split the cycles has windows per
    /// shard only ([`Sampler::shard_window`]): `None` here.
    pub fn window(&self, step: u64) -> Option<Window> {
        let Kernel::Blocked { key, layout, steps_per_cycle } = self.kernel else {
            return None;
        };
        if layout.split() {
            return None;
        }
        let b = self.batch_len as u64;
        let rel = step.checked_sub(self.origin)?;
        let cycle = rel / steps_per_cycle;
        let order = layout.cycle(cycle_key(key, self.origin, cycle));
        let w = blocked::window_of_position(&order, (rel % steps_per_cycle) * b);
        blocked::window(&order, self.origin, cycle, w, steps_per_cycle, b)
    }

    /// The window after `window` (the next of its cycle that any step draws
    /// from, else the first of the next cycle); `None` past the last step.
    pub fn next_window(&self, window: &Window) -> Option<Window> {
        let Kernel::Blocked { key, layout, steps_per_cycle } = self.kernel else {
            return None;
        };
        let b = self.batch_len as u64;
        let (cycle, w, k) = window.at;
        let order = layout.cycle(cycle_key(key, self.origin, cycle));
        if layout.split() {
            let (cycle, j) = blocked::split_next_at(&order, cycle, k, w, steps_per_cycle);
            let order = layout.cycle(cycle_key(key, self.origin, cycle));
            return blocked::split_window(&order, self.origin, cycle, k, j, steps_per_cycle);
        }
        let (cycle, w) = blocked::next_at(&order, cycle, w, steps_per_cycle, b);
        let order = layout.cycle(cycle_key(key, self.origin, cycle));
        blocked::window(&order, self.origin, cycle, w, steps_per_cycle, b)
    }
}

impl Sampler {
    /// Mode 3 only (`None` otherwise, or past the last step): the window
    /// that `shard`'s first index of `step` is drawn from, with the steps
    /// at which `shard` draws from it and its records' index ranges.
    /// Unsplit cycles ([`Blocks::shards`] 1) have one window for all shards:
    /// [`Sampler::window`]. Cycles split for `k` shards have windows per
    /// shard, and a shard of another count gets `None`. [`Sampler::next_window`]
    /// names the window after it, of the same shard.
    pub fn shard_window(&self, step: u64, shard: Shard) -> Option<Window> {
        let Kernel::Blocked { key, layout, steps_per_cycle } = self.kernel else {
            return None;
        };
        if !layout.split() {
            return self.window(step);
        }
        let shard = shard.check().ok()?;
        if u64::from(shard.count) != layout.shards() {
            return None;
        }
        let k = u64::from(shard.index);
        let s = self.batch_len as u64 / layout.shards();
        let rel = step.checked_sub(self.origin)?;
        let cycle = rel / steps_per_cycle;
        let order = layout.cycle(cycle_key(key, self.origin, cycle));
        let j = blocked::split_window_of_local(&order, k, (rel % steps_per_cycle) * s);
        blocked::split_window(&order, self.origin, cycle, k, j, steps_per_cycle)
    }
}

impl Sampler {
    /// Mode 3, unsplit, only (`None` otherwise): window `w` of cycle
    /// `cycle`'s order (cycles counted from the sampler's origin): its
    /// positions in the cycle and its blocks' index ranges (`None` past the
    /// last window). For a reader that walks the cycle's positions itself,
    /// as a packer of documents does, and loads each window ahead.
    pub fn cycle_window(&self, cycle: u64, w: u64) -> Option<(Range<u64>, Vec<Range<u64>>)> {
        match self.kernel {
            Kernel::Blocked { layout, .. } if !layout.split() => match self.order(cycle) {
                Order::Blocked(o) => o.window_at(w),
                Order::Cyclic(_) => None,
            },
            _ => None,
        }
    }

    /// Mode 3, unsplit, only (`None` otherwise): the window of cycle
    /// `cycle` holding its cycle position `q < length`
    /// ([`Sampler::cycle_window`]).
    pub fn cycle_window_of(&self, cycle: u64, q: u64) -> Option<u64> {
        match self.kernel {
            Kernel::Blocked { layout, .. } if !layout.split() && q < self.length => match self.order(cycle) {
                Order::Blocked(o) => Some(blocked::window_of_position(&o, q)),
                Order::Cyclic(_) => None,
            },
            _ => None,
        }
    }
}

impl Sampler {
    /// Cyclic and blocked modes only (`None` otherwise): the position in cycle `cycle`'s
    /// permutation at which `index` is drawn (positions past the cycle's
    /// full batches are left out, see the crate docs).
    pub(crate) fn cycle_position(&self, cycle: u64, index: u64) -> Option<u64> {
        match self.kernel {
            Kernel::Cyclic { .. } | Kernel::Blocked { .. } if index < self.length => {
                Some(self.order(cycle).invert(index))
            }
            _ => None,
        }
    }
}

/// The permutation key of cycle `cycle` counted from `origin`: cycle
/// `origin + cycle` of the seed's sequence. Cycles before a growth at step
/// `origin` number below `origin` (each is at least one step long), so the
/// cycles after it never reuse their keys.
fn cycle_key(key: u64, origin: u64, cycle: u64) -> u64 {
    mix64(key.wrapping_add(origin.wrapping_add(cycle).wrapping_mul(GOLDEN)))
}

/// A rejected iid draw: slot `j` of a batch of `b` tries counters `j + b`,
/// `j + 2b`, ... of the same step's stream, which no first draw uses. Each try
/// is rejected with probability below `length / 2^64`.
#[cold]
fn redraw(step_key: u64, slot: u64, b: u64, lemire: &Lemire) -> u64 {
    let mut counter = slot;
    loop {
        counter = counter.wrapping_add(b);
        let word = mix64(step_key.wrapping_add(counter.wrapping_mul(SLOT_GAMMA)));
        if let Some(index) = lemire.reduce(word) {
            return index;
        }
    }
}
