//! How a loader is configured, and the state it saves for an exact resume.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use zring_sampler::{Blocks, MixtureState, Mode, SamplerState, SchedulePoint, Shard};

use crate::pack::Pack;
use crate::source::Fingerprint;

/// The largest accepted [`LoaderConfig::depth`]. Each step in flight holds a
/// batch buffer set, so depth is memory; thousands of steps ahead buy nothing.
pub const MAX_DEPTH: usize = 1024;

/// The largest accepted [`LoaderConfig::threads`].
pub const MAX_THREADS: usize = 256;

/// The default [`LoaderConfig::ahead_bytes`]: 1 GiB of gathered steps ahead
/// of the consumer. Far above what the default depth of 2 takes for usual
/// batches (tens of megabytes), so it binds only for very large batches,
/// where a deep window would otherwise hold gigabytes.
pub const DEFAULT_AHEAD_BYTES: u64 = 1 << 30;

/// The parameters of a [`Loader`](crate::Loader).
///
/// [`LoaderConfig::new`] gives the defaults for a batch size;
/// [`LoaderConfig::from_state`] gives the configuration that resumes a saved
/// run. Fields are public so a caller can adjust them in between.
#[derive(Clone, Debug, PartialEq)]
pub struct LoaderConfig {
    /// Records per step in the global batch (before sharding). A batch is
    /// shorter when the streams hold fewer records.
    pub batch_size: u64,
    /// How the sampler draws indices.
    pub mode: Mode,
    /// The seed of the sampler.
    pub seed: u64,
    /// Which slice of each global batch this loader delivers.
    pub shard: Shard,
    /// Steps gathered ahead of the consumer, in flight or ready, at most;
    /// `>= 1`. With depth `d`, while the caller works on step `s` the workers
    /// may gather steps `s + 1 ..= s + d`. Default 2.
    pub depth: usize,
    /// The most data bytes (all streams' columns, this shard's records) the
    /// steps gathered ahead may hold together; `depth` still caps the step
    /// count. One step is always allowed, however large. Fixed-layout streams
    /// are counted exactly; a ragged stream counts as its largest step
    /// gathered so far, and until its first step is known the loader gathers
    /// one step at a time. Default [`DEFAULT_AHEAD_BYTES`]; `u64::MAX`
    /// leaves only `depth`.
    pub ahead_bytes: u64,
    /// Gather threads, `>= 1`. Each works on one whole step at a time, so
    /// more threads than `depth` never run at once. Default 2.
    pub threads: usize,
    /// The first step to deliver. Default 0.
    pub start_step: u64,
    /// When set, the streams must hold exactly this many records. A
    /// configuration made by [`LoaderConfig::from_state`] sets it, so a saved
    /// run cannot silently resume over different data.
    pub expect_length: Option<u64>,
    /// The step from which the sampler draws over the streams' current
    /// length ([`SamplerState::origin`]): 0 unless a saved run resumed over
    /// streams that grew. [`LoaderConfig::from_state`] sets it.
    pub origin: u64,
    /// The fingerprint each stream (by name; `"<source>/<name>"` in a
    /// mixture) had when the state was saved. A stream whose fingerprint
    /// differs is refused ([`Error::StreamChanged`](crate::Error::StreamChanged)),
    /// unless it only grew ([`Source::extends`](crate::Source::extends)):
    /// then the cycle under way finishes over the records it began with and
    /// the new records join from the next cycle. Empty (an old state, or a
    /// new run): only `expect_length` is checked.
    /// [`LoaderConfig::from_state`] sets it.
    pub expect_fingerprints: BTreeMap<String, Fingerprint>,
    /// When set, the loader must be a mixture of sources of these lengths
    /// and weights ([`MixtureState::matches`]); when `None` with
    /// `expect_length` set (a state of a single-source loader), it must not
    /// be a mixture. [`LoaderConfig::from_state`] sets it.
    pub expect_mixture: Option<MixtureState>,
    /// A mixture's weights over the steps (`zring_sampler::SchedulePoint`s,
    /// normalised point by point), in place of each source's fixed
    /// [`MixSource::weight`](crate::MixSource::weight). With
    /// `expect_mixture` whose weights or schedule differ, the resumed run
    /// keeps its saved weights up to `start_step` and follows these from
    /// there on (`zring_sampler::SchedulePiece`).
    pub schedule: Option<Vec<SchedulePoint>>,
    /// When set, the loader must pack its documents this way
    /// ([`Loader::new_packed`](crate::Loader::new_packed)); when `None` with
    /// `expect_length` set, it must not pack. [`LoaderConfig::from_state`]
    /// sets it.
    pub expect_pack: Option<Pack>,
    /// A packed run's sources' documents per cycle as the saved run drew
    /// them: for source `k`, `(first cycle, documents)` for each stretch of
    /// cycles (a source that grew during the run has more than one).
    /// Empty for a new run. [`LoaderConfig::from_state`] sets it.
    pub expect_pack_growth: Vec<Vec<(u64, u64)>>,
    /// Mode 3's block shape; `None` lets the loader choose it from its
    /// first stream ([`Source::block_shape`](crate::Source::block_shape):
    /// for a store, a block of at least 1 MiB of records and a window of a
    /// quarter of its record cache). Ignored in the other modes and in
    /// mixtures, whose sources take [`Blocks::DEFAULT`](zring_sampler::Blocks::DEFAULT).
    /// A field of 0 is chosen as for `None`; the loader chooses
    /// [`Blocks::shards`](zring_sampler::Blocks::shards) as its shard's
    /// count, so each shard reads only its own blocks. A shape split for
    /// more than one shard must be split for this loader's count
    /// ([`Error::ShardCount`](crate::Error::ShardCount)); one of 1 shard
    /// serves any count, each shard reading whole windows.
    pub blocks: Option<Blocks>,
}

