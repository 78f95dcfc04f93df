//! Mode 3 over a store larger than its memory budget: a prefetch thread
//! loads each window of blocks (one large read per run of records, kept
//! whole and charged to the record cache) before the workers gather its
//! steps. The guarantees: the batches are exactly the sampler's and carry the
//! right bytes, a resumed loader continues exactly, and the gathers are
//! served from memory (the loaded windows) rather than by reads of their own.
//!
//! The record cache is one per process, so this file is its own test binary
//! and its tests take turns ([`ONE_AT_A_TIME`]).

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::with_timeout;
use zring_engine::{Codec, Store};
use zring_loader::{Blocks, Loader, LoaderConfig, Mode, StoreSource, Stream};
use zring_sampler::Sampler;

const RECORDS: u64 = 3000;
const RECORD: usize = 1000;
const BATCH: u64 = 64;
const SHAPE: Blocks = Blocks { block_records: 50, window_blocks: 6, shards: 1 };

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn create(dir: &Path) {
    let store = Store::builder(dir).codec(Codec::Raw).create().unwrap();
    let records: Vec<Vec<u8>> = (0..RECORDS).map(|i| common::fixed_record(i, RECORD)).collect();
    let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    store.append(&refs, None).unwrap();
    store.sync().unwrap();
}

fn config() -> LoaderConfig {
    LoaderConfig { mode: Mode::Blocked, seed: 8, threads: 3, depth: 4, blocks: Some(SHAPE), ..LoaderConfig::new(BATCH) }
}

fn loader(store: &Arc<Store>, cfg: LoaderConfig) -> Loader {
    let stream = Stream::new("x", Arc::new(StoreSource::fixed(Arc::clone(store), RECORD)));
    Loader::new(vec![stream], cfg).unwrap()
}

#[test]
fn blocked_batches_are_the_samplers_and_come_from_memory() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    with_timeout(Duration::from_secs(120), || {
        let dir = tempfile::tempdir().unwrap();
        create(dir.path());
        // 3 MB of records against a 2 MB budget: O_DIRECT behind a cache
        // that holds several 300 KB windows.
        let store = Arc::new(Store::builder(dir.path()).cache_bytes(2 << 20).open().unwrap());
        let sampler = Sampler::with_blocks(Mode::Blocked, RECORDS, BATCH, 8, Some(SHAPE)).unwrap();
        let mut l = loader(&store, config());
        let steps = 2 * RECORDS / BATCH;
        for step in 0..steps {
            let b = l.next().unwrap();
            assert_eq!(b.indices[..], sampler.batch(step)[..], "step {step}");
            for (k, &i) in b.indices.iter().enumerate() {
                assert_eq!(b.record("x", k).unwrap(), &common::fixed_record(i, RECORD)[..], "step {step} row {k}");
            }
        }
        let state = l.state_at(50);
        assert_eq!(state.sampler.blocks, Some(SHAPE));
        l.close().unwrap();
        let r = store.read_stats();
        assert!(store.wants_hints(), "an explicit budget below the data reads direct, cached: {r:?}");
        // Every gathered record was found in memory: the windows were
        // loaded before their steps. Each block was read once per cycle, and
        // at most one window ahead, each read rounded out to whole pages.
        assert_eq!(r.cache_misses, 0, "{r:?}");
        assert!(r.cache_hits >= 2 * (RECORDS / BATCH) * BATCH && r.cache_hits == r.records, "{r:?}");
        assert!(r.bytes_read >= (RECORDS - BATCH) * RECORD as u64, "{r:?}");
        let ahead = SHAPE.block_records * SHAPE.window_blocks;
        let reads = (2 * RECORDS + ahead) / SHAPE.block_records;
        assert!(r.bytes_read <= (2 * RECORDS + ahead) * RECORD as u64 + reads * 8192, "{r:?}");
        // Served from the windows' block reads as read: no record was
        // copied into a cache entry of its own.
        assert_eq!(r.cache_entries, 0, "{r:?}");
        // The windows' slabs are what the cache's capacity holds.
        assert!(r.window_bytes > 0 && r.window_bytes <= r.cache_capacity, "{r:?}");
        // Resumed at step 50, the same batches.
        let mut resumed = loader(&store, LoaderConfig::from_state(&state));
        for step in 50..80 {
            assert_eq!(resumed.next().unwrap().indices[..], sampler.batch(step)[..], "resumed step {step}");
        }
    });
}

#[test]
fn the_default_shape_comes_from_the_record_size_and_the_cache() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    create(dir.path());
    let store = Arc::new(Store::builder(dir.path()).cache_bytes(2 << 20).open().unwrap());
    let cfg = LoaderConfig { blocks: None, ..config() };
    let l = loader(&store, cfg);
    let shape = l.state().sampler.blocks.expect("mode 3 saves its shape");
    // 1 MiB of 1000-byte records per block.
    assert_eq!(shape.block_records, 1049);
    let r = store.read_stats();
    let memory = if r.cache_capacity > 0 { r.cache_capacity } else { r.budget_bytes };
    assert_eq!(shape.window_blocks, (memory / 4 / (1049 * 1000)).max(1), "{r:?}");
}

