//! Index sampling for zring: which records go into training step `k`.
//!
//! A training loop reads a store of `length` records in batches. This crate
//! decides, for each step, which record indices form the batch. It does no
//! I/O; the loader turns the indices into reads.
//!
//! The central promise is that **the batch of a step is a pure function of
//! `(mode, seed, length, batch_size, step)`**. There is no generator state
//! that advances as batches are drawn, so:
//!
//! - seeking to step one million costs the same as seeking to step one;
//! - resuming after a crash needs five integers ([`SamplerState`]; a sixth,
//!   the origin, when the store grew between runs: [`Sampler::grown`]);
//! - several processes can each compute their own part of a step's batch
//!   without talking to each other ([`Shard`]).
//!
//! ```
//! use zring_sampler::{Mode, Sampler, Shard};
//!
//! let mut sampler = Sampler::new(Mode::Cyclic, 1_000, 64, 42)?;
//! let first = sampler.next_batch();
//! assert_eq!(first.len(), 64);
//! assert_eq!(first, sampler.batch(0)); // any step, directly
//!
//! // Two workers split each global batch into contiguous halves.
//! let mut half = vec![0u64; sampler.shard_len(Shard::new(1, 2)?)?];
//! sampler.fill_shard(0, Shard::new(1, 2)?, &mut half)?;
//! assert_eq!(half, first[32..]);
//!
//! // Save and restore.
//! let json = serde_json::to_string(&sampler.state())?;
//! let state = serde_json::from_str(&json)?;
//! let mut resumed = Sampler::from_state(&state)?;
//! assert_eq!(resumed.next_batch(), sampler.next_batch());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Overview of types and modules
//!
//! - [`Sampler`] computes batches. [`Sampler::batch`] and [`Sampler::fill`]
//!   give the global batch of any step; [`Sampler::fill_shard`] gives one
//!   shard's slice of it into a caller's buffer without allocating;
//!   [`Sampler::next_batch`] and [`Sampler::seek`] are the iterator-like
//!   convenience on top. [`Sampler::next_use`] (and
//!   [`Sampler::fill_next_use`] for many indices) answers the reverse
//!   question, the first step after a given one whose batch contains an
//!   index, directly: cyclic mode inverts the cycle's permutation, so a cache
//!   in front of the store can keep the records needed soonest.
//! - [`Mode`] picks how indices are drawn:
//!   - [`Mode::Sequential`] walks `[0, length)` in order and wraps around the
//!     end, so every batch is full.
//!   - [`Mode::Iid`] draws each index uniformly *with* replacement. Each draw
//!     is the SplitMix64 mixer applied to a counter made of the seed, the step
//!     and the slot in the batch, brought into range by Lemire's
//!     multiply-shift method with rejection, which is exactly unbiased.
//!   - [`Mode::Cyclic`] draws *without* replacement: the stream of positions
//!     `step * B + j` is cut into cycles of `(length / B) * B` positions, and
//!     each cycle reads a fresh keyed permutation of `[0, length)`. When `B`
//!     does not divide `length`, the last `length mod B` indices of each
//!     cycle's permutation are skipped; since the permutation changes every
//!     cycle, different indices are skipped each time.
//!   - [`Mode::Blocked`] (mode 3) draws without replacement too, but
//!     locally: the index space is cut into blocks of
//!     [`Blocks::block_records`] consecutive indices, each cycle puts the
//!     blocks in a fresh keyed order and cuts it into windows of
//!     [`Blocks::window_blocks`] blocks, and the cycle's positions visit
//!     one window's records (in a keyed order of their own) before the
//!     next's. A batch is a uniform draw from one window (two at a window's
//!     end), so a store that reads each block whole, once per cycle, as its
//!     window opens ([`Sampler::window`]) serves every batch from memory.
//!     Cycles, the dropped remainder and [`Sampler::next_use`] are as in
//!     cyclic mode; the block shape is part of [`SamplerState`].
//! - [`Mixture`] draws each global batch from several sources with fixed
//!   weights, exact over the run (largest-remainder rounding of each source's
//!   share of the rows so far; any positive weight, a source of under one row
//!   per batch getting its rows over the steps), every source reading its
//!   own index stream;
//!   its rows are interleaved ([`RowOrder`]) so that every shard of a
//!   power-of-two count holds each source's share of its rows within a row;
//!   [`MixtureState`] is what a resumed mixture run must find again.
//! - [`Shard`] names one consumer's contiguous slice of the global batch.
//! - [`SamplerState`] is what to save; it serialises with serde.
//! - [`Error`] is the one error type; bad arguments return it, never panic.
//!
//! Internally, `feistel` holds the permutation, `random` the counter-based
//! random numbers and `mixture` the weighted mixtures.
//!
//! # Trade-offs
//!
//! - **No table the size of the dataset.** The cyclic permutation is a Feistel
//!   network over the smallest power of four at or above `length`, with
//!   cycle-walking to stay in range; it costs a few nanoseconds per index and
//!   no memory, where a shuffled index array would cost `8 * length` bytes
//!   and a pass over them per cycle. The price is that the permutation is
//!   pseudo-random (four rounds of a multiply–xorshift–multiply hash, eight
//!   for index spaces under `2^14`) rather than a uniformly random choice
//!   among all `length!` permutations. The tests check what matters for
//!   batch composition (position and image uncorrelated, the image of a
//!   position uniform over seeds, neighbours landing far apart); it is not a
//!   cryptographic permutation and must not be used as one.
//! - **Every batch is full.** Sequential wraps circularly and cyclic drops a
//!   different remainder each cycle, so batch shapes never change mid-run,
//!   which suits compiled training steps. The cost is that in cyclic mode a
//!   given cycle does not visit every index when `B` does not divide `length`.
//! - **The shard is not part of the state.** Shards are contiguous slices of
//!   one global batch, so the global stream is the same whatever the shard
//!   count, and a run saved with four workers resumes with two. The cost is
//!   that the shard count must divide the batch length.
//! - **A store smaller than one batch gives a shorter batch**
//!   (`min(batch_size, length)` indices), as loaderx does, rather than
//!   repeating indices within a batch.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod blocked;
mod error;
mod feistel;
mod mixture;
mod random;
mod sampler;
mod schedule;
mod shard;
mod sum;

pub use blocked::{Blocks, Window};
pub use error::Error;
pub use mixture::{Mixture, MixtureState, RowOrder, STREAM_BLOCK};
pub use sampler::{Mode, Sampler, SamplerState, MAX_BATCH};
pub use schedule::{weights_at, SchedulePiece, SchedulePoint};
pub use shard::Shard;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_blocked;
#[cfg(test)]
mod tests_schedule;
