//! The seam between the loader and whatever holds the records.
//!
//! The loader never reads files itself. It asks a [`Source`] to copy the
//! records at a list of indices into a buffer the loader owns, which keeps the
//! pipeline testable with an in-memory source and lets the store choose how to
//! batch its reads.
//!
//! A source that caches records may also want to know the future: the
//! loader's sampler knows at which step every record is needed next, and
//! passes it along ([`Source::wants_hints`], [`Source::gather_hinted`]) in its
//! own terms, a step number or nothing per record; [`crate::StoreSource`]
//! turns that into the store's `zring_engine::NextUse`. Sources that do not
//! cache keep the default methods and never see a hint.

pub use zring_engine::Fingerprint;

/// The error a [`Source`] returns. It is boxed so any store's error type fits;
/// the loader wraps it in [`Error::Gather`](crate::Error::Gather) together with
/// the step and stream it belongs to.
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// How the records of a [`Source`] are laid out in a gathered buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Every record is exactly `record_bytes` long, so a batch of `n` records
    /// is one `n * record_bytes` buffer and needs no offsets.
    Fixed {
        /// The length of each record in bytes.
        record_bytes: usize,
    },
    /// Records have their own lengths; a batch is one buffer plus `n + 1`
    /// offsets delimiting the records in it.
    Ragged,
}

