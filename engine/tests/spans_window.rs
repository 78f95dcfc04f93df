//! A short span of a record that a loaded window holds (mode 3's block
//! reads) is copied from the window, its record checked whole, with no read.
//!
//! The record cache (which holds the windows) is one per process and its
//! capacity is shared by the stores a process has open: this file is its own
//! test binary, with one store, so that the window keeps every record asked.

#[path = "common/spans.rs"]
mod common;

use common::{damage, read, record, store, RECORD};
use zring_engine::{Codec, Error, Span, Store};

/// A short span of a record that a loaded window holds (mode 3's block
/// reads, [`zring_engine::View::prefetch`]) is copied from the window with
/// no read, and its record is checked whole first: a byte flipped on disk
/// before the window was loaded fails the span, which read from disk on its
/// own it could not.
#[test]
fn a_short_span_of_a_record_in_a_loaded_window_is_copied_from_it_checked() {
    let dir = tempfile::tempdir().unwrap();
    drop(store(dir.path(), Codec::Raw));
    damage(dir.path(), 4);
    // 600 KB of records against a 500 KB budget: O_DIRECT behind a record
    // cache that holds a window of two records.
    let store = std::sync::Arc::new(Store::builder(dir.path()).cache_bytes(500_000).open().unwrap());
    assert!(store.is_direct());
    store.view().prefetch(&[2..3, 4..5], &[]).unwrap();
    let held = store.read_stats().window_bytes;
    assert!(held >= 2 * RECORD as u64, "both records' runs held: {:?}", store.read_stats());
    let spans = [Span { index: 2, from: 50_000, len: 1000, at: 1000 }, Span { index: 2, from: 10, len: 900, at: 0 }];
    let before = store.read_stats().bytes_read;
    let got = read(&store, &spans).unwrap();
    assert_eq!(store.read_stats().bytes_read, before, "no read: {:?}", store.read_stats());
    for p in &spans {
        assert_eq!(&got[p.at as usize..][..p.len as usize], &record(2)[p.from as usize..][..p.len as usize]);
    }
    let Err(err) = read(&store, &[Span { index: 4, from: 1000, len: 100, at: 0 }]) else {
        panic!("a short span of a damaged record in a window read without an error");
    };
    assert!(matches!(err, Error::ChecksumMismatch { record: 4, .. }), "{err}");
}
