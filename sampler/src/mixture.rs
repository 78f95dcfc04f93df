//! Weighted mixtures: which source each row of a step comes from, and which
//! of its records.
//!
//! A [`Mixture`] draws every global batch of `B` rows from several sources
//! with fixed weights `w_s` (normalised to sum to 1), exact over the run:
//! after `t + 1` steps, source `s` has contributed the largest-remainder
//! (Hamilton) rounding of `w_s * (t + 1) * B` rows, which is that product
//! rounded down or up, so the remainders carry over between steps and the
//! long-run proportions are exact. Any positive weight is accepted: when a
//! source gets under one row per batch (`w_s B < 1`, a 0.1 % source at 256
//! rows), the running totals are rounded another way (below, "Sources of
//! under a row per batch"), which gives it a row every `1 / (w_s B)` steps
//! or so. What is rounded is the running total, not
//! each batch: a batch holds `w_s * B` rows rounded down or up, or one row
//! further (from `floor(w_s B) - 1` to `ceil(w_s B) + 1`; at 0.7 of 256,
//! 178 to 180 rows for 179.2), because two running totals each within a row
//! of their exact value differ by up to a row more than their exact
//! difference. Rounding each batch as well would make a step's composition
//! depend on the steps before it, where now it is a function of the step
//! alone (seeking is free, below) and the batches are those of earlier
//! checkpoints.
//!
//! # Schedules
//!
//! [`Mixture::scheduled`] takes weights that change with the step
//! ([`SchedulePiece`]: piecewise linear, with jumps). Source `s`'s *target*
//! among the first `r` rows is then `B` times the integral of its weight
//! from step 0 to `r / B` (for fixed weights, `w_s r`), and everything
//! below rounds the targets where it rounded `w_s r`: largest remainders
//! of the targets while every source has a row per batch or more at every
//! point of the schedule (each step's count `floor(target growth) - 1` or
//! more, so never negative, and every source within a row of its target);
//! otherwise the rounding tree, a split giving its first child the nearest
//! integer to the child's target at the (real) step where the node's own
//! target reaches the node's rows, which for fixed weights is `share * n`
//! and for any schedule grows with the node's rows by at most as much
//! (the child's weight is part of the node's), so no count goes back. The
//! tree's shape comes from the first piece's mean weights. A resumed run
//! under other weights adds a piece from its step; every target up to that
//! step is the saved run's to the bit.
//!
//! # Each shard holds each source's share
//!
//! A step's rows are interleaved, not grouped by source, so that a shard
//! (a contiguous slice of the global batch) holds each source's share of
//! its own rows. Lay the step's rows out source by source (source 0's
//! first): *grouped position* `g`, source `s` at `[G_s, G_s + c_s)`. Write
//! `g` in the mixed radix of the batch length's prime factors, twos first,
//! then the odd primes in ascending order (`B = b_1 b_2 ... b_k`, least
//! significant digit `d_1` in radix `b_1`), and put it at the row whose
//! digits are the same read the other way round: row
//! `d_1 (B / b_1) + d_2 (B / (b_1 b_2)) + ... + d_k`. Then, for a shard
//! count `n = b_1 ... b_i`, shard `j`'s rows are those whose first `i` digits
//! spell `j`, which are the grouped positions `g` with `g mod n` fixed: an
//! arithmetic progression of step `n`, of which source `s`'s interval of
//! `c_s` positions holds `floor(c_s / n)` or `ceil(c_s / n)`. So every
//! shard's rows of source `s` are its share `c_s m / B` of the shard's `m`
//! rows rounded down or up, on every step, for every power of two that
//! divides `B` (8 ranks of 256 rows: 0.7/0.2/0.1 gives every rank 22 or 23,
//! 6 or 7, and 3 or 4 rows of its 32) and for `2^a` times any prefix of the
//! odd factors (`2^a` the largest power of two in `B`). Other divisors (3
//! shards of 384 rows) get looser shares, a shard being a union of such
//! progressions: up to 3 rows from its share at 384 rows over 3 shards in
//! the tests. (No order independent of the counts can hold every divisor's
//! shards to a row: at 12 rows, a shard of 4 rows and one of 3 share 2
//! rows, where two residue classes, mod 3 and mod 4, share one.) The global
//! batch and each source's records are those of the grouped order, and a
//! source's rows take its stream positions in row order, so a shard's rows
//! of a source are a contiguous stretch of its stream (one read, and a
//! packed source's tokens in one stretch); counting a source's rows before
//! a given row takes `O(sum of the radices)` digit operations, so a next
//! use by a shard costs about what it did.
//!
//! Runs saved before the rows were interleaved resume grouped: their
//! [`MixtureState`] has no `order` and reads as [`RowOrder::Grouped`], and a
//! loader resuming it keeps that order (the same batches as before).
//!
//! Each source reads its own *stream* of indices: a [`Sampler`] in the
//! mixture's mode over the source's records, seeded from the mixture's seed
//! and the source's position. Source `s`'s rows of step `t` are the next
//! positions of its stream, those from `A_s(t * B)` on, where `A_s(r)` is its
//! allocation among the first `r` rows. So in cyclic mode each source
//! covers its records once per its own cycle, whatever the other sources
//! do. Everything is a pure function of the step: seeking costs nothing and
//! a saved step resumes exactly.
//!
//! # The same batches as the Python mixture before it
//!
//! The composition and the streams are defined to give the batches of the
//! mixture zring's Python loader computed before this crate did, so saved
//! runs restore: weights are normalised by the sum NumPy computes (pairwise
//! summation), quotas rounded as NumPy does, ties between equal remainders
//! broken towards the lower source; a stream position `p` reads step
//! `p / b`, slot `p % b` of its sampler with batches of `b = min(4096,
//! length)` (iid and sequential; cyclic streams read position `p mod length`
//! of the permutation of cycle `p / length` however they are cut). The one
//! difference: a source shorter than 4,096 records in iid or sequential mode
//! gave short batches there; here its stream simply has `length`-index steps.
//!
//! # Allocation is monotone
//!
//! Largest-remainder rounding can take a seat away when the house grows (the
//! Alabama paradox), which here would make a step's count negative. It
//! cannot happen while every source gets at least one row per batch
//! (`w_s * B >= 1`): `A_s((t + 1) B) >= floor(w_s t B + w_s B) >=
//! floor(w_s t B) + 1 >= A_s(t B)`. Mixtures whose every source has that
//! many rows use it, so every mixture accepted before smaller weights were
//! keeps its batches.
//!
//! # Sources of under a row per batch
//!
//! A source with `w_s B < 1` would, under largest remainders, get a row at
//! one step and lose it at the next (the paradox above). With one or more
//! such *small* sources the running totals come instead from a binary tree
//! of roundings, each step still a function of its number alone, in
//! `O(sources)`: its leaves are the small sources, one each, and the
//! *group* of all the others (if any); node 0 holds all `r` rows so far;
//! a node splits its count `n` into `round(p n)` (nearest, halves up) for
//! its first child, `p` that child's share of the node's weight, and the
//! rest for its second. A count that is a function of its parent's count,
//! growing by at most what the parent grows, never goes back, and the
//! leaves add up to `r`. The group's count goes to its members as
//! largest remainders of their global shares `w_k r`, which for a count
//! within a row of the group's share is each member's share rounded down or
//! up, and never goes back either (each gets a row per batch or more).
//!
//! A node of weight `W` at depth `d >= 1` is off its share `W r` by its
//! parent's error times `W / W_parent` plus at most half a row, so a leaf
//! of weight `w` is within `(1 + w * sum(1 / W_a)) / 2` rows of `w r`, the
//! sum over its ancestors `a` below node 0. A leaf at depth 1 or 2 is
//! always under one row; [`Mixture::new`] chooses the splits to keep every
//! leaf under one where it can (every tree up to 8 leaves; beyond, splits
//! of the leaves, heaviest first, into a prefix and the rest or the
//! heaviest with the lightest and the rest, looking up to three levels
//! down; prefixes only beyond 64 leaves).
//! The tree is a function of the weights and `B` alone, and part of what a
//! saved run's batches are: changing how it is chosen changes them. So every
//! source's rows so far are its share rounded down or up (within one row of
//! `w_s * rows so far`) whenever at most three sources are small, whatever
//! the weights: at 0.9989/0.001/0.0001 of 256 rows, the group `[0]` and the
//! pair `[1, 2]` split node 0, and over 20,000 steps the sources are at
//! most 0.50, 0.90 and 0.50 rows from their shares (the tests). With more
//! small sources the bound depends on the weights, and is most often under
//! one too: 0.5/0.2/0.1/0.1/0.05/0.03/0.01/0.005/0.003/0.001/0.001 at 64
//! rows (five small sources) is held to 0.99 rows, at 16 rows (seven) to
//! 0.97; ten sources of 0.003 with a 0.97 one at 256 rows are bound to 1.04
//! rows and reach 0.94 over 20,000 steps.
//!
//! Per rank: each step's rows are laid out and interleaved as above, with
//! the small sources last in the grouped order (after the others, each
//! part by position) and the grouped positions turned by the small
//! sources' rows so far: `g` becomes `(g + S((t + 1) B)) mod B`, `S(r)`
//! their rows among the first `r`. The small sources' rows of the run then
//! take one grouped position after another, modulo `B`, so they go round
//! the ranks (a power-of-two count of shards takes the positions of one
//! residue each): each of `n` ranks holds `1 / n` of them rounded down or
//! up. A source of a row or more per batch keeps each step's share on each
//! rank rounded down or up (a turned run of positions is still one run,
//! modulo `B`). A small source alone so has its share of each rank's rows
//! so far within a row; two or more share the turn, and each one's rows on
//! a rank can be further from its share (1.52 rows at most for the 0.001
//! source above on 8 ranks over 20,000 steps, the pair together 0.94 and
//! the large source 0.94). The turn is 0 in the grouped order
//! ([`RowOrder`]).

