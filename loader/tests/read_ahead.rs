//! The read-ahead window: at most `depth` steps, and at most `ahead_bytes` of
//! data, are gathered ahead of the consumer, but always at least one step, so
//! a step larger than the byte budget still loads.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::{assert_matches_source, with_timeout, MemSource, DEADLOCK};
use zring_loader::{Loader, LoaderConfig, Mode, Stream, DEFAULT_AHEAD_BYTES};

/// Takes `delivered` batches, then waits (up to a generous limit) until the
/// workers have gathered `expect` steps ahead, and checks that they do not
/// Gather threads of every loader here.
const THREADS: u64 = 4;

/// go further.
fn ahead_after(loader: &mut Loader, delivered: u64, expect: u64) {
    for _ in 0..delivered {
        assert_matches_source(&loader.next().unwrap());
    }
    // Until every worker waits for the window to open: from then on nothing
    // more is gathered until next(), so the count is final.
    let started = Instant::now();
    while loader.stats().workers_idle < THREADS && started.elapsed() < DEADLOCK / 2 {
        thread::sleep(Duration::from_millis(1));
    }
    let stats = loader.stats();
    assert_eq!(stats.workers_idle, THREADS, "the workers never all waited: {stats:?}");
    assert_eq!(stats.steps_gathered, delivered + expect, "{stats:?}");
}

fn config(depth: usize, ahead_bytes: u64) -> LoaderConfig {
    LoaderConfig { mode: Mode::Cyclic, depth, threads: THREADS as usize, ahead_bytes, ..LoaderConfig::new(10) }
}

#[test]
fn the_window_is_depth_narrowed_by_bytes() {
    with_timeout(DEADLOCK, || {
        // A step of 10 records of 100 bytes is 1000 bytes.
        let cases = [
            (8, u64::MAX, 8),            // bytes unlimited: depth
            (8, DEFAULT_AHEAD_BYTES, 8), // the default binds only for huge steps
            (8, 2500, 2),                // two steps fit in 2500 bytes
            (8, 1000, 1),
            (8, 10, 1), // a step larger than the budget still loads
            (2, 10_000, 2),
        ];
        for (depth, ahead_bytes, expect) in cases {
            let streams = vec![Stream::new("x", MemSource::fixed(500, 100))];
            let mut loader = Loader::new(streams, config(depth, ahead_bytes)).unwrap();
            ahead_after(&mut loader, 3, expect);
        }
    });
}

#[test]
fn ragged_steps_count_as_the_largest_seen() {
    with_timeout(DEADLOCK, || {
        // Ragged records of `i % 13` bytes: a step of 10 has at most 120.
        // A budget of 1000 therefore allows at least 8 steps once the first
        // step is known; before, one step at a time is gathered.
        let streams = vec![Stream::new("t", MemSource::ragged(500))];
        let mut loader = Loader::new(streams, config(4, 1000)).unwrap();
        ahead_after(&mut loader, 2, 4);
        // Plus a fixed stream of 100-byte records: a step is over 1000 bytes,
        // so one step at a time.
        let streams = vec![Stream::new("t", MemSource::ragged(500)), Stream::new("x", MemSource::fixed(500, 100))];
        let mut loader = Loader::new(streams, config(4, 1000)).unwrap();
        ahead_after(&mut loader, 2, 1);
    });
}
