//! The adapter that lets a loader gather from a `zring_engine::Store`.

use std::ops::Range;
use std::sync::Arc;

use zring_engine::{self as engine, Codec, Fingerprint, NextUse, Store, View};

use crate::source::{Layout, Request, Slots, Source, SourceError, Span};
use crate::Blocks;

/// A [`Store`] seen as a [`Source`].
///
/// A store does not know how its records should be laid out in a batch, so
/// the adapter carries the [`Layout`]: [`Layout::Fixed`] gathers every record
/// into a slot of `record_bytes` (a shorter record is zero-padded, a longer
/// one is an error from the store), [`Layout::Ragged`] gathers each record at
/// its own length. Store errors pass through boxed but unchanged, so a caller
/// can downcast a [`Error::Gather`](crate::Error::Gather) source back to
/// `zring_engine::Error`.
///
/// Each loader step reads one snapshot of the store ([`Source::view`]):
/// the lengths a ragged column is sized by and the records gathered into it
/// are the same records, whatever a writer appends, deletes or compacts
/// meanwhile. Its [fingerprint](Source::fingerprint) is the store's, so a
/// saved state can tell the same records from others, and from more
/// records appended after them ([`Source::extends`]).
///
/// It [wants hints](Source::wants_hints) while the store reads with O_DIRECT
/// behind its record cache (its read policy is "direct" and was not forced):
/// then its gathers pass each record's next use ([`Request::next`]) to the store
/// (`Some(step)` as `NextUse::At(step)`; `None` as `NextUse::At(u64::MAX)`,
/// later than every step known but still this loader's, so a cached record
/// read again without a known next use gives up the rank of the step just
/// read, and is kept behind the records known to come sooner and ahead of
/// those nobody said anything about), and the cache keeps the records needed
/// soonest. In cyclic mode ([`Request::cycle_end`]), a next use past the
/// steps of the next cycle the cache can serve, and an unknown one, go as
/// `NextUse::Never`, which the cache does not copy in.
/// Buffered stores read through the
/// page cache, which takes no hints. The steps are this loader's: the store
/// compares the hints of all its readers, so one store should have one
/// loader passing hints at a time.
#[derive(Clone)]
pub struct StoreSource {
    /// The store gathered from; shared, as every worker reads it.
    pub store: Arc<Store>,
    /// How records are laid out in a batch.
    pub layout: Layout,
}

impl std::fmt::Debug for StoreSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSource")
            .field("path", &self.store.path())
            .field("len", &self.store.len())
            .field("layout", &self.layout)
            .finish()
    }
}

impl StoreSource {
    /// Records gathered into slots of `record_bytes` each.
    pub fn fixed(store: Arc<Store>, record_bytes: usize) -> Self {
        StoreSource { store, layout: Layout::Fixed { record_bytes } }
    }

    /// Records gathered at their own lengths, with offsets.
    pub fn ragged(store: Arc<Store>) -> Self {
        StoreSource { store, layout: Layout::Ragged }
    }
}

impl StoreSource {
    /// The store as it is now ([`Store::view`]).
    fn now(&self) -> StoreView {
        StoreView { view: self.store.view(), layout: self.layout, store: Arc::clone(&self.store) }
    }
}

impl Source for StoreSource {
    fn len(&self) -> u64 {
        self.store.len()
    }

    fn layout(&self) -> Layout {
        self.layout
    }

    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        self.now().gather(req, dst)
    }

    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), SourceError> {
        self.now().lengths(indices, out)
    }

    fn gather_spans(&self, spans: &[Span], dst: &mut [u8], fan_out: bool) -> Result<(), SourceError> {
        self.now().gather_spans(spans, dst, fan_out)
    }

    fn reads_in_part(&self, indices: &[u64], out: &mut [bool]) -> Result<(), SourceError> {
        self.now().reads_in_part(indices, out)
    }

    fn fingerprint(&self) -> Result<Option<Fingerprint>, SourceError> {
        Ok(Some(self.store.fingerprint()?))
    }

    fn extends(&self, earlier: Fingerprint) -> Result<bool, SourceError> {
        Ok(self.store.extends(earlier)?)
    }

    fn view(&self) -> Result<Option<Box<dyn Source>>, SourceError> {
        Ok(Some(Box::new(self.now())))
    }

    fn wants_hints(&self) -> bool {
        self.store.wants_hints()
    }

    fn block_shape(&self) -> Option<Blocks> {
        Some(block_shape(&self.store, self.layout))
    }

    fn prefetch(&self, blocks: &[Range<u64>], next: &[Option<u64>]) -> Result<(), SourceError> {
        Ok(self.store.view().prefetch(blocks, &next_uses(next))?)
    }
}

