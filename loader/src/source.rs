//! The seam between the loader and whatever holds the records.
//!
//! The loader never reads files itself. It asks a [`Source`] to copy the
//! records at a list of indices into a buffer the loader owns, which keeps the
//! pipeline testable with an in-memory source and lets the store choose how to
//! batch its reads.
//!
//! A source that caches records may also want to know the future: the
//! loader's sampler knows at which step every record is needed next, and
//! passes it along ([`Source::wants_hints`], [`Request::next`]) in its own
//! terms, a step number or nothing per record; [`crate::StoreSource`] turns
//! that into the store's `zring_engine::NextUse`. Sources that do not cache
//! keep the default [`Source::wants_hints`] and never see a hint.

pub use zring_engine::{Fingerprint, Span};

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

    /// Copies the records `req` names into their slots in `dst`
    /// ([`Request`]): a fixed slot is `record_bytes` long, the record
    /// zero-padded (a longer record is an error), a ragged slot the record's
    /// own length ([`Source::lengths`]). [`Request::slots`] splits `dst` into
    /// the slots for a source that fills them one by one.
    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError>;

    /// [`Layout::Ragged`] only: writes the byte length of record `indices[i]`
    /// to `out[i]`. `out.len() == indices.len()`.
    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), SourceError>;

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

    /// Whether [`Source::gather`] would use the hints of a request
    /// ([`Request::next`]). The loader asks once per step, before it gathers
    /// the step, and computes hints only when some stream wants them.
    /// Default `false`.
    fn wants_hints(&self) -> bool {
        false
    }

    /// The block shape this source reads best in mode 3: blocks of
    /// consecutive records that are one large read, windows that fit the
    /// memory it caches records in. Asked once, of the first stream, when a
    /// mode-3 loader is built without a shape. Default `None`:
    /// [`Blocks::DEFAULT`](zring_sampler::Blocks::DEFAULT).
    fn block_shape(&self) -> Option<zring_sampler::Blocks> {
        None
    }

    /// [`Layout::Ragged`] only: copies parts of records into `dst`, span
    /// `k` being bytes `from .. from + len` of record `index` at
    /// `dst[at..at + len]` ([`Span`]); spans lie inside `dst` and do not
    /// overlap, and bytes of `dst` outside them are left alone. A packed
    /// loader reads the pieces of documents cut at a row's edge with it.
    ///
    /// Default: each record named is gathered whole (once per call) into
    /// scratch and its spans copied. A source that can read a part of a
    /// record for less says so in [`Source::reads_in_part`].
    fn gather_spans(&self, spans: &[Span], dst: &mut [u8], fan_out: bool) -> Result<(), SourceError> {
        let mut records: Vec<u64> = spans.iter().map(|p| p.index).collect();
        records.sort_unstable();
        records.dedup();
        let mut lens = vec![0u64; records.len()];
        self.lengths(&records, &mut lens)?;
        let mut offsets = Vec::with_capacity(records.len() + 1);
        offsets.push(0u64);
        for l in &lens {
            offsets.push(offsets[offsets.len() - 1] + l);
        }
        for p in spans {
            let k = records.binary_search(&p.index).expect("every span's record is listed");
            if p.from.checked_add(p.len).is_none_or(|end| end > lens[k]) {
                return Err(format!("bytes {}..+{} of record {}, of {} bytes", p.from, p.len, p.index, lens[k]).into());
            }
            if p.at.checked_add(p.len).is_none_or(|end| end > dst.len() as u64) {
                return Err(format!("a span of {} bytes at {} outside {} bytes", p.len, p.at, dst.len()).into());
            }
        }
        let size = usize::try_from(offsets[records.len()]).map_err(|_| "records too large to gather")?;
        let mut scratch = vec![0u8; size];
        self.gather(&Request::ragged(&records, &offsets).fan_out(fan_out), &mut scratch)?;
        for p in spans {
            let k = records.binary_search(&p.index).expect("every span's record is listed");
            // Lossless: checked inside `dst` and the record above.
            let from = (offsets[k] + p.from) as usize;
            dst[p.at as usize..][..p.len as usize].copy_from_slice(&scratch[from..][..p.len as usize]);
        }
        Ok(())
    }

    /// [`Layout::Ragged`] only: whether [`Source::gather_spans`] reads a
    /// span of record `indices[i]` for about the span's own bytes
    /// (`out[i] = true`: a raw record of a store) or reads the whole record
    /// (`false`: a compressed one, or the default gather). A packed loader
    /// keeps a document read whole for the pieces of later steps.
    /// Default: all `false`.
    fn reads_in_part(&self, indices: &[u64], out: &mut [bool]) -> Result<(), SourceError> {
        let _ = indices;
        out.fill(false);
        Ok(())
    }

    /// Mode 3: the records of `blocks` (ranges of consecutive indices, in
    /// index order) are about to be drawn; `next` is empty (no hints; the
    /// loader passes none) or `next[k]` is when the `k`-th record of them,
    /// counting through the ranges, is needed (as in [`Request::next`]).
    /// A source may read each range in large
    /// reads into memory so that the gathers of those steps find them
    /// there. Called by one loader thread, one window ahead of the gathers.
    /// Default: nothing.
    fn prefetch(&self, blocks: &[std::ops::Range<u64>], next: &[Option<u64>]) -> Result<(), SourceError> {
        let _ = (blocks, next);
        Ok(())
    }

    /// Mode 3: the windows to be read next (each its record ranges), in
    /// order, the one about to be [prefetched](Source::prefetch) first.
    /// A source whose files are a cache of object storage evicts by it
    /// (the furthest next use out first). Default: nothing.
    fn plan(&self, windows: &[Vec<std::ops::Range<u64>>]) -> Result<(), SourceError> {
        let _ = windows;
        Ok(())
    }

    /// Whether [`Source::plan`] does anything (the loader spares computing
    /// the windows ahead otherwise). Default `false`.
    fn wants_plan(&self) -> bool {
        false
    }
}

