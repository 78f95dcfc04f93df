//! A loader over a store larger than its memory budget. The store then reads
//! with O_DIRECT behind its record cache, and the loader passes each record's
//! next use along with the gathers. The guarantees: the batches are exactly
//! those of a store with room to spare (hints change which records the cache
//! keeps, never a byte of a batch), the hinted gathers are really used, and
//! over the second epoch the cache serves about its share of the data.
//!
//! The record cache is one per process, so this file is its own test binary
//! and its tests take turns ([`ONE_AT_A_TIME`]).

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::{take, with_timeout, Snapshot};
use zring_engine::parts::commit_manifest;
use zring_engine::{Codec, PartEntry, Parts, Store};
use zring_loader::{
    Layout, Loader, LoaderConfig, Mode, PartsSource, Request, Source, SourceError, StoreSource, Stream,
};

/// Records in the store, and per step: 30 steps per epoch, no remainder.
const RECORDS: u64 = 1200;
const BATCH: u64 = 40;
const STEPS_PER_EPOCH: u64 = RECORDS / BATCH;
/// Fixed-layout slot, at least the longest record.
const SLOT: usize = 8192;
/// Far above the data: the store reads buffered, the reference behaviour.
const ROOMY: u64 = 1 << 40;

/// Tests share the process's record cache and must not overlap.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Record `i`: 6000 to 7800 bytes of noise (stored raw, so stored and
/// logical bytes agree and the budget arithmetic below is simple).
fn record(i: u64) -> Vec<u8> {
    let len = 6000 + (i % 7) as usize * 300;
    (0..len).map(|j| common::fixed_byte(i, j)).collect()
}

/// Creates the store in `dir` and closes the writing handle; returns the
/// stored bytes.
fn create(dir: &Path) -> u64 {
    let store = Store::builder(dir).codec(Codec::Raw).create().unwrap();
    let records: Vec<Vec<u8>> = (0..RECORDS).map(record).collect();
    let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    store.append(&refs, None).unwrap();
    store.sync().unwrap();
    records.iter().map(|r| r.len() as u64).sum()
}

fn open(dir: &Path, budget: u64) -> Arc<Store> {
    Arc::new(Store::builder(dir).cache_bytes(budget).open().unwrap())
}

/// A [`StoreSource`] that counts its hinted gathers.
struct Counted {
    inner: StoreSource,
    hinted: Arc<AtomicU64>,
}

impl Source for Counted {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn layout(&self) -> Layout {
        self.inner.layout()
    }
    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        if !req.next.is_empty() {
            self.hinted.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.gather(req, dst)
    }
    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), SourceError> {
        self.inner.lengths(indices, out)
    }
    fn wants_hints(&self) -> bool {
        self.inner.wants_hints()
    }
}

fn config() -> LoaderConfig {
    LoaderConfig { mode: Mode::Cyclic, seed: 5, threads: 2, depth: 3, ..LoaderConfig::new(BATCH) }
}

/// Two epochs of a loader over `store` with the given streams ("fixed",
/// "ragged" or both); returns the batches and the number of hinted gathers.
fn two_epochs(store: &Arc<Store>, layouts: &[&str]) -> (Vec<Snapshot>, u64) {
    let hinted = Arc::new(AtomicU64::new(0));
    let streams = layouts
        .iter()
        .map(|&name| {
            let inner = match name {
                "fixed" => StoreSource::fixed(Arc::clone(store), SLOT),
                _ => StoreSource::ragged(Arc::clone(store)),
            };
            Stream::new(name, Arc::new(Counted { inner, hinted: Arc::clone(&hinted) }))
        })
        .collect();
    let mut loader = Loader::new(streams, config()).unwrap();
    let batches = take(&mut loader, 2 * STEPS_PER_EPOCH as usize);
    loader.close().unwrap();
    (batches, hinted.load(Ordering::Relaxed))
}

#[test]
fn a_budget_smaller_than_the_data_changes_no_byte() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    with_timeout(common::DEADLOCK * 3, || {
        let dir = tempfile::tempdir().unwrap();
        let data = create(dir.path());

        let roomy = open(dir.path(), ROOMY);
        assert_eq!(roomy.read_stats().policy, "buffered", "{:?}", roomy.read_stats());
        let (reference, hinted) = two_epochs(&roomy, &["fixed", "ragged"]);
        assert_eq!(hinted, 0, "a buffered store wants no hints");
        drop(roomy);

        let tight = open(dir.path(), data / 2);
        assert_eq!(tight.read_stats().policy, "direct", "{:?}", tight.read_stats());
        let (batches, hinted) = two_epochs(&tight, &["fixed", "ragged"]);
        assert!(hinted >= 2 * 2 * STEPS_PER_EPOCH, "only {hinted} hinted gathers");
        assert_eq!(batches.len(), reference.len());
        for (got, want) in batches.iter().zip(&reference) {
            assert!(got == want, "step {} differs under the budget", want.step);
        }
        // And both are the records themselves.
        for b in &batches {
            let (_, ragged, offsets) = &b.columns[1];
            let offsets = offsets.as_ref().unwrap();
            for (k, &i) in b.indices.iter().enumerate() {
                assert_eq!(&ragged[offsets[k] as usize..offsets[k + 1] as usize], &record(i)[..]);
            }
        }
        assert!(tight.read_stats().cache_hits > 0, "{:?}", tight.read_stats());
    });
}

