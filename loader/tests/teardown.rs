//! Creating and dropping loaders leaves no threads behind and never waits on
//! the caller: the workers of a dropped loader are joined even when the
//! caller holds every batch or never read one. This file holds one test so no
//! other test's threads disturb its count of this process's threads.

mod common;

use common::{take, two_streams, with_timeout};
use std::time::Duration;
use zring_loader::{Loader, LoaderConfig};

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task lists this process's threads")
        .count()
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
            let mut loader = Loader::new(two_streams(64), cfg).unwrap();
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
            if i % 100 == 0 {
                // Threads are joined by drop, so none may linger even now.
                assert_eq!(thread_count(), before, "after loader {i}");
            }
        }
        assert_eq!(thread_count(), before);
        for b in &kept {
            common::assert_matches_source(b);
        }
    });
}
