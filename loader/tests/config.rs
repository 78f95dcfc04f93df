//! Bad streams or configuration give a typed error, never a panic or a
//! half-started loader.

mod common;

use common::{two_streams, MemSource};
use zring_loader::{Error, Loader, LoaderConfig, Shard, Stream};

#[test]
fn streams_of_different_lengths_are_refused_with_their_lengths() {
    let streams = vec![Stream::new("img", MemSource::fixed(100, 4)), Stream::new("label", MemSource::fixed(99, 1))];
    let err = Loader::new(streams, LoaderConfig::new(8)).unwrap_err();
    match &err {
        Error::LengthMismatch { lengths } => assert_eq!(lengths, &[("img".to_owned(), 100), ("label".to_owned(), 99)]),
        other => panic!("expected LengthMismatch, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("\"img\": 100") && msg.contains("\"label\": 99"), "{msg}");
}

#[test]
fn no_streams_is_refused() {
    let err = Loader::new(vec![], LoaderConfig::new(8)).unwrap_err();
    assert!(matches!(err, Error::NoStreams), "{err:?}");
}

#[test]
fn duplicate_names_are_refused() {
    let streams = vec![Stream::new("x", MemSource::fixed(10, 4)), Stream::new("x", MemSource::ragged(10))];
    let err = Loader::new(streams, LoaderConfig::new(8)).unwrap_err();
    assert!(matches!(&err, Error::DuplicateStream { name } if name == "x"), "{err:?}");
}

#[test]
fn out_of_range_settings_are_refused() {
    let cases: Vec<(LoaderConfig, &str)> = vec![
        (LoaderConfig { depth: 0, ..LoaderConfig::new(8) }, "depth"),
        (LoaderConfig { depth: 5000, ..LoaderConfig::new(8) }, "depth"),
        (LoaderConfig { threads: 0, ..LoaderConfig::new(8) }, "threads"),
        (LoaderConfig { threads: 100_000, ..LoaderConfig::new(8) }, "threads"),
        (LoaderConfig { start_step: u64::MAX, ..LoaderConfig::new(8) }, "start_step"),
    ];
    for (cfg, field) in cases {
        let err = Loader::new(two_streams(10), cfg.clone()).unwrap_err();
        assert!(matches!(&err, Error::InvalidConfig { field: f, .. } if *f == field), "{cfg:?}: {err:?}");
    }
}

#[test]
fn sampler_errors_pass_through() {
    let err = Loader::new(two_streams(10), LoaderConfig::new(0)).unwrap_err();
    assert!(matches!(err, Error::Sampler(zring_sampler::Error::ZeroBatch)), "{err:?}");

    let err = Loader::new(two_streams(0), LoaderConfig::new(4)).unwrap_err();
    assert!(matches!(err, Error::Sampler(zring_sampler::Error::EmptyIndexSpace)), "{err:?}");

    let bad_shard = LoaderConfig { shard: Shard { index: 2, count: 2 }, ..LoaderConfig::new(8) };
    let err = Loader::new(two_streams(10), bad_shard).unwrap_err();
    assert!(matches!(err, Error::Sampler(zring_sampler::Error::BadShard { .. })), "{err:?}");

    let uneven = LoaderConfig { shard: Shard { index: 0, count: 3 }, ..LoaderConfig::new(8) };
    let err = Loader::new(two_streams(10), uneven).unwrap_err();
    assert!(matches!(err, Error::Sampler(zring_sampler::Error::ShardDoesNotDivide { .. })), "{err:?}");
}
