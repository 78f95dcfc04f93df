//! Recycling never overwrites a batch the caller holds: buffers return to the
//! pool only when dropped, so held batches keep their contents while the
//! loader runs on, and the loader allocates rather than waits when the
//! caller holds more buffers than the pool has.

mod common;

use common::{snapshot, two_streams, with_timeout, DEADLOCK};
use zring_loader::{Loader, LoaderConfig, Mode};

#[test]
fn held_batches_are_never_overwritten() {
    with_timeout(DEADLOCK, || {
        for (threads, depth) in [(1, 1), (2, 2), (8, 4)] {
            let cfg = LoaderConfig { mode: Mode::Iid, threads, depth, ..LoaderConfig::new(32) };
            let mut loader = Loader::new(two_streams(1000), cfg).unwrap();
            let held: Vec<_> = (0..10).map(|_| loader.next().unwrap()).collect();
            let copies: Vec<_> = held.iter().map(snapshot).collect();
            for _ in 0..50 {
                // Drop each new batch at once so its buffers are recycled hard.
                let b = loader.next().unwrap();
                common::assert_matches_source(&b);
            }
            for (b, copy) in held.iter().zip(&copies) {
                assert_eq!(&snapshot(b), copy);
                common::assert_matches_source(b);
            }
        }
    });
}

#[test]
fn recycled_buffers_carry_fresh_contents() {
    with_timeout(DEADLOCK, || {
        // Depth 1, one thread: the pool cycles through very few buffers, so
        // each is reused many times; stale bytes would show up here.
        let cfg = LoaderConfig { mode: Mode::Cyclic, threads: 1, depth: 1, ..LoaderConfig::new(7) };
        let mut loader = Loader::new(two_streams(100), cfg).unwrap();
        for _ in 0..200 {
            common::assert_matches_source(&loader.next().unwrap());
        }
    });
}

/// A caller that drops each batch before asking for the next needs `depth`
/// buffer sets in flight plus the one it holds; the loader pre-allocates
/// exactly that for fixed-size streams, so it never allocates afterwards.
#[test]
fn steady_state_allocates_no_buffers() {
    with_timeout(DEADLOCK, || {
        for (threads, depth) in [(1, 1), (2, 2), (4, 4)] {
            let streams = vec![zring_loader::Stream::new("x", common::MemSource::fixed(500, 16))];
            let cfg = LoaderConfig { threads, depth, ..LoaderConfig::new(10) };
            let mut loader = Loader::new(streams, cfg).unwrap();
            for _ in 0..200 {
                drop(loader.next().unwrap());
            }
            assert_eq!(loader.stats().buffers_allocated, 0, "threads={threads} depth={depth}");
        }
    });
}

/// Ragged buffers start empty and grow to fit; once they have, the pools
/// cover the steady state. With the caller keeping the previous batch alive
/// while it asks for the next (as a Python loop does), at most `depth + 2`
/// buffer sets ever exist at once, so each pool allocates a bounded number of
/// times over the whole run, never once per step.
#[test]
fn ragged_buffers_stop_growing() {
    with_timeout(DEADLOCK, || {
        // Sequential batches of 13 over i % 13-byte records: every batch has
        // the same total size, so a buffer that fitted once always fits.
        let depth = 2;
        let cfg = LoaderConfig { mode: Mode::Sequential, threads: 2, depth, ..LoaderConfig::new(13) };
        let mut loader = Loader::new(two_streams(52), cfg).unwrap();
        let mut previous = loader.next().unwrap();
        for _ in 0..300 {
            let b = loader.next().unwrap();
            common::assert_matches_source(&b);
            previous = b;
        }
        drop(previous);
        // depth + 1 sets are pre-allocated for the indices, the fixed "img"
        // data and the ragged offsets, none for the ragged data: the bound is
        // one more of each of the first three and depth + 2 ragged buffers.
        let bound = 3 + (depth as u64 + 2);
        let allocated = loader.stats().buffers_allocated;
        assert!((1..=bound).contains(&allocated), "{allocated} > {bound}");
    });
}

/// Holding batches costs memory, not a deadlock: the loader allocates new
/// buffers instead of waiting for held ones.
#[test]
fn holding_batches_makes_the_loader_allocate() {
    with_timeout(DEADLOCK, || {
        let streams = vec![zring_loader::Stream::new("x", common::MemSource::fixed(500, 16))];
        let cfg = LoaderConfig { threads: 2, depth: 2, ..LoaderConfig::new(10) };
        let mut loader = Loader::new(streams, cfg).unwrap();
        let held: Vec<_> = (0..20).map(|_| loader.next().unwrap()).collect();
        // 20 held + up to 2 in flight, 3 sets pre-allocated, one data buffer
        // and one index buffer per set.
        let allocated = loader.stats().buffers_allocated;
        assert!((2 * 17..=2 * 19).contains(&allocated), "{allocated}");
        drop(held);
    });
}