#[test]
fn the_second_epoch_is_served_from_the_cache_by_its_share() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    with_timeout(common::DEADLOCK * 3, || {
        let dir = tempfile::tempdir().unwrap();
        let data = create(dir.path());
        let budget = data / 2;
        // One stream at a time: two streams over one store would read each
        // record twice a step, the second time from the cache.
        for layout in ["fixed", "ragged"] {
            // A fresh handle: the last handle on a store took its records out
            // of the cache when it closed, so each run starts cold.
            let store = open(dir.path(), budget);
            let (batches, hinted) = two_epochs(&store, &[layout]);
            let stats = store.read_stats();
            assert_eq!(stats.policy, "direct", "{stats:?}");
            assert!(hinted >= 2 * STEPS_PER_EPOCH, "{layout}: only {hinted} hinted gathers");
            // Every record once per epoch: the first epoch misses, and the
            // second finds what the cache kept. A cache of `budget` holds
            // about budget/data of the records (a little less: each entry is
            // charged a few hundred bytes of bookkeeping, under 6 % here),
            // and the hints make it keep those read first in epoch two, so
            // that share of the epoch hits. Steps read ahead past the
            // second epoch may add hits; they are not counted for it.
            let share = budget as f64 / data as f64;
            assert_eq!(batches.len() as u64, 2 * STEPS_PER_EPOCH);
            let ahead = stats.records - 2 * RECORDS;
            assert!(ahead <= 3 * BATCH, "read ahead {ahead} records with depth 3");
            let epoch_two = stats.cache_hits.saturating_sub(ahead) as f64 / RECORDS as f64;
            eprintln!(
                "{layout}: {} hits in {} records; the second epoch {epoch_two:.3} from the cache, budget/data {share:.3}",
                stats.cache_hits, stats.records
            );
            assert!(epoch_two >= share - 0.1, "{layout}: {epoch_two:.3} of epoch two from the cache: {stats:?}");
            // Over both epochs about half that, as the first is all misses.
            let overall = stats.cache_hits as f64 / stats.records as f64;
            assert!(overall >= (share - 0.1) / 2.0, "{layout}: {overall:.3}");
            drop(store);
        }
    });
}

/// In cyclic mode every record read is needed next in the next cycle, and
/// the cache can serve only that cycle's first steps: the records needed
/// later are not copied in even while the cache has room (they would only be
/// evicted again before their use), so half an epoch fills it only with
/// about the share of what it read that it can keep across the cycle's end.
#[test]
fn a_cyclic_epoch_copies_in_only_what_the_cache_keeps_for_the_next() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    with_timeout(common::DEADLOCK * 3, || {
        let dir = tempfile::tempdir().unwrap();
        let data = create(dir.path());
        let store = open(dir.path(), data / 2);
        let stream = Stream::new("fixed", Arc::new(StoreSource::fixed(Arc::clone(&store), SLOT)));
        let mut loader = Loader::new(vec![stream], config()).unwrap();
        take(&mut loader, (STEPS_PER_EPOCH / 2) as usize);
        loader.close().unwrap();
        let stats = store.read_stats();
        assert_eq!(stats.policy, "direct", "{stats:?}");
        // The cache has room for about half the data: at least seven tenths
        // of what half an epoch and the steps read ahead (how many depends
        // on the threads' timing) read, so a cache copying in every record
        // would hold over 0.6 of them. It can keep for the next epoch about
        // its share of the records (the next epoch's first half), so it took
        // only about half of those read.
        let share = stats.cache_entries as f64 / stats.records as f64;
        eprintln!("{} of {} records read copied into the cache: {share:.2}", stats.cache_entries, stats.records);
        assert!(stats.cache_capacity / 7000 >= stats.records * 7 / 10, "{stats:?}");
        assert!((0.3..=0.6).contains(&share), "{share:.2} of the records read were cached: {stats:?}");
        drop(store);
    });
}

