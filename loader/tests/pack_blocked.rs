//! Packed rows over a store larger than its memory, documents drawn in mode
//! 3: the loader's prefetch thread loads each window of the document order
//! (its blocks of consecutive documents, one large read per run) before the
//! steps whose rows hold its tokens, as it does for a mode-3 loader of
//! records. The guarantees: the rows are exactly those of the same packing
//! over the documents read one by one, a resumed loader goes on exactly, and
//! the documents come from the loaded windows rather than reads of their
//! own. A loader of one shard of several does not read ahead (it would read
//! every window whole for its share) and still delivers the same rows.
//!
//! The record cache is one per process, so this file is its own test binary
//! and its tests take turns ([`ONE_AT_A_TIME`]).

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use common::{with_timeout, Docs, DEADLOCK};
use zring_engine::{Codec, Store};
use zring_loader::{Batch, Loader, LoaderConfig, Mode, Pack, PackMode, Shard, Source, StoreSource};

/// Enough documents for several windows of the order's default shape (64
/// documents a block, 256 blocks a window: 16,384 documents, about 16 MB
/// here, in blocks of about 64 KB).
const DOCS: u64 = 120_000;
const TOKEN: u64 = 2;
const SEQ: u64 = 1024;
const BATCH: u64 = 8;
/// Below the store's 120 MB: O_DIRECT behind a record cache whose quarter
/// holds a window of the order.
const CACHE: u64 = 110 << 20;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn document(d: u64) -> Vec<u8> {
    let len = 300 + (d * 7919) % 401;
    (0..len).flat_map(|j| (((d * 31 + j * 17) % 65_521) as u16).to_le_bytes()).collect()
}

fn create(dir: &Path) -> Arc<Docs> {
    let docs: Vec<Vec<u8>> = (0..DOCS).map(document).collect();
    let store = Store::builder(dir).codec(Codec::Raw).create().unwrap();
    let refs: Vec<&[u8]> = docs.iter().map(Vec::as_slice).collect();
    store.append(&refs, None).unwrap();
    store.sync().unwrap();
    Arc::new(Docs(docs))
}

fn config(shard: Shard) -> LoaderConfig {
    LoaderConfig { mode: Mode::Blocked, seed: 5, threads: 2, depth: 4, shard, ..LoaderConfig::new(BATCH) }
}

fn packed(source: Arc<dyn Source>, how: PackMode, cfg: LoaderConfig) -> Loader {
    Loader::new_packed(source, Pack { labels: true, ..Pack::new(SEQ, how, 0, TOKEN) }, cfg).unwrap()
}

fn same(a: &Batch, b: &Batch) {
    assert_eq!(a.step, b.step);
    for (x, y) in a.columns.iter().zip(&b.columns) {
        assert_eq!(x.data(), y.data(), "step {} column {}", a.step, x.name());
    }
}

/// Steps that take a cycle of the documents and a little more.
fn steps() -> u64 {
    let tokens: u64 = (0..DOCS).map(|d| 300 + (d * 7919) % 401).sum();
    tokens * 11 / 10 / (SEQ * BATCH)
}

#[test]
fn packed_rows_in_mode_3_read_the_document_windows_ahead() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    with_timeout(DEADLOCK * 12, || {
        for how in [PackMode::Concat, PackMode::FirstFit] {
            let dir = tempfile::tempdir().unwrap();
            let docs = create(dir.path());
            let store = Arc::new(Store::builder(dir.path()).cache_bytes(CACHE).open().unwrap());
            let source = Arc::new(StoreSource::ragged(Arc::clone(&store)));
            let mut got = packed(source.clone(), how, config(Shard::ALL));
            let mut want = packed(docs.clone(), how, config(Shard::ALL));
            let n = steps();
            for _ in 0..n {
                same(&got.next().unwrap(), &want.next().unwrap());
            }
            let state = got.state_at(n / 2);
            got.close().unwrap();
            let r = store.read_stats();
            assert!(store.wants_hints(), "{how:?}: a budget below the data reads direct, cached: {r:?}");
            // The documents came from the windows the thread loaded: the
            // only records read on their own are the pieces cut at a
            // stretch's ends, read as spans (two a step at most).
            assert!(r.window_bytes > 0, "{how:?}: no window was loaded: {r:?}");
            assert!(r.cache_hits >= DOCS, "{how:?}: {r:?}");
            assert!(r.cache_misses <= 2 * n, "{how:?}: {} documents read alone in {n} steps: {r:?}", r.cache_misses);
            // Resumed half way, the same rows, read ahead again.
            let mut resumed = packed(source, how, LoaderConfig::from_state(&state));
            let mut want = packed(docs, how, LoaderConfig::from_state(&state));
            for _ in n / 2..n / 2 + 200 {
                same(&resumed.next().unwrap(), &want.next().unwrap());
            }
        }
    });
}

#[test]
fn a_shard_of_several_reads_its_rows_without_reading_windows_whole() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    with_timeout(DEADLOCK * 6, || {
        let dir = tempfile::tempdir().unwrap();
        let docs = create(dir.path());
        let store = Arc::new(Store::builder(dir.path()).cache_bytes(CACHE).open().unwrap());
        let shard = Shard::new(1, 2).unwrap();
        let mut got = packed(Arc::new(StoreSource::ragged(Arc::clone(&store))), PackMode::Concat, config(shard));
        let mut want = packed(docs, PackMode::Concat, config(shard));
        for _ in 0..300 {
            same(&got.next().unwrap(), &want.next().unwrap());
        }
        got.close().unwrap();
        let r = store.read_stats();
        assert_eq!(r.window_bytes, 0, "{r:?}");
    });
}

/// A mixture of packed sources in mode 3: a store's windows are read ahead
/// at the steps its share of the rows reaches them, beside a source that
/// reads no blocks (documents in memory) and holds nothing back.
#[test]
fn a_mixture_of_packed_sources_reads_each_stores_windows_ahead() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    with_timeout(DEADLOCK * 12, || {
        let dir = tempfile::tempdir().unwrap();
        let docs = create(dir.path());
        let store = Arc::new(Store::builder(dir.path()).cache_bytes(CACHE).open().unwrap());
        let pack = Pack { labels: true, ..Pack::new(SEQ, PackMode::Concat, 0, TOKEN) };
        let mixture = |first: Arc<dyn Source>| {
            let sources: Vec<(f64, Arc<dyn Source>)> = vec![(0.6, first), (0.4, docs.clone())];
            Loader::new_packed_mixture(sources, pack, config(Shard::ALL)).unwrap()
        };
        let mut got = mixture(Arc::new(StoreSource::ragged(Arc::clone(&store))));
        let mut want = mixture(docs.clone());
        // About three windows of the store's documents.
        let n = 4000;
        for _ in 0..n {
            same(&got.next().unwrap(), &want.next().unwrap());
        }
        got.close().unwrap();
        let r = store.read_stats();
        assert!(r.window_bytes > 0, "no window was loaded: {r:?}");
        assert!(r.cache_hits >= 30_000, "{r:?}");
        assert!(r.cache_misses <= 2 * n, "{} documents read alone in {n} steps: {r:?}", r.cache_misses);
    });
}
