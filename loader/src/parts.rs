//! The adapter that lets a loader gather from a dataset of parts
//! (`zring_engine::Parts`): many stores read as one index space.

use std::ops::Range;
use std::sync::Arc;

use zring_engine::parts::OpenPart;
use zring_engine::{self as engine, Codec, Fingerprint, Parts, Store};

use crate::source::{Layout, Request, Slots, Source, SourceError, Span};
use crate::store::{block_shape, next_uses};
use crate::Blocks;
use zring_engine::NextUse;

/// A dataset of parts seen as one [`Source`].
///
/// A gather is one engine call over the dataset (`Parts::gather`): its
/// indices are located and checked in one pass, the records in memory are
/// copied straight from their parts' mappings into the caller's slots (no
/// scratch copy, no reordering after), and the rest of all parts touched
/// are read in one batch. A hot random batch over many more parts than rows
/// reads each record's entry and its part's mapping from two arrays of the
/// dataset, about as one store reads it (bench `benches/parts.py`). Other calls
/// (lengths, spans, prefetch) split their indices by part (O(log parts)
/// each) and make one engine call per part touched.
///
/// The parts are committed stores, which nobody writes to, so the source
/// needs no per-step view ([`Source::view`] stays `None`). Its
/// [fingerprint](Source::fingerprint) is the dataset's
/// (`Parts::fingerprint`), and a dataset grown by an append commit
/// [extends](Source::extends) the one a state was saved over, so the
/// loader's resume over a grown source applies: the saved cycle finishes
/// over the old parts, the new ones join from the next cycle.
///
/// Its gathers pass the loader's hints to the parts read through their
/// record caches as a [`StoreSource`](crate::StoreSource) does; in cyclic
/// mode ([`Request::cycle_end`]) a next use past the steps of the next cycle
/// its part's cache can serve goes as `NextUse::Never`, which that cache
/// does not copy in.
#[derive(Clone)]
pub struct PartsSource {
    /// The dataset gathered from; shared, as every worker reads it.
    pub parts: Arc<Parts>,
    /// How records are laid out in a batch.
    pub layout: Layout,
}

impl std::fmt::Debug for PartsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartsSource").field("parts", &self.parts).field("layout", &self.layout).finish()
    }
}

/// The positions of a call's indices grouped by part: `order` lists the
/// positions part by part (in index order within a part), `groups` each
/// part with its range of `order`, `local` the index within the part of
/// each position.
struct Split {
    order: Vec<usize>,
    groups: Vec<(usize, Range<usize>)>,
    local: Vec<u64>,
}

impl PartsSource {
    /// Records gathered into slots of `record_bytes` each.
    pub fn fixed(parts: Arc<Parts>, record_bytes: usize) -> Self {
        PartsSource { parts, layout: Layout::Fixed { record_bytes } }
    }

    /// Records gathered at their own lengths, with offsets.
    pub fn ragged(parts: Arc<Parts>) -> Self {
        PartsSource { parts, layout: Layout::Ragged }
    }

    /// `indices` grouped by part.
    fn split(&self, indices: &[u64]) -> Result<Split, SourceError> {
        let mut part = Vec::with_capacity(indices.len());
        let mut local = Vec::with_capacity(indices.len());
        for &i in indices {
            let (k, l) = self.parts.locate(i)?;
            part.push(k);
            local.push(l);
        }
        let mut order: Vec<usize> = (0..indices.len()).collect();
        // Stable: positions of one part stay in request order.
        order.sort_by_key(|&p| part[p]);
        let mut groups = Vec::new();
        let mut s = 0;
        while s < order.len() {
            let k = part[order[s]];
            let mut e = s + 1;
            while e < order.len() && part[order[e]] == k {
                e += 1;
            }
            groups.push((k, s..e));
            s = e;
        }
        Ok(Split { order, groups, local })
    }

    /// Part `k`. Taken for one part's call at a time and dropped after
    /// it: a call over hundreds of parts holds no more descriptors than one
    /// part's, whatever the dataset's open set keeps.
    fn part(&self, k: usize) -> Result<Arc<OpenPart>, SourceError> {
        Ok(self.parts.part(k)?)
    }

