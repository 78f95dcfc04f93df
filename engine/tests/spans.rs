//! Reads of parts of records ([`Spans`]): a packer of long documents reads
//! a row's piece of a document, not the document (a step of rows cut from
//! 8 M-token documents read 16 MiB to deliver 32 KiB).
//!
//! The guarantees: a span delivers exactly the bytes of its record; a span
//! of a raw record reads at most twice its own bytes (a short span exactly
//! its bytes, a span of at least half the record the whole record, checked
//! against its checksum); a compressed record is read and decoded once per
//! call however many of its spans the call holds; a bad span is refused
//! before anything is written.

#[path = "common/spans.rs"]
mod common;

use common::{damage, read, record, store, RECORD};
use zring_engine::{Codec, Error, Span, Spans, Store};

/// Stored bytes the store's reads have touched, from any source.
fn touched(store: &Store) -> u64 {
    let r = store.read_stats();
    r.bytes_read + r.bytes_from_page_cache + r.bytes_from_cache
}

#[test]
fn a_short_span_of_a_raw_record_reads_only_its_bytes_and_a_long_one_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(store(dir.path(), Codec::Raw));
    // Two short spans of record 2 and one of record 5, out of order in dst.
    let spans = [
        Span { index: 2, from: 50_000, len: 1000, at: 3000 },
        Span { index: 5, from: 99_000, len: 1000, at: 0 },
        Span { index: 2, from: 10, len: 2000, at: 1000 },
    ];
    let before = touched(&store);
    let got = read(&store, &spans).unwrap();
    assert_eq!(touched(&store) - before, 4000, "exactly the spans' bytes: {:?}", store.read_stats());
    for p in &spans {
        let want = &record(p.index)[p.from as usize..][..p.len as usize];
        assert_eq!(&got[p.at as usize..][..p.len as usize], want, "{p:?}");
    }
    // Half of a record or more: the record whole (checked), at most twice
    // the span.
    let long = [Span { index: 3, from: 40_000, len: 50_000, at: 0 }];
    let before = touched(&store);
    let got = read(&store, &long).unwrap();
    assert_eq!(touched(&store) - before, RECORD as u64);
    assert_eq!(got, record(3)[40_000..90_000]);
    // An empty span reads nothing and writes nothing.
    let before = touched(&store);
    let got = read(&store, &[Span { index: 1, from: 7, len: 0, at: 4 }]).unwrap();
    assert_eq!(touched(&store), before);
    assert_eq!(got, vec![0xAB; 4]);
}

#[test]
fn a_long_span_checks_the_records_checksum_and_a_short_one_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(store(dir.path(), Codec::Raw));
    drop(store);
    // Flip a byte in the middle of record 4 on disk.
    damage(dir.path(), 4);
    let r4 = record(4);
    let store = std::sync::Arc::new(Store::open(dir.path()).unwrap());
    let Err(err) = read(&store, &[Span { index: 4, from: 0, len: 60_000, at: 0 }]) else {
        panic!("a long span of a damaged record read without an error");
    };
    assert!(matches!(err, Error::ChecksumMismatch { record: 4, .. }), "{err}");
    // A short span reads only its own bytes, which the record's checksum
    // does not cover on their own (documented): it succeeds.
    let got = read(&store, &[Span { index: 4, from: 1000, len: 100, at: 0 }]).unwrap();
    assert_eq!(got, r4[1000..1100]);
}

#[test]
fn a_compressed_record_is_decoded_once_per_call() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(store(dir.path(), Codec::Zstd));
    let mut codecs = [Codec::Raw; 2];
    store.view().codecs(&[0, 5], &mut codecs).unwrap();
    assert_eq!(codecs, [Codec::Zstd, Codec::Zstd]);
    let spans = [
        Span { index: 1, from: 0, len: 10, at: 0 },
        Span { index: 1, from: 99_990, len: 10, at: 10 },
        Span { index: 0, from: 500, len: 30, at: 20 },
    ];
    let before = touched(&store);
    let got = read(&store, &spans).unwrap();
    let stored = store.stats().unwrap().live_bytes / 6;
    let read = touched(&store) - before;
    // Records 0 and 1, once each (they compress to about the same size).
    assert!(read > stored && read < 3 * stored, "{read} bytes for 2 records of about {stored}");
    for p in &spans {
        assert_eq!(&got[p.at as usize..][..p.len as usize], &record(p.index)[p.from as usize..][..p.len as usize]);
    }
}

#[test]
fn bad_spans_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(store(dir.path(), Codec::Raw));
    let good = Span { index: 0, from: 0, len: 10, at: 0 };
    let cases: [(&[Span], &str); 4] = [
        (&[good, Span { index: 1, from: 99_995, len: 10, at: 10 }], "bytes 99995..100005 of record 1"),
        (&[good, Span { index: 1, from: 0, len: 10, at: 5 }], "overlaps"),
        (&[good, Span { index: 1, from: 0, len: 10, at: 25 }], "outside the destination"),
        (&[good, Span { index: 9, from: 0, len: 1, at: 10 }], "9"),
    ];
    for (spans, says) in cases {
        let mut dst = vec![0xCD; 30];
        let err = store.view().read_spans(&Spans::new(spans), &mut dst).unwrap_err();
        assert!(err.to_string().contains(says), "{err} should say {says:?}");
        assert!(dst.iter().all(|&b| b == 0xCD), "nothing written for {spans:?}");
    }
}

#[test]
fn spans_of_a_sealed_fixed_section_read_inside_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::builder(dir.path()).codec(Codec::Raw).create().unwrap();
    let records: Vec<Vec<u8>> =
        (0..3000u64).map(|i| (0..24).map(|j| (i * 24 + j) as u8 ^ (i >> 8) as u8).collect()).collect();
    let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    store.append(&refs, None).unwrap();
    store.sync().unwrap();
    let report = store.seal().unwrap();
    assert_eq!(report.format_after, 2, "{report:?}");
    drop(store);
    let store = std::sync::Arc::new(Store::open(dir.path()).unwrap());
    let spans = [
        Span { index: 1234, from: 3, len: 5, at: 0 },
        Span { index: 2999, from: 0, len: 24, at: 5 },
        Span { index: 0, from: 20, len: 4, at: 29 },
    ];
    let got = read(&store, &spans).unwrap();
    for p in &spans {
        let want = &records[p.index as usize][p.from as usize..][..p.len as usize];
        assert_eq!(&got[p.at as usize..][..p.len as usize], want, "{p:?}");
    }
}

/// The same spans through every read path: buffered with the mappings,
/// buffered by system calls, and O_DIRECT (aligned reads into scratch).
#[test]
fn spans_read_the_same_bytes_buffered_and_direct() {
    let dir = tempfile::tempdir().unwrap();
    drop(store(dir.path(), Codec::Raw));
    let spans = [
        Span { index: 0, from: 4095, len: 3, at: 0 },
        Span { index: 3, from: 12_345, len: 20_000, at: 3 },
        Span { index: 5, from: 1, len: 60_000, at: 20_003 },
    ];
    for (mmap, direct) in [(true, false), (false, false), (false, true)] {
        let store = std::sync::Arc::new(Store::builder(dir.path()).mmap(mmap).direct(direct).open().unwrap());
        let got = read(&store, &spans).unwrap();
        for p in &spans {
            let want = &record(p.index)[p.from as usize..][..p.len as usize];
            assert_eq!(&got[p.at as usize..][..p.len as usize], want, "mmap {mmap}, direct {direct}: {p:?}");
        }
        assert_eq!(store.is_direct(), direct);
    }
}