impl LoaderConfig {
    /// Defaults for `batch_size`: cyclic mode (every record once per cycle),
    /// seed 0, all shards, depth 2 (and at most [`DEFAULT_AHEAD_BYTES`]
    /// ahead), 2 threads, from step 0.
    pub fn new(batch_size: u64) -> Self {
        LoaderConfig {
            batch_size,
            mode: Mode::Cyclic,
            seed: 0,
            shard: Shard::ALL,
            depth: 2,
            ahead_bytes: DEFAULT_AHEAD_BYTES,
            threads: 2,
            start_step: 0,
            expect_length: None,
            origin: 0,
            expect_fingerprints: BTreeMap::new(),
            expect_mixture: None,
            schedule: None,
            expect_pack: None,
            expect_pack_growth: Vec::new(),
            blocks: None,
        }
    }

    /// The configuration that continues a saved run: a loader built with it
    /// (over the same streams) yields the same batches the saved loader would
    /// have yielded next. Depth, read-ahead bytes and threads take the
    /// defaults and may be changed freely; they never change the batches.
    pub fn from_state(state: &LoaderState) -> Self {
        LoaderConfig {
            batch_size: state.sampler.batch_size,
            mode: state.sampler.mode,
            seed: state.sampler.seed,
            shard: state.shard,
            start_step: state.sampler.step,
            expect_length: Some(state.sampler.length),
            origin: state.sampler.origin,
            expect_fingerprints: state.fingerprints.clone(),
            expect_mixture: state.mixture.clone(),
            expect_pack: state.pack,
            expect_pack_growth: state.pack_growth.clone(),
            blocks: state.sampler.blocks,
            ..LoaderConfig::new(state.sampler.batch_size)
        }
    }
}

/// Everything needed to continue a run exactly, from
/// [`Loader::state`](crate::Loader::state); serialise it with serde next to
/// a checkpoint and pass it to [`LoaderConfig::from_state`] to resume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoaderState {
    /// The sampler's parameters. Its `step` is the step of the batch the
    /// next `next()` call returns (not the last one returned).
    pub sampler: SamplerState,
    /// The shard the loader delivered. A run may resume with another shard
    /// count by changing [`LoaderConfig::shard`] after `from_state`.
    pub shard: Shard,
    /// A mixture's weights and source lengths (`None`, and absent from the
    /// serialised form, for a loader over one set of streams). The
    /// sampler's `length` is then the sum of the sources' lengths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixture: Option<MixtureState>,
    /// Each stream's [`Fingerprint`] (by name; `"<source>/<name>"` in a
    /// mixture) over the records the sampler draws from at this step, for
    /// the streams whose source has one. Empty, and absent from the
    /// serialised form, when none has; a state saved before fingerprints
    /// existed reads as empty and resumes as before.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fingerprints: BTreeMap<String, Fingerprint>,
    /// How a packed loader cuts its documents into rows (`None`, and absent
    /// from the serialised form, for a loader of records). The sampler's
    /// `mode` and `seed` are then those of the document order, and its
    /// `length` is [`PACKED_ROWS`](crate::PACKED_ROWS), the rows of the
    /// packed stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<Pack>,
    /// A packed run whose sources grew: for each source, `(first cycle,
    /// documents)` of each stretch of cycles over one number of documents
    /// (the cycle under way when a grown source was found finished over the
    /// documents it began with; the new ones joined at the next). Empty, and
    /// absent from the serialised form, when no source grew.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pack_growth: Vec<Vec<(u64, u64)>>,
    /// What the run consumed of each source up to `sampler.step` (all
    /// ranks' rows), for people reading the state: never read back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumed: Vec<Consumed>,
}

/// What a run consumed of one source up to a step: the rows of every rank
/// (the global batches), the same on every rank, a function of the step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Consumed {
    /// Rows of the global batches drawn from the source (a mixture's rows
    /// of it; for one source, the steps times the batch).
    pub rows: u64,
    /// A loader of records: records drawn (each a row; in iid mode with
    /// repeats).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<u64>,
    /// Packed rows: documents begun (their first token, or BOS, delivered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents: Option<u64>,
    /// Packed rows: token positions delivered, `rows * seq_len` (in first
    /// fit mode including padding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Passes over the source: records (or documents begun) over the
    /// source's records (or documents); 2.5 is two passes and half.
    pub epochs: f64,
}

impl LoaderState {
    /// The step of the batch the next `next()` call would return.
    pub fn next_step(&self) -> u64 {
        self.sampler.step
    }
}
