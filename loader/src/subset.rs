//! A source seen through some of its records: a train, validation or test
//! split (`zring.split`).
//!
//! [`Subset`] maps its indices `0..len()` to records of another source,
//! `map[i]` in increasing order, so every sampler mode draws from the
//! split alone and a mode-3 block of the split is records that lie close
//! together in the store. Appending to the store never moves a record of
//! one split to another (the Python side assigns each record by its own
//! index), so a split over a store that grew is the old split with more
//! records after it, and the loader's resume over grown sources applies.
//!
//! Its [fingerprint](Source::fingerprint) is the inner source's, the
//! content mixed with the split's `key` (a hash of its definition): a state
//! saved over one split is refused over another split of the same store,
//! and over the same split of the store grown by appends it resumes.

use std::ops::Range;
use std::sync::Arc;

use crate::source::{Fingerprint, Layout, Request, Source, SourceError, Span};
use crate::Blocks;

/// The records `map` names of `inner`, as a source of `map.len()` records.
#[derive(Clone)]
pub struct Subset {
    inner: Arc<dyn Source>,
    map: Arc<[u64]>,
    key: u64,
}

impl std::fmt::Debug for Subset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subset").field("len", &self.map.len()).field("key", &self.key).finish()
    }
}

/// The 32 bits a subset's key mixes into its source's content fingerprint
/// (a splitmix64 finaliser of the key, folded; zring.split computes the same).
pub fn key_bits(key: u64) -> u32 {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z ^ (z >> 32)) as u32
}

impl Subset {
    /// The records `map` (strictly increasing, each below `inner.len()`) of
    /// `inner`; `key` tells this subset's fingerprint from other subsets'.
    pub fn new(inner: Arc<dyn Source>, map: Vec<u64>, key: u64) -> Result<Subset, String> {
        if let Some(k) = map.windows(2).position(|w| w[0] >= w[1]) {
            return Err(format!(
                "a subset's records must be strictly increasing: record {} at {k} is followed by {}",
                map[k],
                map[k + 1]
            ));
        }
        if let Some(&last) = map.last() {
            if last >= inner.len() {
                return Err(format!("a subset names record {last} of a source of {} records", inner.len()));
            }
        }
        Ok(Subset { inner, map: map.into(), key })
    }

    /// The inner records of `indices`.
    fn inner_indices(&self, indices: &[u64]) -> Result<Vec<u64>, SourceError> {
        indices
            .iter()
            .map(|&i| {
                usize::try_from(i)
                    .ok()
                    .and_then(|i| self.map.get(i).copied())
                    .ok_or_else(|| format!("record {i} of a subset of {} records", self.map.len()).into())
            })
            .collect()
    }
}

impl Source for Subset {
    fn len(&self) -> u64 {
        self.map.len() as u64
    }