/// One snapshot of a [`StoreSource`]'s store: what [`Source::view`] hands
/// the loader for one step.
struct StoreView {
    view: View,
    layout: Layout,
    /// The store, for its record cache's size ([`StoreView::horizon`]).
    store: Arc<Store>,
}

impl StoreView {
    /// The first step whose records the record cache could no longer hold
    /// from gathers like this one of `indices` before the cycle ending at
    /// `cycle_end` ([`Request::cycle_end`]).
    ///
    /// In cyclic mode each record comes once a cycle, so every record read
    /// now is needed next in the next cycle, and a cache of `c` records can
    /// serve at most the next cycle's first `c / per_step` steps (no policy
    /// does better: a hit needs its record kept across the cycle's end).
    /// Keeping the records needed soonest, the cache ends the cycle holding
    /// exactly those; a record needed later, copied in while there is room,
    /// is only evicted again before its use. Marked as not needed, it is not
    /// copied at all: in a loader reading a store several times its cache,
    /// most of what filling the cache cost.
    ///
    /// The cache's records are counted at the mean length of this gather's
    /// records (their logical length: a compressed record is kept in fewer
    /// bytes, so the count errs low, keeping fewer than the cache could).
    fn horizon(&self, cycle_end: u64, indices: &[u64]) -> Result<u64, SourceError> {
        let capacity = self.store.read_stats().cache_capacity;
        let mut lengths = vec![0u64; indices.len()];
        self.view.lengths(indices, &mut lengths)?;
        let mean = (lengths.iter().sum::<u64>() / indices.len().max(1) as u64).max(1);
        // Rounded up: a step too many only copies in records the cache
        // then evicts for nearer ones; a step too few loses its hits.
        let reach = (capacity / mean).div_ceil(indices.len().max(1) as u64);
        Ok(cycle_end.saturating_add(reach))
    }
}

impl Source for StoreView {
    fn len(&self) -> u64 {
        self.view.len()
    }

    fn layout(&self) -> Layout {
        self.layout
    }

    /// The store reads into arbitrary slots itself (its ragged gather takes
    /// one start per record, its fixed one pads): no scratch copy.
    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        let n = req.indices.len();
        let slots = match (req.slots, self.layout) {
            (Slots::Packed, Layout::Fixed { record_bytes }) => engine::Slots::Fixed(record_bytes),
            (Slots::Packed, Layout::Ragged) => return Err("gather: packed slots for a ragged StoreSource".into()),
            // The loader passes `len + 1` boundaries; the store takes one
            // start per record and reads each record's length itself.
            (Slots::Offsets(offsets), _) => {
                engine::Slots::Ragged(offsets.get(..n).ok_or("gather: fewer offsets than records")?)
            }
            (Slots::At(starts), Layout::Fixed { record_bytes }) => {
                engine::Slots::FixedAt { width: record_bytes, starts }
            }
            (Slots::At(starts), Layout::Ragged) => engine::Slots::Ragged(starts),
        };
        let next = match req.cycle_end.filter(|_| !req.next.is_empty()) {
            Some(end) => next_uses_before(req.next, self.horizon(end, req.indices)?),
            None => next_uses(req.next),
        };
        let gather = engine::Gather { indices: req.indices, slots, next: &next, fan_out: req.fan_out };
        Ok(self.view.gather(&gather, dst)?)
    }

    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), SourceError> {
        Ok(self.view.lengths(indices, out)?)
    }

    /// The store reads a short span of a raw record alone, unchecked, and
    /// a long one or any span of a compressed record by reading the record
    /// whole ([`engine::Spans`]).
    fn gather_spans(&self, spans: &[Span], dst: &mut [u8], fan_out: bool) -> Result<(), SourceError> {
        Ok(self.view.read_spans(&engine::Spans::new(spans).fan_out(fan_out), dst)?)
    }

    fn reads_in_part(&self, indices: &[u64], out: &mut [bool]) -> Result<(), SourceError> {
        let mut codecs = vec![Codec::Raw; indices.len()];
        self.view.codecs(indices, &mut codecs)?;
        for (o, c) in out.iter_mut().zip(codecs) {
            *o = c == Codec::Raw;
        }
        Ok(())
    }

    fn fingerprint(&self) -> Result<Option<Fingerprint>, SourceError> {
        Ok(Some(self.view.fingerprint()?))
    }
}