/// With `shard=(k, n)` the cycles are split for `n` shards: each rank's
/// rows come from blocks of its own, so together the ranks cover a cycle's
/// records once and each reads about its share; unsplit (a shape of one
/// shard, as states saved before the split resume), each reads whole
/// windows, its neighbours' records included. Each rank reads its own copy
/// of the store, as ranks on separate hosts would (the record cache is
/// shared by handles on one directory).
#[test]
fn shards_read_only_their_own_blocks() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    with_timeout(Duration::from_secs(120), || {
        const RANKS: u32 = 4;
        let cycle = RECORDS / BATCH;
        let share = RECORDS * RECORD as u64 / u64::from(RANKS);
        // Bytes each rank read over two cycles, and the rows it drew.
        let run = |shards: u32| -> Vec<(u64, Vec<u64>)> {
            (0..RANKS)
                .map(|k| {
                    let dir = tempfile::tempdir().unwrap();
                    create(dir.path());
                    let store = Arc::new(Store::builder(dir.path()).cache_bytes(2 << 20).open().unwrap());
                    let shard = zring_loader::Shard::new(k, RANKS).unwrap();
                    let cfg = LoaderConfig { shard, blocks: Some(Blocks { shards, ..SHAPE }), ..config() };
                    let mut l = loader(&store, cfg);
                    let mut rows = Vec::new();
                    for step in 0..2 * cycle {
                        let b = l.next().unwrap();
                        for (j, &i) in b.indices.iter().enumerate() {
                            assert_eq!(b.record("x", j).unwrap(), &common::fixed_record(i, RECORD)[..]);
                        }
                        if step < cycle {
                            rows.extend_from_slice(&b.indices);
                        }
                    }
                    let state = l.state_at(cycle + 5);
                    l.close().unwrap();
                    let read = store.read_stats();
                    if shards == 0 {
                        assert_eq!(read.cache_misses, 0, "rank {k}: every row from a loaded window: {read:?}");
                    }
                    // The state keeps the split; resumed, the same rows.
                    assert_eq!(state.sampler.blocks.map(|b| b.shards), Some(if shards == 0 { RANKS } else { 1 }));
                    let sampler = Sampler::from_state(&state.sampler).unwrap();
                    let mut resumed = loader(&store, LoaderConfig { shard, ..LoaderConfig::from_state(&state) });
                    for step in cycle + 5..cycle + 15 {
                        let mut want = vec![0; (BATCH / u64::from(RANKS)) as usize];
                        sampler.fill_shard(step, shard, &mut want).unwrap();
                        assert_eq!(resumed.next().unwrap().indices[..], want[..], "rank {k} resumed at {step}");
                    }
                    resumed.close().unwrap();
                    (read.bytes_read, rows)
                })
                .collect()
        };
        let split = run(0);
        let mut all: Vec<u64> = split.iter().flat_map(|(_, rows)| rows.iter().copied()).collect();
        all.sort_unstable();
        let drawn = all.len();
        all.dedup();
        assert_eq!(drawn as u64, cycle * BATCH);
        assert_eq!(all.len(), drawn, "the ranks' rows of a cycle are disjoint");
        for (k, (bytes, _)) in split.iter().enumerate() {
            // Two cycles of its stretch (a window's blocks are not kept past
            // it: the second cycle reads them again) and the windows read
            // ahead of the steps: at most 1.5 times its share of two cycles,
            // where a rank reading whole windows reads 4 times.
            assert!(*bytes * 10 <= 2 * share * 15, "rank {k} read {bytes} bytes for a share of {share}");
        }
        for (k, (bytes, _)) in run(1).iter().enumerate() {
            assert!(*bytes >= 2 * share * 3, "unsplit, rank {k} reads whole windows: {bytes} for a share of {share}");
        }
    });
}

/// A source that remembers which records its prefetches loaded and counts
/// the gathered records no prefetch had loaded before.
struct Windowed {
    inner: Arc<common::MemSource>,
    loaded: Mutex<std::collections::HashSet<u64>>,
    prefetched: std::sync::atomic::AtomicU64,
    missed: std::sync::atomic::AtomicU64,
}

