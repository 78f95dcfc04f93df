//! The one error type of this crate.

/// Everything that can go wrong when building a [`Sampler`](crate::Sampler) or
/// asking it for indices.
///
/// Every variant carries the numbers that explain it, so the message alone is
/// enough to fix the call. Nothing in this crate panics on bad arguments: each
/// bad argument maps to one of these variants.
#[non_exhaustive]
#[derive(thiserror::Error, Debug, Clone, PartialEq)]
pub enum Error {
    /// The index space `[0, length)` is empty (`length == 0`), so there is
    /// nothing to sample. Open a store with at least one record.
    #[error("the index space is empty (length 0); a sampler needs at least one record")]
    EmptyIndexSpace,

    /// The batch size is zero. Ask for at least one index per step.
    #[error("batch size is 0; a batch needs at least one index")]
    ZeroBatch,

    /// The global batch, `min(batch_size, length)` indices, is longer than
    /// this crate will hand out in one step ([`MAX_BATCH`](crate::MAX_BATCH)).
    /// Use a smaller batch size.
    #[error("a batch of {batch} indices is larger than the maximum of {max}")]
    BatchTooLarge {
        /// The global batch length that was asked for.
        batch: u64,
        /// The largest batch length allowed.
        max: u64,
    },

    /// A shard must have `count >= 1` and `index < count`.
    #[error("shard {index} of {count} is not a shard: need count >= 1 and index < count")]
    BadShard {
        /// The shard index that was given.
        index: u32,
        /// The shard count that was given.
        count: u32,
    },

    /// The shard count does not divide the global batch length, so the shards
    /// would get slices of different lengths. Pick a shard count that divides
    /// the batch, or a batch size that is a multiple of the shard count.
    #[error("{count} shards do not divide the global batch of {batch} indices evenly")]
    ShardDoesNotDivide {
        /// The global batch length.
        batch: u64,
        /// The shard count that was given.
        count: u32,
    },

    /// A mode number other than 0 (sequential), 1 (iid) or 2 (cyclic).
    #[error("mode {0} is not a sampler mode: use 0 (sequential), 1 (iid), 2 (cyclic) or 3 (blocked)")]
    BadMode(u8),

    /// Mode 3 was given a block shape with a 0 in it.
    #[error(
        "{what} is 0: mode 3 needs blocks of at least one record, windows of at least one block and at least \
         one shard"
    )]
    ZeroBlocks {
        /// The field that is 0: `block_records`, `window_blocks` or `shards`.
        what: &'static str,
    },

    /// A mixture was given no sources.
    #[error("a mixture needs at least one source")]
    NoSources,

    /// A mixture's weights do not match its sources.
    #[error("{weights} weights for {sources} sources")]
    WeightCount {
        /// Weights given.
        weights: usize,
        /// Sources given.
        sources: usize,
    },

    /// A weight that is not positive and finite.
    #[error("weights must be positive and finite, got {weight} for source {index}")]
    BadWeight {
        /// The source's position.
        index: usize,
        /// The weight it was given.
        weight: f64,
    },

    /// A mixture schedule that is not one: no points, a first point after
    /// step 0, steps out of order, three points at one step, a weight that
    /// is negative or not finite, a point of weights summing to 0, or a
    /// source of weight 0 at every point. The message says which.
    #[error("bad mixture schedule: {why}")]
    BadSchedule {
        /// What is wrong, naming the point and source.
        why: String,
    },

    /// A mixture source that holds no records.
    #[error("source {0} is empty")]
    EmptySource(usize),

    /// A source's stretches of cycles that do not follow each other: each
    /// must start at a later cycle than the one before and over more records.
    #[error("the growth {growth:?} is not stretches of cycles over more and more records, the first from cycle 0")]
    BadGrowth {
        /// `(first cycle, records)` of each stretch.
        growth: Vec<(u64, u64)>,
    },

    /// The output buffer has the wrong length: it must hold exactly one
    /// (global or shard) batch.
    #[error("the output buffer holds {got} indices but the batch has {expected}")]
    BufferLength {
        /// The batch length the buffer must have.
        expected: u64,
        /// The length of the buffer that was given.
        got: u64,
    },
}
