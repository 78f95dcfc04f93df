//! A loader's rows of whole pages read with O_DIRECT straight into the
//! batch: the loader's batch buffers start on a page boundary, so a store
//! reading records of 4 KiB multiples from disk puts each one in its row with
//! no copy through a buffer (`bytes_into_place`), on every worker, and the
//! batches are the records.

mod common;

use std::sync::Arc;

use common::{take, with_timeout};
use zring_engine::{Codec, Store};
use zring_loader::{Loader, LoaderConfig, Mode, StoreSource, Stream};

const RECORDS: u64 = 600;
const BATCH: u64 = 40;
const ROW: usize = 8192;

#[test]
fn rows_of_whole_pages_are_read_into_the_batch_itself() {
    with_timeout(common::DEADLOCK * 3, || {
        let dir = tempfile::tempdir().unwrap();
        let writer = Store::builder(dir.path()).codec(Codec::Raw).create().unwrap();
        let records: Vec<Vec<u8>> = (0..RECORDS).map(|i| common::fixed_record(i, ROW)).collect();
        writer.append(&records.iter().map(Vec::as_slice).collect::<Vec<_>>(), None).unwrap();
        writer.sync().unwrap();
        drop(writer);
        let store = Arc::new(Store::builder(dir.path()).direct(true).open().unwrap());
        assert!(store.is_direct(), "O_DIRECT refused here");
        let stream = Stream::new("x", Arc::new(StoreSource::fixed(Arc::clone(&store), ROW)));
        let config = LoaderConfig { mode: Mode::Cyclic, seed: 3, threads: 2, depth: 3, ..LoaderConfig::new(BATCH) };
        let mut loader = Loader::new(vec![stream], config).unwrap();
        for b in take(&mut loader, 20) {
            let data = &b.columns[0].1;
            for (k, &i) in b.indices.iter().enumerate() {
                assert!(data[k * ROW..][..ROW] == records[i as usize][..], "step {}, row {k}", b.step);
            }
        }
        loader.close().unwrap();
        let stats = store.read_stats();
        assert!(stats.bytes_read >= 20 * BATCH * ROW as u64, "{stats:?}");
        assert_eq!(stats.bytes_into_place, stats.bytes_read, "{stats:?}");
    });
}
