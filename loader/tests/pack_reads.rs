//! Regression: packing read each document cut at a row's edge whole, on
//! every step. With 8 M-token documents a step read 16 MiB to deliver
//! 32 KiB, and the scratch it read into grew to the document's size.
//!
//! The guarantees, counted by the store's read counters (every stored byte
//! a read touches, from disk, the page cache or the record cache):
//! * over raw records, a step reads at most twice the token bytes it
//!   delivers (pieces of long documents are read as spans of them);
//! * over compressed records, a long document is read and decoded once per
//!   worker, not once per step;
//! * either way the rows are exactly those of a source read whole.

mod common;

use std::sync::Arc;

use common::{with_timeout, Docs, DEADLOCK};
use zring_engine::{Codec, Store};
use zring_loader::{Batch, Loader, LoaderConfig, Mode, Pack, PackMode, Source, StoreSource};

const TOKEN: u64 = 2;
const SEQ: u64 = 256;
const BATCH: u64 = 4;

/// Document lengths in tokens: mostly long, a few short ones between.
fn lens() -> Vec<u64> {
    vec![200_000, 90_000, 17, 150_000, 300, 120_000, 5, 260_000]
}

fn document(d: u64, len: u64) -> Vec<u8> {
    (0..len).flat_map(|j| (((d * 7919 + j * 31) % 65_521) as u16).to_le_bytes()).collect()
}

fn store(dir: &std::path::Path, codec: Codec) -> (Arc<Store>, Arc<Docs>) {
    let docs: Vec<Vec<u8>> = lens().iter().enumerate().map(|(d, &n)| document(d as u64, n)).collect();
    let store = Store::builder(dir).codec(codec).create().unwrap();
    let refs: Vec<&[u8]> = docs.iter().map(Vec::as_slice).collect();
    store.append(&refs, None).unwrap();
    store.sync().unwrap();
    drop(store);
    (Arc::new(Store::open(dir).unwrap()), Arc::new(Docs(docs)))
}

/// Stored bytes the store's reads have touched, from any source.
fn touched(store: &Store) -> u64 {
    let r = store.read_stats();
    r.bytes_read + r.bytes_from_page_cache + r.bytes_from_cache
}

fn loader(source: Arc<dyn Source>, how: PackMode, threads: usize) -> Loader {
    let pack = Pack::new(SEQ, how, 0, TOKEN);
    let cfg = LoaderConfig { mode: Mode::Sequential, seed: 1, threads, depth: 3, ..LoaderConfig::new(BATCH) };
    Loader::new_packed(source, pack, cfg).unwrap()
}

fn same(a: &Batch, b: &Batch) {
    for (x, y) in a.columns.iter().zip(&b.columns) {
        assert_eq!(x.data(), y.data(), "step {} column {}", a.step, x.name());
    }
}

/// Steps that take most of one pass over the documents.
fn steps(how: PackMode) -> u64 {
    let tokens: u64 = lens().iter().sum();
    match how {
        PackMode::Concat => tokens * 9 / 10 / (SEQ * BATCH),
        // Padding adds rows; stay inside the pass.
        PackMode::FirstFit => tokens * 8 / 10 / (SEQ * BATCH),
    }
}

#[test]
fn over_raw_records_a_step_reads_at_most_twice_what_it_delivers() {
    with_timeout(DEADLOCK * 6, || {
        for how in [PackMode::Concat, PackMode::FirstFit] {
            for threads in [1, 2] {
                let dir = tempfile::tempdir().unwrap();
                let (store, whole) = store(dir.path(), Codec::Raw);
                let mut got = loader(Arc::new(StoreSource::ragged(Arc::clone(&store))), how, threads);
                let mut want = loader(whole, how, 1);
                let before = touched(&store);
                let n = steps(how);
                for _ in 0..n {
                    same(&got.next().unwrap(), &want.next().unwrap());
                }
                got.close().unwrap();
                // The workers gather a few steps ahead of the consumer.
                let gathered = got.stats().steps_gathered;
                assert!(gathered >= n);
                let delivered = gathered * BATCH * SEQ * TOKEN;
                let read = touched(&store) - before;
                assert!(
                    read <= 2 * delivered,
                    "{how:?}, {threads} threads: read {read} bytes to deliver {delivered}: {:?}",
                    store.read_stats()
                );
            }
        }
    });
}

#[test]
fn over_compressed_records_a_long_document_is_decoded_once_per_worker() {
    with_timeout(DEADLOCK * 6, || {
        for how in [PackMode::Concat, PackMode::FirstFit] {
            let dir = tempfile::tempdir().unwrap();
            let (store, whole) = store(dir.path(), Codec::Zstd);
            let stored = store.stats().unwrap().live_bytes;
            let mut got = loader(Arc::new(StoreSource::ragged(Arc::clone(&store))), how, 1);
            let mut want = loader(whole, how, 1);
            let before = touched(&store);
            for _ in 0..steps(how) {
                same(&got.next().unwrap(), &want.next().unwrap());
            }
            got.close().unwrap();
            // Most of one pass with one worker: each document read about
            // once (first fit may cut two long documents into one row and
            // read one of them twice; the worker also gathers a few steps
            // ahead). Read per step, it was over 100 times the store.
            let read = touched(&store) - before;
            assert!(read <= 2 * stored, "{how:?}: read {read} bytes of a store of {stored}: {:?}", store.read_stats());
        }
    });
}