/// The smallest block that is one large read: [`BLOCK_BYTES`].
const BLOCK_BYTES: u64 = 1 << 20;

/// Mode 3's shape for `store`: blocks of at least [`BLOCK_BYTES`] of stored
/// records (a read that large runs at the disk's streaming rate,
/// bench-results/engine-notes.md), and windows of a quarter of the memory that holds them (the
/// record cache of an O_DIRECT store, the budget of a buffered one), so the
/// window gathered from and the one loading fit with room to spare.
pub(crate) fn block_shape(store: &Store, layout: Layout) -> Blocks {
    let records = store.len().max(1);
    let record_bytes = match layout {
        Layout::Fixed { record_bytes } => record_bytes as u64,
        Layout::Ragged => store.stats().map_or(4096, |s| s.live_bytes / records),
    }
    .max(1);
    let block_records = BLOCK_BYTES.div_ceil(record_bytes);
    let r = store.read_stats();
    let memory = if r.cache_capacity > 0 { r.cache_capacity } else { r.budget_bytes };
    let window_blocks = (memory / 4 / (block_records * record_bytes)).max(1);
    Blocks { block_records, window_blocks, shards: 1 }
}

/// [`next_uses`], with every step at or past `horizon` (and every record
/// without a known next use) as [`NextUse::Never`]: not to be kept
/// ([`StoreView::horizon`]).
fn next_uses_before(next: &[Option<u64>], horizon: u64) -> Vec<NextUse> {
    next.iter()
        .map(|n| match n {
            Some(s) if *s < horizon => NextUse::At(*s),
            _ => NextUse::Never,
        })
        .collect()
}

