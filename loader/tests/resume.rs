//! A saved state resumes exactly: the loader built from it yields the batches
//! the saved loader would have yielded next, whatever threads and depth
//! either used, and the state survives a serde round trip.

mod common;

use common::{take, two_streams, with_timeout, MemSource, DEADLOCK};
use zring_loader::{Error, Loader, LoaderConfig, LoaderState, Mode, Shard};

#[test]
fn resume_mid_run_yields_the_same_sequence() {
    with_timeout(DEADLOCK, || {
        for mode in [Mode::Sequential, Mode::Iid, Mode::Cyclic] {
            let cfg = LoaderConfig { mode, seed: 99, threads: 4, depth: 3, ..LoaderConfig::new(16) };
            let mut original = Loader::new(two_streams(200), cfg).unwrap();
            take(&mut original, 17);
            let state = original.state();
            assert_eq!(state.next_step(), 17);
            let json = serde_json::to_string(&state).unwrap();
            let rest = take(&mut original, 30);

            let restored: LoaderState = serde_json::from_str(&json).unwrap();
            assert_eq!(restored, state);
            let cfg = LoaderConfig { threads: 1, depth: 1, ..LoaderConfig::from_state(&restored) };
            let mut resumed = Loader::new(two_streams(200), cfg).unwrap();
            assert_eq!(resumed.next_step(), 17);
            assert_eq!(take(&mut resumed, 30), rest, "{mode:?}");
        }
    });
}

#[test]
fn state_counts_only_delivered_steps() {
    with_timeout(DEADLOCK, || {
        let cfg = LoaderConfig { depth: 8, threads: 4, ..LoaderConfig::new(4) };
        let mut loader = Loader::new(two_streams(50), cfg).unwrap();
        assert_eq!(loader.state().next_step(), 0);
        let b = loader.next().unwrap();
        assert_eq!(b.step, 0);
        // Workers are already ahead, but the state names the step the caller
        // gets next.
        assert_eq!(loader.state().next_step(), 1);
    });
}

#[test]
fn resume_with_a_different_shard_count_keeps_the_global_sequence() {
    with_timeout(DEADLOCK, || {
        let mut whole = Loader::new(two_streams(300), LoaderConfig::new(12)).unwrap();
        take(&mut whole, 5);
        let state = whole.state();
        let expected = whole.next().unwrap();
        let cfg = LoaderConfig { shard: Shard::new(1, 3).unwrap(), ..LoaderConfig::from_state(&state) };
        let mut third = Loader::new(two_streams(300), cfg).unwrap();
        let b = third.next().unwrap();
        assert_eq!(b.step, 5);
        assert_eq!(b.indices[..], expected.indices[4..8]);
    });
}

#[test]
fn resume_over_streams_of_another_length_is_refused() {
    let mut loader = Loader::new(two_streams(100), LoaderConfig::new(8)).unwrap();
    loader.next().unwrap();
    let state = loader.state();
    let streams = vec![zring_loader::Stream::new("img", MemSource::fixed(101, 12))];
    let err = Loader::new(streams, LoaderConfig::from_state(&state)).unwrap_err();
    assert!(matches!(err, Error::StateMismatch { state_length: 100, stream_length: 101 }), "{err:?}");
}