/// Where a gather puts each record in the destination buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slots<'a> {
    /// [`Layout::Fixed`]: record `k` at `dst[k * record_bytes..][..record_bytes]`;
    /// `dst` is exactly `indices.len() * record_bytes` bytes.
    Packed,
    /// [`Layout::Ragged`]: record `k` at `dst[offsets[k]..offsets[k + 1]]`;
    /// `indices.len() + 1` offsets, the first 0 and the last `dst.len()`,
    /// from the lengths [`Source::lengths`] reported for the same indices.
    Offsets(&'a [u64]),
    /// Record `k` at `dst[starts[k]..]`: `record_bytes` long for a fixed
    /// layout, its own length for a ragged one. Slots lie inside `dst` and
    /// do not overlap. The loader puts a mixture's interleaved rows in
    /// place with it, one call per source.
    At(&'a [u64]),
}

/// One gather: the records to copy, where each goes, when each is needed
/// next, and whether the call may fan out over the store's decode pool.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The records to copy.
    pub indices: &'a [u64],
    /// Where each record goes.
    pub slots: Slots<'a>,
    /// When each record is needed next: empty (no hints), or `next[k]` for
    /// `indices[k]`, `Some(step)` the first later loader step whose global
    /// batch holds it, `None` none known (iid draws are looked ahead for a
    /// window of steps only). Given only to a source that
    /// [wants hints](Source::wants_hints); a source may keep the records
    /// needed soonest in memory, but the bytes written are the same.
    pub next: &'a [Option<u64>],
    /// With hints in cyclic mode, the first step of the next cycle: every
    /// hint of this step lies in that cycle, and a source keeping the records
    /// needed soonest can tell which of them it could still hold by then
    /// (the store adapter keeps none beyond its record cache's reach). `None`
    /// otherwise.
    pub cycle_end: Option<u64>,
    /// Whether the source may spread the gather over other threads (a
    /// store's decode pool). The loader turns it off while its own workers
    /// already run as many gathers at once as there are cores.
    pub fan_out: bool,
}

impl<'a> Request<'a> {
    /// Fixed records back to back ([`Slots::Packed`]).
    pub fn packed(indices: &'a [u64]) -> Self {
        Request { indices, slots: Slots::Packed, next: &[], cycle_end: None, fan_out: true }
    }

