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
//! Each source reads its own *stream* of indices: a [`Sampler`](crate::Sampler) in the
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

mod apportion;
mod rows;
mod stream;
mod windows;

use serde::{Deserialize, Serialize};

use std::sync::Arc;

use self::apportion::{allocate, Apportion};
use self::stream::SourceStream;
pub use self::stream::STREAM_BLOCK;
use crate::schedule::{Curve, Track};
use crate::sum::pairwise_sum;
use crate::{Blocks, Error, Mode, SchedulePiece, Shard, MAX_BATCH};

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
    /// Sources that grew during the run: for each source, `(first cycle,
    /// records)` of each stretch of its cycles ([`Mixture::grow`]); absent
    /// when none grew. `lengths` are then the last stretches' records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<Vec<Vec<(u64, u64)>>>,
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
            .streams
            .iter()
            .zip(shapes)
            .enumerate()
            .map(|(k, (stream, &shape))| {
                let shape = Some(Blocks { shards: 1, ..shape });
                SourceStream::with_growth(self.mode, &stream.growth(), source_seed(self.seed, k), shape)
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
        let growth: Vec<Vec<(u64, u64)>> = self.streams.iter().map(SourceStream::growth).collect();
        MixtureState {
            weights: self.weights.clone(),
            lengths: self.lengths.clone(),
            order: self.order,
            schedule: self.schedule.as_ref().map(|s| s.pieces.clone()),
            blocks: self.blocks.clone(),
            growth: growth.iter().any(|g| g.len() > 1).then_some(growth),
        }
    }

    /// Source `k`'s stream as `growth` says (`(first cycle, records)` of each
    /// stretch of cycles, the last over the source's length): what a saved
    /// [`MixtureState::growth`] restores.
    pub fn with_growth(mut self, growth: &[Vec<(u64, u64)>]) -> Result<Mixture, Error> {
        if growth.len() != self.streams.len() {
            return Err(Error::BufferLength { expected: self.streams.len() as u64, got: growth.len() as u64 });
        }
        for (k, g) in growth.iter().enumerate() {
            if g.last().map(|l| l.1) != Some(self.lengths[k]) {
                return Err(Error::BadGrowth { growth: g.clone() });
            }
            let shape = self.blocks.as_ref().map(|b| b[k]);
            self.streams[k] = SourceStream::with_growth(self.mode, g, source_seed(self.seed, k), shape)?;
        }
        Ok(self)
    }

    /// Source `k` grown to `length` records from cycle `first_cycle` of its
    /// stream on: the cycles before draw as they did, later ones from all
    /// `length` records (in an order keyed apart). `first_cycle` must be
    /// after its last stretch's first cycle, `length` above its records.
    pub fn grow(mut self, k: usize, first_cycle: u64, length: u64) -> Result<Mixture, Error> {
        let Some(stream) = self.streams.get_mut(k) else {
            return Err(Error::BufferLength { expected: self.lengths.len() as u64, got: k as u64 });
        };
        let mut growth = stream.growth();
        let last = *growth.last().expect("a stream has a segment");
        if first_cycle <= last.0 || length <= last.1 {
            growth.push((first_cycle, length));
            return Err(Error::BadGrowth { growth });
        }
        stream.push(first_cycle, length)?;
        self.lengths[k] = length;
        Ok(self)
    }

    /// The cycle of source `k`'s stream that holds its position `p` (the
    /// source's rows so far, [`Mixture::allocation`]).
    pub fn source_cycle_of(&self, k: usize, p: u64) -> Option<u64> {
        Some(self.streams.get(k)?.cycle_of(p).0)
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

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_small_weights;