use serde::{Deserialize, Serialize};

use std::sync::Arc;

use crate::schedule::{Curve, Track};
use crate::{Blocks, Error, Mode, Sampler, SchedulePiece, Shard, Window, MAX_BATCH};

/// Indices per sampler step of an iid or sequential source stream (module
/// docs).
pub const STREAM_BLOCK: u64 = 4096;

/// How many later draws of a record [`Mixture::fill_shard_with_next_use`]
/// looks at for one that lands in the shard's rows.
const NEXT_USE_TRIES: u32 = 64;

/// How a step's rows are ordered (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RowOrder {
    /// Source by source, source 0's first: the order of runs saved before
    /// rows were interleaved (a [`MixtureState`] without an `order` reads as
    /// this). A shard then gets whichever sources its slice covers.
    #[default]
    Grouped,
    /// Interleaved by digit reversal, so that each shard holds each
    /// source's share of its rows: what [`Mixture::new`] builds.
    Interleaved,
}

/// What a saved mixture run must find again: the weights (normalised) and
/// every source's length, and the order its rows came in. Serialised next
/// to a loader's sampler state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MixtureState {
    /// The normalised weights, one per source.
    pub weights: Vec<f64>,
    /// The number of records of each source.
    pub lengths: Vec<u64>,
    /// The order of each step's rows; [`RowOrder::Grouped`] when absent (a
    /// state saved before rows were interleaved).
    #[serde(default)]
    pub order: RowOrder,
    /// The weights over the steps, when they change (a schedule, or a run
    /// resumed under other weights): the pieces in force, each from its
    /// step on (`crate::SchedulePiece`). Absent for fixed weights, which
    /// `weights` then are; present, `weights` are the mean of its first
    /// piece's points, used only to shape the rounding tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Vec<SchedulePiece>>,
    /// Mode 3: each source's block shape ([`Mixture::with_blocks`]); absent,
    /// every source's is [`Blocks::DEFAULT`] (states saved before mixtures
    /// chose their shapes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<Vec<Blocks>>,
}

impl MixtureState {
    /// Whether `other` describes the same mixture: equal lengths, weights
    /// equal up to NumPy's `allclose` tolerances (a state written as JSON
    /// text by another program keeps them only to its printed digits). The
    /// row order is not compared: a resumed run takes the saved one
    /// ([`Mixture::with_order`]).
    pub fn matches(&self, other: &MixtureState) -> bool {
        self.lengths == other.lengths
            && self.weights.len() == other.weights.len()
            && self.weights.iter().zip(&other.weights).all(|(a, b)| (a - b).abs() <= 1e-8 + 1e-5 * b.abs())
    }
}

/// One source's stream of indices: position `p` is slot `p % block` of the
/// sampler's step `p / block`.
#[derive(Clone, Debug)]
struct SourceStream {
    sampler: Sampler,
    block: u64,
    length: u64,
}

impl SourceStream {
    fn new(mode: Mode, length: u64, seed: u64, shape: Option<Blocks>) -> Result<SourceStream, Error> {
        // Cyclic streams are the same however they are cut into steps (module
        // docs); whole cycles per step compute each cycle's keys once.
        let block = match mode {
            Mode::Cyclic | Mode::Blocked if length <= MAX_BATCH => length,
            Mode::Cyclic | Mode::Blocked => 1,
            _ => STREAM_BLOCK.min(length),
        };
        Ok(SourceStream { sampler: Sampler::with_blocks(mode, length, block, seed, shape)?, block, length })
    }

    /// Writes the indices at positions `first .. first + out.len()`.
    fn fill(&self, first: u64, out: &mut [u64]) {
        let mut p = first;
        let mut rest = out;
        while !rest.is_empty() {
            let (step, slot) = (p / self.block, p % self.block);
            // Lossless: both are at most the block, itself at most MAX_BATCH.
            let take = (self.block - slot).min(rest.len() as u64) as usize;
            let (now, later) = rest.split_at_mut(take);
            self.sampler.fill_positions(step, slot as usize, now);
            p += take as u64;
            rest = later;
        }
    }

    /// The positions after `p` that draw `index` again (drawn at `p`), in
    /// order; empty in iid mode (no inverse), at most `tries` of them.
    fn later_positions(&self, mode: Mode, p: u64, index: u64, tries: u32) -> impl Iterator<Item = u64> + '_ {
        let n = self.length;
        let cycle = p / n;
        (1..=u64::from(tries)).map_while(move |k| match mode {
            Mode::Iid => None,
            // Position `q` reads `q mod n`: every n positions.
            Mode::Sequential => p.checked_add(k.checked_mul(n)?),
            // One draw per cycle, at the cycle's inverse position.
            Mode::Cyclic | Mode::Blocked => {
                let c = cycle.checked_add(k)?;
                c.checked_mul(n)?.checked_add(self.sampler.cycle_position(c, index)?)
            }
        })
    }
}

/// A weighted mixture of sources, exact over the run (module docs).
#[derive(Clone, Debug)]
pub struct Mixture {
    mode: Mode,
    seed: u64,
    batch_size: u64,
    weights: Vec<f64>,
    lengths: Vec<u64>,
    streams: Vec<SourceStream>,
    order: RowOrder,
    /// The weights over the steps, when they change (module docs).
    schedule: Option<Arc<Scheduled>>,
    /// The batch length's prime factors, twos first, then the odd ones
    /// ascending: the radices of the digit reversal (module docs).
    radices: Vec<u64>,
    /// How the rows so far are counted per source (module docs).
    apportion: Apportion,
    /// The sources in grouped order: by position, except that sources of
    /// under a row per batch come last (module docs).
    seq: Vec<usize>,
    /// Mode 3: each source's block shape, when chosen ([`Mixture::with_blocks`]).
    blocks: Option<Vec<Blocks>>,
}