/// What the loader gathers from: a random-access collection of `len()`
/// records.
///
/// Implementations are shared between the loader's threads, so every method
/// takes `&self` and may be called concurrently for different batches. A
/// method must fill its output completely or return an error; the loader never
/// hands a partly written buffer to the caller.
pub trait Source: Send + Sync + 'static {
    /// The number of records; valid indices are `0..len()`.
    fn len(&self) -> u64;

    /// Whether the source holds no records. A loader refuses empty sources.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How gathered records are laid out. The loader reads this once, when it
    /// is built, and relies on it for its whole life.
    fn layout(&self) -> Layout;

    /// [`Layout::Fixed`] only: copies record `indices[i]` to
    /// `dst[i * record_bytes..][..record_bytes]`. `dst.len()` is exactly
    /// `indices.len() * record_bytes`.
    fn gather(&self, indices: &[u64], dst: &mut [u8]) -> Result<(), SourceError>;

    /// [`Layout::Ragged`] only: writes the byte length of record `indices[i]`
    /// to `out[i]`. `out.len() == indices.len()`.
    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), SourceError>;

    /// [`Layout::Ragged`] only: copies record `indices[i]` to
    /// `dst[offsets[i]..offsets[i + 1]]`. `offsets.len() == indices.len() + 1`,
    /// `offsets[0] == 0`, and the last offset is `dst.len()`; the offsets come
    /// from the lengths [`Source::lengths`] reported for the same indices.
    fn gather_var(&self, indices: &[u64], dst: &mut [u8], offsets: &[u64]) -> Result<(), SourceError>;

    /// A fingerprint of the records ([`Fingerprint`]), which a saved
    /// [`LoaderState`](crate::LoaderState) carries so that a resumed run can
    /// tell the same records from others. Default `None`: the source cannot
    /// tell, and a resume checks its length only.
    fn fingerprint(&self) -> Result<Option<Fingerprint>, SourceError> {
        Ok(None)
    }

    /// Whether the first `earlier.records` records are still those
    /// `earlier` was taken of, with perhaps more after them (the source only
    /// grew). Asked only of a source whose fingerprint is not `earlier`.
    /// Default `false`.
    fn extends(&self, earlier: Fingerprint) -> Result<bool, SourceError> {
        let _ = earlier;
        Ok(false)
    }

    /// The source as it is now, for all the calls of one step: the loader
    /// asks once per step and makes that step's calls (the lengths of a
    /// ragged stream, then its gathers) on what it gets, so a source that
    /// changes meanwhile (a store being appended to, deleted from or
    /// compacted) cannot size a batch by one state and fill it from
    /// another. Default `None`: the source's own calls are consistent with
    /// each other.
    fn view(&self) -> Result<Option<Box<dyn Source>>, SourceError> {
        Ok(None)
    }

    /// Whether [`Source::gather_hinted`] and [`Source::gather_var_hinted`]
    /// would use their hints. The loader asks once per step, before it
    /// gathers the step, and computes hints only when some stream wants them.
    /// Default `false`.
    fn wants_hints(&self) -> bool {
        false
    }

    /// [`Source::gather`], told when each record is needed next: `next[k]`
    /// is for `indices[k]`, `Some(step)` the first later loader step whose
    /// global batch holds it, `None` none known (iid draws are looked ahead
    /// for a window of steps only).
    /// `next.len() == indices.len()`. A source may keep the records needed
    /// soonest in memory; the bytes written must be those of
    /// [`Source::gather`]. The loader calls it only for sources that
    /// [want hints](Source::wants_hints). Default: ignores the hints.
    fn gather_hinted(&self, indices: &[u64], dst: &mut [u8], next: &[Option<u64>]) -> Result<(), SourceError> {
        let _ = next;
        self.gather(indices, dst)
    }

    /// [`Source::gather_var`] with hints, as [`Source::gather_hinted`].
    /// Default: ignores the hints.
    fn gather_var_hinted(
        &self,
        indices: &[u64],
        dst: &mut [u8],
        offsets: &[u64],
        next: &[Option<u64>],
    ) -> Result<(), SourceError> {
        let _ = next;
        self.gather_var(indices, dst, offsets)
    }

    /// Copies record `indices[i]` into its slot at `dst[starts[i]..]`:
    /// `record_bytes` long for a [`Layout::Fixed`] source (a shorter record
    /// zero-padded, as [`Source::gather`] pads), the record's own length
    /// ([`Source::lengths`]) for a [`Layout::Ragged`] one. Slots lie inside
    /// `dst` and do not overlap; `next` is empty or one hint per index, as
    /// for [`Source::gather_hinted`] (called only for a source that wants
    /// hints). The loader puts a mixture's interleaved rows in place with
    /// it, one call per source. Default: gathers into a scratch buffer and
    /// copies each record to its slot.
    fn gather_at(
        &self,
        indices: &[u64],
        dst: &mut [u8],
        starts: &[u64],
        next: &[Option<u64>],
    ) -> Result<(), SourceError> {
        if starts.len() != indices.len() {
            return Err(format!("gather_at: {} starts for {} records", starts.len(), indices.len()).into());
        }
        let (scratch, ends) = match self.layout() {
            Layout::Fixed { record_bytes } => {
                let mut scratch = vec![0u8; indices.len() * record_bytes];
                match next {
                    [] => self.gather(indices, &mut scratch)?,
                    next => self.gather_hinted(indices, &mut scratch, next)?,
                }
                let ends = (1..=indices.len()).map(|i| (i * record_bytes) as u64).collect::<Vec<_>>();
                (scratch, ends)
            }
            Layout::Ragged => {
                let mut offsets = vec![0u64; indices.len() + 1];
                self.lengths(indices, &mut offsets[1..])?;
                for i in 1..offsets.len() {
                    offsets[i] += offsets[i - 1];
                }
                let total = usize::try_from(offsets[indices.len()]).map_err(|_| "gather_at: records too large")?;
                let mut scratch = vec![0u8; total];
                match next {
                    [] => self.gather_var(indices, &mut scratch, &offsets)?,
                    next => self.gather_var_hinted(indices, &mut scratch, &offsets, next)?,
                }
                (scratch, offsets[1..].to_vec())
            }
        };
        let mut from = 0;
        for (&start, &end) in starts.iter().zip(&ends) {
            // Lossless: within the scratch buffer, a usize.
            let record = &scratch[from..end as usize];
            let slot =
                usize::try_from(start).ok().and_then(|s| dst.get_mut(s..s.checked_add(record.len())?)).ok_or_else(
                    || format!("gather_at: a slot at {start} of {} bytes is outside the buffer", record.len()),
                )?;
            slot.copy_from_slice(record);
            from = end as usize;
        }
        Ok(())
    }

    /// The block shape this source reads best in mode 3: blocks of
    /// consecutive records that are one large read, windows that fit the
    /// memory it caches records in. Asked once, of the first stream, when a
    /// mode-3 loader is built without a shape. Default `None`:
    /// [`Blocks::DEFAULT`](zring_sampler::Blocks::DEFAULT).
    fn block_shape(&self) -> Option<zring_sampler::Blocks> {
        None
    }

    /// Mode 3: the records of `blocks` (ranges of consecutive indices, in
    /// index order) are about to be drawn; `next[k]` is when the `k`-th
    /// record of them, counting through the ranges, is needed (as in
    /// [`Source::gather_hinted`]). A source may read each range in large
    /// reads into memory so that the gathers of those steps find them
    /// there. Called by one loader thread, one window ahead of the gathers.
    /// Default: nothing.
    fn prefetch(&self, blocks: &[std::ops::Range<u64>], next: &[Option<u64>]) -> Result<(), SourceError> {
        let _ = (blocks, next);
        Ok(())
    }
}