/// The loader's hints in the store's terms: a later step, or later than any
/// step known.
pub(crate) fn next_uses(next: &[Option<u64>]) -> Vec<NextUse> {
    next.iter().map(|n| NextUse::At(n.unwrap_or(u64::MAX))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Error, Loader, LoaderConfig, Mode, Stream};

    fn record(i: usize) -> Vec<u8> {
        (0..(i % 9) + 1).map(|j| (i * 7 + j) as u8).collect()
    }

    fn store(n: usize) -> (tempfile::TempDir, Arc<Store>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::builder(dir.path()).create().unwrap();
        let records: Vec<Vec<u8>> = (0..n).map(record).collect();
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        store.append(&refs, None).unwrap();
        store.sync().unwrap();
        (dir, Arc::new(store))
    }

    #[test]
    fn hints_past_the_horizon_say_never() {
        let next = [Some(3), Some(9), Some(10), None, Some(u64::MAX)];
        assert_eq!(
            next_uses_before(&next, 10),
            vec![NextUse::At(3), NextUse::At(9), NextUse::Never, NextUse::Never, NextUse::Never]
        );
        assert_eq!(next_uses(&next)[3], NextUse::At(u64::MAX), "without a horizon, unknown stays this loader's");
    }

    #[test]
    fn a_loader_over_a_store_delivers_its_records() {
        let (_dir, store) = store(200);
        let streams = vec![
            Stream::new("fixed", Arc::new(StoreSource::fixed(Arc::clone(&store), 9))),
            Stream::new("ragged", Arc::new(StoreSource::ragged(Arc::clone(&store)))),
        ];
        let cfg = LoaderConfig { mode: Mode::Iid, seed: 3, ..LoaderConfig::new(32) };
        let mut loader = Loader::new(streams, cfg).unwrap();
        for _ in 0..20 {
            let b = loader.next().unwrap();
            for (k, &i) in b.indices.iter().enumerate() {
                let want = record(i as usize);
                assert_eq!(b.record("ragged", k).unwrap(), &want[..]);
                // Fixed slots are zero-padded past the record.
                let slot = b.record("fixed", k).unwrap();
                assert_eq!(&slot[..want.len()], &want[..]);
                assert!(slot[want.len()..].iter().all(|&x| x == 0));
            }
        }
    }

    #[test]
    fn store_errors_arrive_as_gather_errors_that_downcast() {
        let (_dir, store) = store(50);
        // Records are up to 9 bytes; slots of 4 are too small for most.
        let streams = vec![Stream::new("x", Arc::new(StoreSource::fixed(store, 4)) as Arc<dyn Source>)];
        let mut loader = Loader::new(streams, LoaderConfig::new(10)).unwrap();
        match loader.next().unwrap_err() {
            Error::Gather { step: 0, stream, source } => {
                assert_eq!(stream, "x");
                assert!(source.downcast_ref::<zring_engine::Error>().is_some(), "{source}");
            }
            other => panic!("expected Gather, got {other:?}"),
        }
    }

    /// A mixture's rows are interleaved, so each source puts its records
    /// straight into their rows' slots: the same bytes as a gather, padding
    /// included, in a buffer whose other bytes were dirty (a pool's).
    #[test]
    fn gathers_at_slots_match_gathers_and_pad_fixed_slots() {
        let (_dir, store) = store(60);
        let indices = [5u64, 17, 0, 33, 8];
        let rows = [4usize, 0, 7, 2, 5];
        let fixed = StoreSource::fixed(Arc::clone(&store), 9);
        let mut dst = vec![0xAA; 8 * 9];
        let starts: Vec<u64> = rows.iter().map(|&r| (r * 9) as u64).collect();
        fixed.gather(&Request::at(&indices, &starts), &mut dst).unwrap();
        for (&i, &r) in indices.iter().zip(&rows) {
            let want = record(i as usize);
            assert_eq!(&dst[r * 9..][..want.len()], &want[..]);
            assert!(dst[r * 9 + want.len()..(r + 1) * 9].iter().all(|&x| x == 0), "row {r} padded");
        }
        assert!(dst[9..18].iter().all(|&x| x == 0xAA), "rows not asked for are left alone");
        let small = StoreSource::fixed(Arc::clone(&store), 4);
        let err = small.gather(&Request::at(&[8], &[0]), &mut [0; 8]).unwrap_err();
        assert!(matches!(err.downcast_ref::<zring_engine::Error>(), Some(zring_engine::Error::RecordSize { .. })));
        assert!(fixed.gather(&Request::at(&[1], &[0]), &mut [0; 8]).is_err(), "a slot past the buffer");

        let ragged = StoreSource::ragged(Arc::clone(&store));
        let lens: Vec<usize> = indices.iter().map(|&i| record(i as usize).len()).collect();
        // Slots in row order: row r's record starts after the records of lower rows.
        let mut by_row: Vec<(usize, usize)> = rows.iter().copied().zip(0..).collect();
        by_row.sort_unstable();
        let mut starts = vec![0u64; indices.len()];
        let mut at = 0;
        for &(_, k) in &by_row {
            starts[k] = at;
            at += lens[k] as u64;
        }
        let mut dst = vec![0xAA; at as usize];
        ragged.gather(&Request::at(&indices, &starts), &mut dst).unwrap();
        for (k, &i) in indices.iter().enumerate() {
            assert_eq!(&dst[starts[k] as usize..][..lens[k]], &record(i as usize)[..]);
        }
    }
}