/// A schedule's integrals: each source's, and for each split of the
/// rounding tree its node's and its first child's.
#[derive(Debug)]
struct Scheduled {
    pieces: Vec<SchedulePiece>,
    sources: Vec<Track>,
    splits: Vec<Option<(Track, Track)>>,
}

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
    /// A mixture of sources of `lengths` records with `weights`, drawing
    /// global batches of `batch_size` rows in `mode` from `seed`.
    ///
    /// Any positive weight is accepted: a source whose share of a batch is
    /// under one row gets its rows over several steps (module docs).
    ///
    /// Errors: [`Error::NoSources`], [`Error::WeightCount`],
    /// [`Error::BadWeight`] (not positive and finite), [`Error::EmptySource`],
    /// [`Error::ZeroBatch`] and [`Error::BatchTooLarge`].
    pub fn new(mode: Mode, lengths: &[u64], weights: &[f64], batch_size: u64, seed: u64) -> Result<Mixture, Error> {
        if lengths.is_empty() {
            return Err(Error::NoSources);
        }
        if weights.len() != lengths.len() {
            return Err(Error::WeightCount { weights: weights.len(), sources: lengths.len() });
        }
        if let Some((index, &weight)) = weights.iter().enumerate().find(|(_, w)| !(w.is_finite() && **w > 0.0)) {
            return Err(Error::BadWeight { index, weight });
        }
        if let Some(source) = lengths.iter().position(|&n| n == 0) {
            return Err(Error::EmptySource(source));
        }
        if batch_size == 0 {
            return Err(Error::ZeroBatch);
        }
        if batch_size > MAX_BATCH {
            return Err(Error::BatchTooLarge { batch: batch_size, max: MAX_BATCH });
        }
        let total = pairwise_sum(weights);
        let weights: Vec<f64> = weights.iter().map(|w| w / total).collect();
        Mixture::build(mode, lengths, weights, None, batch_size, seed)
    }

    /// A mixture whose weights follow `pieces` (a schedule, and the
    /// schedules a resumed run took over with: `crate::SchedulePiece`),
    /// their points' weights normalised. Source `s`'s target among the first
    /// `r` rows is `B` times the integral of its weight up to step `r / B`,
    /// rounded as fixed weights' `w_s r` are (module docs, "Schedules").
    /// One piece of one point is [`Mixture::new`] of its weights.
    ///
    /// Errors: those of [`Mixture::new`], and [`Error::BadSchedule`] for
    /// pieces out of order or points of another number of sources.
    pub fn scheduled(
        mode: Mode,
        lengths: &[u64],
        pieces: Vec<SchedulePiece>,
        batch_size: u64,
        seed: u64,
    ) -> Result<Mixture, Error> {
        let bad = |why: String| Err(Error::BadSchedule { why });
        let Some(first) = pieces.first() else { return bad("no schedule".to_owned()) };
        if first.from != 0 || pieces.windows(2).any(|p| p[1].from <= p[0].from) {
            return bad("pieces must start at step 0 and at increasing steps".to_owned());
        }
        for piece in &pieces {
            let bad_point = |p: &crate::SchedulePoint| {
                p.weights.iter().any(|w| !(w.is_finite() && *w >= 0.0)) || p.weights.iter().sum::<f64>() <= 0.0
            };
            if piece.points.windows(2).any(|w| w[1].step < w[0].step) || piece.points.iter().any(bad_point) {
                return bad(format!(
                    "the piece from step {} has steps out of order or weights that are negative, not finite or all 0",
                    piece.from
                ));
            }
            if piece.points.is_empty() || piece.points.iter().any(|p| p.weights.len() != lengths.len()) {
                return Err(Error::WeightCount {
                    weights: piece.points.first().map_or(0, |p| p.weights.len()),
                    sources: lengths.len(),
                });
            }
        }
        if let [piece] = &pieces[..] {
            if let [point] = &piece.points[..] {
                // Normalised already (as Mixture::new would): taken as they
                // are, so a saved run's weights go on bit for bit.
                let weights = &point.weights;
                if let Some((index, &weight)) = weights.iter().enumerate().find(|(_, w)| !(w.is_finite() && **w > 0.0))
                {
                    return Err(Error::BadWeight { index, weight });
                }
                return Mixture::build(mode, lengths, weights.clone(), None, batch_size, seed);
            }
        }
        let n = lengths.len();
        // The first piece's mean weights shape the tree (any positive
        // weights would do; the rounding follows the targets).
        let mut weights = vec![0.0; n];
        for p in &first.points {
            for (w, x) in weights.iter_mut().zip(&p.weights) {
                *w += x / first.points.len() as f64;
            }
        }
        let total = pairwise_sum(&weights);
        weights.iter_mut().for_each(|w| *w /= total);
        Mixture::build(mode, lengths, weights, Some(pieces), batch_size, seed)
    }

    fn build(
        mode: Mode,
        lengths: &[u64],
        weights: Vec<f64>,
        pieces: Option<Vec<SchedulePiece>>,
        batch_size: u64,
        seed: u64,
    ) -> Result<Mixture, Error> {
        if lengths.is_empty() {
            return Err(Error::NoSources);
        }
        if let Some(source) = lengths.iter().position(|&n| n == 0) {
            return Err(Error::EmptySource(source));
        }
        if batch_size == 0 {
            return Err(Error::ZeroBatch);
        }
        if batch_size > MAX_BATCH {
            return Err(Error::BatchTooLarge { batch: batch_size, max: MAX_BATCH });
        }
        let b = batch_size as f64;
        // A source of a row per batch or more at every point: so on every
        // step (a step's weight lies between its ends' points).
        let big: Vec<bool> = match &pieces {
            None => weights.iter().map(|w| w * b >= 1.0).collect(),
            Some(pieces) => (0..weights.len())
                .map(|k| pieces.iter().flat_map(|p| &p.points).all(|p| p.weights[k] * b >= 1.0))
                .collect(),
        };
        let apportion = Apportion::new(&weights, &big);
        let schedule = pieces.map(|pieces| {
            let sources: Vec<Track> = (0..weights.len())
                .map(|k| {
                    Track::new(pieces.iter().map(|p| (p.from as f64 * b, Curve::of(&p.points, b, |w| w[k]))).collect())
                })
                .collect();
            let splits = match &apportion {
                Apportion::Hamilton => Vec::new(),
                Apportion::Tree(tree) => tree.split_tracks(&sources),
            };
            Arc::new(Scheduled { pieces, sources, splits })
        });
        let seq = match &apportion {
            Apportion::Hamilton => (0..weights.len()).collect(),
            Apportion::Tree(tree) => {
                (0..weights.len()).filter(|k| tree.big.contains(k)).chain(tree.tiny.iter().copied()).collect()
            }
        };
        let streams = lengths
            .iter()
            .enumerate()
            .map(|(k, &n)| SourceStream::new(mode, n, source_seed(seed, k), None))
            .collect::<Result<_, _>>()?;
        let radices = prime_factors(batch_size);
        Ok(Mixture {
            mode,
            seed,
            batch_size,
            weights,
            lengths: lengths.to_vec(),
            streams,
            order: RowOrder::Interleaved,
            schedule,
            radices,
            apportion,
            seq,
            blocks: None,
        })
    }

    /// The same mixture in mode 3 with source `k`'s stream in blocks of
    /// `shapes[k]` (one per source, else [`Error::BufferLength`]; their
    /// [`Blocks::shards`] are taken as 1: a mixture's cycles are not split
    /// between shards): a loader sizes
    /// each source's windows by its weight, so that they all last about as
    /// many steps and their memory is one plain window's. Other modes are
    /// returned unchanged. The shapes are part of the state, and a run
    /// resumed takes the saved ones.
    pub fn with_blocks(mut self, shapes: &[Blocks]) -> Result<Mixture, Error> {
        if self.mode != Mode::Blocked {
            return Ok(self);
        }
        if shapes.len() != self.lengths.len() {
            return Err(Error::BufferLength { expected: self.lengths.len() as u64, got: shapes.len() as u64 });
        }
        self.streams = self
            .lengths
            .iter()
            .zip(shapes)
            .enumerate()
            .map(|(k, (&n, &shape))| {
                SourceStream::new(self.mode, n, source_seed(self.seed, k), Some(Blocks { shards: 1, ..shape }))
            })
            .collect::<Result<_, _>>()?;
        self.blocks = Some(shapes.iter().map(|&b| Blocks { shards: 1, ..b }).collect());
        Ok(self)
    }

    /// Mode 3: each source's block shape when [`Mixture::with_blocks`] set
    /// them (`None`: [`Blocks::DEFAULT`] for every source).
    pub fn blocks(&self) -> Option<&[Blocks]> {
        self.blocks.as_deref()
    }

    /// The same mixture with its rows in `order`: a run resumed from a
    /// [`MixtureState`] takes the state's order, so a run saved grouped goes
    /// on grouped.
    pub fn with_order(mut self, order: RowOrder) -> Mixture {
        self.order = order;
        self
    }

    /// The order of each step's rows.
    pub fn order(&self) -> RowOrder {
        self.order
    }

    /// The sampling mode of every source's stream.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The seed the sources' seeds derive from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Rows per global batch.
    pub fn batch_len(&self) -> usize {
        // Lossless: batch_size <= MAX_BATCH.
        self.batch_size as usize
    }

    /// The normalised weights (with a schedule: the mean of its first
    /// piece's points, which shape the rounding tree).
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// Each source's number of records.
    pub fn lengths(&self) -> &[u64] {
        &self.lengths
    }

    /// The total number of records over all sources.
    pub fn total_length(&self) -> u64 {
        self.lengths.iter().fold(0u64, |a, &n| a.saturating_add(n))
    }

    /// What a resumed run must find again.
    pub fn state(&self) -> MixtureState {
        MixtureState {
            weights: self.weights.clone(),
            lengths: self.lengths.clone(),
            order: self.order,
            schedule: self.schedule.as_ref().map(|s| s.pieces.clone()),
            blocks: self.blocks.clone(),
        }
    }

    /// The pieces of the schedule, `None` for fixed weights.
    pub fn schedule(&self) -> Option<&[SchedulePiece]> {
        self.schedule.as_ref().map(|s| &s.pieces[..])
    }

    /// Each source's target among the first `rows` rows (module docs): its
    /// weight times `rows`, or with a schedule `B` times its weight's
    /// integral up to step `rows / B`.
    pub fn targets(&self, rows: u64, out: &mut [f64]) {
        let r = rows as f64;
        match &self.schedule {
            None => out.iter_mut().zip(&self.weights).for_each(|(o, w)| *o = w * r),
            Some(s) => out.iter_mut().zip(&s.sources).for_each(|(o, t)| *o = t.integral(r)),
        }
    }

    /// The length of `shard`'s slice of each global batch, or
    /// [`Error::BadShard`] / [`Error::ShardDoesNotDivide`].
    pub fn shard_len(&self, shard: Shard) -> Result<usize, Error> {
        let (lo, hi) = shard.range(self.batch_len())?;
        Ok(hi - lo)
    }

    /// Each source's rows among the first `rows` rows of the mixture
    /// (largest remainders, or the rounding tree when a source gets under
    /// a row per batch: module docs), into `out`, one per source (a shorter
    /// or longer `out` is [`Error::BufferLength`]). The counts sum to
    /// `rows`; they grow with `rows` from one whole batch to the next.
    pub fn allocation(&self, rows: u64, out: &mut [u64]) -> Result<(), Error> {
        if out.len() != self.weights.len() {
            return Err(Error::BufferLength { expected: self.weights.len() as u64, got: out.len() as u64 });
        }
        let mut order = Vec::with_capacity(self.weights.len());
        self.allocate(rows, out, &mut order);
        Ok(())
    }

    /// Each source's rows among the first `rows`, into `out` (one per
    /// source); `order` is scratch.
    fn allocate(&self, rows: u64, out: &mut [u64], order: &mut Vec<(f64, usize)>) {
        let mut quotas = vec![0.0; self.weights.len()];
        self.targets(rows, &mut quotas);
        match &self.apportion {
            Apportion::Hamilton => allocate(&quotas, rows, out, order),
            Apportion::Tree(tree) => {
                let splits = self.schedule.as_ref().map(|s| &s.splits[..]);
                tree.allocate(&quotas, splits, rows, out, order)
            }
        }
    }

    /// Rows of source `k` among the first `rows`, computed alone (the same
    /// as [`Mixture::allocation`]'s `out[k]`).
    fn allocation_of(&self, k: usize, rows: u64) -> u64 {
        if matches!(self.apportion, Apportion::Tree(_)) || self.schedule.is_some() {
            let mut out = vec![0; self.weights.len()];
            self.allocate(rows, &mut out, &mut Vec::with_capacity(self.weights.len()));
            return out[k];
        }
        let r = rows as f64;
        let mut floors = 0u64;
        let (mut ahead, quota_k) = (0u64, self.weights[k] * r);
        let rem_k = quota_k - quota_k.floor();
        for (j, w) in self.weights.iter().enumerate() {
            let q = w * r;
            let f = q.floor();
            floors += f as u64;
            let rem = q - f;
            ahead += u64::from(rem > rem_k || (rem == rem_k && j < k));
        }
        let left = rows.saturating_sub(floors);
        quota_k.floor() as u64 + u64::from(ahead < left)
    }

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
        let (cycle, q) = (p / stream.length, p % stream.length);
        let w = stream.sampler.cycle_window_of(cycle, q)?;
        self.stream_window(k, cycle, w)
    }

    /// The window of source `k`'s stream after `window` (one of its
    /// [`Mixture::source_window`]s).
    pub fn next_source_window(&self, window: &Window) -> Option<Window> {
        let (cycle, w, k) = window.at;
        let k = usize::try_from(k).ok()?;
        let stream = self.blocked_stream(k)?;
        match stream.sampler.cycle_window(cycle, w + 1) {
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
        let Some((positions, _)) = stream.sampler.cycle_window(cycle, w) else {
            return Ok(());
        };
        let Some(base) = cycle.checked_mul(stream.length) else {
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
            let Some(q) = stream.sampler.cycle_position(cycle, i) else {
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
        let (positions, records) = stream.sampler.cycle_window(cycle, w)?;
        let base = cycle.checked_mul(stream.length)?;
        let (lo, hi) = (base.checked_add(positions.start)?, base.checked_add(positions.end)?);
        let first = self.step_of_position(k, lo)?;
        let last = self.step_of_position(k, hi - 1)?;
        // The steps before `complete` draw only positions below `hi`.
        let complete = self.step_of_position(k, hi)?;
        Some(Window { steps: first..last + 1, complete, records, at: (cycle, w, k as u64) })
    }

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

    fn fill(
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
    fn grouped_below_in_rows_below(&self, b: u64, r: u64) -> u64 {
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
    fn row_of(&self, g: u64) -> u64 {
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

    /// The grouped position of row `r`, the inverse of [`Mixture::row_of`].
    fn grouped_position(&self, r: u64) -> u64 {
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
    fn step_of(&self, k: usize, q: u64) -> Option<u64> {
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

/// The prime factors of `n` in ascending order, with multiplicity (empty
/// for 1). Trial division: `n <= MAX_BATCH`, so at most 2^16 divisors tried.
fn prime_factors(mut n: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut p = 2;
    while p * p <= n {
        while n.is_multiple_of(p) {
            out.push(p);
            n /= p;
        }
        p += 1;
    }
    if n > 1 {
        out.push(n);
    }
    out
}

/// Source `k`'s seed: `(seed * 1_000_003 + k) mod 2^62`.
fn source_seed(seed: u64, k: usize) -> u64 {
    ((u128::from(seed) * 1_000_003 + k as u128) % (1u128 << 62)) as u64
}

/// The largest-remainder allocation of `rows` by `quotas` (summing to
/// `rows`) into `out`: floors first, then one more row to each of the
/// largest remainders (ties to the lower source) until `rows` are given.
/// `order` is scratch.
fn allocate(quotas: &[f64], rows: u64, out: &mut [u64], order: &mut Vec<(f64, usize)>) {
    order.clear();
    let mut given = 0u64;
    for (k, (&q, o)) in quotas.iter().zip(out.iter_mut()).enumerate() {
        let f = q.floor();
        *o = f as u64;
        given += *o;
        order.push((q - f, k));
    }
    // Rounded products may sum a hair past `rows` at astronomical row counts:
    // then nobody gets more.
    let left = rows.saturating_sub(given) as usize;
    if left == 0 {
        return;
    }
    let ahead = |a: &(f64, usize), b: &(f64, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    if left < order.len() {
        order.select_nth_unstable_by(left - 1, ahead);
    }
    for &(_, k) in order.iter().take(left) {
        out[k] += 1;
    }
}

/// How a mixture counts each source's rows among the first `r` (module
/// docs).
#[derive(Clone, Debug)]
enum Apportion {
    /// Every source gets at least a row per batch: largest remainders of
    /// all the shares.
    Hamilton,
    /// Some source gets under a row per batch: nearest roundings down a
    /// tree.
    Tree(Tree),
}

impl Apportion {
    /// `big[k]`: source `k` gets a row per batch or more (for fixed weights
    /// `w_k B >= 1`, the test the earlier refusal made, so that every
    /// mixture accepted then keeps its batches).
    fn new(weights: &[f64], big: &[bool]) -> Apportion {
        if big.iter().all(|&b| b) {
            Apportion::Hamilton
        } else {
            Apportion::Tree(Tree::new(weights, big))
        }
    }
}

/// The rounding tree (module docs): node 0 holds all the rows, a split gives
/// its first child the nearest integer to its share of the node's rows and
/// the second child the rest, and each leaf is a source of under a row per
/// batch or the group of all the others.
#[derive(Clone, Debug)]
struct Tree {
    /// Parents before their children.
    nodes: Vec<Node>,
    /// The sources of at least a row per batch, ascending: the group leaf's.
    big: Vec<usize>,
    /// The others, ascending: a leaf each.
    tiny: Vec<usize>,
    /// The most a leaf's rows so far can be from its share, in rows (the
    /// group's: of the group's share; each of its members is then within a
    /// row of its own when this is under one), from the rounding alone.
    bound: f64,
}

#[derive(Clone, Copy, Debug)]
enum Node {
    /// `first` takes `share` of the node's rows, rounded to nearest (halves
    /// up); `second` the rest.
    Split { share: f64, first: usize, second: usize },
    /// All the node's rows are this source's.
    Source(usize),
    /// The node's rows go to the sources of at least a row per batch,
    /// each its global share rounded down or up by largest remainders.
    Group,
}

/// A leaf while the tree is built: its weight and what it is.
#[derive(Clone, Copy, Debug)]
struct Leaf {
    weight: f64,
    node: Node,
}

/// How many levels below a split [`Tree::new`] looks when choosing it:
/// three for mixtures of up to `LOOK_LEVELS[0]` leaves, two up to
/// `LOOK_LEVELS[1]`, one beyond.
const LOOK_LEVELS: [usize; 2] = [12, 24];

/// Up to this many leaves, [`Tree::build`] tries every tree
/// ([`exact_split`]: about 400,000 subtrees at 8).
const EXACT: usize = 8;

/// Above this many leaves, [`Tree::build`] tries prefixes only
/// ([`Tree::build_wide`]).
const WIDE: usize = 64;

impl Tree {
    fn new(weights: &[f64], is_big: &[bool]) -> Tree {
        let big: Vec<usize> = (0..weights.len()).filter(|&k| is_big[k]).collect();
        let mut leaves: Vec<Leaf> = (0..weights.len())
            .filter(|&k| !is_big[k])
            .map(|k| Leaf { weight: weights[k], node: Node::Source(k) })
            .collect();
        if !big.is_empty() {
            let weight = big.iter().map(|&k| weights[k]).sum();
            leaves.push(Leaf { weight, node: Node::Group });
        }
        // Heaviest first; ties by source, the group after the sources (a
        // fixed order: the tree is part of what a saved run's batches are).
        let key = |l: &Leaf| match l.node {
            Node::Source(k) => k,
            _ => usize::MAX,
        };
        leaves.sort_by(|a, b| b.weight.total_cmp(&a.weight).then(key(a).cmp(&key(b))));
        let tiny = (0..weights.len()).filter(|&k| !is_big[k]).collect();
        let mut tree = Tree { nodes: Vec::new(), big, tiny, bound: 0.0 };
        let lookahead = 1 + LOOK_LEVELS.iter().filter(|&&n| leaves.len() <= n).count();
        tree.build(&leaves, 0.0, 0, lookahead);
        tree
    }

    /// Adds the subtree of `leaves` (heaviest first) at `depth`, whose
    /// ancestors below the root sum `1 / W` to `above`; returns its node.
    ///
    /// A node at depth `d >= 1` of weight `W` is `W r` rounded to nearest
    /// from its parent's count, so its error is its parent's error times
    /// `W / W_parent` plus at most half a row: a leaf of weight `w` is off
    /// by at most `(1 + w * sum of 1 / W_a over its ancestors a below the
    /// root) / 2` rows. The splits are chosen to keep that under one.
    fn build(&mut self, leaves: &[Leaf], above: f64, depth: usize, lookahead: usize) -> usize {
        let at = self.nodes.len();
        if let [leaf] = leaves {
            self.bound = self.bound.max(0.5 + 0.5 * leaf.weight * above);
            self.nodes.push(leaf.node);
            return at;
        }
        let total: f64 = leaves.iter().map(|l| l.weight).sum();
        let here = if depth == 0 { above } else { above + 1.0 / total };
        let weights: Vec<f64> = leaves.iter().map(|l| l.weight).collect();
        if weights.len() > WIDE {
            return self.build_wide(leaves, here, total, depth, lookahead);
        }
        if weights.len() <= EXACT {
            let full = (1u32 << weights.len()) - 1;
            let (_, first) = exact_split(&weights, full, above, depth);
            let part = |inside: bool| {
                (0..leaves.len()).filter(|&i| (first >> i & 1 == 1) == inside).map(|i| leaves[i]).collect::<Vec<_>>()
            };
            return self.split(leaves.len(), part(true), part(false), total, here, depth, lookahead);
        }
        let mut best = (f64::INFINITY, 0);
        for (c, (first, second)) in candidates(weights.len()).enumerate() {
            let pick = |set: &[usize]| set.iter().map(|&i| weights[i]).collect::<Vec<f64>>();
            let score = worst(&pick(&first), here, depth + 1, lookahead - 1).max(worst(
                &pick(&second),
                here,
                depth + 1,
                lookahead - 1,
            ));
            if score < best.0 {
                best = (score, c);
            }
        }
        let (first, second) = candidates(weights.len()).nth(best.1).expect("a split of two or more leaves");
        let pick = |set: &[usize]| set.iter().map(|&i| leaves[i]).collect::<Vec<Leaf>>();
        self.split(leaves.len(), pick(&first), pick(&second), total, here, depth, lookahead)
    }

    /// Adds a split of `n` leaves into `first` and `second` (weights
    /// `total`, `here` the sum of `1 / W` down to it) and their subtrees.
    #[allow(clippy::too_many_arguments)]
    fn split(
        &mut self,
        n: usize,
        first: Vec<Leaf>,
        second: Vec<Leaf>,
        total: f64,
        here: f64,
        depth: usize,
        lookahead: usize,
    ) -> usize {
        debug_assert_eq!(first.len() + second.len(), n);
        let at = self.nodes.len();
        let share = first.iter().map(|l| l.weight).sum::<f64>() / total;
        self.nodes.push(Node::Split { share, first: 0, second: 0 });
        let f = self.build(&first, here, depth + 1, lookahead);
        let s = self.build(&second, here, depth + 1, lookahead);
        self.nodes[at] = Node::Split { share, first: f, second: s };
        at
    }

    /// [`Tree::build`] for more than [`WIDE`] leaves: a prefix and the
    /// rest only, each scored by its heaviest leaf one level down, in
    /// `O(leaves)` (`O(leaves^2)` for the tree).
    fn build_wide(&mut self, leaves: &[Leaf], here: f64, total: f64, depth: usize, lookahead: usize) -> usize {
        let at = self.nodes.len();
        let n = leaves.len();
        let mut prefix = vec![0.0; n + 1];
        for (i, l) in leaves.iter().enumerate() {
            prefix[i + 1] = prefix[i] + l.weight;
        }
        // Heaviest first: a part's heaviest leaf is its first.
        let score = |from: usize, to: usize| {
            let w = leaves[from].weight;
            if to - from == 1 {
                w * here
            } else {
                w * (here + 1.0 / (prefix[to] - prefix[from]))
            }
        };
        let k = (1..n)
            .map(|k| (score(0, k).max(score(k, n)), k))
            .fold((f64::INFINITY, 1), |a, b| if b.0 < a.0 { b } else { a })
            .1;
        let share = prefix[k] / total;
        self.nodes.push(Node::Split { share, first: 0, second: 0 });
        let f = self.build(&leaves[..k], here, depth + 1, lookahead);
        let s = self.build(&leaves[k..], here, depth + 1, lookahead);
        self.nodes[at] = Node::Split { share, first: f, second: s };
        at
    }

    /// Each node's integral over a schedule, for each split: its own and its
    /// first child's (indexed by node; `None` for leaves).
    fn split_tracks(&self, sources: &[Track]) -> Vec<Option<(Track, Track)>> {
        let mut of: Vec<Option<Track>> = vec![None; self.nodes.len()];
        // Children come after their parents: fill from the end.
        for i in (0..self.nodes.len()).rev() {
            of[i] = Some(match self.nodes[i] {
                Node::Source(k) => sources[k].clone(),
                Node::Group => Track::sum(&self.big.iter().map(|&k| &sources[k]).collect::<Vec<_>>()),
                Node::Split { first, second, .. } => {
                    Track::sum(&[of[first].as_ref().expect("child"), of[second].as_ref().expect("child")])
                }
            });
        }
        (0..self.nodes.len())
            .map(|i| match self.nodes[i] {
                Node::Split { first, .. } => Some((of[i].clone().expect("node"), of[first].clone().expect("child"))),
                _ => None,
            })
            .collect()
    }

    /// Each source's rows among the first `rows`, into `out`, from their
    /// targets `quotas`. With a schedule (`splits`: each split's tracks,
    /// and the rows per batch), a split gives its first child the nearest
    /// integer to the child's target at the step where the node's target
    /// reaches the node's rows (module docs).
    fn allocate(
        &self,
        quotas: &[f64],
        splits: Option<&[Option<(Track, Track)>]>,
        rows: u64,
        out: &mut [u64],
        order: &mut Vec<(f64, usize)>,
    ) {
        let mut count = vec![0u64; self.nodes.len()];
        count[0] = rows;
        for (i, node) in self.nodes.iter().enumerate() {
            match *node {
                Node::Split { share, first, second } => {
                    let n = count[i];
                    let want = match splits {
                        None => share * n as f64,
                        Some(tracks) => {
                            let (node, child) = tracks[i].as_ref().expect("a split's tracks");
                            let x = node.inverse(n as f64);
                            if x.is_finite() {
                                child.integral(x)
                            } else {
                                // The node's weight is 0 from some step on
                                // and its rows are past its target: the
                                // child's share of the whole.
                                child.integral(f64::MAX.sqrt())
                            }
                        }
                    };
                    // Nearest, halves up; never more than the node holds.
                    let f = ((want + 0.5).floor() as u64).min(n);
                    count[first] = f;
                    count[second] = n - f;
                }
                Node::Source(k) => out[k] = count[i],
                Node::Group => apportion_group(quotas, &self.big, count[i], out, order),
            }
        }
    }
}

/// The least largest `w * (sum of 1 / W_a over ancestors)` any subtree of
/// the leaves in `mask` (of `weights`) can have, its ancestors above it
/// summing to `above`, and the leaves its best split puts first (the one
/// with the lowest leaf of the first such split found; 0 for a leaf).
fn exact_split(weights: &[f64], mask: u32, above: f64, depth: usize) -> (f64, u32) {
    if mask.count_ones() == 1 {
        return (weights[mask.trailing_zeros() as usize] * above, 0);
    }
    let total: f64 = (0..weights.len()).filter(|&i| mask >> i & 1 == 1).map(|i| weights[i]).sum();
    let here = if depth == 0 { above } else { above + 1.0 / total };
    let low = mask & mask.wrapping_neg();
    let rest = mask ^ low;
    let mut best = (f64::INFINITY, 0);
    // Every split once: the first part holds the lowest leaf.
    let mut sub = rest;
    loop {
        let first = low | sub;
        if first != mask {
            let a = exact_split(weights, first, here, depth + 1).0;
            if a < best.0 {
                let score = a.max(exact_split(weights, mask ^ first, here, depth + 1).0);
                if score < best.0 {
                    best = (score, first);
                }
            }
        }
        if sub == 0 {
            break;
        }
        sub = (sub - 1) & rest;
    }
    best
}

/// The splits of `n >= 2` leaves (heaviest first) tried: a prefix and the
/// rest, and the heaviest with a suffix and the rest (a heavy leaf with the
/// lightest ones, the others together).
fn candidates(n: usize) -> impl Iterator<Item = (Vec<usize>, Vec<usize>)> {
    let prefixes = (1..n).map(move |k| ((0..k).collect(), (k..n).collect()));
    let ends = (2..n).map(move |j| (std::iter::once(0).chain(j..n).collect(), (1..j).collect()));
    prefixes.chain(ends)
}

/// The largest `w * (sum of 1 / W_a over ancestors)` a subtree of
/// `weights` (heaviest first) can be held to, looking `lookahead` levels
/// down (at 0, a bound from below: the heaviest leaf lies below the node).
fn worst(weights: &[f64], above: f64, depth: usize, lookahead: usize) -> f64 {
    if let [w] = weights {
        return w * above;
    }
    let total: f64 = weights.iter().sum();
    let here = if depth == 0 { above } else { above + 1.0 / total };
    if lookahead == 0 {
        return weights[0] * here;
    }
    let pick = |set: &[usize]| set.iter().map(|&i| weights[i]).collect::<Vec<f64>>();
    candidates(weights.len())
        .map(|(first, second)| {
            worst(&pick(&first), here, depth + 1, lookahead - 1).max(worst(
                &pick(&second),
                here,
                depth + 1,
                lookahead - 1,
            ))
        })
        .fold(f64::INFINITY, f64::min)
}

/// Gives `members` (the sources of at least a row per batch) `total` rows:
/// each its target `quotas[k]` (its global share) rounded down,
/// then one more to the largest remainders (ties to the lower source) until
/// `total` are given. The tree keeps `total` within a row of the members'
/// share, which makes that each member's share rounded down or up; should
/// float rounding ever leave it outside, the rows still add up.
fn apportion_group(quotas: &[f64], members: &[usize], total: u64, out: &mut [u64], order: &mut Vec<(f64, usize)>) {
    order.clear();
    let mut given = 0u64;
    for &k in members {
        let q = quotas[k];
        let f = q.floor();
        out[k] = f as u64;
        given += out[k];
        order.push((q - f, k));
    }
    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let n = order.len() as u64;
    if total >= given {
        let left = total - given;
        for (i, &(_, k)) in order.iter().enumerate() {
            out[k] += left / n + u64::from((i as u64) < left % n);
        }
    } else {
        // Take back from the smallest remainders.
        let mut over = given - total;
        while over > 0 {
            for &(_, k) in order.iter().rev() {
                if over > 0 && out[k] > 0 {
                    out[k] -= 1;
                    over -= 1;
                }
            }
        }
    }
}

/// The sum NumPy's `add.reduce` computes over a contiguous float64 array:
/// pairwise, in blocks of 128 summed with eight accumulators.
pub(crate) fn pairwise_sum(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        a.iter().fold(0.0, |s, x| s + x)
    } else if n <= 128 {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let whole = n - n % 8;
        for block in a[8..whole].chunks_exact(8) {
            for (acc, x) in r.iter_mut().zip(block) {
                *acc += x;
            }
        }
        let mut s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for x in &a[whole..] {
            s += x;
        }
        s
    } else {
        let half = n / 2;
        let half = half - half % 8;
        pairwise_sum(&a[..half]) + pairwise_sum(&a[half..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The allocation written the slow way: sort every remainder.
    fn hamilton(weights: &[f64], rows: u64) -> Vec<u64> {
        let r = rows as f64;
        let mut base: Vec<u64> = weights.iter().map(|w| (w * r).floor() as u64).collect();
        let left = rows - base.iter().sum::<u64>();
        let mut order: Vec<usize> = (0..weights.len()).collect();
        order.sort_by(|&a, &b| {
            let ra = weights[a] * r - (weights[a] * r).floor();
            let rb = weights[b] * r - (weights[b] * r).floor();
            rb.partial_cmp(&ra).unwrap().then(a.cmp(&b))
        });
        for &k in order.iter().take(left as usize) {
            base[k] += 1;
        }
        base
    }

    fn weights(n: usize) -> Vec<f64> {
        (0..n).map(|k| 1.0 + ((k * 7919) % 13) as f64).collect()
    }

    #[test]
    fn allocations_are_the_largest_remainders_and_each_source_alone_agrees() {
        for s in [1, 2, 3, 7, 100] {
            let m = Mixture::new(Mode::Iid, &vec![10; s], &weights(s), 1024, 1).unwrap();
            let mut out = vec![0; s];
            for rows in (0..5000).step_by(37).chain([1 << 40, (1 << 40) + 999]) {
                m.allocation(rows, &mut out).unwrap();
                assert_eq!(out, hamilton(m.weights(), rows), "{s} sources, {rows} rows");
                assert_eq!(out.iter().sum::<u64>(), rows);
                for (k, &o) in out.iter().enumerate() {
                    assert_eq!(m.allocation_of(k, rows), o);
                }
            }
        }
    }

    #[test]
    fn every_step_holds_each_share_rounded_and_the_counts_never_go_back() {
        let m = Mixture::new(Mode::Cyclic, &[120, 37, 53], &[0.5, 0.3, 0.2], 24, 1).unwrap();
        let mut src = vec![0; 24];
        let mut idx = vec![0; 24];
        let mut total = [0u64; 3];
        for t in 0..500 {
            m.fill_shard(t, Shard::ALL, &mut src, &mut idx).unwrap();
            let mut counts = [0u64; 3];
            for &k in &src {
                counts[k as usize] += 1;
            }
            for k in 0..3 {
                let share = m.weights()[k] * 24.0;
                assert!(counts[k] as f64 >= share.floor() - 1.0 && counts[k] as f64 <= share.ceil() + 1.0);
                total[k] += counts[k];
                assert!((total[k] as f64 - share * (t + 1) as f64).abs() < 1.0, "remainders carry over");
            }
            // Grouped, the same records come source by source, each source's
            // in the same (stream) order.
            let grouped = m.clone().with_order(RowOrder::Grouped);
            let (mut gsrc, mut gidx) = (vec![0; 24], vec![0; 24]);
            grouped.fill_shard(t, Shard::ALL, &mut gsrc, &mut gidx).unwrap();
            assert!(gsrc.windows(2).all(|w| w[0] <= w[1]), "grouped rows come source by source");
            for k in 0..3u32 {
                let of = |s: &[u32], i: &[u64]| {
                    s.iter().zip(i).filter(|(&x, _)| x == k).map(|(_, &i)| i).collect::<Vec<_>>()
                };
                assert_eq!(of(&src, &idx), of(&gsrc, &gidx), "step {t} source {k}");
            }
        }
    }

    /// Counts of each source in `shard`'s rows of `step`.
    fn shard_counts(m: &Mixture, step: u64, shard: Shard) -> Vec<u64> {
        let per = m.shard_len(shard).unwrap();
        let (mut s, mut i) = (vec![0; per], vec![0; per]);
        m.fill_shard(step, shard, &mut s, &mut i).unwrap();
        let mut counts = vec![0; m.weights().len()];
        for k in s {
            counts[k as usize] += 1;
        }
        counts
    }

    /// The bug: at 256 rows over 8 ranks, a grouped 0.7/0.2/0.1 mixture gave
    /// rank 0 only source 0 on every step and rank 7 `[0, 6, 26]`, so each
    /// rank's loss saw another distribution. Interleaved, every rank's step
    /// holds each source's share of its 32 rows (22.4, 6.4, 3.2) within a row,
    /// on every step.
    #[test]
    fn eight_ranks_of_256_rows_each_hold_every_share_within_a_row() {
        let weights = [0.7, 0.2, 0.1];
        let m = Mixture::new(Mode::Cyclic, &[1_000_000, 500_000, 200_000], &weights, 256, 11).unwrap();
        let mut seen = [[0u64; 33]; 3];
        for t in 0..2000 {
            let global = shard_counts(&m, t, Shard::ALL);
            for rank in 0..8 {
                let counts = shard_counts(&m, t, Shard::new(rank, 8).unwrap());
                for k in 0..3 {
                    let share = weights[k] * 32.0;
                    let c = counts[k] as f64;
                    assert!((c - share).abs() <= 1.0, "step {t} rank {rank} source {k}: {c} rows for {share}");
                    // And the share of the step's own rows, rounded down or up.
                    let exact = global[k] as f64 / 8.0;
                    assert!(c == exact.floor() || c == exact.ceil(), "step {t} rank {rank} source {k}");
                    seen[k][counts[k] as usize] += 1;
                }
            }
        }
        assert!(seen[0][22] > 0 && seen[0][23] > 0 && seen[2][3] > 0 && seen[2][4] > 0, "{seen:?}");
        // Grouped, as runs saved before interleaving resume: rank 0 all source 0.
        let grouped = m.clone().with_order(RowOrder::Grouped);
        assert_eq!(shard_counts(&grouped, 0, Shard::new(0, 8).unwrap()), vec![32, 0, 0]);
    }

    #[test]
    fn digit_reversal_is_a_bijection_and_its_inverse() {
        for b in [1u64, 2, 12, 24, 97, 256, 360, 384, 1000] {
            let m = Mixture::new(Mode::Iid, &[10], &[1.0], b, 0).unwrap();
            let mut hit = vec![false; b as usize];
            for g in 0..b {
                let r = m.row_of(g);
                assert!(r < b && !hit[r as usize], "batch {b}: {g} -> {r}");
                hit[r as usize] = true;
                assert_eq!(m.grouped_position(r), g);
            }
        }
        assert_eq!(prime_factors(360), vec![2, 2, 2, 3, 3, 5]);
        // Counting rows below r agrees with reversing every position.
        for b in [12u64, 256, 360, 97] {
            let m = Mixture::new(Mode::Iid, &[10], &[1.0], b, 0).unwrap();
            for end in 0..=b {
                for r in 0..=b {
                    let want = (0..end).filter(|&g| m.row_of(g) < r).count() as u64;
                    assert_eq!(m.grouped_below_in_rows_below(end, r), want, "batch {b}, g < {end}, rows < {r}");
                }
            }
        }
        assert_eq!(prime_factors(1), Vec::<u64>::new());
        assert_eq!(prime_factors(4_294_967_291), vec![4_294_967_291]);
    }

    /// A saved state without `order` (written before rows were interleaved)
    /// reads as grouped; a new one says interleaved.
    #[test]
    fn states_name_their_order_and_old_ones_read_grouped() {
        let old: MixtureState = serde_json::from_str(r#"{"weights": [0.5, 0.5], "lengths": [3, 4]}"#).unwrap();
        assert_eq!(old.order, RowOrder::Grouped);
        let m = Mixture::new(Mode::Iid, &[3, 4], &[1.0, 1.0], 8, 0).unwrap();
        let json = serde_json::to_string(&m.state()).unwrap();
        assert!(json.contains(r#""order":"Interleaved""#), "{json}");
        assert!(old.matches(&m.state()), "the order is not part of what must match");
    }

    /// The shard counts whose shards are residue classes of the grouped
    /// positions: prefix products of the radices.
    fn chain(m: &Mixture) -> Vec<u64> {
        let mut out = vec![1];
        for &b in &m.radices {
            out.push(out.last().unwrap() * b);
        }
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        /// For random weights, batch lengths and steps: the global batch holds
        /// the grouped batch's rows (the same counts and, per source, the same
        /// records in the same order); shards of every divisor tile it; and
        /// every shard count in the radices' chain, which is every power of
        /// two dividing the batch, gives each shard each source's share of its
        /// rows rounded down or up.
        #[test]
        fn every_chain_shard_holds_each_share_rounded(
            raw in proptest::collection::vec(1u32..1000, 1..7),
            batch_factor in 1u64..40,
            twos in 0u32..7,
            step in 0u64..1_000_000,
        ) {
            let batch = batch_factor << twos;
            let weights: Vec<f64> = raw.iter().map(|&w| f64::from(w)).collect();
            let lengths = vec![1000u64; weights.len()];
            let m = Mixture::new(Mode::Iid, &lengths, &weights, batch, 7).unwrap();
            let b = batch as usize;
            let (mut src, mut idx) = (vec![0; b], vec![0; b]);
            m.fill_shard(step, Shard::ALL, &mut src, &mut idx).unwrap();
            let grouped = m.clone().with_order(RowOrder::Grouped);
            let (mut gsrc, mut gidx) = (vec![0; b], vec![0; b]);
            grouped.fill_shard(step, Shard::ALL, &mut gsrc, &mut gidx).unwrap();
            let global = shard_counts(&grouped, step, Shard::ALL);
            for k in 0..weights.len() as u32 {
                let of = |s: &[u32], i: &[u64]| s.iter().zip(i).filter(|(&x, _)| x == k).map(|(_, &i)| i).collect::<Vec<_>>();
                proptest::prop_assert_eq!(of(&src, &idx), of(&gsrc, &gidx));
            }
            let chain = chain(&m);
            for n in (1..=batch).filter(|n| batch % n == 0) {
                let per = b / n as usize;
                for j in 0..n as u32 {
                    let shard = Shard::new(j, n as u32).unwrap();
                    let (mut s, mut i) = (vec![0; per], vec![0; per]);
                    m.fill_shard(step, shard, &mut s, &mut i).unwrap();
                    let at = j as usize * per;
                    proptest::prop_assert_eq!(&s[..], &src[at..at + per]);
                    proptest::prop_assert_eq!(&i[..], &idx[at..at + per]);
                    if chain.contains(&n) {
                        let counts = shard_counts(&m, step, shard);
                        for k in 0..weights.len() {
                            let exact = global[k] as f64 / n as f64;
                            let c = counts[k] as f64;
                            proptest::prop_assert!(
                                c == exact.floor() || c == exact.ceil(),
                                "batch {} shard {}/{} source {}: {} rows for {}", batch, j, n, k, c, exact
                            );
                        }
                    }
                }
            }
            proptest::prop_assert!(chain.contains(&(1u64 << batch.trailing_zeros())));
        }
    }

    /// The README promised each batch `w × B` rows rounded down or up; at
    /// 0.7/0.2/0.1 of 256, "web" got 178 rows for 179.2 in some batches. What
    /// holds: the running total is the exact share rounded down or up, and a
    /// batch is within one row of its share's rounding, a bound some batches
    /// reach.
    #[test]
    fn a_batch_is_within_a_row_of_its_rounded_share_and_the_run_is_exact() {
        let m = Mixture::new(Mode::Iid, &[1_000_000, 500_000, 200_000], &[0.7, 0.2, 0.1], 256, 3).unwrap();
        let (mut src, mut idx) = (vec![0; 256], vec![0; 256]);
        let mut total = [0u64; 3];
        let mut seen = [[false; 3]; 3]; // [source][share floored - 1, floored or ceiled, ceiled + 1]
        for t in 0..3000u64 {
            m.fill_shard(t, Shard::ALL, &mut src, &mut idx).unwrap();
            let mut counts = [0u64; 3];
            for &k in &src {
                counts[k as usize] += 1;
            }
            for k in 0..3 {
                let share = m.weights()[k] * 256.0;
                let (lo, hi) = (share.floor() as u64, share.ceil() as u64);
                assert!((lo - 1..=hi + 1).contains(&counts[k]), "step {t} source {k}: {} rows of {share}", counts[k]);
                let at = if counts[k] < lo {
                    0
                } else if counts[k] > hi {
                    2
                } else {
                    1
                };
                seen[k][at] = true;
                total[k] += counts[k];
                let exact = share * (t + 1) as f64;
                assert!(total[k] == exact.floor() as u64 || total[k] == exact.ceil() as u64, "step {t} source {k}");
            }
        }
        assert!(seen[0][0] && seen[0][1], "179.2 rows: 178 happens, so 'rounded down or up' alone is not true");
        assert!(seen[1][0], "51.2 rows: 50 happens too");
    }

    #[test]
    fn pairwise_sum_is_numpys_order() {
        // Values whose sum depends on the order of additions: 1e16 absorbs a
        // 1.0 added to it alone, but not a 2.0 built first.
        let mut a = vec![1.0; 9];
        a[0] = 1e16;
        // Eight accumulators: [1e16, 1, 1, 1, 1, 1, 1, 1] + [1] (the tail).
        let eight = ((1e16f64 + 1.0) + (1.0 + 1.0)) + ((1.0 + 1.0) + (1.0 + 1.0));
        assert_eq!(pairwise_sum(&a), eight + 1.0);
        assert_ne!(pairwise_sum(&a), a.iter().fold(0.0, |s, x| s + x));
        assert_eq!(pairwise_sum(&[0.1, 0.2, 0.3]), (0.1 + 0.2) + 0.3);
    }

    #[test]
    fn shards_tile_the_global_batch() {
        let m = Mixture::new(Mode::Iid, &[5000, 4099, 8192], &[3.0, 2.0, 1.0], 24, 9).unwrap();
        for t in [0, 1, 77, 123_457] {
            let (mut gs, mut gi) = (vec![0; 24], vec![0; 24]);
            m.fill_shard(t, Shard::ALL, &mut gs, &mut gi).unwrap();
            for k in 0..4 {
                let (mut s, mut i) = (vec![0; 6], vec![0; 6]);
                m.fill_shard(t, Shard::new(k, 4).unwrap(), &mut s, &mut i).unwrap();
                assert_eq!(s, gs[k as usize * 6..][..6]);
                assert_eq!(i, gi[k as usize * 6..][..6]);
            }
        }
    }

    #[test]
    fn next_uses_are_the_shards_next_draws() {
        // Brute force over the steps ahead, for sequential and cyclic
        // streams, prime lengths among them, with and without shards.
        for mode in [Mode::Sequential, Mode::Cyclic] {
            let m = Mixture::new(mode, &[53, 20, 7], &[0.5, 0.3, 0.2], 12, 5).unwrap();
            for shard in [Shard::ALL, Shard::new(1, 3).unwrap()] {
                let per = m.shard_len(shard).unwrap();
                let draws = |t: u64| {
                    let (mut s, mut i) = (vec![0; per], vec![0; per]);
                    m.fill_shard(t, shard, &mut s, &mut i).unwrap();
                    s.into_iter().zip(i).collect::<Vec<_>>()
                };
                let mut found = 0;
                for t in 0..40 {
                    let (mut s, mut i, mut n) = (vec![0; per], vec![0; per], vec![None; per]);
                    m.fill_shard_with_next_use(t, shard, &mut s, &mut i, &mut n).unwrap();
                    for r in 0..per {
                        let want = (t + 1..t + 400).find(|&u| draws(u).contains(&(s[r], i[r])));
                        assert_eq!(n[r], want, "{mode:?} {shard:?} step {t} row {r}");
                        found += usize::from(want.is_some());
                    }
                }
                assert!(found > 0);
            }
        }
        let m = Mixture::new(Mode::Iid, &[53, 20], &[0.5, 0.5], 4, 5).unwrap();
        let (mut s, mut i, mut n) = (vec![0; 4], vec![0; 4], vec![Some(1); 4]);
        m.fill_shard_with_next_use(3, Shard::ALL, &mut s, &mut i, &mut n).unwrap();
        assert_eq!(n, vec![None; 4], "iid draws have no inverse");
    }

    #[test]
    fn cyclic_sources_cover_their_records_once_per_cycle() {
        let lengths = [120u64, 37, 53];
        let m = Mixture::new(Mode::Cyclic, &lengths, &[1.0, 1.0, 1.0], 24, 4).unwrap();
        let mut drawn: Vec<Vec<u64>> = vec![vec![]; 3];
        let (mut s, mut i) = (vec![0; 24], vec![0; 24]);
        for t in 0..40 {
            m.fill_shard(t, Shard::ALL, &mut s, &mut i).unwrap();
            for (&k, &x) in s.iter().zip(&i) {
                drawn[k as usize].push(x);
            }
        }
        for (k, &n) in lengths.iter().enumerate() {
            for c in 0..2 {
                let mut cycle = drawn[k][(c * n) as usize..((c + 1) * n) as usize].to_vec();
                cycle.sort_unstable();
                assert_eq!(cycle, (0..n).collect::<Vec<_>>(), "source {k} cycle {c}");
            }
        }
    }

    #[test]
    fn bad_mixtures_are_errors_that_say_what() {
        assert_eq!(Mixture::new(Mode::Iid, &[], &[], 8, 0).unwrap_err(), Error::NoSources);
        assert_eq!(
            Mixture::new(Mode::Iid, &[5, 5], &[1.0], 8, 0).unwrap_err(),
            Error::WeightCount { weights: 1, sources: 2 }
        );
        assert!(matches!(
            Mixture::new(Mode::Iid, &[5, 5], &[1.0, f64::NAN], 8, 0).unwrap_err(),
            Error::BadWeight { index: 1, .. }
        ));
        assert_eq!(
            Mixture::new(Mode::Iid, &[5, 5], &[1.0, -1.0], 8, 0).unwrap_err(),
            Error::BadWeight { index: 1, weight: -1.0 }
        );
        assert_eq!(Mixture::new(Mode::Iid, &[5, 0], &[1.0, 1.0], 8, 0).unwrap_err(), Error::EmptySource(1));
        // Sources of under a row per batch are not refused (0.5 / 101.5 of
        // 64 rows is 0.32).
        assert!(Mixture::new(Mode::Iid, &[5, 5, 5], &[1.0, 100.0, 0.5], 64, 0).is_ok());
    }
}

#[cfg(test)]
mod tests_small_weights {
    use super::*;

    /// The must-show: 0.9989/0.001/0.0001 at 256 rows (0.256 and 0.0256
    /// rows per batch for the small ones). Over 20,000 steps each source's
    /// rows so far stay within a row of its share, every step; so do each
    /// of 8 ranks' rows of the large source and of the two small ones
    /// together; and a mixture built afresh at step 12,345 (a resumed run)
    /// continues with the same rows.
    #[test]
    fn sources_of_under_a_row_per_batch_get_their_share_over_the_steps() {
        let weights = [0.9989, 0.001, 0.0001];
        let lengths = [1_000_000u64, 5_000, 700];
        let m = Mixture::new(Mode::Cyclic, &lengths, &weights, 256, 17).unwrap();
        let (mut src, mut idx) = (vec![0u32; 256], vec![0u64; 256]);
        let mut total = [0u64; 3];
        let mut ranks = [[0u64; 3]; 8];
        let mut worst = [0f64; 3];
        let mut worst_rank = [0f64; 3];
        let mut small_rank = 0f64;
        let mut kept = Vec::new();
        for t in 0..20_000u64 {
            m.fill_shard(t, Shard::ALL, &mut src, &mut idx).unwrap();
            for (r, &k) in src.iter().enumerate() {
                total[k as usize] += 1;
                ranks[r / 32][k as usize] += 1;
            }
            let rows = ((t + 1) * 256) as f64;
            for k in 0..3 {
                let dev = (total[k] as f64 - m.weights()[k] * rows).abs();
                assert!(dev < 1.0, "step {t} source {k}: {} rows for {}", total[k], m.weights()[k] * rows);
                worst[k] = worst[k].max(dev);
                for rank in &ranks {
                    worst_rank[k] = worst_rank[k].max((rank[k] as f64 - m.weights()[k] * rows / 8.0).abs());
                }
            }
            for rank in &ranks {
                let share = (m.weights()[1] + m.weights()[2]) * rows / 8.0;
                small_rank = small_rank.max((rank[1] as f64 + rank[2] as f64 - share).abs());
            }
            if (12_345..12_400).contains(&t) {
                kept.push((src.clone(), idx.clone()));
            }
        }
        eprintln!("max deviation over 20,000 steps, rows per source: {worst:.4?}");
        eprintln!("per rank of 8: {worst_rank:.4?}; the two small sources together {small_rank:.4}");
        assert!(worst_rank[0] < 1.0 && small_rank < 1.0, "{worst_rank:?} {small_rank}");
        // Both small sources drew rows, and the tiniest not in every step.
        assert!(total[1] > 5000 && total[2] > 500, "{total:?}");
        // Resumed: a mixture made from the saved state's numbers, reading
        // from step 12,345 on, whole and by shards.
        let state: MixtureState = serde_json::from_str(&serde_json::to_string(&m.state()).unwrap()).unwrap();
        assert!(state.matches(&m.state()));
        let resumed = Mixture::new(Mode::Cyclic, &state.lengths, &weights, 256, 17).unwrap().with_order(state.order);
        for (i, (s, x)) in kept.iter().enumerate() {
            let t = 12_345 + i as u64;
            resumed.fill_shard(t, Shard::ALL, &mut src, &mut idx).unwrap();
            assert_eq!((&src, &idx), (s, x), "step {t}");
            for n in [2u32, 8, 256] {
                let per = 256 / n as usize;
                for j in 0..n {
                    let (mut ss, mut si) = (vec![0; per], vec![0; per]);
                    resumed.fill_shard(t, Shard::new(j, n).unwrap(), &mut ss, &mut si).unwrap();
                    let at = j as usize * per;
                    assert_eq!((&ss[..], &si[..]), (&s[at..at + per], &x[at..at + per]), "step {t} shard {j}/{n}");
                }
            }
        }
    }

    /// Weights spread over four decades, up to seven sources, any batch:
    /// every allocation sums to the rows, never goes back from one batch to
    /// the next, and holds each source within the tree's bound of its share
    /// (under one row whenever at most three sources get under a row per
    /// batch); a step's rows come in the counts the allocation says, with
    /// each source's stream positions in order.
    #[test]
    fn any_weights_keep_every_source_within_its_bound() {
        use proptest::prelude::*;
        let cases = proptest::collection::vec(-4.0f64..0.0, 1..8);
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(300));
        runner
            .run(&(cases, 1u64..400, 0u64..1_000_000_000), |(exps, batch, step)| {
                let weights: Vec<f64> = exps.iter().map(|e| 10f64.powf(*e)).collect();
                let s = weights.len();
                let m = Mixture::new(Mode::Iid, &vec![1000; s], &weights, batch, 1).unwrap();
                // Largest remainders: strictly under a row.
                let (bound, tiny) = match &m.apportion {
                    Apportion::Hamilton => (1.0 - 1e-9, 0),
                    Apportion::Tree(t) => (t.bound, t.tiny.len()),
                };
                let big = |k: usize| match &m.apportion {
                    Apportion::Hamilton => true,
                    Apportion::Tree(t) => t.big.contains(&k),
                };
                if tiny <= 3 {
                    prop_assert!(bound < 1.0, "{:?} at {}: bound {}", weights, batch, bound);
                }
                let (mut a, mut z) = (vec![0; s], vec![0; s]);
                m.allocation(step * batch, &mut a).unwrap();
                m.allocation((step + 1) * batch, &mut z).unwrap();
                prop_assert_eq!(a.iter().sum::<u64>(), step * batch);
                prop_assert_eq!(z.iter().sum::<u64>(), (step + 1) * batch);
                let rows = ((step + 1) * batch) as f64;
                for k in 0..s {
                    prop_assert!(z[k] >= a[k], "{:?} at {} step {}: source {} goes back", weights, batch, step, k);
                    let dev = (z[k] as f64 - m.weights()[k] * rows).abs();
                    // A member of the group is within a row of its share
                    // when the group is; a row further at most when not.
                    let limit = match (big(k), bound < 1.0) {
                        (true, true) => 1.0 - 1e-9,
                        (true, false) => bound + 1.0,
                        (false, _) => bound + 1e-9,
                    };
                    prop_assert!(dev <= limit, "source {}: off by {} (bound {})", k, dev, bound);
                    prop_assert_eq!(m.allocation_of(k, (step + 1) * batch), z[k]);
                }
                let b = batch as usize;
                let (mut src, mut idx) = (vec![0; b], vec![0; b]);
                m.fill_shard(step, Shard::ALL, &mut src, &mut idx).unwrap();
                for k in 0..s {
                    let n = src.iter().filter(|&&x| x as usize == k).count() as u64;
                    prop_assert_eq!(n, z[k] - a[k]);
                    let mut want = vec![0; n as usize];
                    m.streams[k].fill(a[k], &mut want);
                    let got: Vec<u64> =
                        src.iter().zip(&idx).filter(|(&x, _)| x as usize == k).map(|(_, &i)| i).collect();
                    prop_assert_eq!(got, want);
                    // The step that holds each of its stream positions.
                    for q in a[k]..z[k] {
                        prop_assert_eq!(m.step_of(k, q), Some(step));
                    }
                }
                Ok(())
            })
            .unwrap();
    }

    /// A thousand sources of under a row per batch each: built quickly,
    /// never going back, every allocation adding up.
    #[test]
    fn a_thousand_small_sources_are_counted() {
        let weights: Vec<f64> = (0..1000).map(|k| 1.0 + (k % 7) as f64).collect();
        let m = Mixture::new(Mode::Iid, &vec![10; 1000], &weights, 256, 0).unwrap();
        let (mut a, mut z) = (vec![0; 1000], vec![0; 1000]);
        let mut worst = 0f64;
        for t in 0..400u64 {
            m.allocation(t * 256, &mut a).unwrap();
            m.allocation((t + 1) * 256, &mut z).unwrap();
            assert_eq!(z.iter().sum::<u64>(), (t + 1) * 256);
            for k in 0..1000 {
                assert!(z[k] >= a[k]);
                worst = worst.max((z[k] as f64 - m.weights()[k] * ((t + 1) * 256) as f64).abs());
            }
        }
        let Apportion::Tree(tree) = &m.apportion else { panic!("small sources make a tree") };
        assert!(worst <= tree.bound + 1e-9, "{worst} {}", tree.bound);
    }

    /// More than three small sources: the tree is chosen among all trees
    /// (up to 8 leaves) and holds these mixtures under a row, which each
    /// source's rows over 20,000 steps respect.
    #[test]
    fn trees_of_many_small_sources_are_the_best_and_hold_their_bound() {
        let cases: [(&[f64], u64, f64); 3] = [
            (&[0.5, 0.2, 0.1, 0.1, 0.05, 0.03, 0.01, 0.005, 0.003, 0.001, 0.001], 64, 0.992),
            (&[0.5, 0.2, 0.1, 0.1, 0.05, 0.03, 0.01, 0.005, 0.003, 0.001, 0.001], 16, 0.967),
            (&[0.6, 0.3, 0.003, 0.002, 0.001, 0.0005, 0.0003, 0.0002], 256, 0.999),
        ];
        for (weights, b, most) in cases {
            let m = Mixture::new(Mode::Iid, &vec![1000; weights.len()], weights, b, 0).unwrap();
            let Apportion::Tree(tree) = &m.apportion else { panic!("small sources make a tree") };
            assert!(tree.bound < most, "{weights:?} at {b}: {}", tree.bound);
            let (mut out, mut before) = (vec![0; weights.len()], vec![0; weights.len()]);
            for t in 1..=20_000u64 {
                m.allocation(t * b, &mut out).unwrap();
                for k in 0..weights.len() {
                    assert!(out[k] >= before[k]);
                    let dev = (out[k] as f64 - m.weights()[k] * (t * b) as f64).abs();
                    assert!(dev < 1.0, "{weights:?} at {b}, step {t}, source {k}: {dev}");
                }
                before.copy_from_slice(&out);
            }
        }
        // The exact search agrees with brute force over the three trees of
        // three leaves: the lightest pair under the root's second child.
        let w = [0.6, 0.3, 0.1];
        let three = |pair: f64, alone: f64| 0.5_f64.max(0.5 + 0.5 * pair.max(alone) / (pair + alone));
        let want = three(0.3, 0.1).min(three(0.6, 0.1)).min(three(0.6, 0.3));
        assert!((0.5 + 0.5 * exact_split(&w, 0b111, 0.0, 0).0 - want).abs() < 1e-12);
    }

    /// Next uses of sources of under a row per batch, against brute force.
    #[test]
    fn next_uses_of_small_sources_are_the_shards_next_draws() {
        for mode in [Mode::Sequential, Mode::Cyclic] {
            let m = Mixture::new(mode, &[53, 7, 5], &[0.9, 0.07, 0.03], 12, 5).unwrap();
            assert!(matches!(m.apportion, Apportion::Tree(_)));
            for shard in [Shard::ALL, Shard::new(1, 3).unwrap(), Shard::new(3, 4).unwrap()] {
                let per = m.shard_len(shard).unwrap();
                let draws = |t: u64| {
                    let (mut s, mut i) = (vec![0; per], vec![0; per]);
                    m.fill_shard(t, shard, &mut s, &mut i).unwrap();
                    s.into_iter().zip(i).collect::<Vec<_>>()
                };
                let mut found = [0; 3];
                for t in 0..60 {
                    let (mut s, mut i, mut n) = (vec![0; per], vec![0; per], vec![None; per]);
                    m.fill_shard_with_next_use(t, shard, &mut s, &mut i, &mut n).unwrap();
                    for r in 0..per {
                        let want = (t + 1..t + 2000).find(|&u| draws(u).contains(&(s[r], i[r])));
                        assert_eq!(n[r], want, "{mode:?} {shard:?} step {t} row {r}");
                        found[s[r] as usize] += usize::from(want.is_some());
                    }
                }
                assert!(found.iter().all(|&f| f > 0), "{found:?}");
            }
        }
    }
}
