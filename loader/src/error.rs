//! The loader's one error type.

use crate::source::{Fingerprint, SourceError};

/// Everything that can go wrong building or running a [`Loader`](crate::Loader).
///
/// Errors from a running loader arrive in step order: the batches before a
/// failed step are delivered normally, then [`Loader::next`](crate::Loader::next)
/// returns the failure of that step, and from then on the loader is poisoned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A loader needs at least one stream.
    #[error("a loader needs at least one stream, got none")]
    NoStreams,

    /// Two streams share a name; names key the columns of a batch.
    #[error("stream name {name:?} is used twice; give every stream its own name")]
    DuplicateStream {
        /// The repeated name.
        name: String,
    },

    /// The streams do not all hold the same number of records, so one index
    /// cannot address a record in each.
    #[error("all streams must have the same length, got {}", format_lengths(.lengths))]
    LengthMismatch {
        /// Every stream's name and length, in the order given.
        lengths: Vec<(String, u64)>,
    },

    /// A configuration value is out of range.
    #[error("invalid loader config: {field} = {value}, expected {expected}")]
    InvalidConfig {
        /// The [`LoaderConfig`](crate::LoaderConfig) field.
        field: &'static str,
        /// The value given.
        value: u64,
        /// What would be accepted.
        expected: &'static str,
    },

    /// A saved [`LoaderState`](crate::LoaderState) was made for streams of a
    /// different length than the ones given now, so its index sequence would
    /// not mean the same records.
    #[error(
        "the saved state is for streams of {state_length} records but the streams hold {stream_length}; \
         resume with the streams the state was saved from"
    )]
    StateMismatch {
        /// The length recorded in the state.
        state_length: u64,
        /// The length of the streams given.
        stream_length: u64,
    },

    /// A stream's records differ from those the saved
    /// [`LoaderState`](crate::LoaderState) was drawn over: some were
    /// replaced, deleted or reordered (its fingerprint differs, and the
    /// stream is not the saved records with more appended).
    #[error(
        "stream {stream:?} changed since the state was saved: it held {} records (content {:#010x}), it now holds {} \
         (content {:#010x}), and its first {} records are not the saved ones (records were replaced, deleted or \
         reordered); resume with the data the state was saved from, or start a new run without the state",
        .saved.records, .saved.content, .now.records, .now.content, .saved.records
    )]
    StreamChanged {
        /// The stream (`"<source>/<name>"` in a mixture).
        stream: String,
        /// Its fingerprint in the state.
        saved: Fingerprint,
        /// Its fingerprint now.
        now: Fingerprint,
    },

    /// A source could not say what its records are
    /// ([`Source::fingerprint`](crate::Source::fingerprint) or
    /// [`Source::extends`](crate::Source::extends) failed).
    #[error("reading the fingerprint of stream {stream:?} failed: {source}")]
    Fingerprint {
        /// The stream (`"<source>/<name>"` in a mixture).
        stream: String,
        /// The source's own error.
        source: SourceError,
    },

    /// The streams grew since the state was saved, and this resume cannot
    /// add the new records.
    #[error(
        "stream {stream:?} grew from {saved} to {now} records since the state was saved, but {why}; resume with the \
         records the state was saved from, or start a new run without the state"
    )]
    CannotGrow {
        /// The stream (`"<source>/<name>"` in a mixture).
        stream: String,
        /// Its records in the state.
        saved: u64,
        /// Its records now.
        now: u64,
        /// Why not.
        why: String,
    },

    /// A saved [`LoaderState`](crate::LoaderState) was made for a mixture
    /// of other sources (another number of them, or other lengths: the data
    /// changed), or for a mixture when the loader is none, or the other way
    /// round. Other weights or another schedule are not refused: the run
    /// follows them from the saved step on ([`LoaderConfig::schedule`](crate::LoaderConfig::schedule)).
    #[error("the state was saved for {saved} but the loader is {loader}; resume with what the state was saved from")]
    MixtureMismatch {
        /// What the state describes.
        saved: String,
        /// What the loader was given.
        loader: String,
    },

    /// A mixture source lacks a stream the first source has, has one more,
    /// or lays one out differently.
    #[error("mixture source {source_index} has streams {got}, source 0 has {want}")]
    SourceStreams {
        /// The source's position.
        source_index: usize,
        /// Its streams (names and layouts).
        got: String,
        /// Source 0's.
        want: String,
    },

    /// A packed source could not be set up: its records are not ragged,
    /// not whole tokens, or hold no tokens at all.
    #[error("cannot pack stream {stream:?}: {source}")]
    Pack {
        /// The stream (`"<source>/tokens"` in a mixture).
        stream: String,
        /// What is wrong with it.
        source: SourceError,
    },

    /// A saved [`LoaderState`](crate::LoaderState) was made with other
    /// packing (sequence length, mode, pad or token size), or for a packed
    /// loader when this one is not, or the other way round.
    #[error("the state was saved for {saved} but the loader is {loader}; resume with the packing it was saved with")]
    PackMismatch {
        /// What the state describes.
        saved: String,
        /// What the loader was given.
        loader: String,
    },

    /// The sampler rejected its parameters (batch size, shard, weights, ...).
    #[error("sampler: {0}")]
    Sampler(#[from] zring_sampler::Error),

    /// A step's records do not fit in memory addressable on this machine.
    #[error("step {step}: stream {stream:?} would need {bytes} bytes, more than a buffer can hold")]
    BatchTooLarge {
        /// The step being gathered.
        step: u64,
        /// The stream being gathered.
        stream: String,
        /// The bytes the step needed.
        bytes: u128,
    },

    /// The source of a stream failed to gather a step.
    #[error("gathering step {step} of stream {stream:?} failed: {source}")]
    Gather {
        /// The step whose gather failed.
        step: u64,
        /// The stream whose source failed.
        stream: String,
        /// The source's own error.
        source: SourceError,
    },

    /// A gather thread panicked (in a source, or in the loader itself). The
    /// panic is caught and reported instead of leaving the consumer waiting.
    #[error("a gather thread panicked{}{}: {message}",
        .step.map(|s| format!(" at step {s}")).unwrap_or_default(),
        .stream.as_ref().map(|s| format!(" in stream {s:?}")).unwrap_or_default())]
    Panicked {
        /// The step being gathered, if the panic happened inside one.
        step: Option<u64>,
        /// The stream being gathered, if the panic happened in a source.
        stream: Option<String>,
        /// The panic's message.
        message: String,
    },

    /// An earlier step failed; the loader delivers nothing after a failure.
    /// Build a new loader from [`Loader::state`](crate::Loader::state) to
    /// retry from the failed step.
    #[error("the loader is poisoned: step {step} failed earlier; build a new loader from its state() to retry")]
    Poisoned {
        /// The step that failed.
        step: u64,
    },

    /// [`Loader::close`](crate::Loader::close) was called.
    #[error("the loader is closed")]
    Closed,

    /// The operating system refused to start a gather thread.
    #[error("could not start a gather thread: {0}")]
    Spawn(#[source] std::io::Error),
}

fn format_lengths(lengths: &[(String, u64)]) -> String {
    let parts: Vec<String> = lengths.iter().map(|(name, len)| format!("{name:?}: {len}")).collect();
    format!("{{{}}}", parts.join(", "))
}
