//! Failures reach the caller in step order and never hang the pipeline: a
//! gather error or a panic in a source is returned by the `next()` of its
//! step, after every earlier step was delivered, and the loader is poisoned
//! afterwards. Closing a loader whose caller holds every buffer returns.

mod common;

use std::sync::Arc;

use common::{assert_matches_source, with_timeout, Faults, MemSource, DEADLOCK};
use zring_loader::{Error, Layout, Loader, LoaderConfig, Mode, Stream};

/// Sequential batches of 10 over 1000 records: record `r` is in step `r / 10`.
fn config(threads: usize, depth: usize) -> LoaderConfig {
    LoaderConfig { mode: Mode::Sequential, threads, depth, ..LoaderConfig::new(10) }
}

fn faulty(layout: Layout, faults: Faults) -> Vec<Stream> {
    vec![
        Stream::new("good", MemSource::fixed(1000, 8)),
        Stream::new("bad", MemSource::with_faults(1000, layout, faults)),
    ]
}

#[test]
fn a_gather_error_arrives_at_its_step_then_the_loader_is_poisoned() {
    for layout in [Layout::Fixed { record_bytes: 4 }, Layout::Ragged] {
        for (threads, depth) in [(1, 1), (4, 4)] {
            with_timeout(DEADLOCK, move || {
                let faults = Faults { fail_on: Some(123), ..Faults::default() };
                let mut loader = Loader::new(faulty(layout, faults), config(threads, depth)).unwrap();
                for step in 0..12 {
                    let b = loader.next().unwrap();
                    assert_eq!(b.step, step);
                    assert_matches_source(&b);
                }
                let err = loader.next().unwrap_err();
                match &err {
                    Error::Gather { step, stream, source } => {
                        assert_eq!(*step, 12);
                        assert_eq!(stream, "bad");
                        assert!(source.to_string().contains("record 123"), "{source}");
                    }
                    other => panic!("expected Gather, got {other:?}"),
                }
                assert!(err.to_string().contains("step 12"), "{err}");
                // Poisoned: the state points at the failed step for a retry.
                let again = loader.next().unwrap_err();
                assert!(matches!(again, Error::Poisoned { step: 12 }), "{again:?}");
                assert_eq!(loader.state().next_step(), 12);
                loader.close().unwrap();
            });
        }
    }
}

#[test]
fn a_panicking_source_becomes_an_error() {
    for layout in [Layout::Fixed { record_bytes: 4 }, Layout::Ragged] {
        with_timeout(DEADLOCK, move || {
            let faults = Faults { panic_on: Some(57), ..Faults::default() };
            let mut loader = Loader::new(faulty(layout, faults), config(3, 2)).unwrap();
            for step in 0..5 {
                assert_eq!(loader.next().unwrap().step, step);
            }
            let err = loader.next().unwrap_err();
            match &err {
                Error::Panicked { step, stream, message } => {
                    assert_eq!(*step, Some(5));
                    assert_eq!(stream.as_deref(), Some("bad"));
                    assert!(message.contains("record 57"), "{message}");
                }
                other => panic!("expected Panicked, got {other:?}"),
            }
            assert!(matches!(loader.next().unwrap_err(), Error::Poisoned { step: 5 }));
            // The panic was reported through next(); close has nothing to add.
            loader.close().unwrap();
        });
    }
}

#[test]
fn an_error_in_the_first_step_is_delivered_too() {
    with_timeout(DEADLOCK, || {
        let faults = Faults { fail_on: Some(0), ..Faults::default() };
        let mut loader = Loader::new(faulty(Layout::Ragged, faults), config(2, 2)).unwrap();
        let err = loader.next().unwrap_err();
        assert!(matches!(err, Error::Gather { step: 0, .. }), "{err:?}");
    });
}

#[test]
fn close_returns_while_the_caller_holds_every_batch() {
    with_timeout(DEADLOCK, || {
        let streams = vec![Stream::new("x", MemSource::fixed(1000, 64))];
        let mut loader = Loader::new(streams, config(4, 2)).unwrap();
        let held: Vec<_> = (0..30).map(|_| loader.next().unwrap()).collect();
        loader.close().unwrap();
        assert!(matches!(loader.next().unwrap_err(), Error::Closed));
        loader.close().unwrap();
        // Batches outlive the loader.
        drop(loader);
        for b in &held {
            assert_matches_source(b);
        }
    });
}

#[test]
fn dropping_an_unread_loader_returns() {
    with_timeout(DEADLOCK, || {
        // Slow gathers: workers are mid-gather when the loader is dropped.
        let faults = Faults { jitter_us: 3_000, ..Faults::default() };
        let src = MemSource::with_faults(1000, Layout::Ragged, faults);
        let loader = Loader::new(vec![Stream::new("x", src as Arc<_>)], config(8, 8)).unwrap();
        drop(loader);
    });
}
