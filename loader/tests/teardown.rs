//! Creating and dropping loaders leaves no threads behind and never waits on
//! the caller: the workers of a dropped loader are joined even when the
//! caller holds every batch or never read one. This file holds one test so no
//! other test's threads disturb its count of this process's threads.

mod common;

use common::{take, with_timeout, MemSource};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zring_loader::{Loader, LoaderConfig, Source, Stream};

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").expect("/proc/self/task lists this process's threads").count()
}

/// The thread count once it is back to `expected`, or what it still is after
/// a grace period. A joined thread has finished running, but the kernel wakes
/// the joiner just before it removes the thread's /proc entry, so an exact
/// count right after a join can still see it for a moment.
fn settled_thread_count(expected: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = thread_count();
        if n == expected || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_thousand_loaders_leave_no_threads() {
    with_timeout(Duration::from_secs(60), || {
        let before = thread_count();
        let mut kept = Vec::new();
        for i in 0..1000u64 {
            let cfg = LoaderConfig {
                threads: 1 + (i % 4) as usize,
                depth: 1 + (i % 3) as usize,
                seed: i,
                ..LoaderConfig::new(8)
            };
            let src = MemSource::ragged(64);
            let streams = vec![
                Stream::new("img", MemSource::fixed(64, 12)),
                Stream::new("txt", Arc::clone(&src) as Arc<dyn Source>),
            ];
            let mut loader = Loader::new(streams, cfg).unwrap();
            match i % 4 {
                // Never read.
                0 => {}
                // Read a little.
                1 => drop(take(&mut loader, 3)),
                // Hold batches past the loader's end.
                2 => kept.extend((0..5).map(|_| loader.next().unwrap())),
                // Closed explicitly while the caller holds a batch.
                _ => {
                    let b = loader.next().unwrap();
                    loader.close().unwrap();
                    kept.push(b);
                }
            }
            drop(loader);
            // Workers share the sources; the only reference left must be ours,
            // which proves every worker has exited (not merely been told to).
            assert_eq!(Arc::strong_count(&src), 1, "loader {i}");
            if i % 100 == 0 {
                // Threads are joined by drop, so none may linger even now.
                assert_eq!(settled_thread_count(before), before, "after loader {i}");
            }
        }
        assert_eq!(settled_thread_count(before), before);
        for b in &kept {
            common::assert_matches_source(b);
        }
    });
}