impl zring_loader::Source for Windowed {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn layout(&self) -> zring_loader::Layout {
        self.inner.layout()
    }
    fn gather(&self, req: &zring_loader::Request<'_>, dst: &mut [u8]) -> Result<(), zring_loader::SourceError> {
        let loaded = self.loaded.lock().unwrap();
        let missed = req.indices.iter().filter(|i| !loaded.contains(i)).count() as u64;
        self.missed.fetch_add(missed, std::sync::atomic::Ordering::Relaxed);
        drop(loaded);
        self.inner.gather(req, dst)
    }
    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), zring_loader::SourceError> {
        self.inner.lengths(indices, out)
    }
    fn prefetch(&self, blocks: &[std::ops::Range<u64>], next: &[Option<u64>]) -> Result<(), zring_loader::SourceError> {
        let count: u64 = blocks.iter().map(|r| r.end - r.start).sum();
        // A window's blocks are held for its steps whatever the hints, so
        // the loader computes none.
        assert!(next.is_empty(), "{} next-use hints for a window's {count} records", next.len());
        self.prefetched.fetch_add(count, std::sync::atomic::Ordering::Relaxed);
        self.loaded.lock().unwrap().extend(blocks.iter().flat_map(Clone::clone));
        Ok(())
    }
}

/// A mixture in mode 3: each source's windows are loaded ahead of the steps
/// that draw from them (no gathered record was not loaded first; before,
/// a mixture loaded none and read every row by itself), about one window
/// ahead of the steps gathered, and the batches are the mixture's.
#[test]
fn a_mixtures_sources_read_their_windows_ahead() {
    with_timeout(Duration::from_secs(120), || {
        let lengths = [40_000u64, 35_003, 20_000];
        let weights = [0.5, 0.3, 0.2];
        let windowed: Vec<Arc<Windowed>> = lengths
            .iter()
            .map(|&n| {
                Arc::new(Windowed {
                    inner: common::MemSource::fixed(n, 8),
                    loaded: Mutex::default(),
                    prefetched: Default::default(),
                    missed: Default::default(),
                })
            })
            .collect();
        let sources: Vec<zring_loader::MixSource> = windowed
            .iter()
            .zip(weights)
            .map(|(s, w)| zring_loader::MixSource::new(w, vec![Stream::new("x", Arc::clone(s) as _)]))
            .collect();
        let m = zring_sampler::Mixture::new(Mode::Blocked, &lengths, &weights, BATCH, 4).unwrap();
        for (start, threads, depth) in [(0u64, 3, 4), (777, 1, 1), (2000, 4, 8)] {
            for w in &windowed {
                w.loaded.lock().unwrap().clear();
                w.missed.store(0, std::sync::atomic::Ordering::Relaxed);
                w.prefetched.store(0, std::sync::atomic::Ordering::Relaxed);
            }
            let cfg = LoaderConfig {
                mode: Mode::Blocked,
                seed: 4,
                threads,
                depth,
                start_step: start,
                ..LoaderConfig::new(BATCH)
            };
            let mut l = Loader::new_mixture(sources.clone(), cfg).unwrap();
            // Each source's share by weight of the sources' windows (256
            // blocks each of the default shape): 384, 230 and 154.
            let shapes = l.state().mixture.and_then(|m| m.blocks).expect("mode 3 saves the shapes");
            let windows: Vec<u64> = shapes.iter().map(|b| b.window_blocks).collect();
            assert_eq!(windows, [384, 230, 154]);
            let m = m.clone().with_blocks(&shapes).unwrap();
            let steps = 1500;
            let mut want_sources = vec![0u32; BATCH as usize];
            let mut want = vec![0u64; BATCH as usize];
            for step in start..start + steps {
                let b = l.next().unwrap();
                m.fill_shard(step, zring_loader::Shard::ALL, &mut want_sources, &mut want).unwrap();
                assert_eq!(b.indices[..], want[..], "step {step}");
                assert_eq!(b.sources.as_deref(), Some(&want_sources[..]), "step {step}");
            }
            let state = l.state();
            l.close().unwrap();
            for (k, w) in windowed.iter().enumerate() {
                let missed = w.missed.load(std::sync::atomic::Ordering::Relaxed);
                assert_eq!(missed, 0, "source {k} from step {start}: rows gathered before their window loaded");
                // The rows drawn, rounded out to whole windows, and one
                // window ahead.
                let drawn = (weights[k] * (steps * BATCH) as f64) as u64;
                let window = windows[k] * 64;
                let prefetched = w.prefetched.load(std::sync::atomic::Ordering::Relaxed);
                assert!(prefetched <= drawn + 3 * window, "source {k}: {prefetched} loaded for {drawn} drawn");
            }
            // Resumed, the saved shapes and the same batches.
            let mut resumed = Loader::new_mixture(sources.clone(), LoaderConfig::from_state(&state)).unwrap();
            for step in start + steps..start + steps + 5 {
                m.fill_shard(step, zring_loader::Shard::ALL, &mut want_sources, &mut want).unwrap();
                assert_eq!(resumed.next().unwrap().indices[..], want[..], "resumed step {step}");
            }
            resumed.close().unwrap();
        }
    });
}