    fn layout(&self) -> Layout {
        self.inner.layout()
    }

    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        let indices = self.inner_indices(req.indices)?;
        self.inner.gather(&Request { indices: &indices, ..*req }, dst)
    }

    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), SourceError> {
        self.inner.lengths(&self.inner_indices(indices)?, out)
    }

    fn fingerprint(&self) -> Result<Option<Fingerprint>, SourceError> {
        Ok(self.inner.fingerprint()?.map(|f| Fingerprint { content: f.content ^ key_bits(self.key), ..f }))
    }

    /// The inner source's records then are its first ones now: the subset
    /// then is the first records of the subset now (its records are
    /// assigned by their own indices).
    fn extends(&self, earlier: Fingerprint) -> Result<bool, SourceError> {
        self.inner.extends(Fingerprint { content: earlier.content ^ key_bits(self.key), ..earlier })
    }

    fn view(&self) -> Result<Option<Box<dyn Source>>, SourceError> {
        Ok(self.inner.view()?.map(|v| {
            Box::new(Subset { inner: Arc::from(v), map: Arc::clone(&self.map), key: self.key }) as Box<dyn Source>
        }))
    }

    fn wants_hints(&self) -> bool {
        self.inner.wants_hints()
    }

    fn block_shape(&self) -> Option<Blocks> {
        self.inner.block_shape()
    }

    fn gather_spans(&self, spans: &[Span], dst: &mut [u8], fan_out: bool) -> Result<(), SourceError> {
        let indices = self.inner_indices(&spans.iter().map(|s| s.index).collect::<Vec<_>>())?;
        let spans: Vec<Span> = spans.iter().zip(indices).map(|(s, index)| Span { index, ..*s }).collect();
        self.inner.gather_spans(&spans, dst, fan_out)
    }

    fn reads_in_part(&self, indices: &[u64], out: &mut [bool]) -> Result<(), SourceError> {
        self.inner.reads_in_part(&self.inner_indices(indices)?, out)
    }

    /// Each block of the subset is the records it maps to: one range of the
    /// inner source covering them when they fill at least half of it (the
    /// records between, of other splits, read along with no next use), else
    /// one range per run of consecutive records, so a sparse split (a
    /// validation set) reads only its own.
    fn prefetch(&self, blocks: &[Range<u64>], next: &[Option<u64>]) -> Result<(), SourceError> {
        let hinted = !next.is_empty();
        let mut ranges = Vec::new();
        let mut hints = Vec::new();
        let mut at = 0usize;
        for b in blocks {
            let (start, end) = (usize::try_from(b.start)?, usize::try_from(b.end)?);
            let Some(records) = self.map.get(start..end) else {
                return Err(format!("block {}..{} of a subset of {} records", b.start, b.end, self.map.len()).into());
            };
            let Some((&first, &last)) = records.first().zip(records.last()) else {
                continue;
            };
            let block_next = if hinted { &next[at..at + records.len()] } else { &[][..] };
            at += records.len();
            if (last - first + 1) <= 2 * records.len() as u64 {
                ranges.push(first..last + 1);
                if hinted {
                    let mut k = 0;
                    for i in first..=last {
                        if records[k] == i {
                            hints.push(block_next[k]);
                            k += 1;
                        } else {
                            hints.push(None);
                        }
                    }
                }
                continue;
            }
            let mut run_start = 0;
            for k in 1..=records.len() {
                if k == records.len() || records[k] != records[k - 1] + 1 {
                    ranges.push(records[run_start]..records[k - 1] + 1);
                    run_start = k;
                }
            }
            hints.extend_from_slice(block_next);
        }
        self.inner.prefetch(&ranges, &hints)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::{Loader, LoaderConfig, Mode, StoreSource, Stream};
    use zring_engine::Store;

    fn record(i: u64) -> Vec<u8> {
        (0..(i % 7) + 1).map(|j| (i * 5 + j) as u8).collect()
    }

    fn store(n: u64) -> (tempfile::TempDir, Arc<Store>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::builder(dir.path()).create().unwrap();
        let records: Vec<Vec<u8>> = (0..n).map(record).collect();
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        store.append(&refs, None).unwrap();
        store.sync().unwrap();
        (dir, Arc::new(store))
    }

    #[test]
    fn a_loader_over_a_subset_reads_only_its_records_once_per_cycle() {
        let (_dir, store) = store(300);
        let map: Vec<u64> = (0..300).filter(|i| i % 3 != 1).collect();
        let sub = Subset::new(Arc::new(StoreSource::ragged(store)), map.clone(), 7).unwrap();
        for mode in [Mode::Sequential, Mode::Cyclic, Mode::Blocked] {
            let cfg = LoaderConfig {
                mode,
                seed: 5,
                blocks: Some(Blocks { block_records: 16, window_blocks: 2 }),
                ..LoaderConfig::new(20)
            };
            let mut loader = Loader::new(vec![Stream::new("x", Arc::new(sub.clone()))], cfg).unwrap();
            let mut seen = vec![0u32; map.len()];
            for _ in 0..10 {
                let b = loader.next().unwrap();
                for (k, &i) in b.indices.iter().enumerate() {
                    seen[i as usize] += 1;
                    assert_eq!(b.record("x", k).unwrap(), &record(map[i as usize])[..], "{mode:?}");
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{mode:?}: one cycle reads each record of the subset once");
        }
        assert!(Subset::new(Arc::new(sub.clone()), vec![3, 2], 0).is_err());
        assert!(Subset::new(Arc::new(sub), vec![200], 0).is_err(), "past the end");
    }

    #[test]
    fn fingerprints_tell_subsets_apart_and_see_a_grown_store() {
        let (dir, store) = store(100);
        let inner: Arc<dyn Source> = Arc::new(StoreSource::ragged(Arc::clone(&store)));
        let a = Subset::new(Arc::clone(&inner), vec![1, 5, 9], 1).unwrap();
        let b = Subset::new(Arc::clone(&inner), vec![1, 5, 9], 2).unwrap();
        let fa = a.fingerprint().unwrap().unwrap();
        assert_ne!(fa, b.fingerprint().unwrap().unwrap(), "another key");
        assert_eq!(fa.records, 100, "the store's records");
        store.append(&[&record(100)[..]], None).unwrap();
        let grown = Subset::new(inner, vec![1, 5, 9, 100], 1).unwrap();
        assert!(grown.extends(fa).unwrap(), "the same split of the store grown");
        assert!(!b.extends(fa).unwrap(), "another split");
        drop(dir);
    }

    /// One prefetch call: its ranges and hints.
    type Asked = (Vec<Range<u64>>, Vec<Option<u64>>);

    /// A source that records what it is asked to prefetch.
    struct Recorder {
        len: u64,
        asked: Mutex<Vec<Asked>>,
    }

    impl Source for Recorder {
        fn len(&self) -> u64 {
            self.len
        }
        fn layout(&self) -> Layout {
            Layout::Fixed { record_bytes: 1 }
        }
        fn gather(&self, _: &Request<'_>, _: &mut [u8]) -> Result<(), SourceError> {
            Ok(())
        }
        fn lengths(&self, _: &[u64], _: &mut [u64]) -> Result<(), SourceError> {
            Ok(())
        }
        fn prefetch(&self, blocks: &[Range<u64>], next: &[Option<u64>]) -> Result<(), SourceError> {
            self.asked.lock().unwrap().push((blocks.to_vec(), next.to_vec()));
            Ok(())
        }
    }

    #[test]
    fn prefetch_reads_a_dense_block_whole_and_a_sparse_one_by_runs() {
        let rec = Arc::new(Recorder { len: 100, asked: Mutex::new(Vec::new()) });
        let map = vec![0, 1, 3, 4, 5, 40, 41, 90];
        let sub = Subset::new(Arc::clone(&rec) as Arc<dyn Source>, map, 0).unwrap();
        let next: Vec<Option<u64>> = (0..8).map(Some).collect();
        sub.prefetch(&[0..5, 5..8], &next).unwrap();
        let asked = rec.asked.lock().unwrap().pop().unwrap();
        assert_eq!(asked.0, vec![0..6, 40..42, 90..91]);
        assert_eq!(asked.1, vec![Some(0), Some(1), None, Some(2), Some(3), Some(4), Some(5), Some(6), Some(7)]);
        let last = vec![Range { start: 5, end: 8 }];
        sub.prefetch(&last, &[]).unwrap();
        assert_eq!(rec.asked.lock().unwrap().pop().unwrap(), (vec![40..42, 90..91], vec![]));
    }
}