    /// The start of each record's slot in `dst`, checked as far as the
    /// request alone allows.
    fn starts(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<Vec<u64>, SourceError> {
        let n = req.indices.len();
        match (req.slots, self.layout) {
            (Slots::Packed, Layout::Fixed { record_bytes }) => {
                if Some(dst.len()) != n.checked_mul(record_bytes) {
                    return Err(format!("gather: {} bytes for {n} records of {record_bytes}", dst.len()).into());
                }
                Ok((0..n as u64).map(|k| k * record_bytes as u64).collect())
            }
            (Slots::Packed, Layout::Ragged) => Err("gather: packed slots for a ragged PartsSource".into()),
            (Slots::Offsets(o), _) => {
                if o.len() != n + 1 || o[0] != 0 || o[n] != dst.len() as u64 || o.windows(2).any(|w| w[0] > w[1]) {
                    return Err(format!("gather: {} offsets for {n} records in {} bytes", o.len(), dst.len()).into());
                }
                Ok(o[..n].to_vec())
            }
            (Slots::At(starts), _) => {
                // Checks that the slots fit `dst` and do not overlap.
                req.slots(self, dst)?;
                Ok(starts.to_vec())
            }
        }
    }

    /// The hints of `req` in cyclic mode ([`Request::cycle_end`]), as a
    /// single store's adapter passes them (`StoreSource`): a next use at or
    /// past the horizon of the record's part, or an unknown one, as
    /// `NextUse::Never`, which that part's record cache does not copy in.
    ///
    /// Each part has a record cache of its own, so each has its own horizon:
    /// the steps of the next cycle its cache can serve. In a cycle part `k`
    /// gives each step about `n × records(k) / len` of its `n` records, so a
    /// cache of `c` bytes holds the part's records of the next cycle's first
    /// `c × len / (mean × n × records(k))` steps (`mean`: the mean length of
    /// this gather's records), rounded up as a store's is.
    fn next_uses_before(&self, req: &Request<'_>, cycle_end: u64) -> Result<Vec<NextUse>, SourceError> {
        let n = req.indices.len();
        let mut lengths = vec![0u64; n];
        self.lengths(req.indices, &mut lengths)?;
        let mean = (lengths.iter().sum::<u64>() / n.max(1) as u64).max(1);
        let len = self.parts.len();
        // (part, its horizon), for the parts touched so far.
        let mut horizons: std::collections::HashMap<usize, u64> = std::collections::HashMap::new();
        let mut out = Vec::with_capacity(n);
        for (&i, next) in req.indices.iter().zip(req.next) {
            let (k, _) = self.parts.locate(i)?;
            let horizon = match horizons.get(&k) {
                Some(&h) => h,
                None => {
                    let capacity = self.parts.with_part(k, |p| p.store.read_stats().cache_capacity)?;
                    let per_step = u128::from(mean) * n as u128 * u128::from(self.parts.part_records(k).max(1));
                    let reach = (u128::from(capacity) * u128::from(len)).div_ceil(per_step.max(1));
                    let h = cycle_end.saturating_add(u64::try_from(reach).unwrap_or(u64::MAX));
                    horizons.insert(k, h);
                    h
                }
            };
            out.push(match next {
                Some(s) if *s < horizon => NextUse::At(*s),
                _ => NextUse::Never,
            });
        }
        Ok(out)
    }

    /// The store of an open part, which stands for all in what a store
    /// says of its reads (policy, shape); no part is opened to ask.
    fn first(&self) -> Option<Arc<Store>> {
        self.parts.any_part().ok().flatten().map(|p| Arc::clone(&p.store))
    }
}

impl Source for PartsSource {
    fn len(&self) -> u64 {
        self.parts.len()
    }

