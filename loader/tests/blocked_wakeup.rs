//! Regression: a mode-3 loader with a prefetch depth of 1 hung forever in
//! `next()`. Workers and the window-prefetch thread waited on one condition
//! variable, and the consumer, having taken a step, woke one waiter: when
//! that was the prefetch thread (waiting for a later claim) no worker
//! claimed the step the window had just opened. A worker's claim did not
//! wake the prefetch thread at all, so it could also sleep past the claim
//! it waited for while every worker waited for the window it had to load.
//!
//! The guarantee: every waiter that may proceed is woken. A mode-3 loader
//! with every depth from 1 to 8 and 1 to 4 workers delivers 1,000 steps of
//! the sampler's batches, each run under a watchdog that fails the test
//! instead of hanging it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::with_timeout;
use zring_engine::{Codec, Store};
use zring_loader::{Blocks, Loader, LoaderConfig, Mode, StoreSource, Stream};
use zring_sampler::Sampler;

const RECORDS: u64 = 2000;
const RECORD: usize = 16;
const BATCH: u64 = 8;
const STEPS: u64 = 1000;
/// Windows of 20 records: a new window every two or three steps, so the
/// prefetch thread waits for claims hundreds of times per run.
const SHAPE: Blocks = Blocks { block_records: 10, window_blocks: 2, shards: 1 };

#[test]
fn mode_3_delivers_at_every_depth_and_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::builder(dir.path()).codec(Codec::Raw).create().unwrap();
        let records: Vec<Vec<u8>> = (0..RECORDS).map(|i| common::fixed_record(i, RECORD)).collect();
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        store.append(&refs, None).unwrap();
        store.sync().unwrap();
    }
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let sampler = Arc::new(Sampler::with_blocks(Mode::Blocked, RECORDS, BATCH, 11, Some(SHAPE)).unwrap());
    for depth in 1..=8 {
        for threads in 1..=4 {
            let (store, sampler) = (Arc::clone(&store), Arc::clone(&sampler));
            with_timeout(Duration::from_secs(60), move || {
                let stream = Stream::new("x", Arc::new(StoreSource::fixed(store, RECORD)));
                let cfg = LoaderConfig {
                    mode: Mode::Blocked,
                    seed: 11,
                    depth,
                    threads,
                    blocks: Some(SHAPE),
                    ..LoaderConfig::new(BATCH)
                };
                let mut loader = Loader::new(vec![stream], cfg).unwrap();
                for step in 0..STEPS {
                    let b = loader.next().unwrap();
                    assert_eq!(b.indices[..], sampler.batch(step)[..], "depth {depth}, {threads} threads, step {step}");
                    let k = (step % BATCH) as usize;
                    let want = common::fixed_record(b.indices[k], RECORD);
                    assert_eq!(b.record("x", k).unwrap(), &want[..], "depth {depth}, {threads} threads, step {step}");
                }
                loader.close().unwrap();
            });
        }
    }
}
