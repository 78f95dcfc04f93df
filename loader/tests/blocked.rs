//! Mode 3 over a store larger than its memory budget: a prefetch thread
//! loads each window of blocks (one large read per run of records) into the
//! record cache before the workers gather its steps. The guarantees: the
//! batches are exactly the sampler's and carry the right bytes, a resumed
//! loader continues exactly, and the gathers are served from memory (the
//! cache) rather than by reads of their own.
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
        // loaded before their steps. Each was read at most once per cycle
        // (less when still cached from the cycle before), and the first
        // cycle read all it draws.
        assert_eq!(r.cache_misses, 0, "{r:?}");
        assert!(r.cache_hits >= 2 * (RECORDS / BATCH) * BATCH && r.cache_hits == r.records, "{r:?}");
        assert!(r.bytes_read >= (RECORDS - BATCH) * RECORD as u64, "{r:?}");
        assert!(r.bytes_read <= 2 * RECORDS * RECORD as u64, "{r:?}");
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
