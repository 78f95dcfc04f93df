//! zring-loader is the part of zring a training loop touches: an endless,
//! step-based loader over named streams of records. While the loop works on
//! step `s`, a few Rust threads already gather steps `s + 1`, `s + 2`, ...
//! from the store, and [`Loader::next`] hands them over strictly in step
//! order, so the loop rarely waits for I/O.
//!
//! Which records make up a step is decided by `zring-sampler`: a pure
//! function of `(mode, seed, length, batch size, step)`. The loader adds no
//! randomness of its own, so the batch sequence does not depend on the number
//! of threads or the pipeline depth, and a saved [`LoaderState`] resumes a run
//! exactly.
//!
//! ```
//! use std::sync::Arc;
//! use zring_loader::{Layout, Loader, LoaderConfig, Request, Source, SourceError, Stream};
//!
//! /// Record `i` is the 4 little-endian bytes of `i`.
//! struct Numbers(u64);
//!
//! impl Source for Numbers {
//!     fn len(&self) -> u64 { self.0 }
//!     fn layout(&self) -> Layout { Layout::Fixed { record_bytes: 4 } }
//!     fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
//!         for (&i, out) in req.indices.iter().zip(req.slots(self, dst)?) {
//!             out.copy_from_slice(&u32::try_from(i)?.to_le_bytes());
//!         }
//!         Ok(())
//!     }
//!     fn lengths(&self, _: &[u64], _: &mut [u64]) -> Result<(), SourceError> {
//!         Err("fixed layout".into())
//!     }
//! }
//!
//! # fn main() -> Result<(), zring_loader::Error> {
//! let streams = vec![Stream::new("x", Arc::new(Numbers(1000)))];
//! let mut loader = Loader::new(streams, LoaderConfig::new(32))?;
//! let batch = loader.next()?;
//! assert_eq!(batch.step, 0);
//! assert_eq!(batch.column("x").unwrap().data().len(), 32 * 4);
//!
//! // Save the position, e.g. next to a model checkpoint, and resume later.
//! let state = loader.state();
//! let mut resumed = Loader::new(
//!     vec![Stream::new("x", Arc::new(Numbers(1000)))],
//!     LoaderConfig::from_state(&state),
//! )?;
//! assert_eq!(resumed.next()?.indices[..], loader.next()?.indices[..]);
//! # Ok(())
//! # }
//! ```
//!
//! # Overview of types and modules
//!
//! * [`Source`] (module `source`) is the seam to the store: gather the records
//!   at some indices into a buffer, in a [`Layout`] that is either fixed-size
//!   or ragged. [`StoreSource`] adapts a `zring_engine::Store`; tests use
//!   in-memory sources. A source that caches may ask for hints
//!   ([`Source::wants_hints`]): with each gather, the step at which every
//!   record is needed next, from the sampler. A `StoreSource` asks while its
//!   store reads with O_DIRECT behind a record cache, which then keeps the
//!   records needed soonest.
//! * [`Stream`] names a source. All streams of a loader have the same length
//!   and are gathered at the same indices, so their records line up.
//! * [`MixSource`] is one source of a weighted mixture
//!   ([`Loader::new_mixture`]): each step's rows come from the sources in
//!   exact proportions (`zring_sampler::Mixture`), interleaved so that each
//!   shard holds each source's share; each source's rows are gathered in
//!   one call and moved to their rows; [`Batch::sources`] names each row's
//!   source.
//! * [`Loader::new_packed`] and [`Loader::new_packed_mixture`] read ragged
//!   sources of token documents as rows of `seq_len` tokens ([`Pack`],
//!   module `pack`): each batch has the columns `tokens`, `segment_ids` and
//!   `positions`, made by the workers from the documents of the loader's
//!   sampling order, concatenated and cut ([`PackMode::Concat`]) or packed
//!   first-fit ([`PackMode::FirstFit`]); with [`Pack::labels`] also
//!   `labels` and `loss_mask` (rows overlapping by one token), with
//!   [`Pack::eod_id`] / [`Pack::bos_id`] tokens added at document edges;
//!   [`Loader::new_packed_typed`] takes sources of other token types
//!   ([`TokenType`]). Rows are found by number, so a packed run seeks,
//!   shards and resumes like any other.
//! * [`LoaderConfig`] holds batch size, sampling mode, seed, shard, pipeline
//!   depth (in steps, and in bytes: `ahead_bytes`), thread count and start
//!   step; [`LoaderState`] is the serde-able
//!   position for an exact resume. It carries each stream's [`Fingerprint`]
//!   (when its source has one, as a [`StoreSource`] does): a resume over
//!   changed records is refused ([`Error::StreamChanged`]), and one over a
//!   store that only grew finishes the cycle under way over the records it
//!   began with, the new records joining from the next cycle
//!   (`zring_sampler::Sampler::grown`).
//! * [`Source::view`] gives the loader one view of a source per step: a
//!   ragged column's lengths and its records come from the same records,
//!   however the store changes meanwhile (a `StoreSource` hands out a
//!   `zring_engine::View`, one snapshot of the store).
//! * [`Loader`] runs the pipeline; [`Batch`] is one step: the shard's indices
//!   and one [`Column`] per stream (bytes, plus offsets for ragged streams).
//! * [`Pooled`] / [`PooledBuf`] are the recycled buffers inside a batch. They
//!   own their memory, so a batch can be kept (or handed to NumPy as a base
//!   object) as long as needed, and they go back to the loader's pool on drop.
//! * [`LoaderStats`] reports the consumer's wait and the gather time per step
//!   as percentiles, and the records and bytes gathered.
//! * [`Error`] is the one error type. A failed step reaches the caller in step
//!   order, then the loader is poisoned.
//!
//! # Trade-offs
//!
//! * One worker gathers one whole step. Parallelism comes from gathering
//!   several steps at once (up to `depth`), not from splitting a step; the
//!   store parallelises the reads inside one gather. See the `loader` module
//!   source for how depth, threads and held buffers interact.
//! * The loader never waits for the caller to return a buffer: when every
//!   pooled buffer is held, it allocates. Holding batches therefore costs
//!   memory, never a deadlock, and the steady state allocates no data
//!   buffers. The small per-step `Vec` of column handles is allocated anew.
//! * Delivery is strictly in step order: a slow step holds back faster later
//!   ones (which are kept ready), the price of a reproducible sequence.
//! * A gather in progress is not interrupted: `close()` waits for running
//!   source calls to return.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod batch;
mod config;
mod error;
mod loader;
mod lookahead;
mod pack;
mod parts;
mod plan;
mod pool;
mod prefetch;
mod source;
mod stats;
mod store;
mod subset;

pub use batch::{Batch, Column};
pub use config::{Consumed, LoaderConfig, LoaderState, DEFAULT_AHEAD_BYTES, MAX_DEPTH, MAX_THREADS};
pub use error::Error;
pub use loader::{Loader, MixSource, Stream};
pub use pack::{Pack, PackMode, PackSource, TokenType, FIRST_FIT_WINDOW, PACKED_ROWS};
pub use parts::PartsSource;
pub use pool::{Pooled, PooledBuf};
pub use source::{Fingerprint, Layout, Request, Slots, Source, SourceError, Span};
pub use stats::{LoaderStats, Percentiles};
pub use store::StoreSource;
pub use subset::{key_bits, Subset};
pub use zring_sampler::{Blocks, MixtureState, Mode, RowOrder, SamplerState, SchedulePiece, SchedulePoint, Shard};