    fn layout(&self) -> Layout {
        self.layout
    }

    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        let starts = self.starts(req, dst)?;
        let next = match req.cycle_end.filter(|_| !req.next.is_empty()) {
            Some(end) => self.next_uses_before(req, end)?,
            None => next_uses(req.next),
        };
        let slots = match self.layout {
            Layout::Fixed { record_bytes } => engine::Slots::FixedAt { width: record_bytes, starts: &starts },
            Layout::Ragged => engine::Slots::Ragged(&starts),
        };
        let g = engine::Gather { indices: req.indices, slots, next: &next, fan_out: req.fan_out };
        Ok(self.parts.gather(&g, dst)?)
    }

    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), SourceError> {
        if out.len() != indices.len() {
            return Err(format!("lengths: {} outputs for {} records", out.len(), indices.len()).into());
        }
        let split = self.split(indices)?;
        let (mut idx, mut lens) = (Vec::new(), Vec::new());
        for (k, range) in &split.groups {
            idx.clear();
            idx.extend(split.order[range.clone()].iter().map(|&p| split.local[p]));
            lens.resize(idx.len(), 0);
            self.parts.with_part(*k, |p| p.view.lengths(&idx, &mut lens))??;
            for (&p, &l) in split.order[range.clone()].iter().zip(&lens) {
                out[p] = l;
            }
        }
        Ok(())
    }

    fn fingerprint(&self) -> Result<Option<Fingerprint>, SourceError> {
        Ok(Some(self.parts.fingerprint()))
    }

    fn extends(&self, earlier: Fingerprint) -> Result<bool, SourceError> {
        Ok(self.parts.extends(earlier))
    }

    fn wants_hints(&self) -> bool {
        self.first().is_some_and(|s| s.wants_hints())
    }

    fn block_shape(&self) -> Option<Blocks> {
        self.first().map(|s| block_shape(&s, self.layout))
    }

    fn gather_spans(&self, spans: &[Span], dst: &mut [u8], fan_out: bool) -> Result<(), SourceError> {
        let indices: Vec<u64> = spans.iter().map(|s| s.index).collect();
        let _pinned = self.parts.fill_indices(&indices)?;
        let split = self.split(&indices)?;
        let mut local = Vec::new();
        for (k, range) in &split.groups {
            let part = self.part(*k)?;
            local.clear();
            local.extend(split.order[range.clone()].iter().map(|&p| Span { index: split.local[p], ..spans[p] }));
            part.view.read_spans(&engine::Spans::new(&local).fan_out(fan_out), dst)?;
        }
        Ok(())
    }

    fn reads_in_part(&self, indices: &[u64], out: &mut [bool]) -> Result<(), SourceError> {
        let split = self.split(indices)?;
        let (mut idx, mut codecs) = (Vec::new(), Vec::new());
        for (k, range) in &split.groups {
            let part = self.part(*k)?;
            idx.clear();
            idx.extend(split.order[range.clone()].iter().map(|&p| split.local[p]));
            codecs.clear();
            codecs.resize(idx.len(), Codec::Raw);
            part.view.codecs(&idx, &mut codecs)?;
            for (&p, &c) in split.order[range.clone()].iter().zip(&codecs) {
                out[p] = c == Codec::Raw;
            }
        }
        Ok(())
    }

    /// Each range is cut at the parts' edges and each part prefetches its
    /// own pieces, with their hints.
    fn plan(&self, windows: &[Vec<Range<u64>>]) -> Result<(), SourceError> {
        Ok(self.parts.plan(windows)?)
    }

    fn wants_plan(&self) -> bool {
        self.parts.has_fill()
    }

    fn prefetch(&self, blocks: &[Range<u64>], next: &[Option<u64>]) -> Result<(), SourceError> {
        // A cache of object storage: the window's bytes fetched (and kept
        // while its blocks are read ahead; its gathers pin them again).
        let _pinned = self.parts.fill_ranges(blocks)?;
        let hints = next_uses(next);
        // (part, local ranges, their hints), in order of first appearance.
        let mut per: Vec<(usize, Vec<Range<u64>>, Vec<engine::NextUse>)> = Vec::new();
        let mut at = 0usize;
        for r in blocks {
            let mut i = r.start;
            while i < r.end {
                let (k, l) = self.parts.locate(i)?;
                let end = (self.parts.start(k) + self.parts.part_records(k)).min(r.end);
                let n = (end - i) as usize;
                let slot = match per.iter().position(|e| e.0 == k) {
                    Some(s) => s,
                    None => {
                        per.push((k, Vec::new(), Vec::new()));
                        per.len() - 1
                    }
                };
                per[slot].1.push(l..l + (end - i));
                if !hints.is_empty() {
                    per[slot].2.extend_from_slice(&hints[at..at + n]);
                }
                at += n;
                i = end;
            }
        }
        for (k, ranges, hints) in &per {
            self.part(*k)?.view.prefetch(ranges, hints)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Loader, LoaderConfig, Mode, Stream};
    use zring_engine::parts::commit_manifest;
    use zring_engine::PartEntry;

    fn record(i: u64) -> Vec<u8> {
        (0..(i % 9) + 1).map(|j| (i * 7 + j) as u8).collect()
    }

    /// Writes part `p{k}` under `root`: records `first..first + n`, each
    /// `record(i)`; its manifest entry.
    fn write_part(root: &std::path::Path, k: usize, first: u64, n: u64) -> PartEntry {
        let name = format!("p{k}");
        let s = Store::builder(root.join(&name)).create().unwrap();
        let recs: Vec<Vec<u8>> = (first..first + n).map(record).collect();
        let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
        s.append(&refs, None).unwrap();
        s.sync().unwrap();
        PartEntry::new(name, s.fingerprint().unwrap())
    }

    /// A dataset of parts of `sizes` records, record `i` of the whole
    /// being `record(i)`.
    fn dataset(sizes: &[u64]) -> (tempfile::TempDir, Arc<Parts>) {
        let dir = tempfile::tempdir().unwrap();
        let mut entries = Vec::new();
        let mut i = 0;
        for (k, &n) in sizes.iter().enumerate() {
            entries.push(write_part(dir.path(), k, i, n));
            i += n;
        }
        commit_manifest(dir.path(), serde_json::Value::Null, entries, false).unwrap();
        let parts = Arc::new(Parts::open_with_capacity(dir.path(), 2).unwrap());
        (dir, parts)
    }

    #[test]
    fn gathers_over_parts_put_each_record_in_its_slot() {
        let (_d, parts) = dataset(&[5, 1, 7, 3]);
        let indices = [15u64, 0, 5, 9, 4, 6, 15, 13];
        let ragged = PartsSource::ragged(Arc::clone(&parts));
        let mut lens = vec![0; indices.len()];
        ragged.lengths(&indices, &mut lens).unwrap();
        assert_eq!(lens, indices.iter().map(|&i| record(i).len() as u64).collect::<Vec<_>>());
        let mut offsets = vec![0u64];
        for l in &lens {
            offsets.push(offsets.last().unwrap() + l);
        }
        let mut dst = vec![0u8; *offsets.last().unwrap() as usize];
        ragged.gather(&Request::ragged(&indices, &offsets), &mut dst).unwrap();
        for (k, &i) in indices.iter().enumerate() {
            assert_eq!(&dst[offsets[k] as usize..offsets[k + 1] as usize], &record(i)[..], "row {k}");
        }
        let fixed = PartsSource::fixed(Arc::clone(&parts), 9);
        let mut dst = vec![0xAAu8; indices.len() * 9];
        fixed.gather(&Request::packed(&indices), &mut dst).unwrap();
        for (k, &i) in indices.iter().enumerate() {
            let want = record(i);
            assert_eq!(&dst[k * 9..][..want.len()], &want[..]);
            assert!(dst[k * 9 + want.len()..(k + 1) * 9].iter().all(|&b| b == 0));
        }
        // Spans of records in several parts.
        let spans = [
            Span { index: 14, from: 1, len: 2, at: 0 },
            Span { index: 2, from: 0, len: 3, at: 2 },
            Span { index: 5, from: 0, len: 1, at: 5 },
        ];
        let mut dst = vec![0u8; 6];
        ragged.gather_spans(&spans, &mut dst, false).unwrap();
        assert_eq!(&dst[..2], &record(14)[1..3]);
        assert_eq!(&dst[2..5], &record(2)[..3]);
        assert_eq!(&dst[5..], &record(5)[..1]);
        assert!(ragged.gather(&Request::packed(&[16]), &mut []).is_err());
        let err = fixed.gather(&Request::packed(&[16]), &mut [0; 9]).unwrap_err();
        assert!(err.to_string().contains("16"), "{err}");
    }

    #[test]
    fn a_loader_over_parts_delivers_every_record_once_per_cycle() {
        let (_d, parts) = dataset(&[40, 3, 1, 60, 16]);
        let streams = vec![Stream::new("x", Arc::new(PartsSource::ragged(parts)) as Arc<dyn Source>)];
        let cfg = LoaderConfig { mode: Mode::Cyclic, seed: 5, ..LoaderConfig::new(24) };
        let mut loader = Loader::new(streams, cfg).unwrap();
        let mut seen = Vec::new();
        for _ in 0..5 {
            let b = loader.next().unwrap();
            for (k, &i) in b.indices.iter().enumerate() {
                assert_eq!(b.record("x", k).unwrap(), &record(i)[..]);
                seen.push(i);
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..120).collect::<Vec<_>>());
    }

    /// Writes parts `from..` of `sizes` (record `i` of the whole being
    /// `record(i)`) and appends them to the dataset at `root` in one commit.
    fn commit_more(root: &std::path::Path, sizes: &[u64], from: usize) {
        let m = zring_engine::parts::read_manifest(root).unwrap();
        let mut entries = m.parts.clone();
        let mut i: u64 = m.records();
        for (k, &n) in sizes.iter().enumerate().skip(from) {
            entries.push(write_part(root, k, i, n));
            i += n;
        }
        commit_manifest(root, serde_json::Value::Null, entries, false).unwrap();
    }

    #[test]
    fn a_state_over_one_manifest_resumes_over_appended_parts() {
        let (dir, parts) = dataset(&[30, 18, 12]);
        let source = |p: Arc<Parts>| vec![Stream::new("x", Arc::new(PartsSource::ragged(p)) as Arc<dyn Source>)];
        let cfg = LoaderConfig { mode: Mode::Cyclic, seed: 9, ..LoaderConfig::new(12) };
        let mut whole = Loader::new(source(parts), cfg).unwrap();
        let step = |l: &mut Loader| {
            let b = l.next().unwrap();
            for (k, &i) in b.indices.iter().enumerate() {
                assert_eq!(b.record("x", k).unwrap(), &record(i)[..]);
            }
            b.indices.to_vec()
        };
        step(&mut whole);
        step(&mut whole);
        let state = whole.state();
        let uninterrupted: Vec<Vec<u64>> = (2..5).map(|_| step(&mut whole)).collect();
        drop(whole);
        // Ten parts appended: 60 records become 60 + 10 * 6.
        commit_more(dir.path(), &[30, 18, 12, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6], 3);
        let grown = Arc::new(Parts::open(dir.path()).unwrap());
        assert_eq!(grown.len(), 120);
        let mut resumed = Loader::new(source(grown), LoaderConfig::from_state(&state)).unwrap();
        let before: Vec<Vec<u64>> = (2..5).map(|_| step(&mut resumed)).collect();
        assert_eq!(before, uninterrupted, "the saved cycle ends as it would have");
        let mut next: Vec<u64> = (0..10).flat_map(|_| step(&mut resumed)).collect();
        next.sort_unstable();
        assert_eq!(next, (0..120).collect::<Vec<_>>(), "the next cycle holds every record once");

        // An overwrite that drops the first part: the state does not resume.
        let m = zring_engine::parts::read_manifest(dir.path()).unwrap();
        commit_manifest(dir.path(), serde_json::Value::Null, m.parts[1..].to_vec(), true).unwrap();
        let dropped = Arc::new(Parts::open(dir.path()).unwrap());
        let err = Loader::new(source(dropped), LoaderConfig::from_state(&state)).unwrap_err();
        assert!(matches!(&err, crate::Error::StreamChanged { stream, .. } if stream == "x"), "{err:?}");
    }

    #[test]
    fn mode_3_prefetches_ranges_across_part_edges() {
        let (_d, parts) = dataset(&[10, 10, 10]);
        let src = PartsSource::ragged(parts);
        src.prefetch(&[5..25, 28..30], &[]).unwrap();
        let next: Vec<Option<u64>> = (0..22).map(Some).collect();
        src.prefetch(&[5..25, 28..30], &next).unwrap();
        let streams = vec![Stream::new("x", Arc::new(src) as Arc<dyn Source>)];
        let cfg = LoaderConfig { mode: Mode::Blocked, ..LoaderConfig::new(6) };
        let mut loader = Loader::new(streams, cfg).unwrap();
        for _ in 0..10 {
            let b = loader.next().unwrap();
            for (k, &i) in b.indices.iter().enumerate() {
                assert_eq!(b.record("x", k).unwrap(), &record(i)[..]);
            }
        }
    }
}