    /// Ragged records between `offsets` ([`Slots::Offsets`]).
    pub fn ragged(indices: &'a [u64], offsets: &'a [u64]) -> Self {
        Request { indices, slots: Slots::Offsets(offsets), next: &[], cycle_end: None, fan_out: true }
    }

    /// Records at `starts` ([`Slots::At`]).
    pub fn at(indices: &'a [u64], starts: &'a [u64]) -> Self {
        Request { indices, slots: Slots::At(starts), next: &[], cycle_end: None, fan_out: true }
    }

    /// The same request with next-use hints ([`Request::next`]); an empty
    /// slice gives none.
    pub fn hints(self, next: &'a [Option<u64>]) -> Self {
        Request { next, ..self }
    }

    /// The same request with the next cycle's first step ([`Request::cycle_end`]).
    pub fn cycle_end(self, end: Option<u64>) -> Self {
        Request { cycle_end: end, ..self }
    }

    /// The same request with fan-out on or off ([`Request::fan_out`]).
    pub fn fan_out(self, on: bool) -> Self {
        Request { fan_out: on, ..self }
    }

    /// `dst` cut into this request's slots, slot `k` for `indices[k]`: the
    /// whole `record_bytes` of a fixed slot (the source pads), exactly the
    /// record of a ragged one (for [`Slots::At`], the lengths `source`
    /// reports). Errors when the slots do not fit the request or `dst`, or
    /// overlap.
    pub fn slots<'d, S: Source + ?Sized>(
        &self,
        source: &S,
        dst: &'d mut [u8],
    ) -> Result<Vec<&'d mut [u8]>, SourceError> {
        let n = self.indices.len();
        let mut spans: Vec<(u64, u64, usize)> = Vec::with_capacity(n);
        match (self.slots, source.layout()) {
            (Slots::Packed, Layout::Fixed { record_bytes }) => {
                if Some(dst.len()) != n.checked_mul(record_bytes) {
                    return Err(format!("gather: {} bytes for {n} records of {record_bytes}", dst.len()).into());
                }
                let w = record_bytes as u64;
                spans.extend((0..n).map(|k| (k as u64 * w, w, k)));
            }
            (Slots::Packed, Layout::Ragged) => return Err("gather: packed slots for a ragged source".into()),
            (Slots::Offsets(o), _) => {
                if o.len() != n + 1 || o[0] != 0 || o[n] != dst.len() as u64 {
                    return Err(format!("gather: {} offsets for {n} records in {} bytes", o.len(), dst.len()).into());
                }
                spans.extend((0..n).map(|k| (o[k], o[k + 1].saturating_sub(o[k]), k)));
            }
            (Slots::At(starts), layout) => {
                if starts.len() != n {
                    return Err(format!("gather: {} starts for {n} records", starts.len()).into());
                }
                let mut lens = vec![0u64; n];
                match layout {
                    Layout::Fixed { record_bytes } => lens.fill(record_bytes as u64),
                    Layout::Ragged => source.lengths(self.indices, &mut lens)?,
                }
                spans.extend(starts.iter().zip(&lens).enumerate().map(|(k, (&s, &l))| (s, l, k)));
            }
        }
        spans.sort_unstable_by_key(|&(start, len, _)| (start, len));
        let mut slots: Vec<Option<&'d mut [u8]>> = (0..n).map(|_| None).collect();
        let mut rest: &'d mut [u8] = dst;
        let mut pos = 0u64;
        for (start, len, k) in spans {
            let fits = start >= pos && start.checked_add(len).is_some_and(|end| end - pos <= rest.len() as u64);
            if !fits {
                return Err(format!(
                    "gather: a slot at {start} of {len} bytes overlaps another or lies outside the buffer"
                )
                .into());
            }
            // Lossless: inside `rest`, a slice.
            let (_, tail) = std::mem::take(&mut rest).split_at_mut((start - pos) as usize);
            let (slot, tail) = tail.split_at_mut(len as usize);
            rest = tail;
            pos = start + len;
            slots[k] = Some(slot);
        }
        Ok(slots.into_iter().map(|s| s.expect("one slot per record")).collect())
    }
}