/// The same over a dataset of parts: each part has a record cache of its
/// own, and each part's store is passed the cycle's end as a single store
/// is, so the parts together copy in only about what their caches keep for
/// the next epoch, not every record read while they have room.
#[test]
fn a_cyclic_epoch_over_parts_copies_in_only_what_the_caches_keep_for_the_next() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    with_timeout(common::DEADLOCK * 3, || {
        const PARTS: u64 = 4;
        let dir = tempfile::tempdir().unwrap();
        let per = RECORDS / PARTS;
        let mut entries = Vec::new();
        let mut data = 0;
        for k in 0..PARTS {
            let name = format!("p{k}");
            let store = Store::builder(dir.path().join(&name)).codec(Codec::Raw).create().unwrap();
            let records: Vec<Vec<u8>> = (k * per..(k + 1) * per).map(record).collect();
            let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
            store.append(&refs, None).unwrap();
            store.sync().unwrap();
            data += records.iter().map(|r| r.len() as u64).sum::<u64>();
            entries.push(PartEntry::new(name, store.fingerprint().unwrap()));
        }
        commit_manifest(dir.path(), serde_json::Value::Null, entries, false).unwrap();
        // The parts' stores are opened by the dataset, so the budget is the
        // process's, stated for the test's length.
        // A handle on each part first: the dataset's handles then open with
        // the data of all parts counted against the budget, so they read
        // with O_DIRECT from the start (a part opened alone fits).
        let _budget = zring_engine::state_cache_bytes(data / 2);
        let _held: Vec<Store> =
            (0..PARTS).map(|k| Store::builder(dir.path().join(format!("p{k}"))).open().unwrap()).collect();
        let parts = Arc::new(Parts::open(dir.path()).unwrap());
        for k in 0..PARTS as usize {
            parts.part(k).unwrap();
        }
        let stream = Stream::new("fixed", Arc::new(PartsSource::fixed(Arc::clone(&parts), SLOT)));
        let mut loader = Loader::new(vec![stream], config()).unwrap();
        take(&mut loader, (STEPS_PER_EPOCH / 2) as usize);
        loader.close().unwrap();
        let stores = parts.open_stores();
        assert_eq!(stores.len() as u64, PARTS);
        let (mut records, mut entries, mut capacity) = (0, 0, 0);
        for s in &stores {
            let stats = s.read_stats();
            assert_eq!(stats.policy, "direct", "{stats:?}");
            records += stats.records;
            entries += stats.cache_entries;
            capacity += stats.cache_capacity;
        }
        let share = entries as f64 / records as f64;
        eprintln!("parts: {entries} of {records} records read copied into the caches: {share:.2}");
        // The caches have room for about half the data: at least two thirds
        // of what half an epoch and the steps read ahead read (more than
        // the share below, which taking every record read would exceed).
        assert!(capacity / 7000 >= records * 2 / 3, "capacity {capacity} for {records} records");
        assert!((0.3..=0.6).contains(&share), "{share:.2} of the records read were cached");
    });
}

/// Iid draws with the look-ahead's hints: the cache keeps the records drawn
/// again soonest instead of a fixed subset, and serves well over its share
/// (with a third of the data cached, plain admission serves a third).
#[test]
fn iid_draws_with_hints_beat_the_cache_share() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    with_timeout(common::DEADLOCK * 3, || {
        let dir = tempfile::tempdir().unwrap();
        let data = create(dir.path());
        let budget = data / 3;
        let store = open(dir.path(), budget);
        let hinted = Arc::new(AtomicU64::new(0));
        let source = Counted { inner: StoreSource::fixed(Arc::clone(&store), SLOT), hinted: Arc::clone(&hinted) };
        let cfg = LoaderConfig { mode: Mode::Iid, ..config() };
        let mut loader = Loader::new(vec![Stream::new("fixed", Arc::new(source))], cfg).unwrap();
        // Warm up for two passes' worth of draws, then measure four.
        take(&mut loader, 2 * STEPS_PER_EPOCH as usize);
        let warm = store.read_stats();
        let batches = take(&mut loader, 4 * STEPS_PER_EPOCH as usize);
        loader.close().unwrap();
        for b in batches.iter().take(5) {
            for (k, &i) in b.indices.iter().enumerate() {
                assert_eq!(&b.columns[0].1[k * SLOT..k * SLOT + record(i).len()], &record(i)[..]);
            }
        }
        let stats = store.read_stats();
        assert_eq!(stats.policy, "direct", "{stats:?}");
        assert!(hinted.load(Ordering::Relaxed) >= 6 * STEPS_PER_EPOCH, "the iid gathers were hinted");
        let rate = (stats.cache_hits - warm.cache_hits) as f64 / (stats.records - warm.records) as f64;
        let share = budget as f64 / data as f64;
        eprintln!("iid with hints: {rate:.3} of the draws from the cache, budget/data {share:.3}");
        assert!(rate >= 1.3 * share, "{rate:.3} of the draws from a cache of {share:.3} of the data: {stats:?}");
    });
}
